"""The reconciler's functional core: what to do about one service, given what was observed.

`plan(...)` is pure: no AWS, no clock, no I/O. It gets the service's records, the instances EC2
reports for its incarnation, the readiness probe results and `now`, and returns actions for the
shell to apply, in the order it must apply them. Everything it decides is derived from that input,
so two runs that observe the same world plan the same thing, and a run that observes a steady
world plans only a no-op (invariant 6).

Replica lifecycle (SkyPilot Serve's vocabulary, DESIGN.md):

    PENDING (claimed) -> PROVISIONING (launched) -> STARTING (running) -> READY (probe 200)
    READY -> NOT_READY (probe failing) -> FAILED_PROBING (failing `probe_failure_threshold` times)
    not READY by `initial_delay_seconds` after launch -> FAILED_INITIAL_DELAY
    launch refused by AWS -> FAILED_PROVISION (`refused`; retried in place, exponential backoff)
    instance terminated by AWS (spot reclaim) or outside fleetkeeper -> PREEMPTED
    the replica's app exited by itself (APP_EXITED, the process driver's code) -> FAILED
    chosen for removal -> SHUTTING_DOWN (recorded before the instance is terminated)

Failed and shutting-down replicas are replaced by new replica ids; their items are deleted once
their instance is gone, except the failures of a target version that has not yet been decided,
which the circuit breaker counts.

A failed replica carries typed facts: `failure_code` (the AWS error code of a refused launch, the
StateReason code of an ended instance, or fleetkeeper's own) and `cause` (whose fault: the version's,
the environment's, a spot reclaim), decided here from codes alone. The breaker counts by `cause`;
status messages are for people and are never read back.

The shell only observes and applies. What it records after a launch is decided here too: `launched`
and `refused` give the replica's next record, and `service_status` the status of the records as they
are once AWS refused launches the plan expected to go through.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from fleetkeeper import autoscale, wake
from fleetkeeper.model import (
    AutoscalerState,
    BalancerState,
    EndpointConfig,
    FailureCause,
    Interruption,
    InterruptionKind,
    Lifecycle,
    Market,
    ReplicaRecord,
    ReplicaStatus,
    ServiceState,
    ServiceStatus,
    VersionRecord,
    VersionState,
    from_iso,
    to_iso,
)
from fleetkeeper.reconciler import health_check
from fleetkeeper.reconciler.balancer import DrainState
from fleetkeeper.reconciler.driver import Instance, InstanceState, client_token

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence, Set

    from fleetkeeper.spec import MarketPolicy, ServiceSpec

# --- inputs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """One readiness probe: only HTTP 200 is `ok`. `detail` is deterministic text for messages."""

    url: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Policy:
    """The reconciler's knobs; the defaults are what the function runs with."""

    probe_failure_threshold: int = 3
    # Circuit breaker: this many replica failures of a version that never reached READY fail it.
    breaker_threshold: int = 3
    backoff_base: timedelta = timedelta(seconds=30)
    backoff_max: timedelta = timedelta(minutes=30)
    # A managed instance of no live service is terminated only when older than this: it covers a
    # service created (and its first replica launched) after this run listed the services.
    orphan_grace: timedelta = timedelta(minutes=10)
    # DescribeInstances is eventually consistent: a just-launched instance may be missing for a while.
    lost_instance_grace: timedelta = timedelta(minutes=5)
    # Claims per service per run, so one big service cannot use up a run's time budget.
    max_launches_per_run: int = 50
    # Capacity pools (instance type x subnet) one launch may try in a run before it backs off: enough
    # to go round three zones and on to the next instance type, few enough that a run in which EC2
    # has no capacity anywhere spends a bounded number of RunInstances calls on each replica.
    pools_per_run: int = 4
    # A spot instance is taken back this long after its interruption warning (EC2's two minutes).
    interruption_notice: timedelta = timedelta(minutes=2)
    # How much earlier than strictly needed a warned replica's drain starts: the run that drains it is
    # woken for that moment (a delayed kick, Reconciler.interrupt), and a woken run starts late by a
    # few seconds (the queue's delivery, a Lambda start). The schedule is the backstop.
    warning_margin: timedelta = timedelta(seconds=15)
    # Follow-ups (fleetkeeper.reconciler.followup): how often a service in motion (a replica booting
    # or probing, a drain, an instance going) is looked at again between two scheduled runs, and the
    # least time between two of its follow-ups.
    follow_up_interval: timedelta = timedelta(seconds=10)
    follow_up_min_gap: timedelta = timedelta(seconds=5)

    def backoff(self, attempts: int) -> timedelta:
        """Wait before launch attempt `attempts + 1`, after `attempts` refusals (30 s, 60 s, ... 30 min)."""
        factor: int = 2 ** max(attempts - 1, 0)
        wait: timedelta = min(self.backoff_base * factor, self.backoff_max)
        return wait


# --- actions ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordReplica:
    """Write `after` over `before` (conditioned on `before.rev`)."""

    before: ReplicaRecord
    after: ReplicaRecord


@dataclass(frozen=True)
class DeleteReplica:
    replica: ReplicaRecord


@dataclass(frozen=True)
class Terminate:
    """Terminate these instances; `reasons` pairs each instance id with why (for the log)."""

    reasons: tuple[tuple[str, str], ...]

    @property
    def instance_ids(self) -> tuple[str, ...]:
        return tuple(instance_id for instance_id, _ in self.reasons)


@dataclass(frozen=True)
class Claim:
    """Claim new replica ids for `version`: bump the service's replica_seq and put PENDING items.
    The ids in `spot` are bought as spot instances, the others on demand."""

    version: int
    replica_ids: tuple[int, ...]
    spot: tuple[int, ...] = ()

    def market(self, replica_id: int) -> Market:
        return Market.SPOT if replica_id in self.spot else Market.ON_DEMAND


@dataclass(frozen=True)
class Launch:
    """Start replica `replica_id`'s instance. `fresh`: claimed by this very plan, so never launched."""

    replica_id: int
    fresh: bool


@dataclass(frozen=True)
class MarkVersion:
    version: int
    expected: VersionState
    state: VersionState
    message: str = ""


@dataclass(frozen=True)
class TripBreaker:
    """Mark `version` FAILED and, when there is one, move the target back to `rollback_to`."""

    version: int
    message: str
    rollback_to: int | None

    @property
    def status_message(self) -> str:
        """What the rollback writes on the service at once, so a client waiting on the update sees why."""
        return f"rolling back to version {self.rollback_to}: {self.message}"


