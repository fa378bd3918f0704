"""A replica whose boot failed for the environment (IAM had not propagated its role, or its secrets
parameter failed verification) says so on its port (reconciler/replica_boot.py); the probe carries
the typed code (ProbeResult.boot_failure) and the planner fails the replica as the environment's:
replaced, never counted by the circuit breaker, its event carrying the code."""

from __future__ import annotations

import pytest

from fleetkeeper.model import FailureCause, ReplicaStatus
from fleetkeeper.reconciler.plan import INITIAL_DELAY_EXCEEDED, ProbeResult, RecordReplica, TripBreaker, plan
from fleetkeeper.reconciler.plan.failures import BOOT_FAILURES
from fleetkeeper.service_events import EventType, replica_changed
from tests.support.builders import NOW, ago, instance, replica, spec, state, version

S = ReplicaStatus
SECRETS_REJECTED = "Fleetkeeper.SecretsParameterRejected"
IDENTITY_NOT_READY = "Fleetkeeper.BootIdentityNotReady"


def reported(code: str) -> ProbeResult:
    return ProbeResult("http://127.0.0.1:8080", False, f"HTTP 503 (boot failed: {code})", code)


def test_the_boot_and_the_planner_know_the_same_codes() -> None:
    from fleetkeeper.reconciler import replica_boot

    assert set(BOOT_FAILURES) == {replica_boot.IDENTITY_NOT_READY, replica_boot.SECRETS_REJECTED}


@pytest.mark.parametrize("code", [IDENTITY_NOT_READY, SECRETS_REJECTED])
def test_a_reported_boot_failure_is_the_environments_at_once(code: str) -> None:
    starting = replica(0, S.STARTING, launched_at=ago(60))  # well inside its 600 s initial delay
    actions = plan(state([starting], [version(1, spec=spec(1))]), [instance(0)], {0: reported(code)}, NOW)
    [write] = [a for a in actions if isinstance(a, RecordReplica) and a.before.replica_id == 0]
    after = write.after
    assert (after.status, after.failure_code, after.cause) == (S.FAILED_INITIAL_DELAY, code, FailureCause.ENVIRONMENT)
    assert after.status_message == f"the replica never started: {BOOT_FAILURES[code]}"
    [event] = replica_changed(starting, after)
    assert (event.type, event.code) == (EventType.WARNING, code)
    if code == SECRETS_REJECTED:
        assert "secrets parameter failed verification" in event.message  # loud: the event says so


def test_reported_boot_failures_never_trip_the_breaker_where_silent_ones_do() -> None:
    three = spec(3)
    booting = [replica(i, S.STARTING, launched_at=ago(700)) for i in range(3)]  # past the 600 s delay
    instances = [instance(i) for i in range(3)]
    told = plan(
        state(booting, [version(1, spec=three)]), instances, {i: reported(SECRETS_REJECTED) for i in range(3)}, NOW
    )
    assert not any(isinstance(a, TripBreaker) for a in told)
    failed = [a.after for a in told if isinstance(a, RecordReplica)]
    assert [r.cause for r in failed] == [FailureCause.ENVIRONMENT] * 3
    # The same replicas with nothing reported: the version's failures, and the breaker trips.
    silent = ProbeResult("http://127.0.0.1:8080", False, "connection refused")
    untold = plan(state(booting, [version(1, spec=three)]), instances, dict.fromkeys(range(3), silent), NOW)
    assert any(isinstance(a, TripBreaker) for a in untold)
    assert {a.after.failure_code for a in untold if isinstance(a, RecordReplica)} == {INITIAL_DELAY_EXCEEDED}


def test_a_ready_replica_answering_the_header_is_not_a_boot_failure() -> None:
    """Only a booting replica's report counts: a READY one that answers 503 with the header (its app
    could) is a failed probe like any other."""
    ready = replica(0, S.READY)
    actions = plan(state([ready], [version(1, spec=spec(1))]), [instance(0)], {0: reported(IDENTITY_NOT_READY)}, NOW)
    [write] = [a for a in actions if isinstance(a, RecordReplica)]
    assert (write.after.status, write.after.cause) == (S.NOT_READY, None)
