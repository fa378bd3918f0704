"""What one replica is now, from what was observed: which instances are fleetkeeper's
(`launched_by_fleetkeeper`) and whose (`match_instances`), adoption of an unrecorded launch, the probe's
verdict, the initial delay, a lost instance, and the duplicates no replica owns."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from fleetkeeper.model import (
    FailureCause,
    Lifecycle,
    ReplicaRecord,
    ReplicaStatus,
    ServiceState,
    from_iso,
    to_iso,
)
from fleetkeeper.reconciler.driver import Instance, InstanceState, client_token
from fleetkeeper.reconciler.plan.failures import (
    APP_EXITED,
    BOOT_FAILURES,
    ENVIRONMENT_TERMINATIONS,
    INITIAL_DELAY_EXCEEDED,
    INSTANCE_LOST,
    PROBE_FAILED,
    SPOT_RECLAIMED,
    termination_cause,
)
from fleetkeeper.reconciler.plan.lifecycle import GONE_STATES, LEAVING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence, Set
    from datetime import datetime

    from fleetkeeper.reconciler.plan.policy import Policy
    from fleetkeeper.reconciler.plan.work import _Work
    from fleetkeeper.spec.service import ReadinessProbe


@dataclass(frozen=True)
class ProbeResult:
    """One readiness probe: only HTTP 200 is `ok`. `detail` is deterministic text for messages.
    `boot_failure`: the code a replica's failed boot reported (failures.BOOT_FAILURES), if any.

    `answered`: False for a long probe still in flight when its run had no more time for it (no
    verdict: the replica is judged by a run of its own, a follow-up). `started_at`: when the probe was
    sent, when that was not the plan's `now` (a long probe planned in the run's second pass): a
    verdict is judged at the moment it was asked for, as SkyPilot judges its probes (probe_time)."""

    url: str
    ok: bool
    detail: str
    boot_failure: str | None = None
    answered: bool = True
    started_at: datetime | None = None
    http_status: int | None = None  # the answer's status, when the replica answered one (not 200)


_NOT_YET_RUNNING = frozenset({ReplicaStatus.PENDING, ReplicaStatus.PROVISIONING})
_BOOTING = frozenset({ReplicaStatus.PENDING, ReplicaStatus.PROVISIONING, ReplicaStatus.STARTING})


def observed(state: ServiceState) -> bool:
    """Whether this read of the service can be acted on (invariant 1).

    DynamoDB's Query is only read-committed against TransactWriteItems: a read may see the service
    item of a create or an update without the version item written in the same transaction. An
    ACTIVE service whose target version is not visible is not observed yet: nothing is planned for
    it (no FAILED, no status, no claims) and the next run reads it again. A DELETING service needs no
    version to be taken down.
    """
    return state.service.lifecycle is Lifecycle.DELETING or state.target is not None


def launched_by_fleetkeeper(instance: Instance) -> bool:
    """Whether fleetkeeper launched this instance for the replica its tags name (invariant 7).

    The tags alone do not say it: anyone allowed ec2:CreateTags can copy them onto any instance.
    fleetkeeper launches a replica only with a ClientToken it derives from the stack and the replica
    (`client_token(uid, replica_id, attempt, stack=...)`), so an instance is fleetkeeper's only when
    its token is one of those for the stack, uid and replica id it is tagged with. An instance a stack
    launched before stacks had ids has the token without a stack, and keeps it once its stack adopts
    it (fleetkeeper.reconciler.ownership). Any other is neither adopted nor terminated, by `plan` and
    by `plan_orphans` alike. Which stack's it is, is fleetkeeper.reconciler.ownership's question.
    """
    token = instance.client_token
    if not token or not instance.uid or instance.replica_id < 0:
        return False
    bases = [client_token(instance.uid, instance.replica_id)]
    if instance.stack:
        bases.insert(0, client_token(instance.uid, instance.replica_id, stack=instance.stack))
    for base in bases:
        if token == base:
            return True
        attempt = token.removeprefix(base + "-")
        if token.startswith(base + "-") and attempt.isascii() and attempt.isdigit() and attempt[0] != "0":
            return True
    return False


def is_live(instance: Instance) -> bool:
    return instance.state not in GONE_STATES


def _launch_order(instance: Instance) -> tuple[str, str]:
    return (instance.launched_at or "", instance.instance_id)


def match_instances(state: ServiceState, instances: Sequence[Instance]) -> dict[int, Instance]:
    """The one live instance each replica owns: its recorded instance, else the earliest with its tag."""
    by_replica: dict[int, list[Instance]] = {}
    for instance in instances:
        if instance.uid == state.service.uid and is_live(instance) and launched_by_fleetkeeper(instance):
            by_replica.setdefault(instance.replica_id, []).append(instance)
    matched: dict[int, Instance] = {}
    for replica_id, candidates in by_replica.items():
        record = state.replicas.get(replica_id)
        if record is None:
            continue
        recorded = [i for i in candidates if i.instance_id == record.instance_id]
        matched[replica_id] = recorded[0] if recorded else min(candidates, key=_launch_order)
    return matched


def _may_be_unseen(record: ReplicaRecord, described: Set[str], now: datetime, policy: Policy) -> bool:
    """Whether a leaving replica may still have an instance EC2 does not show yet.

    A claim is launched in the run that makes it; a run that dies (or loses the write) after
    RunInstances leaves the record without its instance id, and DescribeInstances lags RunInstances.
    Deleting the item then would leave the instance running with no replica to terminate it through
    (until the sweep of ids "no longer" claimed finds it), above the service's surge bound
    meanwhile. So the item stays until `lost_instance_grace` after its last write: by then the
    instance, if any, is visible, matched by its tag and terminated first.

    A recorded instance can be hidden the same way: launched and recorded, then chosen for removal
    before DescribeInstances lists it. While the answer lacks it altogether (`described`: the ids
    DescribeInstances listed, in any state) the item stays until `lost_instance_grace` after the
    launch. One listed as terminated is gone: its item goes at once.
    """
    if record.status not in LEAVING:
        return False
    if record.instance_id is None:
        since = _seconds_since(record.updated_at, now)
    elif record.instance_id not in described:
        since = _seconds_since(record.launched_at or record.updated_at, now)
    else:
        return False
    return since is not None and since < policy.lost_instance_grace.total_seconds()


def probe_targets(state: ServiceState, instances: Sequence[Instance]) -> dict[int, Instance]:
    """Replicas worth probing: not leaving, with a running instance (the shell resolves addresses)."""
    return {
        replica_id: instance
        for replica_id, instance in match_instances(state, instances).items()
        if instance.state is InstanceState.RUNNING and state.replicas[replica_id].status not in LEAVING
    }


def _seconds_since(moment: str | None, now: datetime) -> float | None:
    return None if moment is None else (now - from_iso(moment)).total_seconds()


def _observe(
    record: ReplicaRecord,
    instance: Instance | None,
    described: Instance | None,
    probe: ProbeResult | None,
    state: ServiceState,
    now: datetime,
    policy: Policy,
) -> ReplicaRecord:
    """The replica's next record given its instance (live, or as last described) and probe."""
    if record.status in LEAVING:
        return record
    if instance is None:
        return _without_instance(record, described, now, policy)
    if record.instance_id != instance.instance_id:
        # Adopt: launched by a run that crashed before recording it (or found by tag after a race).
        record = replace(
            record,
            instance_id=instance.instance_id,
            instance_type=instance.instance_type or record.instance_type,
            launched_at=record.launched_at or to_iso(now),
            status=ReplicaStatus.PROVISIONING,
            status_message="",
            failure_code=None,
            cause=None,
        )
    if probe is not None and not probe.answered:
        probe = None  # in flight when its run ran out of time: no verdict (a run of its own judges it)
    if probe is not None and probe.url != record.url:
        record = replace(record, url=probe.url)
    if instance.state is InstanceState.PENDING:
        if record.status in _NOT_YET_RUNNING:
            record = replace(record, status=ReplicaStatus.PROVISIONING)
        return _check_initial_delay(record, state, now, "instance still pending")
    if record.status in _NOT_YET_RUNNING:
        # Provisioned: the instance is running. The initial delay counts from here, as SkyPilot's counts
        # from its first probe once the cluster is up (replica_managers.py, first_not_ready_time).
        record = replace(record, status=ReplicaStatus.STARTING, probing_since=record.probing_since or to_iso(now))
    if instance.state in (InstanceState.STOPPING, InstanceState.STOPPED):
        probe = ProbeResult(url=record.url or "", ok=False, detail=f"instance is {instance.state.value}")
    if probe is None:
        # Running, but no verdict (no address yet, the probe phase ran out of time, a long probe still in
        # flight): nothing is judged. A replica that never gets one must still fail its initial delay, or
        # it would stay STARTING forever, never replaced and never counted by the breaker; a probe in
        # flight gets its timeout and `unanswered_grace` first, so it is never failed while it may answer.
        if record.status is ReplicaStatus.STARTING:
            grace = timedelta(seconds=_probe_of(record, state).timeout_seconds) + policy.unanswered_grace
            return _check_initial_delay(record, state, now, "never answered a readiness probe", grace)
        return record
    if probe.boot_failure in BOOT_FAILURES and record.status in _BOOTING:
        # The boot failed for the environment and said so (replica_boot.py): replaced at once, never
        # counted by the breaker, whatever the initial delay would have said.
        return replace(
            record,
            status=ReplicaStatus.FAILED_INITIAL_DELAY,
            status_message=f"the replica never started: {BOOT_FAILURES[probe.boot_failure]}",
            failure_code=probe.boot_failure,
            cause=FailureCause.ENVIRONMENT,
        )
    return _judged(record, probe, state, now)