@dataclass(frozen=True)
class RecordStatus:
    status: ServiceStatus
    message: str
    observed_generation: int


@dataclass(frozen=True)
class DeleteService:
    """Every instance is gone: delete the DELETING service item (cleanup takes its children)."""


@dataclass(frozen=True)
class EnsureEndpoint:
    """Create the service's endpoint, or bring it to `config`, then record it on the service item.
    Planned before any replica is registered, and whenever the target version's spec changes it."""

    config: EndpointConfig


@dataclass(frozen=True)
class Register:
    """Put these replicas into the endpoint (their records say REGISTERING), then record each
    REGISTERED (`registered`)."""

    replica_ids: tuple[int, ...]


@dataclass(frozen=True)
class Deregister:
    """Take these replicas out of the endpoint. Their records say DRAINING already (written first),
    or their items are about to be deleted; their instances are terminated in a later run, once
    drained or past the drain deadline."""

    replica_ids: tuple[int, ...]


@dataclass(frozen=True)
class RecordAutoscale:
    """Write the service's autoscaler state `after` over `before` (conditioned on `before`'s revision).
    Planned first: the replicas the rest of the plan aims at are `after`'s target, so a run that
    dies before the write decides again from `before`, and one that dies after it goes on from
    `after`; either way the decision is the one the table's state and the rate give."""

    before: AutoscalerState | None
    after: AutoscalerState | None


@dataclass(frozen=True)
class RouteEndpoint:
    """Point the endpoint's route at the stack's wake target (`waking`: an autoscaled service with no
    replica in its endpoint, fleetkeeper.wake) or back at its target group, then record which.
    Planned after the registrations and deregistrations: the route returns to the wake target only
    once the last replica is out, and leaves it only once the balancer serves a registered one."""

    waking: bool


@dataclass(frozen=True)
class RemoveEndpoint:
    """A deleted service's last instance is gone: delete its endpoint before the service item."""


Action = (
    RecordReplica
    | DeleteReplica
    | Terminate
    | Claim
    | Launch
    | MarkVersion
    | TripBreaker
    | RecordStatus
    | DeleteService
    | EnsureEndpoint
    | Register
    | Deregister
    | RouteEndpoint
    | RemoveEndpoint
    | RecordAutoscale
)

# --- vocabulary -------------------------------------------------------------------------------------

GONE_STATES = frozenset({InstanceState.SHUTTING_DOWN, InstanceState.TERMINATED})
# Replicas on their way out: never probed, never counted toward the target, replaced.
LEAVING = frozenset(
    {
        ReplicaStatus.SHUTTING_DOWN,
        ReplicaStatus.FAILED_INITIAL_DELAY,
        ReplicaStatus.FAILED_PROBING,
        ReplicaStatus.PREEMPTED,
        ReplicaStatus.FAILED,
    }
)
_NOT_YET_RUNNING = frozenset({ReplicaStatus.PENDING, ReplicaStatus.PROVISIONING})
_BOOTING = frozenset({ReplicaStatus.PENDING, ReplicaStatus.PROVISIONING, ReplicaStatus.STARTING})
_MESSAGE_PROBLEMS = 3


# --- failure facts: whose fault a failure is, from codes (never from messages) -------------------------

# fleetkeeper's own failure codes, for failures no AWS code describes. All count against the version.
NOT_IN_USE = "Target.NotInUse"  # a READY replica the load balancer took but sends nothing (a zone it lacks)
PROBE_FAILED = "Fleetkeeper.ProbeFailed"  # FAILED_PROBING: `probe_failure_threshold` failed probes
INITIAL_DELAY_EXCEEDED = "Fleetkeeper.InitialDelayExceeded"  # FAILED_INITIAL_DELAY
# PREEMPTED: the instance ended with no state reason, or DescribeInstances stopped listing it.
INSTANCE_LOST = "Fleetkeeper.InstanceLost"
# FAILED: the replica's app exited by itself (the process driver's state reason code). A crash of the
# app, the version's fault; not a preemption.
APP_EXITED = "Fleetkeeper.ProcessExited"

# RunInstances refusals that say nothing about the version: the zone is out of capacity or does not
# offer the instance type (the next attempt goes to the next subnet), the account is at a limit, or
# EC2 is having a moment. They are retried with backoff (the status message says why) and never
# count toward the circuit breaker: a capacity blip must not fail a good version. Any other refusal
# (a missing AMI, a bad parameter, a denied permission) is the version's.
ENVIRONMENT_REFUSALS = frozenset(
    {
        "Unsupported",
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientFreeAddressesInSubnet",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "UnfulfillableCapacity",
        "RequestLimitExceeded",
        "ThrottlingException",
        "Throttling",
        "ServiceUnavailable",
        "Unavailable",
        "InternalError",
        # The first spot launch of an account needs EC2's spot service-linked role; the stack may
        # create it (template.yaml, SpotServiceLinkedRole), and an account whose SCP forbids that
        # needs an administrator to create it once: the account's fault, never the version's.
        "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
        # A retried launch's ClientToken names an instance that has ended, or a request with other
        # parameters: about that token, not the version (the next attempt carries a new token).
        "IdempotentInstanceTerminated",
        "IdempotentParameterMismatch",
        # The process driver's (embedded mode): the laptop ran out of ports or could not start bash.
        "NoFreePort",
        "ProcessLaunchFailed",
        # The ec2 driver's (fleetkeeper.identity.PROFILE_NOT_READY): an owner's instance profile made
        # seconds ago, which EC2 refuses until IAM has propagated it.
        "Fleetkeeper.InstanceProfileNotReady",
        # ...and for an owner's role IAM would not make (denied, or the account's role quota is full).
        "Fleetkeeper.IdentityUnavailable",
        # The ec2 driver's (drivers/ec2.py NO_SERVED_ZONE): no replica subnet is in a zone the
        # stack's load balancer covers; the stack's parameters must change, not the version.
        "Fleetkeeper.NoSubnetInLoadBalancerZones",
    }
)
# StateReason codes of an instance AWS took back because it was spot. Only these make a preemption a
# spot reclaim: an instance that merely *was* spot and ended for another reason is not one.
SPOT_RECLAIMS = frozenset({"Server.SpotInstanceTermination"})
# How a spot reclaim's status message ends (for people; the breaker reads `cause`).
SPOT_RECLAIMED = "spot instance reclaimed by AWS"


