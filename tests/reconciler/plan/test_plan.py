"""Table tests of the pure planner: every replica transition, updates, the breaker, delete, orphans,
the refusal and status functions, and the planner's purity.

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import pytest
import time_machine

from fleetkeeper.model import (
    FailureCause,
    Lifecycle,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceState,
    ServiceStatus,
    VersionRecord,
    VersionState,
    to_iso,
)
from fleetkeeper.reconciler.driver import Instance, InstanceState, client_token
from fleetkeeper.reconciler.plan import (
    INITIAL_DELAY_EXCEEDED,
    INSTANCE_LOST,
    PROBE_FAILED,
    Action,
    Claim,
    DeleteReplica,
    DeleteService,
    Launch,
    MarkVersion,
    Policy,
    ProbeResult,
    RecordReplica,
    RecordStatus,
    Terminate,
    TripBreaker,
    launched,
    plan,
    plan_orphans,
    refused,
    service_status,
    status_changed,
)
from fleetkeeper.spec.service import ServiceSpec
from tests.support.specs import hello_spec

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STAMP = to_iso(NOW)
UID = "u1"
S = ReplicaStatus
C = FailureCause
NEW, READY = VersionState.NEW, VersionState.READY


def ago(seconds: float) -> str:
    return to_iso(NOW - timedelta(seconds=seconds))


def spec(replicas: int = 2, **update: Any) -> ServiceSpec:
    data = hello_spec()
    data["service"] = {**data["service"], "replicas": replicas}
    data["service"]["readiness_probe"] = {"path": "/health", "initial_delay_seconds": 600}
    if update:
        data["update"] = update
    return ServiceSpec.model_validate(data)


def version(number: int, state: VersionState = NEW, *, in_place: bool = False, **kw: Any) -> VersionRecord:
    """A version record. A later version runs other code than version 1 (its `run` says which), so an
    update to it replaces replicas; `in_place`: it runs the same as version 1 (only the `service:`
    section or the update policy may differ), so an update to it keeps them."""
    the_spec = kw.pop("spec", None) or spec()
    if number != 1 and not in_place:
        the_spec = the_spec.model_copy(update={"run": f"{the_spec.run} # version {number}"})
    mode = kw.pop("mode", the_spec.update.mode)
    return VersionRecord(
        name="svc", uid=UID, version=number, spec=the_spec, mode=mode, created_at=ago(9999), state=state, **kw
    )


# The typed facts a failed replica of each status carries unless a case says otherwise.
_FACTS: dict[ReplicaStatus, dict[str, Any]] = {
    S.FAILED_PROBING: {"failure_code": PROBE_FAILED, "cause": C.VERSION},
    S.FAILED_INITIAL_DELAY: {"failure_code": INITIAL_DELAY_EXCEEDED, "cause": C.VERSION},
    S.PREEMPTED: {"failure_code": INSTANCE_LOST, "cause": C.VERSION},
}


def replica(rid: int, status: ReplicaStatus = S.READY, v: int = 1, **kw: Any) -> ReplicaRecord:
    defaults: dict[str, Any] = {
        "instance_id": f"i-{rid}",
        "launched_at": ago(900),
        "url": "http://127.0.0.1:8080",
    }
    if status in (S.PENDING, S.FAILED_PROVISION):
        defaults = {}
    defaults.update(_FACTS.get(status, {}))
    defaults.update(kw)
    return ReplicaRecord(
        name="svc",
        uid=UID,
        replica_id=rid,
        version=v,
        status=status,
        created_at=ago(1000),
        updated_at=ago(1000),
        **defaults,
    )


def refusal(
    rid: int, code: str, message: str, cause: FailureCause, *, v: int = 1, attempts: int = 1, retry_in: float = -30
) -> ReplicaRecord:
    """A FAILED_PROVISION replica; `retry_in` seconds until its next attempt (negative: due)."""
    return replica(
        rid,
        S.FAILED_PROVISION,
        v=v,
        status_message=f"{code}: {message}",
        failure_code=code,
        cause=cause,
        launch_attempts=attempts,
        refused_runs=attempts,
        version_refusals=attempts if cause is C.VERSION else 0,
        next_attempt_at=to_iso(NOW + timedelta(seconds=retry_in)),
    )


def instance(rid: int, state: InstanceState = InstanceState.RUNNING, **kw: Any) -> Instance:
    fields: dict[str, Any] = {
        "instance_id": f"i-{rid}",
        "state": state,
        "service": "svc",
        "uid": UID,
        "version": 1,
        "replica_id": rid,
        "private_ip": "10.0.0.1",
        "launched_at": ago(900),
    }
    fields.update(kw)
    # Launched by fleetkeeper for the replica its tags name, unless a test says otherwise.
    fields.setdefault("client_token", client_token(fields["uid"], fields["replica_id"]))
    return Instance(**fields)


def state(
    replicas: list[ReplicaRecord],
    versions: list[VersionRecord] | None = None,
    *,
    target: int = 1,
    seq: int | None = None,
    lifecycle: Lifecycle = Lifecycle.ACTIVE,
    status: ServiceStatus = ServiceStatus.NO_REPLICA,
    message: str = "",
    generation: int = 1,
    observed: int = 0,
) -> ServiceState:
    versions = versions or [version(1)]
    service = ServiceRecord(
        name="svc",
        uid=UID,
        generation=generation,
        lifecycle=lifecycle,
        target_version=target,
        latest_version=max(v.version for v in versions),
        status=status,
        status_message=message,
        observed_generation=observed,
        created_at=ago(10_000),
        updated_at=ago(10_000),
        replica_seq=seq if seq is not None else max((r.replica_id + 1 for r in replicas), default=0),
    )
    return ServiceState(
        service=service,
        versions={v.version: v for v in versions},
        replicas={r.replica_id: r for r in replicas},
    )


OK = ProbeResult("http://127.0.0.1:8080", True, "HTTP 200")
DOWN = ProbeResult("http://127.0.0.1:8080", False, "connection refused")

# --- expected actions -------------------------------------------------------------------------------


def moved(before: ReplicaRecord, **changes: Any) -> RecordReplica:
    """The write of `before` with `changes`, stamped with the plan's `now`."""
    return RecordReplica(before, replace(before, updated_at=STAMP, **changes))