def _without_instance(
    record: ReplicaRecord, described: Instance | None, now: datetime, policy: Policy
) -> ReplicaRecord:
    """The replica's next record when its instance is not live: not launched yet, not visible yet, or
    ended (as last described, with why)."""
    if record.instance_id is None:
        if described is None:
            return record  # claimed or refused, not launched: the launch step deals with it
        # Launched by a run that died before recording it, and the instance died too. A retry
        # under the same ClientToken would only return that dead instance: replace the replica.
        record = replace(record, instance_id=described.instance_id)
    if described is None:
        since = _seconds_since(record.launched_at, now)
        if since is not None and since < policy.lost_instance_grace.total_seconds():
            return record  # not visible yet: DescribeInstances lags RunInstances
        why, code = "is gone", INSTANCE_LOST
    else:
        reason = f" ({described.state_reason})" if described.state_reason else ""
        why, code = f"is {described.state.value}{reason}", described.state_reason_code or INSTANCE_LOST
    cause = termination_cause(code)
    if code == APP_EXITED:
        # The app itself ended (it crashed, or its `run` returned): say so, in its words.
        return replace(
            record,
            status=ReplicaStatus.FAILED,
            status_message=f"the replica's app ended by itself ({described.state_reason if described else why})",
            failure_code=code,
            cause=FailureCause.VERSION,
        )
    told = (
        SPOT_RECLAIMED
        if cause is FailureCause.SPOT_RECLAIM
        else ENVIRONMENT_TERMINATIONS.get(code, "terminated outside fleetkeeper")
    )
    return replace(
        record,
        status=ReplicaStatus.PREEMPTED,
        status_message=f"instance {record.instance_id} {why}: {told}",
        failure_code=code,
        cause=cause,
    )