def refusal_cause(code: str) -> FailureCause:
    """Whose fault a refused launch is, from the refusal's error code."""
    return FailureCause.ENVIRONMENT if code in ENVIRONMENT_REFUSALS else FailureCause.VERSION


def termination_cause(code: str) -> FailureCause:
    """Whose fault an instance's end is, from its state reason code: a spot reclaim; `Server.*` (AWS
    ended it: an internal error, no capacity at launch, a retirement) is the environment's; `Client.*`
    (shut down from inside, through the API, a bad volume or snapshot), a driver's own code (the
    process driver's: the app exited) and fleetkeeper's own are the version's."""
    if code in SPOT_RECLAIMS:
        return FailureCause.SPOT_RECLAIM
    if code.startswith("Server."):
        return FailureCause.ENVIRONMENT
    return FailureCause.VERSION


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


def drain_targets(state: ServiceState, instances: Sequence[Instance]) -> dict[int, Instance]:
    """Replicas whose drain the balancer must report on: DRAINING, with a live instance."""
    return {
        replica_id: instance
        for replica_id, instance in match_instances(state, instances).items()
        if state.replicas[replica_id].balancer is BalancerState.DRAINING
    }


def endpoint_config(spec: ServiceSpec, serving: Iterable[ServiceSpec] = ()) -> EndpointConfig:
    """What the endpoint is configured with: the target version's spec, and the health check every
    target in it passes (`serving`: the specs of the versions registered in it once this run's
    registrations and deregistrations are made; none: the target version's own check).

    A version's own health check applies only while the endpoint holds that version's targets
    alone; mid-rollout it is the fallback both versions pass (fleetkeeper.reconciler.health_check).
    """
    check = health_check.shared_check(
        health_check.alb_check(s.service.readiness_probe, s.envs) for s in serving
    ) or health_check.alb_check(spec.service.readiness_probe, spec.envs)
    return EndpointConfig(
        port=spec.port,
        policy=spec.load_balancing_policy,
        drain_seconds=spec.drain_seconds,
        health_path=check.path,
        health_codes=check.codes,
        health_timeout_seconds=check.timeout_seconds,
        health_interval_seconds=check.interval_seconds,
    )


def wanted_replicas(state: ServiceState) -> int:
    """The replicas the target version should run: the autoscaled target (the service item's
    autoscaler state, within the policy's bounds) when it autoscales, else the spec's count."""
    target = state.target
    if target is None:
        return 0
    policy = autoscale.policy_of(target.spec)
    if policy is None:
        return target.spec.target_replicas
    return autoscale.current_target(policy, state.service.autoscaler)


def plan_autoscale(state: ServiceState, request_rate: float | None, now: datetime) -> RecordAutoscale | None:
    """The autoscaler's decision for an ACTIVE service, as the write it needs (None: nothing changes).

    A target version that does not autoscale drops a state left from one that did (written once),
    so turning autoscaling on again starts from the policy's minimum and a fresh window.
    """
    service = state.service
    if service.lifecycle is not Lifecycle.ACTIVE or state.target is None:
        return None
    policy = autoscale.policy_of(state.target.spec)
    before = service.autoscaler
    if policy is None:
        return RecordAutoscale(before, None) if before is not None else None
    # Requests the endpoint's wake target answered (no replica served them, so the load balancer's
    # metric did not count them) are demand too: without them a service at zero never wakes.
    endpoint = service.endpoint
    waking_since = endpoint.waking_since if endpoint is not None else None
    rate = wake.demand_rate(request_rate, service.wake_at, waking_since, now)
    after = autoscale.decide(policy, before, rate, now)
    return None if after is before else RecordAutoscale(before, after)


def registered(record: ReplicaRecord, now: datetime, unused: str | None = None) -> ReplicaRecord:
    """The record of a replica the shell just registered with the endpoint (after `Register`).

    `unused`: why the balancer took it but will send it no request (`Target.NotInUse`); the replica
    stays READY and registered, and its message (and the service's) says that it serves nothing."""
    message = f"{NOT_IN_USE}: registered, but the load balancer sends it no requests ({unused})" if unused else ""
    return replace(
        record,
        balancer=BalancerState.REGISTERED,
        drain_started_at=None,
        updated_at=to_iso(now),
        status_message=message,
    )


# --- observation: one replica -----------------------------------------------------------------------


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
        told = SPOT_RECLAIMED if cause is FailureCause.SPOT_RECLAIM else "terminated outside fleetkeeper"
        return replace(
            record,
            status=ReplicaStatus.PREEMPTED,
            status_message=f"instance {record.instance_id} {why}: {told}",
            failure_code=code,
            cause=cause,
        )
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
    if probe is not None and probe.url != record.url:
        record = replace(record, url=probe.url)
    if instance.state is InstanceState.PENDING:
        if record.status in _NOT_YET_RUNNING:
            record = replace(record, status=ReplicaStatus.PROVISIONING)
        return _check_initial_delay(record, state, now, "instance still pending")
    if instance.state in (InstanceState.STOPPING, InstanceState.STOPPED):
        probe = ProbeResult(url=record.url or "", ok=False, detail=f"instance is {instance.state.value}")
    if probe is None:
        # Running, but not probed (no address yet, or the probe phase ran out of time): no verdict.
        # A replica that never gets one must still fail its initial delay, or it would stay
        # STARTING forever, never replaced and never counted by the breaker.
        if record.status in _BOOTING:
            booting = replace(record, status=ReplicaStatus.STARTING) if record.status in _NOT_YET_RUNNING else record
            return _check_initial_delay(booting, state, now, "never answered a readiness probe")
        return record
    if probe.ok:
        if record.status is ReplicaStatus.READY and record.probe_failures == 0:
            return record  # steady: nothing to write (last_probe_ok_at only moves on transitions)
        stamp = to_iso(now)
        return replace(
            record,
            status=ReplicaStatus.READY,
            status_message="",
            ready_at=record.ready_at if record.status is ReplicaStatus.READY else stamp,
            last_probe_ok_at=stamp,
            probe_failures=0,
        )
    if record.status in _BOOTING:
        return _check_initial_delay(
            replace(record, status=ReplicaStatus.STARTING, status_message=f"not ready yet: {probe.detail}"),
            state,
            now,
            f"last probe: {probe.detail}",
        )
    failures = record.probe_failures + 1
    if failures >= policy.probe_failure_threshold:
        return replace(
            record,
            status=ReplicaStatus.FAILED_PROBING,
            probe_failures=failures,
            status_message=f"readiness probe failed {failures} times in a row: {probe.detail}",
            failure_code=PROBE_FAILED,
            cause=FailureCause.VERSION,
        )
    return replace(
        record,
        status=ReplicaStatus.NOT_READY,
        probe_failures=failures,
        status_message=f"readiness probe failing: {probe.detail}",
    )


