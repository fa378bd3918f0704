"""Readiness probes longer than the run's probe budget, as SkyPilot allows them (issue 24, Deliver 5).

A probe whose timeout the run's probe phase is not made to hold (over MAX_PROBE_TIMEOUT_SECONDS)
starts with the run's probes, runs while the run reconciles its services, and its verdict is planned
in a second pass of the same run, before the invocation ends. The scale is lowered (the phase holds
1 s probes, the run's budget is 1 s, the slow replica answers after 1.5 s) so the tests take
seconds, as tests/reconciler/test_probe_deadline.py lowers its limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from fleetkeeper.model import ReplicaStatus
from fleetkeeper.reconciler import probing

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.support.reconciler_world import ProbeServer, World


@pytest.fixture
def lowered(world: World, server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setattr(probing, "MAX_PROBE_TIMEOUT_SECONDS", 1)  # the run's phase holds 1 s probes
    world.reconciler.probe_budget_seconds = 1
    try:
        yield world
    finally:
        server.delay = 0.0


def slow_service(timeout: int) -> dict[str, object]:
    return {"readiness_probe": {"path": "/health", "timeout_seconds": timeout}, "replicas": 1}


def test_a_replica_slower_than_the_runs_probe_budget_becomes_ready(lowered: World, server: ProbeServer) -> None:
    """Before: probed inside the run's 1 s phase, it had no verdict every run and never got READY."""
    world = lowered
    server.delay = 1.5
    world.create(service={**slow_service(3), "ports": server.port})
    world.converge()
    state = world.store.load("svc")
    assert state is not None
    assert [r.status for r in state.replicas.values()] == [ReplicaStatus.READY]
    assert state.service.status_message == "1/1 ready"


def test_a_hung_long_probe_ends_at_its_own_timeout_and_the_replica_is_not_ready(
    lowered: World, server: ProbeServer
) -> None:
    world = lowered
    server.delay = 2.5  # longer than the probe's 2 s: it never answers in time
    world.create(service={**slow_service(2), "ports": server.port})
    for _ in range(3):
        report = world.run()
        assert report.errors == []
    state = world.store.load("svc")
    assert state is not None
    (replica,) = state.replicas.values()
    assert replica.status is not ReplicaStatus.READY
    assert "timed out after 2s" in replica.status_message


def test_short_probes_are_decided_in_the_first_pass_only(lowered: World, server: ProbeServer) -> None:
    """A service whose probes fit the run's phase costs no second pass (no second read of it)."""
    world = lowered
    world.create(service={**slow_service(1), "ports": server.port})
    world.converge()
    mark = world.log.mark()
    world.run()
    # The index's listing and the service's own Query; a second pass would read the service again.
    assert world.log.since(mark).count(("dynamodb", "Query")) == 2
    assert world.log.since(mark).count(("ec2", "DescribeInstances")) == 1


def test_a_long_probe_its_run_cannot_hold_is_no_verdict_and_its_own_run_judges_it(
    lowered: World, server: ProbeServer
) -> None:
    """A shard's run has its period for long probes; one still in flight when that is spent is no
    verdict (a READY replica stays READY, never "no verdict" failed), and the service gets a follow-up:
    a run of its own (a kick), which has the whole invocation and judges it."""
    from fleetkeeper.reconciler.budget import ShardBudget

    world = lowered
    world.create(service={**slow_service(3), "ports": server.port})
    world.converge()
    asked: list[tuple[str, int]] = []
    world.reconciler.follow_up = lambda name, delay, due: asked.append((name, delay))
    server.status, server.delay = 503, 2.0  # failing now, and slower than the 1.5 s the shard can give
    budget = ShardBudget(remaining=lambda: 11.5, service_margin=10.0)
    report = world.reconciler.run_shard(["svc"], budget)
    assert report.errors == []
    state = world.store.load("svc")
    assert state is not None
    assert [r.status for r in state.replicas.values()] == [ReplicaStatus.READY]
    assert asked == [("svc", 10)]
    world.run("svc")  # the follow-up: a kick, no period to keep
    state = world.store.load("svc")
    assert state is not None
    (replica,) = state.replicas.values()
    assert (replica.status, replica.status_message) == (ReplicaStatus.NOT_READY, "readiness probe failing: HTTP 503")


def test_initial_delay_zero_does_not_fail_a_replica_whose_first_long_probe_is_in_flight(
    lowered: World, server: ProbeServer
) -> None:
    """Issue 35: with `initial_delay_seconds: 0` every replica failed "never answered a readiness
    probe, 0s after launch" while its first long probe was still in flight. The delay now counts from
    provisioning and a probe in flight is no verdict: the replica turns READY."""
    world = lowered
    server.delay = 1.5
    probe = {"path": "/health", "timeout_seconds": 3, "initial_delay_seconds": 0}
    world.create(service={"readiness_probe": probe, "replicas": 1, "ports": server.port})
    world.converge()
    state = world.store.require("svc")
    assert [(r.replica_id, r.status) for r in state.replicas.values()] == [(0, ReplicaStatus.READY)]
    assert state.replicas[0].probing_since is not None