def drained(before: ReplicaRecord, why: str) -> RecordReplica:
    return moved(before, status=S.SHUTTING_DOWN, status_message=why, failure_code=None, cause=None)


def became_ready(before: ReplicaRecord, **more: Any) -> RecordReplica:
    return moved(
        before, status=S.READY, status_message="", ready_at=STAMP, last_probe_ok_at=STAMP, probe_failures=0, **more
    )


def terminate(*reasons: tuple[str, str]) -> Terminate:
    return Terminate(tuple(reasons))


def launches(version_number: int, *ids: int) -> list[Action]:
    """A claim of `ids` and their fresh launches."""
    return [Claim(version_number, ids), *(Launch(rid, fresh=True) for rid in ids)]


def mark_ready(number: int) -> MarkVersion:
    return MarkVersion(number, NEW, READY)


def status(kind: ServiceStatus, message: str, generation: int = 1) -> RecordStatus:
    return RecordStatus(kind, message, generation)


# --- a new service --------------------------------------------------------------------------------


def test_new_service_claims_its_replicas_and_launches_them() -> None:
    assert plan(state([]), [], {}, NOW) == [
        *launches(1, 0, 1),
        status(ServiceStatus.REPLICA_INIT, "0/2 ready; replica 0 PENDING; replica 1 PENDING"),
    ]


def test_claims_continue_the_replica_sequence_never_reusing_ids() -> None:
    assert plan(state([], seq=7), [], {}, NOW) == [
        *launches(1, 7, 8),
        status(ServiceStatus.REPLICA_INIT, "0/2 ready; replica 7 PENDING; replica 8 PENDING"),
    ]


def test_launches_per_run_are_capped() -> None:
    current = state([], [version(1, spec=spec(replicas=80))])
    assert plan(current, [], {}, NOW, Policy(max_launches_per_run=50)) == [
        *launches(1, *range(50)),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/80 ready; replica 0 PENDING; replica 1 PENDING; replica 2 PENDING; and 47 more",
        ),
    ]


# --- launch recovery ------------------------------------------------------------------------------


def test_a_pending_replica_left_by_a_crashed_run_is_launched_again_at_once() -> None:
    assert plan(state([replica(0, S.PENDING), replica(1)]), [instance(1)], {1: OK}, NOW) == [
        mark_ready(1),
        Launch(0, fresh=False),
        status(ServiceStatus.READY, "1/2 ready; replica 0 PENDING"),
    ]


def test_a_pending_replica_whose_instance_exists_is_adopted_not_relaunched() -> None:
    pending = replica(0, S.PENDING)
    actions = plan(state([pending, replica(1)]), [instance(0), instance(1)], {1: OK}, NOW)
    assert actions == [
        moved(pending, instance_id="i-0", launched_at=STAMP, status=S.STARTING, probing_since=STAMP),
        mark_ready(1),
        status(ServiceStatus.READY, "1/2 ready; replica 0 STARTING"),
    ]


def test_a_refused_launch_waits_for_its_backoff() -> None:
    waiting = refusal(0, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=5)
    current = state([waiting, replica(1)])
    expected_status = status(
        ServiceStatus.READY, "1/2 ready; replica 0 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity"
    )
    assert plan(current, [instance(1)], {1: OK}, NOW) == [mark_ready(1), expected_status]
    later = NOW + timedelta(seconds=6)
    assert plan(current, [instance(1)], {1: OK}, later) == [mark_ready(1), Launch(0, fresh=False), expected_status]


def test_backoff_is_exponential_and_capped() -> None:
    policy = Policy()
    assert [policy.backoff(n).total_seconds() for n in (1, 2, 3)] == [30, 60, 120]
    assert policy.backoff(30) == policy.backoff_max


# --- refused and launched: the launch outcomes the shell records ---------------------------------


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        # Capacity and placement: the next attempt may land elsewhere (another subnet).
        ("InsufficientInstanceCapacity", C.ENVIRONMENT),
        ("Unsupported", C.ENVIRONMENT),
        ("InsufficientFreeAddressesInSubnet", C.ENVIRONMENT),
        # Account limits and EC2 having a moment.
        ("VcpuLimitExceeded", C.ENVIRONMENT),
        ("RequestLimitExceeded", C.ENVIRONMENT),
        # The process driver's own: the laptop, not the version.
        ("NoFreePort", C.ENVIRONMENT),
        # The version's: its image, its parameters, its permissions.
        ("InvalidAMIID.NotFound", C.VERSION),
        ("InvalidParameterValue", C.VERSION),
        ("UnauthorizedOperation", C.VERSION),
    ],
)
def test_a_refusal_records_its_code_whose_fault_it_is_and_the_backoff(code: str, cause: FailureCause) -> None:
    pending = replica(3, S.PENDING)
    assert refused(pending, code, "what AWS said", NOW, Policy()) == replace(
        pending,
        status=S.FAILED_PROVISION,
        status_message=f"{code}: what AWS said",
        failure_code=code,
        cause=cause,
        launch_attempts=1,
        refused_runs=1,
        version_refusals=1 if cause is C.VERSION else 0,
        next_attempt_at=to_iso(NOW + timedelta(seconds=30)),
        updated_at=STAMP,
    )