def _check_initial_delay(record: ReplicaRecord, state: ServiceState, now: datetime, detail: str) -> ReplicaRecord:
    version = state.versions.get(record.version)
    since = _seconds_since(record.launched_at, now)
    if version is None or since is None:
        return record
    delay = version.spec.service.readiness_probe.initial_delay_seconds
    if since <= delay:
        return record
    return replace(
        record,
        status=ReplicaStatus.FAILED_INITIAL_DELAY,
        status_message=f"not ready {delay}s after launch ({detail})",
        failure_code=INITIAL_DELAY_EXCEEDED,
        cause=FailureCause.VERSION,
    )


# --- the plan ---------------------------------------------------------------------------------------


@dataclass
class _Work:
    """What one plan accumulates before it is put in apply order."""

    original: Mapping[int, ReplicaRecord]
    replicas: dict[int, ReplicaRecord]
    terminate: dict[str, str]
    delete: list[ReplicaRecord]
    claimed: list[ReplicaRecord]

    def drain(self, replica_id: int, why: str, live: Mapping[int, Instance]) -> None:
        record = self.replicas[replica_id]
        self.replicas[replica_id] = replace(
            record, status=ReplicaStatus.SHUTTING_DOWN, status_message=why, failure_code=None, cause=None
        )
        if replica_id in live:
            self.terminate[live[replica_id].instance_id] = f"replica {replica_id}: {why}"

    def replica_actions(self, now: datetime) -> list[Action]:
        actions: list[Action] = []
        deleted = {record.replica_id for record in self.delete}
        for replica_id, after in sorted(self.replicas.items()):
            before = self.original.get(replica_id)
            if replica_id in deleted:
                continue
            if before is not None and after != before:
                actions.append(RecordReplica(before, replace(after, updated_at=to_iso(now))))
        return actions

    def current(self) -> list[ReplicaRecord]:
        """Every replica as it will be once the plan is applied: deleted ones gone, claimed ones in."""
        deleted = {record.replica_id for record in self.delete}
        return [r for rid, r in sorted(self.replicas.items()) if rid not in deleted] + self.claimed

    def cleanup_actions(self) -> list[Action]:
        actions: list[Action] = []
        if self.terminate:
            actions.append(Terminate(tuple(sorted(self.terminate.items()))))
        actions.extend(DeleteReplica(record) for record in self.delete)
        return actions


def plan(
    state: ServiceState,
    instances: Sequence[Instance],
    probes: Mapping[int, ProbeResult],
    now: datetime,
    policy: Policy | None = None,
    *,
    balanced: bool = False,
    drains: Mapping[int, DrainState] | None = None,
    request_rate: float | None = None,
    balancer_serves: bool | None = None,
) -> list[Action]:
    """The actions that move one service toward its target, in apply order.

    `instances`: what EC2 reports for this service's uid (any state). `probes`: by replica id, for
    the replicas that were probed. `balanced`: the stack gives services an endpoint (a load
    balancer); `drains`: by replica id, what the balancer reported for the DRAINING replicas
    (`drain_targets`); `request_rate`: the service's requests a second over the last metric window
    (None: no reading this run); `balancer_serves`: while the endpoint routes to the wake target, whether
    the balancer would send a request to one of the service's registered replicas now (the ALB: one
    healthy; None: not asked). Order: the autoscaler's state (the target the rest aims at), the
    endpoint (created before anything is registered), replica records
    (a draining replica leaves READY, and leaves the endpoint, before its instance goes),
    registrations and deregistrations, version marks / breaker, terminations, item deletions, claims
    and launches, and the service status last, so a run that dies midway never records a status it
    did not reach. A service that is not `observed` (its target version not visible yet) gets no
    action at all.
    """
    policy = policy or Policy()
    if not observed(state):
        return []  # half a transaction: the target version is not visible yet
    scaling = plan_autoscale(state, request_rate, now)
    if scaling is not None:
        state = replace(state, service=replace(state.service, autoscaler=scaling.after))
    head: list[Action] = [scaling] if scaling is not None else []
    service = state.service
    mine = [i for i in instances if i.uid == service.uid and launched_by_fleetkeeper(i)]
    described = {i.instance_id: i for i in mine}
    live = match_instances(state, mine)
    work = _Work(original=state.replicas, replicas={}, terminate={}, delete=[], claimed=[])

    _terminate_strays(state, mine, live, work)
    # The latest dead instance of each replica id (a launch that was never recorded may have died).
    dead = {i.replica_id: i for i in sorted(mine, key=_launch_order) if not is_live(i)}
    for replica_id, record in state.replicas.items():
        seen = described.get(record.instance_id) if record.instance_id else dead.get(replica_id)
        work.replicas[replica_id] = _observe(
            record, live.get(replica_id), seen, probes.get(replica_id), state, now, policy
        )

    # Failed and shutting-down replicas lose their instance (again, if a run died before it could).
    for replica_id, record in work.replicas.items():
        if record.status in LEAVING and replica_id in live:
            work.terminate[live[replica_id].instance_id] = f"replica {replica_id}: {record.status.value}"

    balance = _Balance(balanced=balanced, drains=drains or {}, serves=balancer_serves)
    if service.lifecycle is Lifecycle.DELETING:
        return _plan_delete(state, mine, live, work, now, balance)

    versions = {number: record.state for number, record in state.versions.items()}
    marks: list[Action] = []
    for number in sorted({r.version for r in work.replicas.values() if r.status is ReplicaStatus.READY}):
        if versions.get(number) is VersionState.NEW:
            marks.append(MarkVersion(number, VersionState.NEW, VersionState.READY))
            versions[number] = VersionState.READY

    tripped = _circuit_breaker(state, work, versions, policy)
    if tripped is not None:
        # The target moves (or the service fails): the next run plans against the new target.
        ensure, moves = balance.plan(state, live, work, now)
        return [*head, *ensure, *work.replica_actions(now), *moves, *marks, tripped, *work.cleanup_actions()]

    launches = _plan_replicas(state, live, work, versions, now, policy, described.keys())
    ensure, moves = balance.plan(state, live, work, now)
    status = service_status(state, work.current(), versions, set(live))
    actions: list[Action] = [
        *head,
        *ensure,
        *work.replica_actions(now),
        *moves,
        *marks,
        *work.cleanup_actions(),
        *launches,
    ]
    if status_changed(state, status):
        actions.append(status)
    return actions


