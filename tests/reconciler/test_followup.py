"""Table tests of follow-ups (fleetkeeper.reconciler.followup): when a service in motion is worth its
next run, and whether a run asks for one given the follow-up already pending on the service."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from fleetkeeper.model import (
    BalancerState,
    EndpointConfig,
    EndpointRecord,
    FailureCause,
    Interruption,
    InterruptionKind,
    Lifecycle,
    ReplicaRecord,
    ServiceState,
)
from fleetkeeper.reconciler.followup import MAX_DELAY_SECONDS, FollowUp, follow_up, next_reconcile
from fleetkeeper.reconciler.plan import Policy
from tests.support.builders import NOW, S, ago, refusal, replica, spec, state, version

ENV = FailureCause.ENVIRONMENT
POLICY = Policy()
# The cases' spec drains for 30 s (not the default 120 s, EC2's whole notice), so a warned spot replica
# has a drain deadline to be woken for.
SPEC = spec().model_copy(update={"service": spec().service.model_copy(update={"drain_seconds": 30})})
EPOCH = int(NOW.timestamp())


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def warned(rid: int, kind: InterruptionKind, seconds_ago: float) -> ReplicaRecord:
    return replica(rid, interruption=Interruption(kind, f"i-{rid}", ago(seconds_ago)))


# (case, replicas, live replica ids, expected moment in seconds from NOW, None: nothing to wait for)
CASES: list[tuple[str, list[ReplicaRecord], set[int], float | None]] = [
    ("steady: every replica READY", [replica(0), replica(1)], {0, 1}, None),
    ("no replica at all", [], set(), None),
    ("booting: polled", [replica(0), replica(1, S.PROVISIONING, launched_at=ago(20))], {0, 1}, 10),
    ("starting: polled", [replica(0, S.STARTING, launched_at=ago(30))], {0}, 10),
    ("initial delay ends before the next poll", [replica(0, S.STARTING, launched_at=ago(595))], {0}, 6),
    (
        "initial delay counts from provisioning, not the launch",
        [replica(0, S.STARTING, launched_at=ago(900), probing_since=ago(595))],
        {0},
        6,
    ),
    ("probe failing: polled until it recovers or fails", [replica(0, S.NOT_READY, probe_failures=1)], {0}, 10),
    ("claimed, not launched (a run cut short)", [replica(0, S.PENDING)], set(), 10),
    (
        "refused: its backoff ends",
        [replica(0), refusal(1, "InsufficientInstanceCapacity", "x", ENV, retry_in=40)],
        {0},
        40,
    ),
    ("refused, backoff over: the plan launched or keeps it", [refusal(1, "X", "x", ENV, retry_in=-30)], set(), None),
    ("refused, of an old version: deleted, not retried", [refusal(1, "X", "x", ENV, v=0, retry_in=40)], set(), None),
    (
        "shutting down, instance terminated by the run: seen gone next",
        [replica(0), replica(1, S.SHUTTING_DOWN)],
        {0, 1},
        0,
    ),
    ("shutting down, instance unseen: its grace ends", [replica(1, S.SHUTTING_DOWN, launched_at=ago(100))], set(), 200),
    ("shutting down, grace over", [replica(1, S.SHUTTING_DOWN, launched_at=ago(900))], set(), None),
    ("failed, kept for the breaker, instance gone", [replica(0), replica(1, S.FAILED_PROBING)], {0}, None),
    ("draining and staying", [replica(0, S.READY, balancer=BalancerState.DRAINING)], {0}, 10),
    ("warned of a spot interruption: its drain deadline", [warned(0, InterruptionKind.SPOT_INTERRUPTION, 5)], {0}, 70),
    ("spot deadline passed: the plan drained it", [warned(0, InterruptionKind.SPOT_INTERRUPTION, 100)], {0}, None),
    ("rebalance recommendation: no deadline", [warned(0, InterruptionKind.REBALANCE, 5)], {0}, None),
]


@pytest.mark.parametrize(("replicas", "live", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_next_reconcile(replicas: list[ReplicaRecord], live: set[int], expected: float | None) -> None:
    moment = next_reconcile(state(replicas, [version(1, spec=SPEC)]), live, NOW, POLICY)
    assert moment == (None if expected is None else at(expected))


def test_a_deleting_service_is_polled_until_its_item_goes() -> None:
    deleting = state([replica(0, S.SHUTTING_DOWN)], lifecycle=Lifecycle.DELETING)
    assert next_reconcile(deleting, {0}, NOW, POLICY) == at(10)
    assert next_reconcile(state([], lifecycle=Lifecycle.DELETING), set(), NOW, POLICY) == at(10)


def test_a_replica_whose_long_probe_had_no_verdict_is_judged_by_a_run_of_its_own() -> None:
    steady = state([replica(0), replica(1)], [version(1)])
    assert next_reconcile(steady, {0, 1}, NOW, POLICY) is None
    assert next_reconcile(steady, {0, 1}, NOW, POLICY, unjudged={1}) == at(10)
    leaving = state([replica(0), replica(1, S.SHUTTING_DOWN)], [version(1)])
    assert next_reconcile(leaving, set(), NOW, POLICY, unjudged={1}) is None  # leaving: nothing to judge


def test_the_interval_is_the_policys() -> None:
    booting = state([replica(0, S.PROVISIONING, launched_at=ago(5))])
    assert next_reconcile(booting, {0}, NOW, Policy(follow_up_interval=timedelta(seconds=3))) == at(3)


# (case, moment from NOW (None: none), pending (from NOW; None: none ever), running, expected)
DECISIONS: list[tuple[str, float | None, float | None, float | None, FollowUp | None]] = [
    ("steady: nothing", None, None, None, None),
    ("steady with an old due time: nothing written", None, -600, None, None),
    ("first follow-up", 10, None, None, FollowUp(10, EPOCH + 10, None)),
    ("due at once: not before the minimum gap", -3, None, None, FollowUp(5, EPOCH + 5, None)),
    ("further than SQS delays: left to the schedule", MAX_DELAY_SECONDS + 1, None, None, None),
    ("at SQS's longest delay", MAX_DELAY_SECONDS, None, None, FollowUp(900, EPOCH + 900, None)),
    ("pending, earlier: coalesced", 30, 10, None, None),
    ("pending, a little later: coalesced", 10, 14, None, None),
    ("pending, much later: replaced by an earlier one", 10, 300, None, FollowUp(10, EPOCH + 10, EPOCH + 300)),
    ("pending in the past (lost, or this run): a new one", 10, -20, None, FollowUp(10, EPOCH + 10, EPOCH - 20)),
    ("pending is now: the follow-up running", 10, 0, None, FollowUp(10, EPOCH + 10, EPOCH)),
    ("this run is the pending one, delivered early", 10, 2, 2, FollowUp(10, EPOCH + 10, EPOCH + 2)),
]


@pytest.mark.parametrize(
    ("moment", "pending", "running", "expected"), [d[1:] for d in DECISIONS], ids=[d[0] for d in DECISIONS]
)
def test_follow_up_decision(
    moment: float | None, pending: float | None, running: float | None, expected: FollowUp | None
) -> None:
    def epoch(seconds: float | None) -> int | None:
        return None if seconds is None else EPOCH + int(seconds)

    when = None if moment is None else NOW + timedelta(seconds=moment)
    assert follow_up(when, epoch(pending), NOW, POLICY, running=epoch(running)) == expected


def test_a_fraction_of_a_second_rounds_the_delay_up() -> None:
    now = NOW + timedelta(milliseconds=300)
    assert follow_up(NOW + timedelta(seconds=10), None, now, POLICY) == FollowUp(10, EPOCH + 10, None)


def _balanced(replicas: list[ReplicaRecord], drain_seconds: int = 30) -> ServiceState:
    plain = state(replicas)
    config = EndpointConfig(port=8080, policy="round_robin", drain_seconds=drain_seconds, health_path="/health")
    endpoint = EndpointRecord(url="http://svc.example", config=config, target_group="tg", route="r")
    return replace(plain, service=replace(plain.service, endpoint=endpoint))


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (replica(0, S.NOT_READY, balancer=BalancerState.DRAINING, drain_started_at=ago(25)), 6),
        (replica(0, S.SHUTTING_DOWN, balancer=BalancerState.DRAINING, drain_started_at=ago(28)), 3),
        (replica(0, S.SHUTTING_DOWN, balancer=BalancerState.DRAINING, drain_started_at=ago(5)), 10),
        (replica(0, S.SHUTTING_DOWN, balancer=BalancerState.DRAINING, drain_started_at=ago(40)), 0),
    ],
    ids=[
        "drained and staying",
        "leaving, its drain about to end",
        "leaving, drain far off: polled",
        "leaving, drain over: terminated by the run",
    ],
)
def test_a_drain_ends_at_the_endpoints_drain_time(record: ReplicaRecord, expected: float) -> None:
    assert next_reconcile(_balanced([record]), {0}, NOW, POLICY) == at(expected)