def test_each_refusal_doubles_the_backoff_and_the_latest_code_decides() -> None:
    before = refusal(3, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, attempts=2)
    assert refused(before, "InvalidAMIID.NotFound", "no such image", NOW, Policy()) == replace(
        before,
        status_message="InvalidAMIID.NotFound: no such image",
        failure_code="InvalidAMIID.NotFound",
        cause=C.VERSION,
        launch_attempts=3,
        refused_runs=3,
        version_refusals=1,
        next_attempt_at=to_iso(NOW + timedelta(seconds=120)),
        updated_at=STAMP,
    )


def test_capacity_refusals_of_a_walk_never_count_toward_the_breaker_only_the_versions_do() -> None:
    """Three pools refused for capacity, then one refusal that is the version's: the breaker counts 1."""
    pending = replica(3, S.PENDING)
    walked = refused(pending, "InvalidParameterValue", "bad", NOW, Policy(), tried=4)
    assert (walked.launch_attempts, walked.version_refusals, walked.cause) == (4, 1, C.VERSION)
    again = refused(walked, "InsufficientInstanceCapacity", "none", NOW, Policy(), tried=2)
    assert (again.launch_attempts, again.version_refusals, again.cause) == (6, 1, C.ENVIRONMENT)
    # Two replicas refused like that: 2 failures, under the threshold of 3: no breaker trip.
    current = state([replace(walked, replica_id=0), replace(walked, replica_id=1)])
    assert not [a for a in plan(current, [], {}, NOW) if isinstance(a, TripBreaker)]


def test_a_run_that_walked_pools_counts_each_attempt_but_backs_off_once() -> None:
    """Four pools refused in one run: four attempts (the next run starts at the fifth pool, with its
    own token), and one refused run: the backoff after the first run is still 30 s."""
    pending = replica(3, S.PENDING)
    assert refused(pending, "InsufficientInstanceCapacity", "none", NOW, Policy(), tried=4) == replace(
        pending,
        status=S.FAILED_PROVISION,
        status_message="InsufficientInstanceCapacity: none",
        failure_code="InsufficientInstanceCapacity",
        cause=C.ENVIRONMENT,
        launch_attempts=4,
        refused_runs=1,
        next_attempt_at=to_iso(NOW + timedelta(seconds=30)),
        updated_at=STAMP,
    )
    assert launched(pending, "i-1", NOW, instance_type="c6i.large", tried=2) == replace(
        pending,
        instance_id="i-1",
        instance_type="c6i.large",
        status=S.PROVISIONING,
        launch_attempts=2,
        launched_at=STAMP,
        updated_at=STAMP,
    )


@pytest.mark.parametrize(
    "before",
    [replica(3, S.PENDING), refusal(3, "InvalidAMIID.NotFound", "no such image", C.VERSION, attempts=2)],
    ids=["claimed", "refused before"],
)
def test_a_launch_records_the_instance_and_clears_the_failure(before: ReplicaRecord) -> None:
    assert launched(before, "i-new", NOW) == replace(
        before,
        instance_id="i-new",
        status=S.PROVISIONING,
        status_message="",
        failure_code=None,
        cause=None,
        launched_at=STAMP,
        next_attempt_at=None,
        updated_at=STAMP,
    )


# --- replica transitions --------------------------------------------------------------------------


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


def test_a_leaving_replica_whose_instance_is_gone_is_deleted() -> None:
    leaving = replica(0, S.SHUTTING_DOWN)
    actions = plan(state([leaving, replica(1), replica(2)]), [instance(1), instance(2)], {1: OK, 2: OK}, NOW)
    assert actions == [mark_ready(1), DeleteReplica(leaving), status(ServiceStatus.READY, "2/2 ready")]