def refused(
    record: ReplicaRecord, refusal_code: str, message: str, now: datetime, policy: Policy, *, tried: int = 1
) -> ReplicaRecord:
    """The record of a replica whose launch AWS refused in every pool this run tried (`tried` attempts,
    each its own pool and ClientToken; the shell writes it on LaunchRefused).

    FAILED_PROVISION with the last refusal's code and whose fault it is, retried in place (from the next
    pool) once a backoff that doubles with each refused run has passed (`plan` launches it again then).
    """
    runs = record.refused_runs + 1
    cause = refusal_cause(refusal_code)
    return replace(
        record,
        status=ReplicaStatus.FAILED_PROVISION,
        status_message=f"{refusal_code}: {message}",
        failure_code=refusal_code,
        cause=cause,
        launch_attempts=record.launch_attempts + tried,
        refused_runs=runs,
        version_refusals=record.version_refusals + (1 if cause is FailureCause.VERSION else 0),
        next_attempt_at=to_iso(now + policy.backoff(runs)),
        updated_at=to_iso(now),
    )


def launched(
    record: ReplicaRecord, instance_id: str, now: datetime, *, instance_type: str | None = None, tried: int = 0
) -> ReplicaRecord:
    """The record of a replica whose instance was just launched (as `instance_type`, after `tried`
    refused attempts in this run), or found by tag: PROVISIONING."""
    stamp = to_iso(now)
    return replace(
        record,
        instance_id=instance_id,
        instance_type=instance_type or record.instance_type,
        status=ReplicaStatus.PROVISIONING,
        status_message="",
        failure_code=None,
        cause=None,
        launch_attempts=record.launch_attempts + tried,
        launched_at=stamp,
        next_attempt_at=None,
        updated_at=stamp,
    )


def warned(record: ReplicaRecord, interruption: Interruption) -> ReplicaRecord | None:
    """The record of a replica whose instance AWS warned about, or None: nothing to record (another
    instance's warning, a replica already leaving, or the same or a weaker warning recorded already)."""
    if record.status in LEAVING or record.instance_id not in (None, interruption.instance_id):
        return None
    known = record.interruption
    # A rebalance recommendation after the interruption warning adds nothing.
    stronger = known is not None and known.kind in (interruption.kind, InterruptionKind.SPOT_INTERRUPTION)
    if known is not None and known.instance_id == interruption.instance_id and stronger:
        return None
    return replace(record, interruption=interruption)


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
        # An id at or past replica_seq was claimed after this run read the service: leave it.


def _plan_delete(
    state: ServiceState,
    mine: Sequence[Instance],
    live: Mapping[int, Instance],
    work: _Work,
    now: datetime,
    balance: _Balance,
) -> list[Action]:
    for replica_id, record in work.replicas.items():
        if record.status is not ReplicaStatus.SHUTTING_DOWN:
            work.drain(replica_id, "service is being deleted", live)
    remaining = [i for i in mine if is_live(i)]
    for instance in remaining:
        work.terminate.setdefault(instance.instance_id, "service is being deleted")
    ensure, moves = balance.plan(state, live, work, now)
    actions: list[Action] = [*ensure, *work.replica_actions(now), *moves, *work.cleanup_actions()]
    service = state.service
    if not remaining:
        # The endpoint goes before the service item: once the item is gone nothing would remove it.
        if balance.balanced:
            actions.append(RemoveEndpoint())
        actions.append(DeleteService())
    else:
        draining = len(remaining) - len(work.terminate.keys() & {i.instance_id for i in remaining})
        message = f"deleting: terminating {len(remaining)} instance(s)"
        if draining:
            message = f"deleting: draining {draining} replica(s), terminating {len(remaining) - draining} instance(s)"
        if (service.status, service.status_message) != (ServiceStatus.SHUTTING_DOWN, message):
            actions.append(RecordStatus(ServiceStatus.SHUTTING_DOWN, message, service.generation))
    return actions


