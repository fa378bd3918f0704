"""Availability Zones the stack's ALB does not cover, on the strict layer.

A target registered in a zone none of the load balancer's subnets is in is `unused` /
`Target.NotInUse` (Elastic Load Balancing, "Target health status"): the ALB sends it no request.
Before, the reconciler recorded such a replica REGISTERED with nothing to say, and the service READY
with every replica serving; now the replica's message and the service's say it serves nothing, and
a drain of such a target is over at once (nothing can be in flight to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from fleetkeeper.model import BalancerState, ReplicaStatus, VersionState
from fleetkeeper.reconciler.balancer import DrainState, Target
from fleetkeeper.reconciler.drivers import ec2 as ec2_driver
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from tests.support.aws_calls import AwsCalls
from tests.support.reconciler_world import World, make_alb, raw_client

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer


def test_a_replica_in_a_zone_the_alb_lacks_says_it_gets_no_requests(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    balancer = make_alb()  # subnets in us-east-1a and us-east-1b
    ec2 = raw_client("ec2")
    subnet = ec2.create_subnet(VpcId=balancer.settings.vpc_id, CidrBlock="10.42.3.0/24", AvailabilityZone="us-east-1c")
    monkeypatch.setenv("FLEETKEEPER_SUBNET_IDS", subnet["Subnet"]["SubnetId"])  # the replicas' subnet
    world = World(server, balancer=balancer)
    world.create(service={"readiness_probe": "/health", "replicas": 1, "ports": server.port})
    for _ in range(10):
        world.run()
        state = world.store.load("svc")
        assert state is not None
        if any(r.balancer is BalancerState.REGISTERED for r in state.replicas.values()):
            break
    # The run that registered it says so in the service's status too, not a run later.
    assert "Target.NotInUse" in state.service.status_message
    world.converge()

    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    (replica,) = state.replicas.values()
    assert replica.status is ReplicaStatus.READY and replica.balancer is BalancerState.REGISTERED
    assert replica.status_message.startswith("Target.NotInUse: registered, but the load balancer sends it no requests")
    assert "us-east-1c" in replica.status_message
    assert "replica 0 READY: Target.NotInUse" in state.service.status_message

    # Deregistered, it has nothing in flight: drained at once, not IN_SERVICE (which would
    # deregister it again, run after run).
    target = Target(replica.replica_id, str(replica.instance_id), server.port, None)
    assert balancer.drain_states(state.service.endpoint, [target]) == {target.instance_id: DrainState.DRAINED}


def test_a_replica_in_a_covered_zone_has_nothing_to_say(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    balancer = make_alb()
    subnets = raw_client("ec2").describe_subnets(Filters=[{"Name": "vpc-id", "Values": [balancer.settings.vpc_id]}])[
        "Subnets"
    ]
    monkeypatch.setenv("FLEETKEEPER_SUBNET_IDS", ",".join(s["SubnetId"] for s in subnets))
    world = World(server, balancer=balancer)
    world.create(service={"readiness_probe": "/health", "replicas": 2, "ports": server.port})
    world.converge()
    state = world.store.load("svc")
    assert state is not None
    assert [r.status_message for r in state.replicas.values()] == ["", ""]
    assert state.service.status_message == "2/2 ready"


# --- launches go only to zones the load balancer covers (drivers/ec2.py, launch_subnets) ---------


@pytest.fixture
def fresh_zone_cache() -> Iterator[None]:
    """The driver keeps what DescribeSubnets said per cold start; each test starts cold."""
    ec2_driver._served_subnets.clear()
    yield
    ec2_driver._served_subnets.clear()


def _zone_world(
    server: ProbeServer, monkeypatch: pytest.MonkeyPatch, replica_zones: tuple[str, ...]
) -> tuple[World, dict[str, str]]:
    """The ALB in us-east-1a and -1b, replica subnets in `replica_zones`, the template's variables."""
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    balancer = make_alb()
    ec2 = raw_client("ec2")
    alb_subnets = [
        s["SubnetId"]
        for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [balancer.settings.vpc_id]}])["Subnets"]
    ]
    replica_subnets: dict[str, str] = {}
    for n, zone in enumerate(replica_zones):
        made = ec2.create_subnet(
            VpcId=balancer.settings.vpc_id, CidrBlock=f"10.42.{10 + n}.0/24", AvailabilityZone=zone
        )
        replica_subnets[made["Subnet"]["SubnetId"]] = zone
    monkeypatch.setenv("FLEETKEEPER_SUBNET_IDS", ",".join(replica_subnets))
    monkeypatch.setenv("FLEETKEEPER_LOAD_BALANCER_SUBNET_IDS", ",".join(alb_subnets))
    return World(server, balancer=balancer), replica_subnets


def test_replicas_launch_only_in_zones_the_load_balancer_covers(
    aws: None,
    strict_aws: StrictAws,
    server: ProbeServer,
    monkeypatch: pytest.MonkeyPatch,
    fresh_zone_cache: None,
) -> None:
    world, replica_subnets = _zone_world(server, monkeypatch, ("us-east-1a", "us-east-1c", "us-east-1b"))
    world.create(service={"readiness_probe": "/health", "replicas": 4, "ports": server.port})
    with AwsCalls() as calls:
        world.run()
    # One DescribeSubnets for the whole run's launches, of both lists.
    assert [c for c in calls.operations() if c == ("ec2", "DescribeSubnets")] == [("ec2", "DescribeSubnets")]
    world.converge()

    launched_in = {replica_subnets[i["SubnetId"]] for i in world.instances()}
    assert launched_in == {"us-east-1a", "us-east-1b"}  # spread over the covered zones, never -1c
    state = world.store.load("svc")
    assert state is not None
    assert state.service.status_message == "4/4 ready"
    assert all("Target.NotInUse" not in r.status_message for r in state.replicas.values())

    with AwsCalls() as calls:  # the next run (same cold start) asks nothing more
        world.create(name="other", service={"readiness_probe": "/health", "replicas": 1, "ports": server.port})
        world.run("other")
    assert ("ec2", "DescribeSubnets") not in calls.operations()


def test_no_replica_subnet_in_a_covered_zone_is_the_stacks_problem_not_the_versions(
    aws: None,
    strict_aws: StrictAws,
    server: ProbeServer,
    monkeypatch: pytest.MonkeyPatch,
    fresh_zone_cache: None,
) -> None:
    world, _ = _zone_world(server, monkeypatch, ("us-east-1c",))
    world.create(service={"readiness_probe": "/health", "replicas": 2, "ports": server.port})
    for _ in range(8):  # more runs than the breaker's threshold of failures
        world.run()
    assert world.instances() == []
    state = world.store.load("svc")
    assert state is not None
    version = state.versions[state.service.target_version]
    assert version.state is not VersionState.FAILED  # the breaker never counted it
    assert "Fleetkeeper.NoSubnetInLoadBalancerZones" in state.service.status_message
    assert "LoadBalancerSubnetIds" in state.service.status_message


def test_without_load_balancer_subnets_every_replica_subnet_is_used(
    aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch, fresh_zone_cache: None
) -> None:
    driver = Ec2Driver(subnet_ids=["subnet-a", "subnet-c"])
    assert driver.launch_subnets() == ["subnet-a", "subnet-c"]  # no call: nothing to compare with
    shared = Ec2Driver(subnet_ids=["subnet-a"], load_balancer_subnet_ids=["subnet-a", "subnet-b"])
    assert shared.launch_subnets() == ["subnet-a"]  # the ALB is on the replicas' own subnets