def test_a_leaving_replica_never_recorded_as_launched_waits_for_a_late_instance() -> None:
    """Found by the simulation (seed 1595159725, 400 steps): a run launched replica 0 and lost the
    write that records it; replica 0 was then chosen for removal; DescribeInstances did not show its
    instance yet, and deleting the item left that instance running past the surge bound. The item
    stays for `lost_instance_grace` after its last write: a late instance is matched by its tag and
    terminated first; after the grace, with none shown, the item goes."""
    others = [replica(1), replica(2)]
    seen = [instance(1), instance(2)]
    probes = {1: OK, 2: OK}
    fresh = replace(replica(0, S.SHUTTING_DOWN, instance_id=None, launched_at=None), updated_at=ago(60))
    assert plan(state([fresh, *others]), seen, probes, NOW) == [
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    late = instance(0)
    assert plan(state([fresh, *others]), [late, *seen], probes, NOW) == [
        mark_ready(1),
        Terminate((("i-0", "replica 0: SHUTTING_DOWN"),)),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    old = replace(fresh, updated_at=ago(Policy().lost_instance_grace.total_seconds() + 1))
    assert plan(state([old, *others]), seen, probes, NOW) == [
        mark_ready(1),
        DeleteReplica(old),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_leaving_replica_whose_recorded_instance_is_not_listed_yet_waits_for_it() -> None:
    """From the simulation (seed 1282648386, 400 steps, surge-bound): replica 0's launch was recorded,
    but DescribeInstances did not list its instance yet when the replica was chosen for removal (a
    scale-down here); the next run deleted the item, and the instance, listed a little later, ran on
    with no replica, past the surge bound.
    While the describe answer lacks the recorded instance altogether, the item stays (for at most
    `lost_instance_grace` after the launch): the instance is terminated once listed. An instance
    listed as terminated is gone: the item goes at once, as it does once the grace is over."""
    others = [replica(1), replica(2)]
    seen = [instance(1), instance(2)]
    probes = {1: OK, 2: OK}
    hidden = replica(0, S.PROVISIONING, launched_at=ago(60))
    chosen = drained(hidden, "scaling down to 2")
    assert plan(state([hidden, *others]), seen, probes, NOW) == [
        chosen,
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    leaving = chosen.after
    assert plan(state([leaving, *others]), seen, probes, NOW) == [
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    assert plan(state([leaving, *others]), [instance(0, launched_at=ago(60)), *seen], probes, NOW) == [
        mark_ready(1),
        terminate(("i-0", "replica 0: SHUTTING_DOWN")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    gone = instance(0, InstanceState.TERMINATED, launched_at=ago(60))
    assert plan(state([leaving, *others]), [gone, *seen], probes, NOW) == [
        mark_ready(1),
        DeleteReplica(leaving),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    old = replace(leaving, launched_at=ago(Policy().lost_instance_grace.total_seconds() + 1))
    assert plan(state([old, *others]), seen, probes, NOW) == [
        mark_ready(1),
        DeleteReplica(old),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_failures_of_an_undecided_target_are_kept_for_the_breaker() -> None:
    failed = replica(0, S.FAILED_PROBING)
    current = state([failed, replica(1, S.STARTING, launched_at=ago(60))])
    assert plan(current, [instance(1)], {}, NOW) == [
        *launches(1, 2),
        status(
            ServiceStatus.REPLICA_INIT, "0/2 ready; replica 0 FAILED_PROBING; replica 1 STARTING; replica 2 PENDING"
        ),
    ]


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


def test_the_recorded_instance_is_judged_not_another_dead_launch_of_the_replica() -> None:
    ready = replica(0)
    other = instance(0, InstanceState.TERMINATED, instance_id="i-dup", state_reason_code="Client.UserInitiatedShutdown")
    message = "instance i-0 is gone: terminated outside fleetkeeper"
    assert plan(state([ready], [version(1, READY, spec=spec(1))]), [other], {}, NOW) == [
        moved(ready, status=S.PREEMPTED, status_message=message, failure_code=INSTANCE_LOST, cause=C.VERSION),
        *launches(1, 1),
        status(ServiceStatus.REPLICA_INIT, f"0/1 ready; replica 0 PREEMPTED: {message}; replica 1 PENDING"),
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


def test_a_stray_listed_first_does_not_hide_the_owned_instances() -> None:
    stray = instance(0, instance_id="i-stray")
    actions = plan(state([replica(1), replica(2)], seq=3), [stray, instance(1), instance(2)], {1: OK, 2: OK}, NOW)
    assert actions == [
        mark_ready(1),
        terminate(("i-stray", "replica 0 no longer exists")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_launches_go_past_replicas_that_need_none() -> None:
    waiting = refusal(1, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=5)
    due_now = refusal(2, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=0)
    current = state([replica(0), waiting, due_now, replica(3, S.PENDING)], [version(1, READY, spec=spec(4))])
    text = "FAILED_PROVISION: InsufficientInstanceCapacity: no capacity"
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        Launch(2, fresh=False),
        Launch(3, fresh=False),
        status(ServiceStatus.READY, f"1/4 ready; replica 1 {text}; replica 2 {text}; replica 3 PENDING"),
    ]


def test_retries_count_toward_the_launch_cap() -> None:
    due = refusal(0, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT)
    current = state([due], [version(1, spec=spec(3))])
    assert plan(current, [], {}, NOW, Policy(max_launches_per_run=2)) == [
        Launch(0, fresh=False),
        *launches(1, 1),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/3 ready; replica 0 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity; replica 1 PENDING",
        ),
    ]


# --- steady state ---------------------------------------------------------------------------------


def test_steady_state_plans_nothing() -> None:
    ready = [replica(0, ready_at=ago(100)), replica(1, ready_at=ago(100))]
    current = state(ready, [version(1, READY)], status=ServiceStatus.READY, message="2/2 ready", observed=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == []


def test_status_is_recorded_when_the_generation_moves() -> None:
    current = state(
        [replica(0), replica(1)],
        [version(1, READY)],
        status=ServiceStatus.READY,
        message="2/2 ready",
        generation=2,
        observed=1,
    )
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        status(ServiceStatus.READY, "2/2 ready", 2)
    ]


def test_status_message_names_the_failing_replica() -> None:
    waiting = refusal(2, "InsufficientInstanceCapacity", "no capacity in us-east-1a", C.ENVIRONMENT, retry_in=30)
    current = state([replica(0), replica(1), waiting], [version(1, READY, spec=spec(3))])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        status(
            ServiceStatus.READY,
            "2/3 ready; replica 2 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity in us-east-1a",
        )
    ]


# --- service_status: the pure status function the shell also calls after refusals ---------------


def test_the_status_of_records_as_they_are_after_refusals_names_the_refusal() -> None:
    """What the shell records when AWS refused launches `plan` expected to go through: the status of
    the records as they now are (one launched, one refused), not a re-plan."""
    current = state([], seq=2)
    now_records = [
        replica(0, S.PROVISIONING),
        refusal(1, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=30),
    ]
    assert service_status(current, now_records, {1: NEW}, set()) == status(
        ServiceStatus.REPLICA_INIT,
        "0/2 ready; replica 0 PROVISIONING; replica 1 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity",
    )


@pytest.mark.parametrize(
    ("records", "versions", "with_instance", "expected"),
    [
        ([], {1: NEW}, set(), (ServiceStatus.NO_REPLICA, "0/2 ready")),
        # An old replica on its way out counts as left while its instance lives.
        (
            [replica(0, S.SHUTTING_DOWN), replica(1, v=2), replica(2, v=2)],
            {1: READY, 2: READY},
            {0, 1, 2},
            (ServiceStatus.UPDATING, "updating to version 2 (rolling): 2/2 new ready, 1 old replica(s) left"),
        ),
        (
            [replica(0, S.SHUTTING_DOWN), replica(1, v=2), replica(2, v=2)],
            {1: READY, 2: READY},
            {1, 2},
            (ServiceStatus.READY, "2/2 ready"),
        ),
    ],
    ids=["nothing", "old instance still up", "old instance gone"],
)
def test_service_status(
    records: list[ReplicaRecord],
    versions: dict[int, VersionState],
    with_instance: set[int],
    expected: tuple[ServiceStatus, str],
) -> None:
    current = state(records, [version(n, s) for n, s in sorted(versions.items())], target=max(versions))
    assert service_status(current, records, versions, with_instance) == status(*expected)


def test_the_status_of_a_service_whose_target_version_is_missing() -> None:
    assert service_status(state([], target=2), [], {1: NEW}, set()) == status(
        ServiceStatus.FAILED,
        "the target version is missing; no earlier version was ever READY: "
        "launching stopped until the service is updated",
    )


def test_a_status_is_only_written_when_it_changed() -> None:
    current = state([], status=ServiceStatus.READY, message="2/2 ready", generation=3, observed=3)
    assert not status_changed(current, status(ServiceStatus.READY, "2/2 ready", 3))
    assert status_changed(current, status(ServiceStatus.READY, "2/2 ready", 4))
    assert status_changed(current, status(ServiceStatus.READY, "1/2 ready", 3))
    assert status_changed(current, status(ServiceStatus.UPDATING, "2/2 ready", 3))


# --- scaling and duplicates -----------------------------------------------------------------------


def test_scale_down_drains_not_ready_then_newest_first() -> None:
    r0, r1, r2 = replica(0), replica(1), replica(2, S.STARTING, launched_at=ago(60))
    current = state([r0, r1, r2], [version(1, spec=spec(1))])
    assert plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK}, NOW) == [
        drained(r1, "scaling down to 1"),
        drained(r2, "scaling down to 1"),
        mark_ready(1),
        terminate(("i-1", "replica 1: scaling down to 1"), ("i-2", "replica 2: scaling down to 1")),
        status(ServiceStatus.READY, "1/1 ready"),
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


# --- updates --------------------------------------------------------------------------------------


def rolling_state(new: list[ReplicaRecord], old: list[ReplicaRecord], **update: Any) -> ServiceState:
    versions = [version(1, READY), version(2, spec=spec(2, **update))]
    return state(old + new, versions, target=2)


ROLLED = "replaced by version 2 (rolling)"


def test_rolling_surges_first_then_retires_old_as_new_become_ready() -> None:
    # step 1: two old ready -> one new (surge 1), nothing removed (max_unavailable 0)
    r0, r1 = replica(0), replica(1)
    current = rolling_state([], [r0, r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING",
        ),
    ]
    # step 2: the new one is ready -> one old goes, one more new comes. The draining replica's record
    # (no longer READY) is written before its instance is terminated.
    r2 = replica(2, v=2)
    current = rolling_state([r2], [r0, r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK, 2: OK}, NOW) == [
        drained(r0, ROLLED),
        mark_ready(2),
        terminate(("i-0", f"replica 0: {ROLLED}")),
        *launches(2, 3),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 1/2 new ready, 2 old replica(s) left; replica 3 PENDING",
        ),
    ]
    # step 3: the second new is still starting -> nothing may go
    r3 = replica(3, S.STARTING, v=2, launched_at=ago(60))
    current = rolling_state([r2, r3], [r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(1), instance(2), instance(3)], {1: OK, 2: OK, 3: DOWN}, NOW) == [
        moved(r3, status_message="not ready yet: probe GET /health → connection refused"),
        mark_ready(2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 1/2 new ready, 1 old replica(s) left; "
            "replica 3 STARTING: not ready yet: probe GET /health → connection refused",
        ),
    ]
    # step 4: both new ready -> the last old goes
    current = rolling_state([r2, replica(3, v=2)], [r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(1), instance(2), instance(3)], {1: OK, 2: OK, 3: OK}, NOW) == [
        drained(r1, ROLLED),
        mark_ready(2),
        terminate(("i-1", f"replica 1: {ROLLED}")),
        status(ServiceStatus.UPDATING, "updating to version 2 (rolling): 2/2 new ready, 1 old replica(s) left"),
    ]


def test_rolling_with_unavailability_and_no_surge_removes_before_adding() -> None:
    r0 = replica(0)
    current = rolling_state([], [r0, replica(1)], max_surge=0, max_unavailable=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        drained(r0, ROLLED),
        terminate(("i-0", f"replica 0: {ROLLED}")),
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING",
        ),
    ]


def test_blue_green_launches_all_new_and_keeps_old_until_all_new_are_ready() -> None:
    r0, r1 = replica(0), replica(1)
    current = rolling_state([], [r0, r1], mode="blue_green")
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *launches(2, 2, 3),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (blue_green): 0/2 new ready, 2 old replica(s) left; "
            "replica 2 PENDING; replica 3 PENDING",
        ),
    ]
    r2, r3 = replica(2, v=2), replica(3, S.STARTING, v=2, launched_at=ago(60))
    current = rolling_state([r2, r3], [r0, r1], mode="blue_green")
    insts = [instance(i) for i in range(4)]
    assert plan(current, insts, {0: OK, 1: OK, 2: OK, 3: DOWN}, NOW) == [
        moved(r3, status_message="not ready yet: probe GET /health → connection refused"),
        mark_ready(2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (blue_green): 1/2 new ready, 2 old replica(s) left; "
            "replica 3 STARTING: not ready yet: probe GET /health → connection refused",
        ),
    ]
    current = rolling_state([r2, replica(3, v=2)], [r0, r1], mode="blue_green")
    replaced = "replaced by version 2 (blue_green)"
    assert plan(current, insts, dict.fromkeys(range(4), OK), NOW) == [
        drained(r0, replaced),
        drained(r1, replaced),
        mark_ready(2),
        terminate(("i-0", f"replica 0: {replaced}"), ("i-1", f"replica 1: {replaced}")),
        status(ServiceStatus.UPDATING, "updating to version 2 (blue_green): 2/2 new ready, 2 old replica(s) left"),
    ]


def test_an_update_finishes_ready_when_old_instances_are_gone() -> None:
    leaving = replica(1, S.SHUTTING_DOWN)
    current = rolling_state([replica(2, v=2), replica(3, v=2)], [leaving])
    assert plan(current, [instance(2), instance(3)], {2: OK, 3: OK}, NOW) == [
        mark_ready(2),
        DeleteReplica(leaving),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_an_update_drops_the_old_versions_refused_launches_and_drains_its_not_ready_replicas() -> None:
    old_refusal = refusal(0, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT)
    starting = replica(1, S.STARTING, launched_at=ago(60))
    current = rolling_state([replica(2, v=2), replica(3, v=2)], [old_refusal, starting])
    insts = [instance(1), instance(2), instance(3)]
    assert plan(current, insts, {1: DOWN, 2: OK, 3: OK}, NOW) == [
        drained(starting, ROLLED),
        mark_ready(2),
        terminate(("i-1", f"replica 1: {ROLLED}")),
        DeleteReplica(old_refusal),
        status(ServiceStatus.UPDATING, "updating to version 2 (rolling): 2/2 new ready, 1 old replica(s) left"),
    ]


def test_a_failed_target_drains_the_old_replicas_that_serve_nothing_and_keeps_the_rest() -> None:
    failed = version(2, VersionState.FAILED, state_message="version 2 failed: 3 replica failures")
    starting = replica(0, S.STARTING, launched_at=ago(60))
    current = state([starting], [version(1), failed], target=2)
    assert plan(current, [instance(0)], {}, NOW) == [
        drained(starting, "replaced by version 2 (rolling)"),
        terminate(("i-0", "replica 0: replaced by version 2 (rolling)")),
        status(
            ServiceStatus.FAILED,
            "version 2 failed: 3 replica failures; no earlier version was ever READY: "
            "launching stopped until the service is updated",
        ),
    ]


def test_rolling_with_unavailability_of_every_replica_replaces_them_all_at_once() -> None:
    r0, r1 = replica(0), replica(1)
    current = rolling_state([], [r0, r1], max_surge=0, max_unavailable=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        drained(r0, ROLLED),
        drained(r1, ROLLED),
        terminate(("i-0", f"replica 0: {ROLLED}"), ("i-1", f"replica 1: {ROLLED}")),
        *launches(2, 2, 3),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING; "
            "replica 3 PENDING",
        ),
    ]


def test_rolling_surge_counts_the_new_replicas_already_launched() -> None:
    old = [replica(i) for i in range(3)]
    starting = replica(3, S.STARTING, v=2, launched_at=ago(60))
    versions = [version(1, READY), version(2, spec=spec(3, max_surge=1, max_unavailable=0))]
    current = state([*old, starting], versions, target=2)
    insts = [instance(i) for i in range(4)]
    assert plan(current, insts, {0: OK, 1: OK, 2: OK}, NOW) == [
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/3 new ready, 3 old replica(s) left; replica 3 STARTING",
        ),
    ]


# --- circuit breaker ------------------------------------------------------------------------------


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


def test_the_breakers_rollback_says_why_in_the_planners_words() -> None:
    trip = TripBreaker(2, "version 2 failed: 3 replica failures", rollback_to=1)
    assert trip.status_message == "rolling back to version 1: version 2 failed: 3 replica failures"


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


def test_status_after_rollback_says_why() -> None:
    failed = version(2, VersionState.FAILED, state_message="version 2 failed: 3 replica failures")
    current = state([replica(0), replica(1)], [version(1, READY), failed], target=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        status(ServiceStatus.READY, "2/2 ready; rolled back to version 1: version 2 failed: 3 replica failures")
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


# --- delete and orphans ---------------------------------------------------------------------------


def test_delete_drains_every_replica_and_terminates_every_instance() -> None:
    stray = instance(7, instance_id="i-stray")
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], lifecycle=Lifecycle.DELETING, seq=9)
    assert plan(current, [instance(0), instance(1), stray], {0: OK}, NOW) == [
        drained(r0, "service is being deleted"),
        drained(r1, "service is being deleted"),
        terminate(
            ("i-0", "replica 0: service is being deleted"),
            ("i-1", "replica 1: service is being deleted"),
            ("i-stray", "replica 7 no longer exists"),
        ),
        status(ServiceStatus.SHUTTING_DOWN, "deleting: terminating 3 instance(s)"),
    ]


def test_delete_terminates_a_live_instance_no_replica_item_owns_yet() -> None:
    # Claimed by a concurrent run after this one read the service (id at replica_seq): an ACTIVE
    # service leaves it alone, a DELETING one terminates it with everything else.
    gone = replica(0, S.SHUTTING_DOWN)
    newer = instance(1, instance_id="i-newer")
    current = state([gone], lifecycle=Lifecycle.DELETING, status=ServiceStatus.SHUTTING_DOWN)
    assert plan(current, [newer], {}, NOW) == [
        terminate(("i-newer", "service is being deleted")),
        status(ServiceStatus.SHUTTING_DOWN, "deleting: terminating 1 instance(s)"),
    ]


def test_delete_clears_the_failure_facts_of_a_failed_replica_it_drains() -> None:
    refused_one = refusal(0, "InvalidAMIID.NotFound", "x", C.VERSION, retry_in=30)
    current = state([refused_one], lifecycle=Lifecycle.DELETING)
    assert plan(current, [], {}, NOW) == [drained(refused_one, "service is being deleted"), DeleteService()]


def test_delete_removes_the_service_item_once_no_instance_remains() -> None:
    gone = instance(0, InstanceState.TERMINATED)
    current = state([replica(0, S.SHUTTING_DOWN)], lifecycle=Lifecycle.DELETING)
    assert plan(current, [gone], {}, NOW) == [DeleteService()]


def test_orphans_are_terminated_after_the_grace_period_only() -> None:
    old = instance(0, uid="dead", instance_id="i-old", launched_at=ago(3600))
    young = instance(1, uid="dead", instance_id="i-young", launched_at=ago(60))
    live = instance(2, instance_id="i-live", launched_at=ago(3600))
    gone = instance(3, uid="dead", instance_id="i-gone", state=InstanceState.TERMINATED, launched_at=ago(3600))
    assert plan_orphans({UID}, [old, young, live, gone], NOW) == terminate(
        ("i-old", "orphan: service svc (uid dead) no longer exists")
    )
    assert plan_orphans({UID, "dead"}, [old], NOW) is None


# --- observation and ownership (invariants 1 and 7) -----------------------------------------------


def test_a_service_whose_target_version_is_not_visible_yet_gets_no_action() -> None:
    current = state([replica(0, S.STARTING), replica(1, S.FAILED_PROBING)], [version(1, READY)], target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW) == []


def test_a_deleting_service_is_taken_down_without_its_target_version() -> None:
    r0 = replica(0)
    current = state([r0], [version(1, READY)], target=2, lifecycle=Lifecycle.DELETING)
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        drained(r0, "service is being deleted"),
        terminate(("i-0", "replica 0: service is being deleted")),
        status(ServiceStatus.SHUTTING_DOWN, "deleting: terminating 1 instance(s)"),
    ]


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


@pytest.mark.parametrize(
    "fields",
    [{"uid": "", "client_token": client_token("", 0)}, {"replica_id": -1, "client_token": client_token(UID, -1)}],
    ids=["no uid", "no replica id"],
)
def test_an_instance_without_a_uid_or_replica_id_is_never_an_orphan(fields: dict[str, Any]) -> None:
    assert plan_orphans({"u9"}, [instance(0, launched_at=ago(3600), **fields)], NOW) is None


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


def test_orphans_one_by_one_whatever_comes_before_them() -> None:
    # Each instance that is not an orphan (live service, spared service, young) comes before one that is.
    live = instance(2, instance_id="i-live", launched_at=ago(3600))
    spared = instance(4, uid="gone", service="broken", instance_id="i-spared", launched_at=ago(3600))
    young = instance(1, uid="dead", instance_id="i-young", launched_at=ago(599))
    at_grace = instance(0, uid="dead", instance_id="i-at-grace", launched_at=ago(600))
    nameless = instance(5, uid="dead", service="", instance_id="i-nameless", launched_at=ago(3600))
    undated = instance(6, uid="dead", instance_id="i-undated", launched_at=None)
    assert plan_orphans(
        {UID}, [live, at_grace, spared, nameless, young, undated], NOW, spared_services={"broken"}
    ) == terminate(
        ("i-at-grace", "orphan: service svc (uid dead) no longer exists"),
        ("i-nameless", "orphan: service ? (uid dead) no longer exists"),
        ("i-undated", "orphan: service svc (uid dead) no longer exists"),
    )


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


def test_a_shut_down_replica_of_an_undecided_target_is_deleted_once_its_instance_is_gone() -> None:
    leaving = replica(0, S.SHUTTING_DOWN)
    starting = replica(1, S.STARTING, launched_at=ago(60))
    current = state([leaving, starting], [version(1, spec=spec(1))])
    assert plan(current, [instance(1)], {}, NOW) == [
        DeleteReplica(leaving),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 1 STARTING"),
    ]


def test_scale_down_launches_nothing_more_and_drains_unlaunched_claims() -> None:
    ready = [replica(i, ready_at=ago(100)) for i in range(4)]
    current = state(ready, [version(1, READY, spec=spec(3))])
    assert plan(current, [instance(i) for i in range(4)], dict.fromkeys(range(4), OK), NOW) == [
        drained(ready[3], "scaling down to 3"),
        terminate(("i-3", "replica 3: scaling down to 3")),
        status(ServiceStatus.READY, "3/3 ready"),
    ]
    claimed = [replica(i, S.PENDING) for i in range(3)]
    current = state(claimed, [version(1, spec=spec(1))])
    assert plan(current, [], {}, NOW) == [
        drained(claimed[1], "scaling down to 1"),
        drained(claimed[2], "scaling down to 1"),
        Launch(0, fresh=False),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 PENDING"),
    ]


# --- purity: a function of its inputs only --------------------------------------------------------


def _scenarios() -> dict[str, tuple[ServiceState, list[Instance], dict[int, ProbeResult]]]:
    """Inputs that between them take most of the planner's paths, each one planning record writes."""
    r0, r1 = replica(0), replica(1)
    return {
        "rolling step": (
            rolling_state([replica(2, v=2)], [r0, r1], max_surge=1, max_unavailable=0),
            [instance(0), instance(1), instance(2)],
            {0: OK, 1: OK, 2: OK},
        ),
        "failures and replacement": (
            state([replica(0, S.NOT_READY, probe_failures=2), r1, replica(2, S.PENDING)]),
            [instance(0, tags={"k": "v"}), instance(1)],
            {0: DOWN, 1: OK},
        ),
        "breaker": (
            state([replica(i, S.FAILED_PROBING) for i in range(2)] + [replica(2, S.STARTING, launched_at=ago(700))]),
            [instance(2)],
            {2: DOWN},
        ),
        "delete": (
            state([r0, replica(1, S.FAILED_PROBING)], lifecycle=Lifecycle.DELETING, seq=5),
            [instance(0), instance(1), instance(4, instance_id="i-stray")],
            {0: OK},
        ),
    }


SCENARIOS = _scenarios()


def _read_only(
    current: ServiceState, instances: list[Instance], probes: dict[int, ProbeResult]
) -> tuple[Any, Any, Any]:
    """The same inputs behind read-only views: a planner that wrote into them would raise."""
    frozen = replace(
        current,
        versions=MappingProxyType(current.versions),
        replicas=MappingProxyType(current.replicas),
    )
    return frozen, tuple(replace(i, tags=MappingProxyType(i.tags)) for i in instances), MappingProxyType(probes)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_plan_leaves_its_inputs_as_they_were(name: str) -> None:
    inputs = SCENARIOS[name]
    before = copy.deepcopy(inputs)
    actions = plan(*_read_only(*inputs), NOW)
    assert actions, "a scenario that plans nothing proves nothing"
    assert inputs == before
    assert actions == plan(*before, NOW)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_plan_depends_on_now_not_on_the_wall_clock(name: str) -> None:
    """The same inputs planned at two far-apart wall-clock times give the same actions."""
    with time_machine.travel(datetime(1999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC), tick=False):
        first = plan(*SCENARIOS[name], NOW)
    with time_machine.travel(datetime(2087, 7, 4, 6, 30, 1, 1_000, tzinfo=UTC), tick=False):
        second = plan(*SCENARIOS[name], NOW)
    assert any(isinstance(action, RecordReplica) for action in first)
    assert first == second


def test_refused_and_launched_depend_on_now_not_on_the_wall_clock() -> None:
    pending = replica(0, S.PENDING)
    with time_machine.travel(datetime(1999, 1, 1, tzinfo=UTC), tick=False):
        first = (refused(pending, "Unsupported", "x", NOW, Policy()), launched(pending, "i-1", NOW))
    with time_machine.travel(datetime(2087, 1, 1, tzinfo=UTC), tick=False):
        second = (refused(pending, "Unsupported", "x", NOW, Policy()), launched(pending, "i-1", NOW))
    assert first == second


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


# --- updates that keep replicas (plan/in_place.py) ---------------------------------------------------


def _two_versions(v2_spec: ServiceSpec, *, in_place: bool = True, **v2: Any) -> list[VersionRecord]:
    return [version(1, READY), version(2, spec=v2_spec, in_place=in_place, **v2)]


def _probe_spec(path: str, replicas: int = 2) -> ServiceSpec:
    data = hello_spec()
    data["service"] = {"replicas": replicas, "readiness_probe": {"path": path, "initial_delay_seconds": 600}}
    return ServiceSpec.model_validate(data)


def test_a_change_of_count_and_probe_only_takes_effect_on_the_ready_replicas_in_place() -> None:
    # replicas 2 -> 3 and a new probe path: the two READY replicas take version 2 (one write each), no
    # termination; one more replica is claimed for the count, and version 2 is READY at once.
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], _two_versions(_probe_spec("/ready", replicas=3)), target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        moved(r0, version=2),
        moved(r1, version=2),
        mark_ready(2),
        *launches(2, 2),
        status(ServiceStatus.READY, "2/3 ready; replica 2 PENDING"),
    ]