@dataclass(frozen=True)
class _Balance:
    """The endpoint's part of a plan: create it, keep exactly the serving replicas registered, and
    hold a leaving replica's termination until its drain is over."""

    balanced: bool
    drains: Mapping[int, DrainState]
    serves: bool | None = None

    def plan(
        self, state: ServiceState, live: Mapping[int, Instance], work: _Work, now: datetime
    ) -> tuple[list[Action], list[Action]]:
        """(EnsureEndpoint, planned before the records), (Register, Deregister, planned after them).

        A replica serves (is registered) while the service is ACTIVE, the replica READY and its
        instance running. One that stops serving is recorded DRAINING and deregistered in the same
        run; its instance is terminated only once the balancer reports it drained, or
        `drain_seconds` after its drain began. Updates `work`: the records' balancer states, and the
        terminations held back.
        """
        if not self.balanced:
            return [], []
        service = state.service
        active = service.lifecycle is Lifecycle.ACTIVE
        endpoint = service.endpoint
        drain_seconds = endpoint.config.drain_seconds if endpoint is not None else 0
        deleted = {record.replica_id for record in work.delete}
        register: list[int] = []
        deregister: list[int] = []
        stamp = to_iso(now)
        in_endpoint = (BalancerState.REGISTERING, BalancerState.REGISTERED)
        for replica_id, record in sorted(work.replicas.items()):
            current = record.balancer
            instance = live.get(replica_id)
            if replica_id in deleted:
                if current in in_endpoint:
                    deregister.append(replica_id)  # its instance is gone: nothing to drain
                continue
            running = instance is not None and instance.state is InstanceState.RUNNING
            if active and record.status is ReplicaStatus.READY and running:
                if current is not BalancerState.REGISTERED:
                    if current is not BalancerState.REGISTERING:
                        work.replicas[replica_id] = replace(
                            record, balancer=BalancerState.REGISTERING, drain_started_at=None
                        )
                    register.append(replica_id)
                continue
            hold = False
            if current in in_endpoint:
                work.replicas[replica_id] = replace(record, balancer=BalancerState.DRAINING, drain_started_at=stamp)
                deregister.append(replica_id)
                hold = True
            elif current is BalancerState.DRAINING and instance is not None:
                seen = self.drains.get(replica_id)
                if seen is DrainState.IN_SERVICE:
                    # The deregistration was lost (a run died before making it): again, and the
                    # drain starts over from now.
                    work.replicas[replica_id] = replace(record, drain_started_at=stamp)
                    deregister.append(replica_id)
                    hold = True
                else:
                    since = _seconds_since(record.drain_started_at, now)
                    hold = seen is not DrainState.DRAINED and since is not None and since < drain_seconds
                    if not hold and record.status not in LEAVING:
                        # Drained and staying (NOT_READY, say): nothing more to ask the balancer.
                        work.replicas[replica_id] = replace(record, balancer=None, drain_started_at=None)
            if hold and instance is not None:
                work.terminate.pop(instance.instance_id, None)
        ensure: list[Action] = []
        if active and state.target is not None:
            # After the loop: the health check follows the versions the endpoint holds once this
            # run's moves are made (ensured first, so a new version's target is checked with the
            # shared check from its registration on, and the old ones keep passing).
            serving = sorted(
                {
                    record.version
                    for replica_id, record in work.replicas.items()
                    if record.balancer in in_endpoint and replica_id not in deleted
                }
            )
            specs = [state.versions[v].spec for v in serving if v in state.versions]
            config = endpoint_config(state.target.spec, specs)
            if endpoint is None or endpoint.config != config:
                ensure.append(EnsureEndpoint(config))
        moves: list[Action] = []
        if register:
            moves.append(Register(tuple(register)))
        if deregister:
            moves.append(Deregister(tuple(deregister)))
        route = self._route(state, work, endpoint is not None or bool(ensure))
        if route is not None:
            moves.append(route)
        return ensure, moves

    def _route(self, state: ServiceState, work: _Work, has_endpoint: bool) -> RouteEndpoint | None:
        """Wake target or target group. To the wake target once an ACTIVE autoscaled service has no
        replica in its endpoint (after this run's deregistrations); back to the target group once a
        replica registered by an earlier run is one the balancer sends requests to (`serves`: the
        ALB answers 503 itself while its only targets are still in their first health checks, and
        the wake target's 503 says when to retry). A change only: a steady service plans nothing."""
        service = state.service
        if not has_endpoint or service.lifecycle is not Lifecycle.ACTIVE or state.target is None:
            return None
        in_endpoint = any(
            record.balancer in (BalancerState.REGISTERING, BalancerState.REGISTERED)
            for record in work.replicas.values()
        )
        recorded = service.endpoint.waking if service.endpoint is not None else False
        if autoscale.policy_of(state.target.spec) is None:
            waking = False
        elif recorded:
            # A replica registered by an earlier run that stays in the endpoint, and the balancer serves.
            stays = any(
                work.replicas.get(replica_id, record).balancer is BalancerState.REGISTERED
                for replica_id, record in state.replicas.items()
                if record.balancer is BalancerState.REGISTERED and replica_id not in {r.replica_id for r in work.delete}
            )
            waking = not (self.serves and stays)
        else:
            waking = not in_endpoint
        return RouteEndpoint(waking) if waking != recorded else None


def has_registered(state: ServiceState) -> bool:
    """Some replica is recorded REGISTERED (by an earlier run): what the shell asks the balancer
    about while the endpoint routes to the wake target."""
    return any(record.balancer is BalancerState.REGISTERED for record in state.replicas.values())


def _failures(records: Sequence[ReplicaRecord]) -> int:
    """Failures of a version for the breaker: the refusals of its launches that were the version's
    (`version_refusals`: never the capacity refusals of a walk over the pools), and replicas that
    failed once running when their cause is the version's. A replica that got past its refusals no
    longer counts them."""
    refused = sum(r.version_refusals for r in records if r.status is ReplicaStatus.FAILED_PROVISION)
    running = [r for r in records if r.status.failed and r.status is not ReplicaStatus.FAILED_PROVISION]
    return refused + sum(1 for r in running if r.cause is not None and r.cause.counts_toward_breaker)


def _circuit_breaker(
    state: ServiceState, work: _Work, versions: Mapping[int, VersionState], policy: Policy
) -> TripBreaker | None:
    """ECS-style deployment circuit breaker: a target version that keeps failing is given up on."""
    target = state.service.target_version
    if versions.get(target) is not VersionState.NEW:
        return None  # READY once (failures are then ordinary replacements) or already FAILED
    mine = [r for r in work.replicas.values() if r.version == target]
    failures = _failures(mine)
    if failures < policy.breaker_threshold:
        return None
    # The failure seen last: one that happened in this very run, else the most recently recorded.
    last = max(
        (r for r in mine if r.status.failed),
        key=lambda r: (r != work.original.get(r.replica_id), r.updated_at, r.replica_id),
        default=None,
    )
    last_text = f"; last: {_describe(last)}" if last else ""
    # Back to the version that was serving: the one the READY replicas of other versions run (a
    # user who rolled back from v2 to v1 must not land on v2 again), else the newest READY one.
    serving = {
        r.version
        for r in work.replicas.values()
        if r.version != target and r.status is ReplicaStatus.READY and versions.get(r.version) is VersionState.READY
    }
    candidates = serving or {n for n, s in versions.items() if s is VersionState.READY and n != target}
    good = max(candidates, default=None)
    message = f"version {target} failed: {failures} replica failures before any became ready{last_text}"
    return TripBreaker(version=target, message=message, rollback_to=good)


def _removal_order(record: ReplicaRecord) -> tuple[bool, int]:
    """Which replicas go first when there are too many: not-ready ones, then the newest."""
    return (record.status is ReplicaStatus.READY, -record.replica_id)