def _judged(record: ReplicaRecord, probe: ProbeResult, state: ServiceState, now: datetime) -> ReplicaRecord:
    """The replica's next record given a probe verdict on its running instance."""
    # A verdict is judged at the moment it was asked for (a long probe planned later carries it).
    asked = probe.started_at or now
    if probe.ok:
        if record.status is ReplicaStatus.READY and record.probe_failures == 0 and record.failing_since is None:
            return record  # steady: nothing to write (last_probe_ok_at only moves on transitions)
        stamp = to_iso(now)
        return replace(
            record,
            status=ReplicaStatus.READY,
            status_message="",
            ready_at=record.ready_at if record.status is ReplicaStatus.READY else stamp,
            last_probe_ok_at=stamp,
            probe_failures=0,
            failing_since=None,
        )
    if record.status is ReplicaStatus.STARTING:
        said = f"{_probe_request(record, state)} → {probe.detail}"
        if probe.http_status == HTTP_NOT_FOUND:
            return _not_found_while_starting(record, state, asked, said)
        return _check_initial_delay(
            replace(record, status_message=f"not ready yet: probe {said}", probe_failures=0, failing_since=None),
            state,
            asked,
            f"last probe {said}",
        )
    # READY once: replaced only after a whole window of failed probes in a row (SkyPilot's consecutive
    # failure window, from the first failed probe to this one), probed every follow-up meanwhile.
    failures = record.probe_failures + 1
    failing_since = record.failing_since or to_iso(asked)
    failing_for = max(_seconds_since(failing_since, asked) or 0.0, 0.0)
    window = _probe_of(record, state).failure_window_seconds
    if failing_for >= window:
        return replace(
            record,
            status=ReplicaStatus.FAILED_PROBING,
            probe_failures=failures,
            failing_since=failing_since,
            status_message=(
                f"readiness probe failed for {int(failing_for)}s ({failures} probes in a row; the window is "
                f"{window}s): {probe.detail}"
            ),
            failure_code=PROBE_FAILED,
            cause=FailureCause.VERSION,
        )
    return replace(
        record,
        status=ReplicaStatus.NOT_READY,
        probe_failures=failures,
        failing_since=failing_since,
        status_message=f"readiness probe failing: {probe.detail}",
    )


