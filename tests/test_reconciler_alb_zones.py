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

from fleetkeeper.model import BalancerState, ReplicaStatus
from fleetkeeper.reconciler.balancer import DrainState, Target
from tests.reconciler_world import World, make_alb, raw_client

if TYPE_CHECKING:
    from tests.reconciler_world import ProbeServer
    from tests.strict_aws import StrictAws


def test_a_replica_in_a_zone_the_alb_lacks_says_it_gets_no_requests(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    balancer = make_alb()  # subnets in us-east-1a and us-east-1b
    ec2 = raw_client("ec2")
    subnet = ec2.create_subnet(VpcId=balancer.vpc_id, CidrBlock="10.42.3.0/24", AvailabilityZone="us-east-1c")
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
    subnets = raw_client("ec2").describe_subnets(Filters=[{"Name": "vpc-id", "Values": [balancer.vpc_id]}])["Subnets"]
    monkeypatch.setenv("FLEETKEEPER_SUBNET_IDS", ",".join(s["SubnetId"] for s in subnets))
    world = World(server, balancer=balancer)
    world.create(service={"readiness_probe": "/health", "replicas": 2, "ports": server.port})
    world.converge()
    state = world.store.load("svc")
    assert state is not None
    assert [r.status_message for r in state.replicas.values()] == ["", ""]
    assert state.service.status_message == "2/2 ready"