def _plan_replicas(
    state: ServiceState,
    live: Mapping[int, Instance],
    work: _Work,
    versions: Mapping[int, VersionState],
    now: datetime,
    policy: Policy,
    described: Set[str],
) -> list[Action]:
    """Scale, roll and replace: drains go into `work`, claims and launches are returned. `described`:
    the ids of the service's instances DescribeInstances listed, in any state."""
    service = state.service
    target_number = service.target_version
    target = state.target
    target_failed = target is None or versions.get(target_number) is VersionState.FAILED
    wanted = 0 if target is None or target_failed else wanted_replicas(state)

    def retrying(record: ReplicaRecord) -> bool:
        """A refused launch of the live target is retried in place; any other refusal is dropped."""
        return record.version == target_number and not target_failed

    def holds_slot(record: ReplicaRecord) -> bool:
        if record.interruption is not None:
            return False  # warned by AWS: replaced at once (_plan_warned)
        if record.status is ReplicaStatus.FAILED_PROVISION:
            return retrying(record)
        return record.status not in LEAVING

    # Items whose replica is over and whose instance is gone. The target's failures stay while the
    # circuit breaker may still need to count them (the version is neither READY nor FAILED yet).
    for replica_id, before in sorted(work.original.items()):
        refused = before.status is ReplicaStatus.FAILED_PROVISION
        over = before.status in LEAVING or (refused and not retrying(before))
        counted = before.status.failed and before.version == target_number
        counted = counted and versions.get(target_number) is VersionState.NEW
        if over and replica_id not in live and not counted and not _may_be_unseen(before, described, now, policy):
            work.delete.append(before)

    _plan_warned(work, live, target, wanted, now, policy)
    new = [r for r in work.replicas.values() if holds_slot(r) and r.version == target_number]
    old = [r for r in work.replicas.values() if holds_slot(r) and r.version != target_number]

    markets = target.spec.markets if target is not None else None
    spot_ready = sum(1 for r in new if r.market is Market.SPOT and r.status is ReplicaStatus.READY)
    wanted_by = wanted_by_market(markets, wanted, spot_ready)
    for market in (Market.SPOT, Market.ON_DEMAND):
        bought = [r for r in new if r.market is market]
        if len(bought) <= wanted_by[market]:
            continue
        if target_failed:
            why = f"version {target_number} FAILED"
        elif market is Market.ON_DEMAND and markets is not None and markets.dynamic_fallback and spot_ready:
            why = f"on-demand fallback retired: {spot_ready} spot replica(s) READY"
        else:
            why = f"scaling down to {wanted}"
        excess = sorted(bought, key=_removal_order)[: len(bought) - wanted_by[market]]
        for record in excess:
            work.drain(record.replica_id, why, live)
        new = [r for r in new if r not in excess]

    ready_new = sum(1 for r in new if r.status is ReplicaStatus.READY)
    total = sum(wanted_by.values())
    room = total - len(new)
    if old and target is not None:
        update = target.spec.update
        replaced = f"replaced by version {target_number} ({target.mode})"
        # Old replicas that serve nothing go at once in both modes: they hold no availability.
        old_ready = [r for r in old if r.status is ReplicaStatus.READY]
        for record in old:
            if record.status is not ReplicaStatus.READY:
                work.drain(record.replica_id, replaced, live)
        if target_failed:
            # Nothing replaces them (a FAILED target launches nothing): what still serves keeps
            # serving until the user updates the service or rolls back to a READY version.
            going = []
        elif target.mode == "blue_green":
            going = old_ready if ready_new >= wanted else []
        else:
            # Rolling: keep at least `wanted - max_unavailable` ready; oldest versions go first. The
            # surge is over every replica the target wants, on-demand fallback ones included.
            removable = max(ready_new + len(old_ready) - max(wanted - update.max_unavailable, 0), 0)
            going = sorted(old_ready, key=lambda r: (r.version, r.replica_id))[:removable]
            staying = len(old_ready) - len(going)
            room = min(room, max(total + update.max_surge - len(new) - staying, 0))
        for record in going:
            work.drain(record.replica_id, replaced, live)

    actions: list[Action] = []
    for record in sorted(new, key=lambda r: r.replica_id):
        waiting = record.instance_id is not None or record.replica_id in live
        if waiting or record.status not in (ReplicaStatus.PENDING, ReplicaStatus.FAILED_PROVISION):
            continue
        if record.next_attempt_at is not None and from_iso(record.next_attempt_at) > now:
            continue  # AWS refused it: exponential backoff
        actions.append(Launch(record.replica_id, fresh=False))
    room = min(room, policy.max_launches_per_run - len(actions))
    if room > 0 and target is not None:
        # Spot first (what the service is meant to run on), then on-demand (its fallback).
        spot_room = min(room, max(wanted_by[Market.SPOT] - sum(1 for r in new if r.market is Market.SPOT), 0))
        ids = tuple(range(service.replica_seq, service.replica_seq + room))
        spot_ids = ids[:spot_room]
        actions.append(Claim(target_number, ids, spot_ids))
        actions.extend(Launch(replica_id, fresh=True) for replica_id in ids)
        stamp = to_iso(now)
        for replica_id in ids:
            market = Market.SPOT if replica_id in spot_ids else Market.ON_DEMAND
            work.claimed.append(ReplicaRecord.pending(service, replica_id, target_number, stamp, market))
    return actions


def wanted_by_market(markets: MarketPolicy | None, wanted: int, spot_ready: int) -> dict[Market, int]:
    """How many of the target's `wanted` replicas are bought each way, SkyPilot's way: without spot,
    all on demand; with it, `base_ondemand_fallback_replicas` on demand and the rest spot, plus (with
    `dynamic_ondemand_fallback`) one on-demand replica for each wanted spot replica not READY."""
    if markets is None or not markets.spot:
        return {Market.SPOT: 0, Market.ON_DEMAND: wanted}
    base = min(markets.base_ondemand, wanted)
    spot = wanted - base
    extra = max(spot - spot_ready, 0) if markets.dynamic_fallback else 0
    return {Market.SPOT: spot, Market.ON_DEMAND: base + extra}


def drain_due(interruption: Interruption, version: VersionRecord | None, policy: Policy) -> datetime | None:
    """When a replica warned of a spot interruption must start its drain, so that the drain is over
    before AWS takes the instance: the notice, less the version's drain time, less the margin.
    None: a rebalance recommendation (no deadline)."""
    if interruption.kind is not InterruptionKind.SPOT_INTERRUPTION:
        return None
    drain = timedelta(seconds=version.spec.drain_seconds if version is not None else 0)
    due: datetime = from_iso(interruption.at) + policy.interruption_notice - drain - policy.warning_margin
    return due


