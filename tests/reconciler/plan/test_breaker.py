"""Table tests of plan/breaker.py: when a target version that never became READY has failed (which
failures count, by their cause), and which version the service rolls back to.

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetkeeper.model import FailureCause, ReplicaRecord, ReplicaStatus, ServiceStatus, VersionState
from fleetkeeper.reconciler.plan import INITIAL_DELAY_EXCEEDED, DeleteReplica, RecordStatus, TripBreaker, plan
from tests.support.builders import (
    DOWN,
    NOW,
    OK,
    READY,
    C,
    S,
    ago,
    became_ready,
    drained,
    instance,
    launches,
    mark_ready,
    moved,
    refusal,
    replica,
    spec,
    state,
    status,
    terminate,
    version,
)


def test_failures_of_an_undecided_target_are_kept_for_the_breaker() -> None:
    failed = replica(0, S.FAILED_PROBING)
    current = state([failed, replica(1, S.STARTING, launched_at=ago(60))])
    assert plan(current, [instance(1)], {}, NOW) == [
        *launches(1, 2),
        status(
            ServiceStatus.REPLICA_INIT, "0/2 ready; replica 0 FAILED_PROBING; replica 1 STARTING; replica 2 PENDING"
        ),
    ]


def test_breaker_rolls_back_to_the_last_ready_version() -> None:
    versions = [version(1, READY), version(2)]
    failing = [replica(2, S.FAILED_INITIAL_DELAY, v=2), replica(3, S.FAILED_PROBING, v=2)]
    bad_image = refusal(4, "InvalidAMIID.NotFound", "x", C.VERSION, v=2)
    current = state([replica(0), replica(1), *failing, bad_image], versions, target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        TripBreaker(
            2,
            "version 2 failed: 3 replica failures before any became ready; "
            "last: replica 4 FAILED_PROVISION: InvalidAMIID.NotFound: x",
            rollback_to=1,
        )
    ]


def test_breaker_without_a_good_version_fails_the_service_and_stops_launching() -> None:
    failing = [replica(i, S.FAILED_INITIAL_DELAY) for i in range(3)]
    assert plan(state(failing), [], {}, NOW) == [
        TripBreaker(
            1,
            "version 1 failed: 3 replica failures before any became ready; last: replica 2 FAILED_INITIAL_DELAY",
            rollback_to=None,
        )
    ]
    # the next run sees the version FAILED: no launches, status FAILED, what is left drained, the
    # failures cleaned up
    failed = version(1, VersionState.FAILED, state_message="version 1 failed: 3 replica failures")
    starting = replica(3, S.STARTING, launched_at=ago(60))
    assert plan(state([*failing, starting], [failed]), [instance(3)], {3: DOWN}, NOW) == [
        drained(starting, "version 1 FAILED"),
        terminate(("i-3", "replica 3: version 1 FAILED")),
        *(DeleteReplica(record) for record in failing),
        status(
            ServiceStatus.FAILED,
            "version 1 failed: 3 replica failures; no earlier version was ever READY: "
            "launching stopped until the service is updated",
        ),
    ]


def test_a_failure_in_this_run_that_trips_the_breaker_still_loses_its_instance() -> None:
    failed = [replica(i, S.FAILED_PROBING) for i in range(2)]
    slow = replica(2, S.STARTING, launched_at=ago(700))
    message = "not ready 600s after launch (last probe GET /health → connection refused)"
    assert plan(state([*failed, slow]), [instance(2)], {2: DOWN}, NOW) == [
        moved(
            slow,
            status=S.FAILED_INITIAL_DELAY,
            status_message=message,
            failure_code=INITIAL_DELAY_EXCEEDED,
            cause=C.VERSION,
        ),
        TripBreaker(
            1,
            "version 1 failed: 3 replica failures before any became ready; "
            f"last: replica 2 FAILED_INITIAL_DELAY: {message}",
            rollback_to=None,
        ),
        terminate(("i-2", "replica 2: FAILED_INITIAL_DELAY")),
    ]


def test_a_version_that_was_ready_never_trips_the_breaker() -> None:
    failing = [replica(i, S.PREEMPTED) for i in range(3)]
    current = state([*failing, replica(3)], [version(1, READY, spec=spec(1))])
    assert plan(current, [instance(3)], {3: OK}, NOW) == [
        *(DeleteReplica(record) for record in failing),
        status(ServiceStatus.READY, "1/1 ready"),
    ]


# Three failed replicas of a NEW target: does their cause trip the breaker? The messages say the
# opposite of the cause on purpose: the breaker reads the typed cause, never the text.
_SPOT_TEXT = "instance i-{} is terminated: spot instance reclaimed by AWS"


_CRASH_TEXT = "instance i-{} is terminated: terminated outside fleetkeeper"


@pytest.mark.parametrize(
    ("status_of", "cause", "text", "trips"),
    [
        (S.PREEMPTED, C.VERSION, _SPOT_TEXT, True),
        (S.PREEMPTED, C.SPOT_RECLAIM, _CRASH_TEXT, False),
        (S.PREEMPTED, C.ENVIRONMENT, _CRASH_TEXT, False),
        (S.PREEMPTED, C.UNRECORDED, _CRASH_TEXT, False),
        (S.FAILED_PROVISION, C.VERSION, "InsufficientInstanceCapacity: x{}", True),
        (S.FAILED_PROVISION, C.ENVIRONMENT, "InvalidAMIID.NotFound: x{}", False),
        (S.FAILED_PROVISION, C.UNRECORDED, "InvalidAMIID.NotFound: x{}", False),
    ],
)
def test_the_breaker_counts_failures_by_their_cause(
    status_of: ReplicaStatus, cause: FailureCause, text: str, trips: bool
) -> None:
    failed = [
        replica(
            i,
            status_of,
            status_message=text.format(i),
            failure_code="some-code",
            cause=cause,
            launch_attempts=1 if status_of is S.FAILED_PROVISION else 0,
            # The typed count of refusals that were the version's goes with the cause.
            version_refusals=1 if status_of is S.FAILED_PROVISION and cause is C.VERSION else 0,
            next_attempt_at=ago(-60) if status_of is S.FAILED_PROVISION else None,
        )
        for i in range(3)
    ]
    actions = plan(state(failed, [version(1, spec=spec(3))]), [], {}, NOW)
    if trips:
        last = f"replica 2 {status_of.value}: {text.format(2)}"
        assert actions == [
            TripBreaker(
                1,
                f"version 1 failed: 3 replica failures before any became ready; last: {last}",
                rollback_to=None,
            )
        ]
    elif status_of is S.PREEMPTED:
        # Replaced, and kept for the breaker while the version is undecided.
        assert actions == [
            *launches(1, 3, 4, 5),
            status(
                ServiceStatus.REPLICA_INIT,
                f"0/3 ready; replica 0 PREEMPTED: {text.format(0)}; replica 1 PREEMPTED: {text.format(1)}; "
                f"replica 2 PREEMPTED: {text.format(2)}; and 3 more",
            ),
        ]
    else:
        # Retried in place after the backoff: nothing to launch yet, no more claims.
        assert actions == [
            status(
                ServiceStatus.REPLICA_INIT,
                f"0/3 ready; replica 0 FAILED_PROVISION: {text.format(0)}; "
                f"replica 1 FAILED_PROVISION: {text.format(1)}; replica 2 FAILED_PROVISION: {text.format(2)}",
            )
        ]


def test_the_breaker_rolls_back_to_the_version_still_serving_else_the_newest_ready_one() -> None:
    failing = [replica(i, S.FAILED_PROBING, v=3) for i in (3, 4, 5)]
    message = "version 3 failed: 3 replica failures before any became ready; last: replica 5 FAILED_PROBING"
    # rolled back from v2 to v1, then updated to v3: v1 serves, a v2 replica is still booting
    versions = [version(1, READY), version(2, READY), version(3)]
    booting = replica(1, S.STARTING, v=2, launched_at=ago(60))
    current = state([replica(0), booting, *failing], versions, target=3)
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW) == [TripBreaker(3, message, rollback_to=1)]
    # nothing serves: the newest READY version, never a FAILED or the target one
    versions = [version(1, READY), version(2, VersionState.FAILED), version(3)]
    assert plan(state(failing, versions, target=3), [], {}, NOW) == [TripBreaker(3, message, rollback_to=1)]


def test_the_breaker_rolls_back_to_a_version_that_became_ready_in_the_same_run() -> None:
    starting = replica(0, S.STARTING, launched_at=ago(60))
    failing = [replica(i, S.FAILED_PROBING, v=2) for i in (1, 2, 3)]
    current = state([starting, *failing], [version(1), version(2)], target=2)
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        became_ready(starting),
        mark_ready(1),
        TripBreaker(
            2,
            "version 2 failed: 3 replica failures before any became ready; last: replica 3 FAILED_PROBING",
            rollback_to=1,
        ),
    ]


def test_the_breaker_names_the_failure_of_this_run_before_more_recent_records() -> None:
    failed = [replace(replica(i, S.FAILED_PROBING), updated_at=ago(10)) for i in (1, 2)]
    slow = replica(0, S.STARTING, launched_at=ago(700))
    message = "not ready 600s after launch (last probe GET /health → connection refused)"
    assert plan(state([slow, *failed]), [instance(0)], {0: DOWN}, NOW) == [
        moved(
            slow,
            status=S.FAILED_INITIAL_DELAY,
            status_message=message,
            failure_code=INITIAL_DELAY_EXCEEDED,
            cause=C.VERSION,
        ),
        TripBreaker(
            1,
            "version 1 failed: 3 replica failures before any became ready; "
            f"last: replica 0 FAILED_INITIAL_DELAY: {message}",
            rollback_to=None,
        ),
        terminate(("i-0", "replica 0: FAILED_INITIAL_DELAY")),
    ]


def test_a_failed_target_with_a_ready_version_says_to_roll_back() -> None:
    failed = version(2, VersionState.FAILED, state_message="version 2 failed: 3 replica failures")
    current = state([replica(0), replica(1)], [version(1, READY), failed], target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        status(
            ServiceStatus.FAILED,
            "version 2 failed: 3 replica failures: launching stopped; "
            "update the service or roll back to a READY version",
        ),
    ]


# Guards a regression found by review (commit 5faa8d0): the breaker rolled back to another READY version
# than the one that was serving.
def test_the_breaker_rolls_back_to_the_version_that_was_serving() -> None:
    # v1 and v2 were both READY; the user rolled back to v1, then v3 fails: back to v1, not v2.
    fails = [replica(i, S.FAILED_INITIAL_DELAY, v=3) for i in (2, 3, 4)]
    current = state(
        [replica(0, v=1), replica(1, v=1), *fails],
        [version(1, VersionState.READY), version(2, VersionState.READY), version(3)],
        target=3,
    )
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        TripBreaker(
            3,
            "version 3 failed: 3 replica failures before any became ready; last: replica 4 FAILED_INITIAL_DELAY",
            rollback_to=1,
        )
    ]


# Guards a regression found by review (commit 85bc229): spot reclaims tripped the breaker as failures of
# the version.
def test_spot_reclaims_do_not_trip_the_breaker_but_crashes_outside_spot_do() -> None:
    def preempted(rid: int, code: str, cause: FailureCause) -> ReplicaRecord:
        message = f"instance i-{rid} is terminated ({code}): why"
        return replica(rid, S.PREEMPTED, status_message=message, failure_code=code, cause=cause)

    reclaimed = [preempted(i, "Server.SpotInstanceTermination", FailureCause.SPOT_RECLAIM) for i in (0, 1, 2)]
    assert plan(state(reclaimed), [], {}, NOW) == [
        *launches(1, 3, 4),
        RecordStatus(
            ServiceStatus.REPLICA_INIT,
            "0/2 ready; "
            + "; ".join(f"replica {i} PREEMPTED: {reclaimed[i].status_message}" for i in (0, 1, 2))
            + "; and 2 more",
            1,
        ),
    ]
    killed = [preempted(i, "Client.UserInitiatedShutdown", FailureCause.VERSION) for i in (0, 1, 2)]
    assert plan(state(killed), [], {}, NOW) == [
        TripBreaker(
            1,
            "version 1 failed: 3 replica failures before any became ready; "
            f"last: replica 2 PREEMPTED: {killed[2].status_message}",
            rollback_to=None,
        )
    ]