def test_a_change_only_in_the_service_section_launches_and_terminates_nothing() -> None:
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], _two_versions(_probe_spec("/ready")), target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        moved(r0, version=2),
        moved(r1, version=2),
        mark_ready(2),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_change_a_replica_runs_still_rolls() -> None:
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], _two_versions(_probe_spec("/ready"), in_place=False), target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING",
        ),
    ]


def test_new_secret_values_roll_even_when_the_spec_is_the_same() -> None:
    r0 = replica(0)
    versions = [version(1, READY, secrets_ref="a"), version(2, spec=spec(1), in_place=True, secrets_ref="b")]
    current = state([r0], versions, target=2)
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        *launches(2, 1),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/1 new ready, 1 old replica(s) left; replica 1 PENDING",
        ),
    ]


def test_only_ready_replicas_are_kept_in_place_the_others_are_replaced() -> None:
    ready, sick = replica(0), replica(1, S.NOT_READY, probe_failures=1, failing_since=ago(20))
    current = state([ready, sick], _two_versions(_probe_spec("/ready")), target=2)
    rolled = "replaced by version 2 (rolling)"
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: DOWN}, NOW) == [
        moved(ready, version=2),
        RecordReplica(sick, drained(replace(sick, probe_failures=2), rolled).after),
        mark_ready(2),
        terminate(("i-1", f"replica 1: {rolled}")),
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 1/2 new ready, 1 old replica(s) left; replica 2 PENDING",
        ),
    ]