def _plan_warned(
    work: _Work,
    live: Mapping[int, Instance],
    target: VersionRecord | None,
    wanted: int,
    now: datetime,
    policy: Policy,
) -> None:
    """Replicas AWS warned about: they hold no slot (their replacements are claimed in this plan) and
    serve until enough unwarned replicas of the target are READY to stand in for them, or until a
    spot interruption's deadline: a warned replica is drained early enough that its drain ends
    before AWS takes the instance (its notice, less the endpoint's drain time, less one run period
    of margin). A warned replica that is not READY goes at once: it serves nothing.
    """
    warned = [r for r in work.replicas.values() if r.interruption is not None and r.status not in LEAVING]
    if not warned:
        return
    target_number = target.version if target is not None else None
    ready_unwarned = sum(
        1
        for r in work.replicas.values()
        if r.version == target_number and r.interruption is None and r.status is ReplicaStatus.READY
    )
    for record in sorted(warned, key=lambda r: r.replica_id):
        notice = record.interruption
        assert notice is not None
        if notice.kind is InterruptionKind.SPOT_INTERRUPTION:
            what = f"spot interruption warning at {notice.at}: AWS takes instance {notice.instance_id} back"
            deadline = drain_due(notice, target, policy)
            due = deadline is not None and now >= deadline
        else:
            what = f"rebalance recommendation at {notice.at} for instance {notice.instance_id}"
            due = False
        if record.status is not ReplicaStatus.READY or due:
            why = what
        elif ready_unwarned >= wanted:
            why = f"replaced after a {what}"
        else:
            continue  # serving until its replacement is READY
        work.drain(record.replica_id, why, live)


def _describe(record: ReplicaRecord) -> str:
    text = f"replica {record.replica_id} {record.status.value}"
    return f"{text}: {record.status_message}" if record.status_message else text


def service_status(
    state: ServiceState,
    replicas: Sequence[ReplicaRecord],
    versions: Mapping[int, VersionState],
    with_instance: Set[int],
) -> RecordStatus:
    """The service status from every replica (not just ready ones), with a message that says why.

    `replicas`: every replica of the service as it now is (after this run's transitions, deletions and
    claims), in replica id order; `versions`: each version's state as it now is; `with_instance`: the
    ids of the replicas that still have a live instance. Pure: `plan` records what it returns when it
    differs from the service's, and the shell calls it again on the records as they are after AWS
    refused launches the plan expected to go through.
    """
    service = state.service
    target_number = service.target_version
    target = state.target
    target_failed = target is None or versions.get(target_number) is VersionState.FAILED
    wanted = 0 if target is None or target_failed else wanted_replicas(state)

    new = [r for r in replicas if r.version == target_number and r.status not in LEAVING]
    ready = sum(1 for r in new if r.status is ReplicaStatus.READY)
    old_left = [
        r for r in replicas if r.version != target_number and (r.status not in LEAVING or r.replica_id in with_instance)
    ]
    quiet = (ReplicaStatus.READY, ReplicaStatus.SHUTTING_DOWN)
    problems = [r for r in replicas if r.status not in quiet or r.status_message.startswith(NOT_IN_USE)]

    if target_failed:
        reason = target.state_message if target is not None else "the target version is missing"
        status = ServiceStatus.FAILED
        if any(s is VersionState.READY for s in versions.values()):
            progress = f"{reason}: launching stopped; update the service or roll back to a READY version"
        else:
            progress = f"{reason}; no earlier version was ever READY: launching stopped until the service is updated"
    elif old_left:
        status = ServiceStatus.UPDATING
        mode = target.mode if target is not None else "rolling"
        progress = (
            f"updating to version {target_number} ({mode}): {ready}/{wanted} new ready, "
            f"{len(old_left)} old replica(s) left"
        )
    else:
        if ready > 0:
            status = ServiceStatus.READY
        elif new:
            status = ServiceStatus.REPLICA_INIT
        else:
            status = ServiceStatus.NO_REPLICA
        progress = f"{ready}/{wanted} ready"

    parts = [progress]
    parts.extend(_describe(r) for r in problems[:_MESSAGE_PROBLEMS])
    if len(problems) > _MESSAGE_PROBLEMS:
        parts.append(f"and {len(problems) - _MESSAGE_PROBLEMS} more")
    latest = state.versions.get(service.latest_version)
    if latest is not None and latest.version != target_number and latest.state is VersionState.FAILED:
        parts.append(f"rolled back to version {target_number}: {latest.state_message}")
    return RecordStatus(status, "; ".join(parts), service.generation)


def status_changed(state: ServiceState, status: RecordStatus) -> bool:
    """Whether `status` differs from what the service item holds (a steady state writes nothing)."""
    service = state.service
    return (status.status, status.message, status.observed_generation) != (
        service.status,
        service.status_message,
        service.observed_generation,
    )


def plan_orphans(
    live_uids: Set[str],
    instances: Sequence[Instance],
    now: datetime,
    policy: Policy | None = None,
    *,
    spared_services: Set[str] = frozenset(),
    stack_id: str | None = None,
) -> Terminate | None:
    """Managed instances of no live service (deleted, or an old incarnation), past the grace period.

    Only the scheduled run sweeps, and only instances the driver listed, which are all managed: an
    instance without the managed tag is never even seen. An instance fleetkeeper did not launch
    (`launched_by_fleetkeeper`) is never an orphan, nor is one of `spared_services`: services this
    run could not load, whose uid it therefore cannot vouch for. With `stack_id`, nor is one not
    tagged with that stack (another stack's, or one launched before stacks had ids: nothing proves
    an untagged one is this stack's, fleetkeeper.reconciler.ownership).
    """
    policy = policy or Policy()
    reasons: dict[str, str] = {}
    for instance in instances:
        if not is_live(instance) or instance.uid in live_uids or not launched_by_fleetkeeper(instance):
            continue
        if stack_id is not None and instance.stack != stack_id:
            continue
        if instance.service in spared_services:
            continue
        age = _seconds_since(instance.launched_at, now)
        if age is not None and age < policy.orphan_grace.total_seconds():
            continue  # maybe a service created after this run listed the services
        owner = f"{instance.service or '?'} (uid {instance.uid or '?'})"
        reasons[instance.instance_id] = f"orphan: service {owner} no longer exists"
    return Terminate(tuple(sorted(reasons.items()))) if reasons else None