# A STARTING replica whose probe path answers 404 in every probe for this long (and at least
# NOT_FOUND_PROBES probes) fails then, before its initial delay is over. SkyPilot waits the whole
# delay (1200 s by default) whatever the probe gets; but a 404 is an answer, not silence: the app is
# up and listening, and says the path is not one of its own, which waiting does not change (an app
# still loading refuses the connection, or answers 503). Any other answer in between starts the
# count again. fleetkeeper's own rule: docs/architecture/reconciler.md.
HTTP_NOT_FOUND = 404
NOT_FOUND_SECONDS = 30
NOT_FOUND_PROBES = 3


def _not_found_while_starting(record: ReplicaRecord, state: ServiceState, asked: datetime, said: str) -> ReplicaRecord:
    """A STARTING replica's probe answered 404: counted (probe_failures, failing_since: the run of 404s),
    failed once the run is long enough, else judged by its initial delay as any unready answer."""
    failures = record.probe_failures + 1
    since = record.failing_since or to_iso(asked)
    lasted = max(_seconds_since(since, asked) or 0.0, 0.0)
    if failures >= NOT_FOUND_PROBES and lasted >= NOT_FOUND_SECONDS:
        path = _probe_of(record, state).path
        return replace(
            record,
            status=ReplicaStatus.FAILED_INITIAL_DELAY,
            probe_failures=failures,
            failing_since=since,
            status_message=(
                f"probe {said} for {int(lasted)}s ({failures} probes in a row): the app answers, but {path} is not "
                "one of its paths; fix service.readiness_probe.path (or serve it)"
            ),
            failure_code=INITIAL_DELAY_EXCEEDED,
            cause=FailureCause.VERSION,
        )
    return _check_initial_delay(
        replace(record, status_message=f"not ready yet: probe {said}", probe_failures=failures, failing_since=since),
        state,
        asked,
        f"last probe {said}",
    )


def _probe_request(record: ReplicaRecord, state: ServiceState) -> str:
    probe = _probe_of(record, state)
    return f"{probe.method} {probe.path}"


def _probe_of(record: ReplicaRecord, state: ServiceState) -> ReadinessProbe:
    """The readiness probe a replica is judged by: its own version's (the target's if that is gone)."""
    from fleetkeeper.spec.service import ReadinessProbe

    version = state.versions.get(record.version) or state.target
    if version is None:
        return ReadinessProbe(path="/")  # SkyPilot's default probe, its failure window the default one
    return version.spec.service.readiness_probe


def initial_delay_origin(record: ReplicaRecord) -> str | None:
    """Where a replica's initial delay counts from: the end of its provisioning (the first run that saw
    its instance running), else, while it is still pending or for a record written before that was
    recorded, its launch."""
    return record.probing_since or record.launched_at


def _check_initial_delay(
    record: ReplicaRecord, state: ServiceState, at: datetime, detail: str, grace: timedelta = timedelta(0)
) -> ReplicaRecord:
    version = state.versions.get(record.version)
    since = _seconds_since(initial_delay_origin(record), at)
    if version is None or since is None:
        return record
    delay = version.spec.service.readiness_probe.initial_delay_seconds
    if since <= delay + grace.total_seconds():
        return record
    after = "provisioning" if record.probing_since else "launch"
    return replace(
        record,
        status=ReplicaStatus.FAILED_INITIAL_DELAY,
        status_message=f"not ready {delay}s after {after} ({detail})",
        failure_code=INITIAL_DELAY_EXCEEDED,
        cause=FailureCause.VERSION,
    )


def _terminate_strays(state: ServiceState, mine: Sequence[Instance], live: Mapping[int, Instance], work: _Work) -> None:
    """Live instances no replica owns: duplicates of a replica, or of a replica whose item is gone."""
    owned = {instance.instance_id for instance in live.values()}
    for instance in mine:
        if not is_live(instance) or instance.instance_id in owned:
            continue
        if instance.replica_id in state.replicas:
            work.terminate[instance.instance_id] = f"duplicate launch of replica {instance.replica_id}"
        elif 0 <= instance.replica_id < state.service.replica_seq:
            work.terminate[instance.instance_id] = f"replica {instance.replica_id} no longer exists"
