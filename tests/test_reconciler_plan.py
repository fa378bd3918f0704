"""Table tests of the pure `plan`: every replica transition, updates, the breaker, delete, orphans."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

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
from fleetkeeper.reconciler.driver import Instance, InstanceState
from fleetkeeper.reconciler.plan import (
    INITIAL_DELAY_EXCEEDED,
    INSTANCE_LOST,
    PROBE_FAILED,
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
    plan,
    plan_orphans,
)
from fleetkeeper.spec import ServiceSpec
from tests.conftest import hello_spec

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
UID = "u1"
S = ReplicaStatus


def ago(seconds: float) -> str:
    return to_iso(NOW - timedelta(seconds=seconds))


def spec(replicas: int = 2, **update: Any) -> ServiceSpec:
    data = hello_spec()
    data["service"] = {**data["service"], "replicas": replicas}
    data["service"]["readiness_probe"] = {"path": "/health", "initial_delay_seconds": 600}
    if update:
        data["update"] = update
    return ServiceSpec.model_validate(data)


def version(number: int, state: VersionState = VersionState.NEW, **kw: Any) -> VersionRecord:
    the_spec = kw.pop("spec", None) or spec()
    mode = kw.pop("mode", the_spec.update.mode)
    return VersionRecord(
        name="svc", uid=UID, version=number, spec=the_spec, mode=mode, created_at=ago(9999), state=state, **kw
    )


# The typed facts a failed replica of each status carries unless a case says otherwise.
_FACTS: dict[ReplicaStatus, dict[str, Any]] = {
    S.FAILED_PROBING: {"failure_code": PROBE_FAILED, "cause": FailureCause.VERSION},
    S.FAILED_INITIAL_DELAY: {"failure_code": INITIAL_DELAY_EXCEEDED, "cause": FailureCause.VERSION},
    S.PREEMPTED: {"failure_code": INSTANCE_LOST, "cause": FailureCause.VERSION},
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


def records(actions: list[Any]) -> dict[int, ReplicaRecord]:
    return {a.after.replica_id: a.after for a in actions if isinstance(a, RecordReplica)}


def only(actions: list[Any], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def terminated(actions: list[Any]) -> set[str]:
    return {i for a in only(actions, Terminate) for i in a.instance_ids}


def status_of(actions: list[Any]) -> RecordStatus:
    [status] = only(actions, RecordStatus)
    return status


# --- a new service --------------------------------------------------------------------------------


def test_new_service_claims_its_replicas_and_launches_them() -> None:
    actions = plan(state([]), [], {}, NOW)
    assert actions[:3] == [Claim(1, (0, 1)), Launch(0, fresh=True), Launch(1, fresh=True)]
    status = status_of(actions)
    assert status.status is ServiceStatus.REPLICA_INIT
    assert status.message == "0/2 ready; replica 0 PENDING; replica 1 PENDING"
    assert status.observed_generation == 1


def test_claims_continue_the_replica_sequence_never_reusing_ids() -> None:
    actions = plan(state([], seq=7), [], {}, NOW)
    assert only(actions, Claim) == [Claim(1, (7, 8))]


def test_launches_per_run_are_capped() -> None:
    actions = plan(state([], [version(1, spec=spec(replicas=80))]), [], {}, NOW, Policy(max_launches_per_run=50))
    assert only(actions, Claim)[0].replica_ids == tuple(range(50))


# --- launch recovery ------------------------------------------------------------------------------


def test_a_pending_replica_left_by_a_crashed_run_is_launched_again_at_once() -> None:
    actions = plan(state([replica(0, S.PENDING), replica(1)]), [instance(1)], {1: OK}, NOW)
    assert Launch(0, fresh=False) in actions
    assert not only(actions, Claim)


def test_a_pending_replica_whose_instance_exists_is_adopted_not_relaunched() -> None:
    actions = plan(state([replica(0, S.PENDING), replica(1)]), [instance(0), instance(1)], {1: OK}, NOW)
    adopted = records(actions)[0]
    assert adopted.instance_id == "i-0" and adopted.status is S.STARTING
    assert not only(actions, Launch) and not only(actions, Claim)


def test_a_refused_launch_waits_for_its_backoff() -> None:
    refused = replica(0, S.FAILED_PROVISION, launch_attempts=1, next_attempt_at=to_iso(NOW + timedelta(seconds=5)))
    actions = plan(state([refused, replica(1)]), [instance(1)], {1: OK}, NOW)
    assert not only(actions, Launch) and not only(actions, Claim)
    later = plan(state([refused, replica(1)]), [instance(1)], {1: OK}, NOW + timedelta(seconds=6))
    assert Launch(0, fresh=False) in later


def test_backoff_is_exponential_and_capped() -> None:
    policy = Policy()
    assert [policy.backoff(n).total_seconds() for n in (1, 2, 3)] == [30, 60, 120]
    assert policy.backoff(30) == policy.backoff_max


# --- replica transitions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "inst_state", "probe", "after"),
    [
        (S.PROVISIONING, InstanceState.PENDING, None, S.PROVISIONING),
        (S.PROVISIONING, InstanceState.RUNNING, None, S.STARTING),
        (S.PROVISIONING, InstanceState.RUNNING, OK, S.READY),
        (S.STARTING, InstanceState.RUNNING, DOWN, S.STARTING),
        (S.STARTING, InstanceState.RUNNING, OK, S.READY),
        (S.READY, InstanceState.RUNNING, DOWN, S.NOT_READY),
        (S.NOT_READY, InstanceState.RUNNING, OK, S.READY),
        (S.READY, InstanceState.STOPPED, None, S.NOT_READY),
    ],
)
def test_replica_transitions(
    before: ReplicaStatus, inst_state: InstanceState, probe: ProbeResult | None, after: ReplicaStatus
) -> None:
    old = replica(0, before, launched_at=ago(60), probe_failures=1 if before is S.NOT_READY else 0)
    probes = {0: probe} if probe else {}
    actions = plan(state([old], [version(1, spec=spec(1))]), [instance(0, inst_state)], probes, NOW)
    new = records(actions).get(0, old)
    assert new.status is after
    if after is S.READY:
        assert new.probe_failures == 0 and new.last_probe_ok_at == to_iso(NOW)


def test_first_ready_replica_marks_its_version_ready() -> None:
    actions = plan(state([replica(0, S.STARTING)]), [instance(0)], {0: OK}, NOW)
    assert MarkVersion(1, VersionState.NEW, VersionState.READY) in actions


def test_not_ready_past_the_threshold_fails_probing_and_is_replaced() -> None:
    failing = replica(0, S.NOT_READY, probe_failures=2)
    actions = plan(state([failing, replica(1)]), [instance(0), instance(1)], {0: DOWN, 1: OK}, NOW)
    assert records(actions)[0].status is S.FAILED_PROBING
    assert "3 times in a row: connection refused" in records(actions)[0].status_message
    assert terminated(actions) == {"i-0"}
    assert only(actions, Claim) == [Claim(1, (2,))]


def test_starting_past_the_initial_delay_fails_and_is_replaced() -> None:
    slow = replica(0, S.STARTING, launched_at=ago(601))
    actions = plan(state([slow, replica(1)]), [instance(0), instance(1)], {0: DOWN, 1: OK}, NOW)
    assert records(actions)[0].status is S.FAILED_INITIAL_DELAY
    assert terminated(actions) == {"i-0"}
    assert only(actions, Claim) == [Claim(1, (2,))]


def test_a_spot_instance_terminated_by_aws_is_preempted_and_replaced() -> None:
    gone = instance(0, InstanceState.TERMINATED, spot=True, state_reason_code="Server.SpotInstanceTermination")
    actions = plan(state([replica(0), replica(1)]), [gone, instance(1)], {1: OK}, NOW)
    assert records(actions)[0].status is S.PREEMPTED
    assert "spot instance reclaimed" in records(actions)[0].status_message
    assert only(actions, Claim) == [Claim(1, (2,))]


def test_an_instance_missing_right_after_launch_is_given_time() -> None:
    young = replica(0, S.PROVISIONING, launched_at=ago(10))
    actions = plan(state([young, replica(1)]), [instance(1)], {1: OK}, NOW)
    assert 0 not in records(actions) and not only(actions, Claim)
    old = replica(0, S.PROVISIONING, launched_at=ago(400))
    assert records(plan(state([old, replica(1)]), [instance(1)], {1: OK}, NOW))[0].status is S.PREEMPTED


def test_a_leaving_replica_whose_instance_is_gone_is_deleted() -> None:
    leaving = replica(0, S.SHUTTING_DOWN)
    actions = plan(state([leaving, replica(1), replica(2)]), [instance(1), instance(2)], {1: OK, 2: OK}, NOW)
    assert only(actions, DeleteReplica) == [DeleteReplica(leaving)]


def test_failures_of_an_undecided_target_are_kept_for_the_breaker() -> None:
    failed = replica(0, S.FAILED_PROBING)
    actions = plan(state([failed, replica(1, S.STARTING)]), [instance(1)], {}, NOW)
    assert not only(actions, DeleteReplica)


# --- steady state ---------------------------------------------------------------------------------


def test_steady_state_plans_nothing() -> None:
    ready = [replica(0, ready_at=ago(100)), replica(1, ready_at=ago(100))]
    current = state(
        ready,
        [version(1, VersionState.READY)],
        status=ServiceStatus.READY,
        message="2/2 ready",
        observed=1,
    )
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == []


def test_status_is_recorded_when_the_generation_moves() -> None:
    current = state(
        [replica(0), replica(1)],
        [version(1, VersionState.READY)],
        status=ServiceStatus.READY,
        message="2/2 ready",
        generation=2,
        observed=1,
    )
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        RecordStatus(ServiceStatus.READY, "2/2 ready", 2)
    ]


def test_status_message_names_the_failing_replica() -> None:
    refused = replica(
        2, S.FAILED_PROVISION, launch_attempts=1, next_attempt_at=ago(-30),
        status_message="InsufficientInstanceCapacity: no capacity in us-east-1a",
        failure_code="InsufficientInstanceCapacity", cause=FailureCause.ENVIRONMENT,
    )  # fmt: skip
    current = state([replica(0), replica(1), refused], [version(1, VersionState.READY, spec=spec(3))])
    status = status_of(plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW))
    assert status.status is ServiceStatus.READY
    assert status.message == (
        "2/3 ready; replica 2 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity in us-east-1a"
    )


# --- scaling and duplicates -----------------------------------------------------------------------


def test_scale_down_drains_not_ready_then_newest_first() -> None:
    current = state([replica(0), replica(1), replica(2, S.STARTING, launched_at=ago(60))], [version(1, spec=spec(1))])
    actions = plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK}, NOW)
    drained = {rid for rid, r in records(actions).items() if r.status is S.SHUTTING_DOWN}
    assert drained == {1, 2}
    assert terminated(actions) == {"i-1", "i-2"}


def test_a_duplicate_launch_of_one_replica_is_terminated() -> None:
    twin = instance(0, instance_id="i-twin", launched_at=ago(10))
    actions = plan(state([replica(0), replica(1)]), [instance(0), twin, instance(1)], {0: OK, 1: OK}, NOW)
    assert terminated(actions) == {"i-twin"}


def test_an_instance_whose_replica_item_is_gone_is_terminated_but_a_newer_claim_is_not() -> None:
    stray = instance(5, instance_id="i-stray")
    newer = instance(9, instance_id="i-newer")  # claimed by a concurrent run after this one read
    actions = plan(state([replica(0), replica(1)], seq=9), [instance(0), instance(1), stray, newer], {}, NOW)
    assert terminated(actions) == {"i-stray"}


# --- updates --------------------------------------------------------------------------------------


def rolling_state(new: list[ReplicaRecord], old: list[ReplicaRecord], **update: Any) -> ServiceState:
    versions = [version(1, VersionState.READY), version(2, spec=spec(2, **update))]
    return state(old + new, versions, target=2)


def drained(actions: list[Any]) -> set[int]:
    return {rid for rid, r in records(actions).items() if r.status is S.SHUTTING_DOWN}


def test_rolling_surges_first_then_retires_old_as_new_become_ready() -> None:
    # step 1: two old ready -> one new (surge 1), nothing removed (max_unavailable 0)
    current = rolling_state([], [replica(0), replica(1)], max_surge=1, max_unavailable=0)
    actions = plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW)
    assert only(actions, Claim) == [Claim(2, (2,))] and not drained(actions)
    assert status_of(actions).status is ServiceStatus.UPDATING
    # step 2: the new one is ready -> one old goes, one more new comes
    current = rolling_state([replica(2, v=2)], [replica(0), replica(1)], max_surge=1, max_unavailable=0)
    actions = plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK, 2: OK}, NOW)
    assert drained(actions) == {0} and only(actions, Claim) == [Claim(2, (3,))]
    # step 3: the second new is still starting -> nothing may go
    current = rolling_state(
        [replica(2, v=2), replica(3, S.STARTING, v=2, launched_at=ago(60))],
        [replica(1)],
        max_surge=1,
        max_unavailable=0,
    )
    actions = plan(current, [instance(1), instance(2), instance(3)], {1: OK, 2: OK, 3: DOWN}, NOW)
    assert not drained(actions) and not only(actions, Claim)
    # step 4: both new ready -> the last old goes
    current = rolling_state([replica(2, v=2), replica(3, v=2)], [replica(1)], max_surge=1, max_unavailable=0)
    actions = plan(current, [instance(1), instance(2), instance(3)], {1: OK, 2: OK, 3: OK}, NOW)
    assert drained(actions) == {1} and terminated(actions) == {"i-1"}


def test_rolling_with_unavailability_and_no_surge_removes_before_adding() -> None:
    current = rolling_state([], [replica(0), replica(1)], max_surge=0, max_unavailable=1)
    actions = plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW)
    assert drained(actions) == {0} and only(actions, Claim) == [Claim(2, (2,))]


def test_a_draining_replica_leaves_ready_before_its_instance_is_terminated() -> None:
    current = rolling_state([replica(2, v=2)], [replica(0), replica(1)], max_surge=1, max_unavailable=0)
    actions = plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK, 2: OK}, NOW)
    kinds = [type(a) for a in actions]
    assert kinds.index(RecordReplica) < kinds.index(Terminate)


def test_blue_green_launches_all_new_and_keeps_old_until_all_new_are_ready() -> None:
    current = rolling_state([], [replica(0), replica(1)], mode="blue_green")
    actions = plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW)
    assert only(actions, Claim) == [Claim(2, (2, 3))] and not drained(actions)
    current = rolling_state([replica(2, v=2), replica(3, S.STARTING, v=2)], [replica(0), replica(1)], mode="blue_green")
    insts = [instance(i) for i in range(4)]
    assert not drained(plan(current, insts, {0: OK, 1: OK, 2: OK, 3: DOWN}, NOW))
    current = rolling_state([replica(2, v=2), replica(3, v=2)], [replica(0), replica(1)], mode="blue_green")
    actions = plan(current, insts, dict.fromkeys(range(4), OK), NOW)
    assert drained(actions) == {0, 1}


def test_an_update_finishes_ready_when_old_instances_are_gone() -> None:
    current = rolling_state([replica(2, v=2), replica(3, v=2)], [replica(1, S.SHUTTING_DOWN)])
    actions = plan(current, [instance(2), instance(3)], {2: OK, 3: OK}, NOW)
    assert only(actions, DeleteReplica) and status_of(actions).status is ServiceStatus.READY


# --- circuit breaker ------------------------------------------------------------------------------


def test_breaker_rolls_back_to_the_last_ready_version() -> None:
    versions = [version(1, VersionState.READY), version(2)]
    failing = [replica(2, S.FAILED_INITIAL_DELAY, v=2), replica(3, S.FAILED_PROBING, v=2)]
    refused = replica(
        4,
        S.FAILED_PROVISION,
        v=2,
        launch_attempts=1,
        status_message="InvalidAMIID.NotFound: x",
        failure_code="InvalidAMIID.NotFound",
        cause=FailureCause.VERSION,
    )
    current = state([replica(0), replica(1), *failing, refused], versions, target=2)
    actions = plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW)
    [trip] = only(actions, TripBreaker)
    assert trip.version == 2 and trip.rollback_to == 1
    assert trip.message.startswith("version 2 failed: 3 replica failures before any became ready")
    assert not only(actions, Claim) and not only(actions, Launch)


def test_breaker_without_a_good_version_fails_the_service_and_stops_launching() -> None:
    failing = [replica(i, S.FAILED_INITIAL_DELAY) for i in range(3)]
    actions = plan(state(failing), [], {}, NOW)
    assert only(actions, TripBreaker) == [TripBreaker(1, actions[-1].message, None)]
    # the next run sees the version FAILED: no launches, status FAILED, the failures cleaned up
    failed = version(1, VersionState.FAILED, state_message="version 1 failed: 3 replica failures")
    actions = plan(state([*failing, replica(3, S.STARTING)], [failed]), [instance(3)], {3: DOWN}, NOW)
    assert not only(actions, Claim) and not only(actions, Launch)
    assert terminated(actions) == {"i-3"}
    assert status_of(actions).status is ServiceStatus.FAILED
    assert "version 1 failed" in status_of(actions).message


def test_a_version_that_was_ready_never_trips_the_breaker() -> None:
    failing = [replica(i, S.PREEMPTED) for i in range(3)]
    current = state([*failing, replica(3)], [version(1, VersionState.READY, spec=spec(1))])
    assert not only(plan(current, [instance(3)], {3: OK}, NOW), TripBreaker)


def test_status_after_rollback_says_why() -> None:
    failed = version(2, VersionState.FAILED, state_message="version 2 failed: 3 replica failures")
    current = state([replica(0), replica(1)], [version(1, VersionState.READY), failed], target=1)
    status = status_of(plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW))
    assert status.status is ServiceStatus.READY
    assert status.message == "2/2 ready; rolled back to version 1: version 2 failed: 3 replica failures"


# --- delete and orphans ---------------------------------------------------------------------------


def test_delete_drains_every_replica_and_terminates_every_instance() -> None:
    stray = instance(7, instance_id="i-stray")
    current = state([replica(0), replica(1)], lifecycle=Lifecycle.DELETING, seq=9)
    actions = plan(current, [instance(0), instance(1), stray], {0: OK}, NOW)
    assert drained(actions) == {0, 1}
    assert terminated(actions) == {"i-0", "i-1", "i-stray"}
    assert not only(actions, DeleteService) and not only(actions, Claim)


def test_delete_removes_the_service_item_once_no_instance_remains() -> None:
    gone = instance(0, InstanceState.TERMINATED)
    current = state([replica(0, S.SHUTTING_DOWN)], lifecycle=Lifecycle.DELETING)
    assert plan(current, [gone], {}, NOW) == [DeleteService()]


def test_orphans_are_terminated_after_the_grace_period_only() -> None:
    old = instance(0, uid="dead", instance_id="i-old", launched_at=ago(3600))
    young = instance(1, uid="dead", instance_id="i-young", launched_at=ago(60))
    live = instance(2, instance_id="i-live", launched_at=ago(3600))
    gone = instance(3, uid="dead", instance_id="i-gone", state=InstanceState.TERMINATED, launched_at=ago(3600))
    orphans = plan_orphans({UID}, [old, young, live, gone], NOW)
    assert orphans is not None and orphans.instance_ids == ("i-old",)
    assert plan_orphans({UID, "dead"}, [old], NOW) is None


def test_plan_is_deterministic() -> None:
    current = rolling_state([replica(2, v=2)], [replica(0), replica(1)])
    insts = [instance(0), instance(1), instance(2)]
    probes = {0: OK, 1: OK, 2: OK}
    assert plan(current, insts, probes, NOW) == plan(replace(current), list(insts), dict(probes), NOW)


def test_an_unrecorded_launch_whose_instance_died_is_replaced_not_relaunched() -> None:
    dead = instance(0, InstanceState.TERMINATED, state_reason_code="Client.UserInitiatedShutdown")
    actions = plan(state([replica(0, S.PENDING), replica(1)]), [dead, instance(1)], {1: OK}, NOW)
    assert records(actions)[0].status is S.PREEMPTED and records(actions)[0].instance_id == "i-0"
    assert Launch(0, fresh=False) not in actions
    assert only(actions, Claim) == [Claim(1, (2,))]