def test_a_rollback_to_a_version_that_runs_the_same_is_in_place_too() -> None:
    # Version 2 (READY, a new probe path) rolled back to version 1: the replicas take 1 back in place.
    r0 = replica(0, v=2)
    versions = [version(1, READY, spec=spec(1)), version(2, READY, spec=_probe_spec("/ready", 1), in_place=True)]
    current = state([r0], versions, target=1)
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        moved(r0, version=1),
        status(ServiceStatus.READY, "1/1 ready"),
    ]


def test_a_failed_target_takes_no_replica_over() -> None:
    r0 = replica(0)
    versions = [version(1, READY), version(2, VersionState.FAILED, spec=_probe_spec("/ready"), in_place=True)]
    current = state([r0], versions, target=2, status=ServiceStatus.FAILED, message="x")
    actions = plan(current, [instance(0)], {0: OK}, NOW)
    assert [a for a in actions if isinstance(a, RecordReplica)] == []


def test_a_replica_kept_in_place_is_steady_afterwards() -> None:
    # Once recorded, nothing more is written: the steady state costs reads only (invariant 6).
    r0, r1 = replica(0, v=2), replica(1, v=2)
    versions = [version(1, READY), version(2, READY, spec=_probe_spec("/ready"), in_place=True)]
    current = state([r0, r1], versions, target=2, status=ServiceStatus.READY, message="2/2 ready", observed=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == []
