"""Concurrent workers, ELB's quotas and one bad target, on the strict layer.

- Two workers that read the same free rule priority (listener port) both create: AWS answers the
  second PriorityInUse (DuplicateListener). The layer runs another worker's create between the
  run's describe and its own (`strict_aws.elbv2.before`); the run takes the next free value.
- ELB's quotas (rules, listeners, target groups, targets): the layer enforces them (lowered here to
  reach them in a few services); the service's status names the quota, and the run reports no error.
- One target DescribeTargetHealth does not know (InvalidTarget) must not hide the others' states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.model import BalancerState
from fleetkeeper.reconciler.balancer import DrainState, Target
from tests.strict_aws.elbv2 import ElbQuotas
from tests.support.reconciler_world import World, make_alb, raw_client

if TYPE_CHECKING:
    from fleetkeeper.reconciler.balancers.alb import AlbBalancer
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer

NOT_FOUND = {"Type": "fixed-response", "FixedResponseConfig": {"StatusCode": "404", "ContentType": "text/plain"}}


def alb_world(server: ProbeServer, monkeypatch: pytest.MonkeyPatch, **alb: Any) -> tuple[World, AlbBalancer]:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    server.requests.clear()
    balancer = make_alb(**alb)
    return World(server, balancer=balancer), balancer


def status_message(world: World, name: str = "svc") -> str:
    state = world.store.load(name)
    assert state is not None
    return state.service.status_message


def one_replica(server: ProbeServer) -> dict[str, Any]:
    return {"readiness_probe": "/health", "replicas": 1, "ports": server.port}


# -- conflicts ----------------------------------------------------------------------------------------


def test_a_priority_taken_between_describe_and_create_is_retried_with_the_next(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, balancer = alb_world(server, monkeypatch, domain="svc.example.com")
    listener = balancer.settings.listener_arn
    assert listener is not None

    def other_worker() -> None:
        raw_client("elbv2").create_rule(
            ListenerArn=listener,
            Priority=1,
            Conditions=[{"Field": "host-header", "HostHeaderConfig": {"Values": ["other.svc.example.com"]}}],
            Actions=[NOT_FOUND],
        )

    strict_aws.elbv2.before("CreateRule", other_worker)
    world.create(service=one_replica(server))
    report = world.run()
    assert report.errors == []  # before: PriorityInUse, a run error
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    rules = raw_client("elbv2").describe_rules(ListenerArn=listener)["Rules"]
    hosts = {r["Conditions"][0]["HostHeaderConfig"]["Values"][0]: r["Priority"] for r in rules if not r["IsDefault"]}
    assert hosts == {"other.svc.example.com": "1", "svc.svc.example.com": "2"}


def test_a_port_taken_between_describe_and_create_is_retried_with_the_next(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, balancer = alb_world(server, monkeypatch)

    def other_worker() -> None:
        raw_client("elbv2").create_listener(
            LoadBalancerArn=balancer.settings.arn, Protocol="HTTP", Port=10000, DefaultActions=[NOT_FOUND]
        )

    strict_aws.elbv2.before("CreateListener", other_worker)
    world.create(service=one_replica(server))
    report = world.run()
    assert report.errors == []  # before: DuplicateListener, a run error
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    assert state.service.endpoint.url.endswith(":10001")


def test_conflicts_are_retried_a_bounded_number_of_times(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that loses every race gives up after a few attempts (a run error; the next run goes on)."""
    world, balancer = alb_world(server, monkeypatch)
    taken = iter(range(10000, 10049))

    def other_worker() -> None:
        raw_client("elbv2").create_listener(
            LoadBalancerArn=balancer.settings.arn, Protocol="HTTP", Port=next(taken), DefaultActions=[NOT_FOUND]
        )

    for _ in range(10):
        strict_aws.elbv2.before("CreateListener", other_worker)
    world.create(service=one_replica(server))
    report = world.run()
    assert report.errors == ["svc"]
    assert strict_aws.attempts_of("elastic-load-balancing-v2", "CreateListener") == 5 + 5  # ours and theirs
    strict_aws.elbv2._before.clear()
    world.converge()
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    assert state.service.endpoint.url.endswith(":10005")


