"""Table tests of plan/failures.py: whose fault a failure is, from its code alone. An ended instance,
from its state reason code, as the plan records it (each of those cases asserts the WHOLE action
list `plan` returns, the expected records built from the inputs with `replace`: builders in
tests/support/builders.py); and a boot failure the replica reports on its port."""

from __future__ import annotations

import pytest

from fleetkeeper.model import FailureCause, ServiceStatus
from fleetkeeper.reconciler.driver import InstanceState
from fleetkeeper.reconciler.plan import INITIAL_DELAY_EXCEEDED, ProbeResult, RecordReplica, TripBreaker, plan
from fleetkeeper.reconciler.plan.failures import BOOT_FAILURES
from fleetkeeper.service_events import EventType, replica_changed
from tests.support.builders import (
    NOW,
    OK,
    C,
    S,
    ago,
    instance,
    launches,
    mark_ready,
    moved,
    replica,
    spec,
    state,
    status,
    version,
)

# Why an instance ended, as EC2 (or a driver) reports it, and what the planner makes of it.
_ENDINGS = [
    # Only the state reason makes a spot reclaim; `spot` alone does not.
    ("Server.SpotInstanceTermination", True, C.SPOT_RECLAIM, "spot instance reclaimed by AWS"),
    ("Client.UserInitiatedShutdown", True, C.VERSION, "terminated outside fleetkeeper"),
    # AWS-side ends are the environment's.
    ("Server.InternalError", False, C.ENVIRONMENT, "terminated outside fleetkeeper"),
    ("Server.ScheduledStop", False, C.ENVIRONMENT, "terminated outside fleetkeeper"),
    # Shut down from inside the instance, or through the API by someone: the version's.
    ("Client.InstanceInitiatedShutdown", False, C.VERSION, "terminated outside fleetkeeper"),
    ("Client.UserInitiatedShutdown", False, C.VERSION, "terminated outside fleetkeeper"),
    # Ended during launch for the account's reasons (a customer managed EBS key the role may not
    # use: pending -> terminated; the volume quota): the environment's, with what to fix.
    ("Client.InternalError", False, C.ENVIRONMENT, "the reconciler's role needs that key: the stack's EbsKmsKeyArn"),
    ("Client.VolumeLimitExceeded", False, C.ENVIRONMENT, "EBS volume or storage quota"),
]


@pytest.mark.parametrize(("code", "spot", "cause", "told"), _ENDINGS)
def test_an_instance_that_ended_is_preempted_with_its_state_reason_code_and_cause(
    code: str, spot: bool, cause: FailureCause, told: str
) -> None:
    gone = instance(0, InstanceState.TERMINATED, spot=spot, state_reason_code=code, state_reason=f"{code}: why")
    ready = replica(0)
    actions = plan(state([ready, replica(1)]), [gone, instance(1)], {1: OK}, NOW)
    # The message: what EC2 said, then (for people) what it means, which `told` is part of.
    said = f"instance i-0 is terminated ({code}: why): "
    message = next(
        (a.after.status_message or "" for a in actions if isinstance(a, RecordReplica) and a.after.replica_id == 0),
        "",
    )
    assert message.startswith(said) and told in message, message
    assert actions == [
        moved(ready, status=S.PREEMPTED, status_message=message, failure_code=code, cause=cause),
        mark_ready(1),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 PREEMPTED: {message}; replica 2 PENDING"),
    ]


def test_a_replica_whose_app_exited_by_itself_is_failed_not_preempted() -> None:
    # The process driver's code: the replica's process ended on its own (the app crashed or its run
    # returned). A FAILED replica of the version's fault (counted by the breaker), never PREEMPTED.
    code = "Fleetkeeper.ProcessExited"
    reason = f"{code}: the replica process exited with code 1"
    gone = instance(0, InstanceState.TERMINATED, state_reason_code=code, state_reason=reason)
    ready = replica(0)
    actions = plan(state([ready, replica(1)]), [gone, instance(1)], {1: OK}, NOW)
    message = f"the replica's app ended by itself ({reason})"
    assert actions == [
        moved(ready, status=S.FAILED, status_message=message, failure_code=code, cause=C.VERSION),
        mark_ready(1),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 FAILED: {message}; replica 2 PENDING"),
    ]


# --- boot failures: the environment's, reported on the replica's port ------------------------------
# A replica whose boot failed for the environment (IAM had not propagated its role, or its secrets
# parameter failed verification) says so on its port (reconciler/replica_boot.py); the probe carries
# the typed code (ProbeResult.boot_failure) and the planner fails the replica as the environment's:
# replaced, never counted by the circuit breaker, its event carrying the code.

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
