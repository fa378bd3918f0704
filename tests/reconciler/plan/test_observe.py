"""Table tests of plan/observe.py: what each replica is now, from what was observed. The probe's verdict
and its window, the initial delay, a missing or lost instance, adoption of an unrecorded launch, the
duplicates no replica owns, a target version not visible yet, and which instances are fleetkeeper's
(`launched_by_fleetkeeper`: its ClientToken).

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.model import FailureCause, ReplicaStatus, ServiceStatus
from fleetkeeper.reconciler.driver import InstanceState, client_token
from fleetkeeper.reconciler.plan import (
    INITIAL_DELAY_EXCEEDED,
    INSTANCE_LOST,
    PROBE_FAILED,
    Action,
    Launch,
    ProbeResult,
    RecordReplica,
    RecordStatus,
    plan,
    plan_orphans,
)
from fleetkeeper.spec.service import ServiceSpec
from tests.support.builders import (
    DOWN,
    NOW,
    OK,
    READY,
    STAMP,
    UID,
    C,
    S,
    ago,
    became_ready,
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
from tests.support.specs import hello_spec

# --- replica transitions: the probe's verdict, its window, the initial delay ----------------------


@pytest.mark.parametrize(
    ("before", "inst_state", "probe", "changes", "next_status"),
    [
        (
            S.PROVISIONING,
            InstanceState.PENDING,
            None,
            None,
            (ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 PROVISIONING"),
        ),
        (
            S.PROVISIONING,
            InstanceState.RUNNING,
            None,
            {"status": S.STARTING, "probing_since": STAMP},
            (ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 STARTING"),
        ),
        (S.PROVISIONING, InstanceState.RUNNING, OK, "ready", (ServiceStatus.READY, "1/1 ready")),
        (
            S.STARTING,
            InstanceState.RUNNING,
            DOWN,
            {"status_message": "not ready yet: probe GET /health → connection refused"},
            (
                ServiceStatus.REPLICA_INIT,
                "0/1 ready; replica 0 STARTING: not ready yet: probe GET /health → connection refused",
            ),
        ),
        (S.STARTING, InstanceState.RUNNING, OK, "ready", (ServiceStatus.READY, "1/1 ready")),
        (
            S.READY,
            InstanceState.RUNNING,
            DOWN,
            {
                "status": S.NOT_READY,
                "probe_failures": 1,
                "failing_since": STAMP,
                "status_message": "readiness probe failing: connection refused",
            },
            (ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 NOT_READY: readiness probe failing: connection refused"),
        ),
        (S.NOT_READY, InstanceState.RUNNING, OK, "ready", (ServiceStatus.READY, "1/1 ready")),
        (
            S.READY,
            InstanceState.STOPPED,
            None,
            {
                "status": S.NOT_READY,
                "probe_failures": 1,
                "failing_since": STAMP,
                "status_message": "readiness probe failing: instance is stopped",
            },
            (
                ServiceStatus.REPLICA_INIT,
                "0/1 ready; replica 0 NOT_READY: readiness probe failing: instance is stopped",
            ),
        ),
    ],
)
def test_replica_transitions(
    before: ReplicaStatus,
    inst_state: InstanceState,
    probe: ProbeResult | None,
    changes: dict[str, Any] | str | None,
    next_status: tuple[ServiceStatus, str],
) -> None:
    old = replica(0, before, probe_failures=1 if before is S.NOT_READY else 0, launched_at=ago(60))
    probes = {0: probe} if probe else {}
    actions = plan(state([old], [version(1, spec=spec(1))]), [instance(0, inst_state)], probes, NOW)
    expected: list[Action] = []
    if changes == "ready":
        provisioned = {"probing_since": STAMP} if before is S.PROVISIONING else {}
        expected = [became_ready(old, **provisioned), mark_ready(1)]
    elif isinstance(changes, dict):
        expected = [moved(old, **changes)]
    assert actions == [*expected, status(*next_status)]


def test_more_transitions() -> None:
    """One replica of a one-replica service (ready or not) per case, with the whole plan."""
    one = [version(1, spec=spec(1))]
    # booting, first failed probe: STARTING with the probe's detail
    provisioning = replica(0, S.PROVISIONING, launched_at=ago(60))
    assert plan(state([provisioning], one), [instance(0)], {0: DOWN}, NOW) == [
        moved(
            provisioning,
            status=S.STARTING,
            probing_since=STAMP,
            status_message="not ready yet: probe GET /health → connection refused",
        ),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/1 ready; replica 0 STARTING: not ready yet: probe GET /health → connection refused",
        ),
    ]
    # back to READY: the failure message goes
    failing = replica(0, S.NOT_READY, probe_failures=1, status_message="readiness probe failing: x")
    assert plan(state([failing], one), [instance(0)], {0: OK}, NOW) == [
        became_ready(failing),
        mark_ready(1),
        status(ServiceStatus.READY, "1/1 ready"),
    ]
    # the probe found the replica at another address
    starting = replica(0, S.STARTING, launched_at=ago(60))
    moved_probe = ProbeResult("http://10.0.0.9:8080", True, "HTTP 200")
    assert plan(state([starting], one), [instance(0)], {0: moved_probe}, NOW) == [
        moved(
            starting,
            url="http://10.0.0.9:8080",
            status=S.READY,
            status_message="",
            ready_at=STAMP,
            last_probe_ok_at=STAMP,
            probe_failures=0,
        ),
        mark_ready(1),
        status(ServiceStatus.READY, "1/1 ready"),
    ]
    # an instance pending again (stopped and started) within the initial delay: left as it is
    assert plan(state([starting], one), [instance(0, InstanceState.PENDING)], {}, NOW) == [
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 STARTING"),
    ]


def test_not_ready_for_the_whole_window_fails_probing_and_is_replaced() -> None:
    # SkyPilot's window: 180 s of consecutive failed probes, from the first to this one.
    failing = replica(0, S.NOT_READY, probe_failures=18, failing_since=ago(180))
    actions = plan(state([failing, replica(1)]), [instance(0), instance(1)], {0: DOWN, 1: OK}, NOW)
    message = "readiness probe failed for 180s (19 probes in a row; the window is 180s): connection refused"
    assert actions == [
        moved(
            failing,
            status=S.FAILED_PROBING,
            probe_failures=19,
            status_message=message,
            failure_code=PROBE_FAILED,
            cause=C.VERSION,
        ),
        mark_ready(1),
        terminate(("i-0", "replica 0: FAILED_PROBING")),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 FAILED_PROBING: {message}; replica 2 PENDING"),
    ]


def test_not_ready_within_the_window_keeps_its_instance_however_many_probes_failed() -> None:
    # The old rule replaced a replica after 3 failed probes (20-30 s); SkyPilot waits for the window.
    failing = replica(0, S.NOT_READY, probe_failures=17, failing_since=ago(179))
    actions = plan(state([failing, replica(1)]), [instance(0), instance(1)], {0: DOWN, 1: OK}, NOW)
    assert actions == [
        moved(failing, probe_failures=18, status_message="readiness probe failing: connection refused"),
        mark_ready(1),
        status(ServiceStatus.READY, "1/2 ready; replica 0 NOT_READY: readiness probe failing: connection refused"),
    ]


@pytest.mark.parametrize(("window", "failing_for", "fails"), [(30, 29, False), (30, 30, True), (0, 0, True)])
def test_the_window_is_the_probes_consecutive_failure_threshold_timeout(
    window: int, failing_for: int, fails: bool
) -> None:
    data = hello_spec()
    data["service"] = {
        "replicas": 1,
        "readiness_probe": {"path": "/health", "consecutive_failure_threshold_timeout": window},
    }
    one = [version(1, spec=ServiceSpec.model_validate(data))]
    before = replica(
        0, S.READY if failing_for == 0 else S.NOT_READY, failing_since=ago(failing_for) if failing_for else None
    )
    (first, *_) = plan(state([before], one), [instance(0)], {0: DOWN}, NOW)
    assert isinstance(first, RecordReplica)
    assert first.after.status is (S.FAILED_PROBING if fails else S.NOT_READY)
    assert first.after.failing_since == (before.failing_since or STAMP)


def test_a_long_verdict_is_judged_when_it_was_asked_for() -> None:
    # A long probe sent 90 s before its plan ran (the run's second pass): its window counts to then.
    failing = replica(0, S.NOT_READY, probe_failures=5, failing_since=ago(200))
    asked = NOW - timedelta(seconds=90)
    late = replace(DOWN, started_at=asked)
    (first, *_) = plan(state([failing, replica(1)]), [instance(0), instance(1)], {0: late, 1: OK}, NOW)
    assert isinstance(first, RecordReplica) and first.after.status is S.NOT_READY  # 110 s of failures


def test_a_probe_still_in_flight_is_no_verdict() -> None:
    # Not answered when its run had no more time: nothing is judged (a READY replica stays READY).
    flying = replace(DOWN, answered=False)
    assert plan(state([replica(0), replica(1)]), [instance(0), instance(1)], {0: flying, 1: OK}, NOW) == [
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_starting_past_the_initial_delay_fails_and_is_replaced() -> None:
    slow = replica(0, S.STARTING, launched_at=ago(601))
    actions = plan(state([slow, replica(1)]), [instance(0), instance(1)], {0: DOWN, 1: OK}, NOW)
    message = "not ready 600s after launch (last probe GET /health → connection refused)"
    assert actions == [
        moved(
            slow,
            status=S.FAILED_INITIAL_DELAY,
            status_message=message,
            failure_code=INITIAL_DELAY_EXCEEDED,
            cause=C.VERSION,
        ),
        mark_ready(1),
        terminate(("i-0", "replica 0: FAILED_INITIAL_DELAY")),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 FAILED_INITIAL_DELAY: {message}; replica 2 PENDING"),
    ]


@pytest.mark.parametrize(
    ("before", "inst_state", "detail"),
    [
        (S.PROVISIONING, InstanceState.PENDING, "instance still pending"),
        # A probe that may still be in flight is given its timeout (15 s) and a minute more.
        (S.STARTING, InstanceState.RUNNING, "never answered a readiness probe"),
    ],
)
def test_past_the_initial_delay_without_a_verdict_fails(
    before: ReplicaStatus, inst_state: InstanceState, detail: str
) -> None:
    slow = replica(0, before, launched_at=ago(601 if before is S.PROVISIONING else 676))
    message = f"not ready 600s after launch ({detail})"
    assert plan(state([slow], [version(1, spec=spec(1))]), [instance(0, inst_state)], {}, NOW) == [
        moved(
            slow,
            status=S.FAILED_INITIAL_DELAY,
            status_message=message,
            failure_code=INITIAL_DELAY_EXCEEDED,
            cause=C.VERSION,
        ),
        terminate(("i-0", "replica 0: FAILED_INITIAL_DELAY")),
        *launches(1, 1),
        status(ServiceStatus.REPLICA_INIT, f"0/1 ready; replica 0 FAILED_INITIAL_DELAY: {message}; replica 1 PENDING"),
    ]


def test_a_replica_not_ready_exactly_at_its_initial_delay_still_has_time() -> None:
    starting = replica(0, S.STARTING, launched_at=ago(600))
    current = state([starting], [version(1, spec=spec(1))])
    assert plan(current, [instance(0)], {0: DOWN}, NOW) == [
        moved(starting, status_message="not ready yet: probe GET /health → connection refused"),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/1 ready; replica 0 STARTING: not ready yet: probe GET /health → connection refused",
        ),
    ]


def test_initial_delay_zero_and_a_long_probe_never_fail_a_replica_while_its_first_probe_is_in_flight() -> None:
    # Issue 35: "never answered a readiness probe, 0s after launch" while its first 60 s probe was in flight.
    data = hello_spec()
    data["service"] = {
        "replicas": 1,
        "readiness_probe": {"path": "/h", "initial_delay_seconds": 0, "timeout_seconds": 60},
    }
    one = [version(1, spec=ServiceSpec.model_validate(data))]
    provisioning = replica(0, S.PROVISIONING, launched_at=ago(300))
    # The run that sees it running: the delay starts now, whatever the launch's age; no verdict yet.
    (first, *_) = plan(state([provisioning], one), [instance(0)], {}, NOW)
    assert isinstance(first, RecordReplica)
    assert (first.after.status, first.after.probing_since) == (S.STARTING, STAMP)
    starting = first.after
    # Another run 30 s later, the probe still in flight: nothing judged.
    later = NOW + timedelta(seconds=30)
    assert [a for a in plan(state([starting], one), [instance(0)], {}, later) if isinstance(a, RecordReplica)] == []
    # The verdict, planned 60 s after it was asked for: judged at its asking, 0 s after provisioning.
    verdict = replace(DOWN, started_at=NOW)
    (record, *_) = plan(state([starting], one), [instance(0)], {0: verdict}, NOW + timedelta(seconds=60))
    assert isinstance(record, RecordReplica) and record.after.status is S.STARTING
    # The next probe, asked for 70 s after provisioning and failing: past the delay, as on SkyPilot.
    again = replace(DOWN, started_at=NOW + timedelta(seconds=70))
    (failed, *_) = plan(state([record.after], one), [instance(0)], {0: again}, NOW + timedelta(seconds=130))
    assert isinstance(failed, RecordReplica)
    assert (failed.after.status, failed.after.status_message) == (
        S.FAILED_INITIAL_DELAY,
        "not ready 0s after provisioning (last probe GET /h → connection refused)",
    )


NOT_FOUND = ProbeResult("http://127.0.0.1:8080", False, "HTTP 404", http_status=404)


UNAVAILABLE = ProbeResult("http://127.0.0.1:8080", False, "HTTP 503", http_status=503)


def test_a_probe_path_that_answers_404_fails_a_starting_replica_before_its_initial_delay() -> None:
    # The app listens and answers: the path is not its own, which the rest of a 600 s delay won't change.
    starting = replica(0, S.STARTING, launched_at=ago(60))
    first = plan(state([starting]), [instance(0)], {0: NOT_FOUND}, NOW)[0]
    assert first == moved(
        starting, status_message="not ready yet: probe GET /health → HTTP 404", probe_failures=1, failing_since=ago(0)
    )
    counted = replace(starting, status_message=first.after.status_message, probe_failures=2, failing_since=ago(30))
    failed = plan(state([counted]), [instance(0)], {0: NOT_FOUND}, NOW)[0]
    assert failed == moved(
        counted,
        status=S.FAILED_INITIAL_DELAY,
        probe_failures=3,
        status_message=(
            "probe GET /health → HTTP 404 for 30s (3 probes in a row): the app answers, but /health is not one of "
            "its paths; fix service.readiness_probe.path (or serve it)"
        ),
        failure_code=INITIAL_DELAY_EXCEEDED,
        cause=C.VERSION,
    )


@pytest.mark.parametrize(("probes", "lasted"), [(2, 30), (3, 29)])
def test_404s_fewer_or_shorter_than_the_rule_wait_as_any_unready_answer(probes: int, lasted: int) -> None:
    counted = replica(0, S.STARTING, launched_at=ago(60), probe_failures=probes - 1, failing_since=ago(lasted))
    [again, *_] = plan(state([counted]), [instance(0)], {0: NOT_FOUND}, NOW)
    assert again.after.status is S.STARTING and again.after.probe_failures == probes


def test_another_answer_starts_the_count_of_404s_again() -> None:
    # A 503 is an app still loading (SkyPilot's semantics: wait for the initial delay).
    counted = replica(0, S.STARTING, launched_at=ago(60), probe_failures=5, failing_since=ago(50))
    [reset, *_] = plan(state([counted]), [instance(0)], {0: UNAVAILABLE}, NOW)
    assert reset == moved(
        counted, status_message="not ready yet: probe GET /health → HTTP 503", probe_failures=0, failing_since=None
    )


# --- instances missing or lost --------------------------------------------------------------------


def test_an_instance_missing_right_after_launch_is_given_time() -> None:
    young = replica(0, S.PROVISIONING, launched_at=ago(10))
    assert plan(state([young, replica(1)]), [instance(1)], {1: OK}, NOW) == [
        mark_ready(1),
        status(ServiceStatus.READY, "1/2 ready; replica 0 PROVISIONING"),
    ]
    old = replica(0, S.PROVISIONING, launched_at=ago(400))
    message = "instance i-0 is gone: terminated outside fleetkeeper"
    assert plan(state([old, replica(1)]), [instance(1)], {1: OK}, NOW) == [
        moved(old, status=S.PREEMPTED, status_message=message, failure_code=INSTANCE_LOST, cause=C.VERSION),
        mark_ready(1),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 PREEMPTED: {message}; replica 2 PENDING"),
    ]


def test_a_missing_instance_is_lost_exactly_at_the_grace_period() -> None:
    old = replica(0, S.PROVISIONING, launched_at=ago(300))
    message = "instance i-0 is gone: terminated outside fleetkeeper"
    assert plan(state([old], [version(1, spec=spec(1))]), [], {}, NOW) == [
        moved(old, status=S.PREEMPTED, status_message=message, failure_code=INSTANCE_LOST, cause=C.VERSION),
        *launches(1, 1),
        status(ServiceStatus.REPLICA_INIT, f"0/1 ready; replica 0 PREEMPTED: {message}; replica 1 PENDING"),
    ]


def test_an_instance_that_ended_without_a_reason_is_lost() -> None:
    ready = replica(0)
    gone = instance(0, InstanceState.TERMINATED)
    message = "instance i-0 is terminated: terminated outside fleetkeeper"
    assert plan(state([ready], [version(1, READY, spec=spec(1))]), [gone], {}, NOW) == [
        moved(ready, status=S.PREEMPTED, status_message=message, failure_code=INSTANCE_LOST, cause=C.VERSION),
        *launches(1, 1),
        status(ServiceStatus.REPLICA_INIT, f"0/1 ready; replica 0 PREEMPTED: {message}; replica 1 PENDING"),
    ]


def test_an_unrecorded_launch_whose_instance_died_is_replaced_not_relaunched() -> None:
    dead = instance(
        0,
        InstanceState.TERMINATED,
        state_reason_code="Client.UserInitiatedShutdown",
        state_reason="Client.UserInitiatedShutdown: User initiated shutdown",
    )
    pending = replica(0, S.PENDING)
    message = (
        "instance i-0 is terminated (Client.UserInitiatedShutdown: User initiated shutdown): "
        "terminated outside fleetkeeper"
    )
    assert plan(state([pending, replica(1)]), [dead, instance(1)], {1: OK}, NOW) == [
        moved(
            pending,
            instance_id="i-0",
            status=S.PREEMPTED,
            status_message=message,
            failure_code="Client.UserInitiatedShutdown",
            cause=C.VERSION,
        ),
        mark_ready(1),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 PREEMPTED: {message}; replica 2 PENDING"),
    ]


def test_the_recorded_instance_is_judged_not_another_dead_launch_of_the_replica() -> None:
    ready = replica(0)
    other = instance(0, InstanceState.TERMINATED, instance_id="i-dup", state_reason_code="Client.UserInitiatedShutdown")
    message = "instance i-0 is gone: terminated outside fleetkeeper"
    assert plan(state([ready], [version(1, READY, spec=spec(1))]), [other], {}, NOW) == [
        moved(ready, status=S.PREEMPTED, status_message=message, failure_code=INSTANCE_LOST, cause=C.VERSION),
        *launches(1, 1),
        status(ServiceStatus.REPLICA_INIT, f"0/1 ready; replica 0 PREEMPTED: {message}; replica 1 PENDING"),
    ]


# --- adoption of an unrecorded launch, and duplicates ---------------------------------------------


def test_a_pending_replica_whose_instance_exists_is_adopted_not_relaunched() -> None:
    pending = replica(0, S.PENDING)
    actions = plan(state([pending, replica(1)]), [instance(0), instance(1)], {1: OK}, NOW)
    assert actions == [
        moved(pending, instance_id="i-0", launched_at=STAMP, status=S.STARTING, probing_since=STAMP),
        mark_ready(1),
        status(ServiceStatus.READY, "1/2 ready; replica 0 STARTING"),
    ]


def test_a_refused_replica_whose_earlier_launch_is_found_adopts_it() -> None:
    refused_one = refusal(0, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=30)
    current = state([refused_one], [version(1, spec=spec(1))])
    assert plan(current, [instance(0)], {}, NOW) == [
        moved(
            refused_one,
            instance_id="i-0",
            launched_at=STAMP,
            status=S.STARTING,
            probing_since=STAMP,
            status_message="",
            failure_code=None,
            cause=None,
        ),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 STARTING"),
    ]


def test_the_recorded_instance_wins_over_an_earlier_launch_of_the_replica() -> None:
    twin = instance(0, instance_id="i-twin", launched_at=ago(1000))
    actions = plan(state([replica(0), replica(1)]), [twin, instance(0), instance(1)], {0: OK, 1: OK}, NOW)
    assert actions == [
        mark_ready(1),
        terminate(("i-twin", "duplicate launch of replica 0")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_an_unrecorded_replica_adopts_its_earliest_launch_and_the_rest_are_duplicates() -> None:
    pending = replica(0, S.PENDING)
    later = instance(0, instance_id="i-a", launched_at=ago(10))
    earlier = instance(0, instance_id="i-b", launched_at=ago(20))
    unknown = instance(0, instance_id="i-c", launched_at=None)
    actions = plan(state([pending, replica(1)]), [later, earlier, instance(1)], {1: OK}, NOW)
    assert actions == [
        moved(pending, instance_id="i-b", launched_at=STAMP, status=S.STARTING, probing_since=STAMP),
        mark_ready(1),
        terminate(("i-a", "duplicate launch of replica 0")),
        status(ServiceStatus.READY, "1/2 ready; replica 0 STARTING"),
    ]
    # an instance EC2 reports no launch time for sorts first
    actions = plan(state([pending, replica(1)]), [earlier, unknown, instance(1)], {1: OK}, NOW)
    assert actions == [
        moved(pending, instance_id="i-c", launched_at=STAMP, status=S.STARTING, probing_since=STAMP),
        mark_ready(1),
        terminate(("i-b", "duplicate launch of replica 0")),
        status(ServiceStatus.READY, "1/2 ready; replica 0 STARTING"),
    ]


def test_a_stray_listed_first_does_not_hide_the_owned_instances() -> None:
    stray = instance(0, instance_id="i-stray")
    actions = plan(state([replica(1), replica(2)], seq=3), [stray, instance(1), instance(2)], {1: OK, 2: OK}, NOW)
    assert actions == [
        mark_ready(1),
        terminate(("i-stray", "replica 0 no longer exists")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_duplicate_launch_of_one_replica_is_terminated() -> None:
    twin = instance(0, instance_id="i-twin", launched_at=ago(10))
    actions = plan(state([replica(0), replica(1)]), [instance(0), twin, instance(1)], {0: OK, 1: OK}, NOW)
    assert actions == [
        mark_ready(1),
        terminate(("i-twin", "duplicate launch of replica 0")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_an_instance_whose_replica_item_is_gone_is_terminated_but_a_newer_claim_is_not() -> None:
    stray = instance(5, instance_id="i-stray")
    newer = instance(9, instance_id="i-newer")  # claimed by a concurrent run after this one read
    actions = plan(state([replica(0), replica(1)], seq=9), [instance(0), instance(1), stray, newer], {}, NOW)
    assert actions == [
        mark_ready(1),
        terminate(("i-stray", "replica 5 no longer exists")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


# --- observation and ownership (invariants 1 and 7) -----------------------------------------------


def test_a_service_whose_target_version_is_not_visible_yet_gets_no_action() -> None:
    current = state([replica(0, S.STARTING), replica(1, S.FAILED_PROBING)], [version(1, READY)], target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW) == []


# ClientTokens on an instance tagged as replica 0 of UID: is it fleetkeeper's launch?
_TOKENS = [
    (client_token(UID, 0), True),
    (client_token(UID, 0, 1), True),
    (client_token(UID, 0, 12), True),
    (None, False),
    ("", False),
    (client_token(UID, 1), False),  # another replica's token
    (client_token("u2", 0), False),  # another incarnation's
    (client_token(UID, 0) + "-", False),
    (client_token(UID, 0) + "-01", False),
    (client_token(UID, 0) + "-0", False),
    (client_token(UID, 0) + "-x", False),
    (client_token(UID, 0) + "-\u0663", False),  # a digit, but not an ASCII one
    ("12", False),
    (client_token(UID, 0) + "7", False),
]


@pytest.mark.parametrize(("token", "ours"), _TOKENS)
def test_only_an_instance_launched_with_the_replicas_token_is_a_duplicate(token: str | None, ours: bool) -> None:
    copy_ = instance(0, instance_id="i-copy", launched_at=ago(10), client_token=token)
    actions = plan(state([replica(0), replica(1)]), [instance(0), copy_, instance(1)], {0: OK, 1: OK}, NOW)
    duplicate = [terminate(("i-copy", "duplicate launch of replica 0"))] if ours else []
    assert actions == [mark_ready(1), *duplicate, status(ServiceStatus.READY, "2/2 ready")]


@pytest.mark.parametrize(("token", "ours"), _TOKENS)
def test_only_an_instance_launched_with_the_replicas_token_is_adopted(token: str | None, ours: bool) -> None:
    pending = replica(0, S.PENDING)
    found = instance(0, instance_id="i-found", client_token=token)
    actions = plan(state([pending, replica(1)]), [found, instance(1)], {1: OK}, NOW)
    if ours:
        expected: list[Action] = [
            moved(pending, instance_id="i-found", launched_at=STAMP, status=S.STARTING, probing_since=STAMP)
        ]
        message = "1/2 ready; replica 0 STARTING"
    else:
        expected = []
        message = "1/2 ready; replica 0 PENDING"
    launch = [] if ours else [Launch(0, fresh=False)]
    assert actions == [*expected, mark_ready(1), *launch, status(ServiceStatus.READY, message)]


@pytest.mark.parametrize(("token", "ours"), _TOKENS)
def test_only_an_instance_launched_by_fleetkeeper_is_an_orphan(token: str | None, ours: bool) -> None:
    orphan = instance(0, launched_at=ago(3600), client_token=token)
    expected = terminate(("i-0", "orphan: service svc (uid u1) no longer exists")) if ours else None
    assert plan_orphans({"u9"}, [orphan], NOW) == expected


# Guards a regression found by review (commit 5faa8d0): a replica that never got a probe verdict was never
# failed by its initial delay.
def test_a_running_replica_that_never_gets_a_probe_verdict_still_fails_its_initial_delay() -> None:
    starting = replica(0, S.STARTING, launched_at=ago(7200))
    message = "not ready 600s after launch (never answered a readiness probe)"
    assert plan(state([starting]), [instance(0)], {}, NOW) == [
        moved(
            starting,
            status=S.FAILED_INITIAL_DELAY,
            status_message=message,
            failure_code=INITIAL_DELAY_EXCEEDED,
            cause=FailureCause.VERSION,
        ),
        terminate(("i-0", "replica 0: FAILED_INITIAL_DELAY")),
        *launches(1, 1, 2),
        RecordStatus(
            ServiceStatus.REPLICA_INIT,
            f"0/2 ready; replica 0 FAILED_INITIAL_DELAY: {message}; replica 1 PENDING; replica 2 PENDING",
            1,
        ),
    ]