# -- quotas -------------------------------------------------------------------------------------------


def test_too_many_listeners_is_the_services_status_and_clears_when_there_is_room(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, _ = alb_world(server, monkeypatch)
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1)
    world.create("one", service=one_replica(server))
    world.converge()
    world.create("two", service=one_replica(server))
    report = world.run()
    assert report.errors == []  # before: TooManyListeners, a run error the service's users never see
    assert "no endpoint: TooManyListeners: the stack's load balancer has as many listeners" in status_message(
        world, "two"
    )
    # Steady while the quota holds: tried again every run, the same status, nothing written.
    world.run()
    mark = world.log.mark()
    for _ in range(3):
        assert world.run().errors == []
    assert [call for call in world.log.mutations(mark) if call[0] == "dynamodb"] == []
    assert "TooManyListeners" in status_message(world, "two")
    # Room again (another service goes): the endpoint comes and the message goes.
    world.delete("one")
    world.converge()
    two = world.store.load("two")
    assert two is not None and two.service.endpoint is not None
    assert "no endpoint" not in two.service.status_message


def test_too_many_rules_and_target_groups_are_the_services_status(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, _ = alb_world(server, monkeypatch, domain="svc.example.com")
    strict_aws.elbv2.quotas = ElbQuotas(rules_per_load_balancer=1)
    world.create("one", service=one_replica(server))
    world.converge()
    world.create("two", service=one_replica(server))
    assert world.run().errors == []
    assert "no endpoint: TooManyRules" in status_message(world, "two")

    strict_aws.elbv2.quotas = ElbQuotas(target_groups_per_region=2)
    world.create("three", service=one_replica(server))
    assert world.run().errors == []
    assert "no endpoint: TooManyTargetGroups" in status_message(world, "three")


def test_too_many_targets_leaves_the_replicas_registering_and_says_so(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, _ = alb_world(server, monkeypatch)
    strict_aws.elbv2.quotas = ElbQuotas(targets_per_load_balancer=1)
    world.create("one", service=one_replica(server))
    world.converge()
    world.create("two", service=one_replica(server))
    for _ in range(4):
        assert world.run().errors == []
    two = world.store.load("two")
    assert two is not None
    assert [r.balancer for r in two.replicas.values()] == [BalancerState.REGISTERING]
    assert "no endpoint: TooManyTargets" in two.service.status_message
    strict_aws.elbv2.quotas = ElbQuotas()  # raised
    world.converge()
    two = world.store.load("two")
    assert two is not None
    assert [r.balancer for r in two.replicas.values()] == [BalancerState.REGISTERED]
    assert "TooManyTargets" not in two.service.status_message


# -- one bad target -------------------------------------------------------------------------------------


def test_one_unknown_target_does_not_hide_the_others_drain_states(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, balancer = alb_world(server, monkeypatch)
    world.create(service={"readiness_probe": "/health", "replicas": 2, "ports": server.port, "drain_seconds": 600})
    world.converge()
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    endpoint = state.service.endpoint
    serving, leaving = (
        Target(r.replica_id, str(r.instance_id), server.port, None)
        for r in sorted(state.replicas.values(), key=lambda r: r.replica_id)[:2]
    )
    balancer.deregister(endpoint, [leaving])
    gone = Target(9, "i-0123456789abcdef0", server.port, None)  # EC2 does not know it: InvalidTarget
    states = balancer.drain_states(endpoint, [serving, leaving, gone])
    # Before: every target DRAINED, so a still-serving replica would have been terminated.
    assert states == {
        serving.instance_id: DrainState.IN_SERVICE,
        leaving.instance_id: DrainState.DRAINING,
        gone.instance_id: DrainState.DRAINED,
    }
