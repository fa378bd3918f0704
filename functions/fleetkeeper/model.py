"""The records fleetkeeper keeps, and the status vocabulary (SkyPilot Serve's; docs/architecture/store.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

# Defined with the other choices (fleetkeeper.choices), and imported from here too.
from fleetkeeper.choices import Market as Market

if TYPE_CHECKING:
    from fleetkeeper.choices import LoadBalancingPolicy, UpdateMode
    from fleetkeeper.spec.service import ServiceSpec


class Lifecycle(StrEnum):
    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


class ServiceStatus(StrEnum):
    NO_REPLICA = "NO_REPLICA"
    REPLICA_INIT = "REPLICA_INIT"
    READY = "READY"
    UPDATING = "UPDATING"
    FAILED = "FAILED"
    SHUTTING_DOWN = "SHUTTING_DOWN"


class ReplicaStatus(StrEnum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    STARTING = "STARTING"
    READY = "READY"
    NOT_READY = "NOT_READY"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    FAILED_PROVISION = "FAILED_PROVISION"
    FAILED_INITIAL_DELAY = "FAILED_INITIAL_DELAY"
    FAILED_PROBING = "FAILED_PROBING"
    PREEMPTED = "PREEMPTED"
    # The replica's app ended by itself (SkyPilot's FAILED: "the replica fails due to user's run or
    # setup"): its process exited, which is the version's fault, never a preemption.
    FAILED = "FAILED"

    @property
    def failed(self) -> bool:
        return self in _FAILED


_FAILED = {
    ReplicaStatus.FAILED_PROVISION,
    ReplicaStatus.FAILED_INITIAL_DELAY,
    ReplicaStatus.FAILED_PROBING,
    ReplicaStatus.PREEMPTED,
    ReplicaStatus.FAILED,
}


class FailureCause(StrEnum):
    """Whose fault a failed replica's failure is: it decides what the circuit breaker counts.

    Derived from codes (a RunInstances error code, an instance's StateReason code, fleetkeeper's own
    codes), never from a message; the table of codes is in reconciler/plan/failures.py.
    """

    # The version's: its image, its spec, its app (probe and initial-delay failures, a refused launch
    # AWS blames on the request, an instance shut down from inside or through the API). Counts.
    VERSION = "VERSION"
    # The environment's: capacity, placement, account limits, throttling, AWS-side (`Server.*`)
    # terminations. Never counts; a refused launch is retried (in the next subnet).
    ENVIRONMENT = "ENVIRONMENT"
    # AWS took a spot instance back (`Server.SpotInstanceTermination`): the price of spot. Never counts.
    SPOT_RECLAIM = "SPOT_RECLAIM"
    # A refused or preempted replica stored before fleetkeeper recorded causes: its cause is not
    # known, so it never counts (its next refusal, or its replacement, records a real one).
    UNRECORDED = "UNRECORDED"

    @property
    def counts_toward_breaker(self) -> bool:
        return self is FailureCause.VERSION

    @classmethod
    def of_unrecorded(cls, status: ReplicaStatus) -> FailureCause | None:
        """The cause of a replica stored without one: implied by its status, or not known."""
        if status in (ReplicaStatus.FAILED_PROBING, ReplicaStatus.FAILED_INITIAL_DELAY):
            return cls.VERSION
        return cls.UNRECORDED if status.failed else None


class VersionState(StrEnum):
    """What the reconciler learned about a version: never ran, reached READY once, or was given up on."""

    NEW = "NEW"
    READY = "READY"
    FAILED = "FAILED"


class BalancerState(StrEnum):
    """A replica's place in its service's endpoint, as the reconciler last wrote it (absent: not in it).

    Each state is written *before* the load balancer call that makes it true, so a run that dies
    between the two leaves a state the next run completes: REGISTERING is registered again (the call
    is idempotent), DRAINING deregistered again if the balancer still routes to it.
    """

    # Being put into the endpoint: the registration may or may not have happened yet.
    REGISTERING = "REGISTERING"
    # In the endpoint: receives requests (only READY replicas are).
    REGISTERED = "REGISTERED"
    # Taken out of the endpoint at `drain_started_at`: finishing its requests in flight. It is
    # terminated only once the balancer reports it drained or its drain deadline has passed.
    DRAINING = "DRAINING"


class InterruptionKind(StrEnum):
    """The warnings EC2 sends about a running instance (EventBridge, source aws.ec2)."""

    # "EC2 Instance Rebalance Recommendation": a spot instance at elevated risk of interruption. Its
    # replacement is launched at once; it serves until the replacement is READY.
    REBALANCE = "rebalance-recommendation"
    # "EC2 Spot Instance Interruption Warning": AWS takes the instance back two minutes later. It is
    # drained from the endpoint at once, and replaced at once.
    SPOT_INTERRUPTION = "spot-interruption"


@dataclass(frozen=True)
class Interruption:
    """A warning AWS sent about a replica's instance (recorded on the replica before it is acted on,
    so a run that dies after recording it still acts on it)."""

    kind: InterruptionKind
    instance_id: str
    at: str  # when AWS sent it (the event's time)


def ready_of(ready: int, wanted: int) -> str:
    """ "2/3 ready"; never more ready than wanted ("1/1 ready, 1 more being removed": the surplus of a
    scale-down is READY until it is drained, and "2/1 ready" reads as a fraction the wrong way up)."""
    if ready > wanted:
        return f"{wanted}/{wanted} ready, {ready - wanted} more being removed"
    return f"{ready}/{wanted} ready"


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def from_iso(text: str) -> datetime:
    return datetime.fromisoformat(text)


@dataclass(frozen=True)
class EndpointConfig:
    """What the load balancer is told about a service, from its target version's spec."""

    port: int  # the target group's port (each target is registered with its own version's port)
    policy: LoadBalancingPolicy  # as balanced (`LoadBalancingPolicy.balanced_as`)
    drain_seconds: int
    # The ALB's own health check (fleetkeeper.reconciler.health_check): the readiness probe's path
    # when the ALB can send it, else "/" passing on any 200-499; the defaults are what endpoints
    # recorded before the check was derived from the probe's timeout were made with.
    health_path: str
    health_codes: str = "200"
    health_timeout_seconds: int = 4
    health_interval_seconds: int = 5


@dataclass(frozen=True)
class EndpointRecord:
    """A service's endpoint as the reconciler created it (the service item's `endpoint`)."""

    url: str  # what clients call: GET /v1/services/NAME, `fleetkeeper status`
    config: EndpointConfig  # what the balancer was last configured with
    target_group: str  # the adapter's id of the service's set of targets (the ALB's target group ARN)
    route: str  # what sends the endpoint's requests there (an ALB listener or rule ARN, a local port)
    # The CloudWatch dimensions of the endpoint's AWS/ApplicationELB RequestCount metric (LoadBalancer,
    # TargetGroup), which both adapters publish: what the autoscaler reads.
    dimensions: tuple[tuple[str, str], ...] = ()
    # Since when the route forwards to the stack's wake target instead of the target group
    # (fleetkeeper.wake.demand): set by the reconciler while an autoscaled service has no replica in its
    # endpoint; None: the route forwards to the target group.
    waking_since: str | None = None
    # The load balancer the endpoint is on (its ARN): the stack's template ALB or one of the pools
    # the reconciler made (fleetkeeper.reconciler.balancers.alb). None: recorded before pools,
    # so the template's. A service never moves while it has an endpoint.
    load_balancer: str | None = None

    @property
    def waking(self) -> bool:
        return self.waking_since is not None


@dataclass(frozen=True)
class Recommendation:
    """What the autoscaler recommended from `at` on (until the next one): `replicas` for `rate`
    requests a second (the rate measured when the recommendation last changed)."""

    at: str
    replicas: int
    rate: float


@dataclass(frozen=True)
class AutoscalerState:
    """A service's autoscaler, all of it (the service item's `autoscaler`, written by the reconciler).

    `target`: the replicas the service runs now. `history`: the recommendations, oldest first, one
    entry per *change* of recommendation (so a steady rate appends nothing and writes nothing), kept
    while any stabilization window still reaches them. Everything a decision needs is here, so a
    reconciler that crashes or is replaced decides exactly as the one before would have
    (fleetkeeper.reconciler.autoscale). `rev` conditions every write on the state it was computed from.
    """

    target: int
    history: tuple[Recommendation, ...] = ()
    rev: int = 0


AccessMode = Literal["read", "write"]


@dataclass(frozen=True)
class AccessGrant:
    """A principal (or a pattern of them) a service names as allowed to read it, or to change it too.

    `principal` is canonical (fleetkeeper.owners.principals.canonical_pattern): a role without its path."""

    principal: str
    mode: AccessMode


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    uid: str
    generation: int
    lifecycle: Lifecycle
    target_version: int
    latest_version: int
    status: ServiceStatus
    status_message: str
    observed_generation: int
    created_at: str
    updated_at: str
    # Next replica number: replica ids are never reused within an incarnation, so an EC2
    # ClientToken derived from one never names two different launches.
    replica_seq: int = 0
    # Written by the reconciler once the endpoint exists (None: no load balancer, or not created yet).
    endpoint: EndpointRecord | None = None
    # Written by the reconciler for a service whose target version autoscales (None: never did).
    autoscaler: AutoscalerState | None = None
    # When the reconciler's pending follow-up (a delayed kick for this service) is due, in epoch
    # seconds (fleetkeeper.reconciler.followup); None: none was ever asked for. Written by the
    # reconciler only when it asks for a new one, so a steady service never writes it.
    followup_at: int | None = None
    # Who the incarnation belongs to: the canonical principal that created it (an IAM role's ARN
    # without its path for an assumed-role session, an IAM user's ARN, `local:<os-user>` in embedded
    # mode); "" for services created before ownership existed (only administrators see them). Its
    # hash scopes the replicas' identity (fleetkeeper.replicas.identity).
    owner: str = ""
    # More principals the service answers to (fleetkeeper.owners.access), and the revision every change of
    # them is conditioned on.
    access: tuple[AccessGrant, ...] = ()
    access_rev: int = 0
    # When the endpoint last received a request it could not serve (no replica in it), written by
    # the wake target (fleetkeeper.wake.demand), at most once per WAKE_COALESCE_SECONDS; None: never.
    wake_at: str | None = None


@dataclass(frozen=True)
class VersionRecord:
    name: str
    uid: str
    version: int
    spec: ServiceSpec
    mode: UpdateMode
    created_at: str
    state: VersionState = VersionState.NEW
    state_message: str = ""
    # Where the version's secret values are (fleetkeeper.replicas.secrets): the spec keeps their names
    # only. None: the version has no secrets.
    secrets_ref: str | None = None


@dataclass(frozen=True)
class ReplicaRecord:
    name: str
    uid: str
    replica_id: int
    version: int
    status: ReplicaStatus
    created_at: str
    updated_at: str
    instance_id: str | None = None
    url: str | None = None
    status_message: str = ""
    # Typed facts of a failed replica (None unless `status.failed`): the code of the failure (an AWS
    # RunInstances error code, the instance's StateReason code, or fleetkeeper's own) and whose fault
    # it was. The breaker reads these, never `status_message`, which is for people.
    failure_code: str | None = None
    cause: FailureCause | None = None
    # Probe bookkeeping.
    ready_at: str | None = None
    last_probe_ok_at: str | None = None
    probe_failures: int = 0
    # The first failed probe of a READY replica's current run of failures (None: not failing): it is
    # replaced once they have lasted its probe's consecutive-failure window (SkyPilot's 180 s). While
    # STARTING: the first of its probe's run of 404 answers (plan/observe.py, NOT_FOUND_SECONDS).
    failing_since: str | None = None
    # When the reconciler first saw its instance running (the end of provisioning): the initial delay
    # counts from here, as SkyPilot's does (None: not yet, or a record written before it was kept).
    probing_since: str | None = None
    # Launch bookkeeping: how many RunInstances attempts AWS refused (each attempt is its own capacity
    # pool: instance type x subnet, and its own ClientToken), in how many runs every pool tried was
    # refused (the backoff's exponent), and when to try again.
    launch_attempts: int = 0
    refused_runs: int = 0
    # Of those refusals, the ones that were the version's (cause VERSION): what the breaker counts.
    # A walk of pools stops at the first of them, so capacity refusals before it never count.
    version_refusals: int = 0
    next_attempt_at: str | None = None
    # When the reconciler recorded the replica's instance (initial_delay_seconds counts from here).
    launched_at: str | None = None
    # The replica's place in the service's endpoint (None: not in it) and when its drain began.
    balancer: BalancerState | None = None
    drain_started_at: str | None = None
    # Bought on demand or as spot (decided at the claim), and the instance type it was launched as.
    market: Market = Market.ON_DEMAND
    instance_type: str | None = None
    # The last warning AWS sent about its instance (a rebalance recommendation, a spot interruption).
    interruption: Interruption | None = None
    # When a person asked for this replica to go (`fleetkeeper down NAME --replica-id N`, SkyPilot's
    # `sky serve down --replica-id`): the reconciler drains and terminates it, and replaces it as any other.
    terminate_requested_at: str | None = None
    # Optimistic-concurrency revision: every reconciler write is conditioned on the revision it read,
    # so of two runs acting on one replica only the first write lands (store.put_replica).
    rev: int = 0

    @classmethod
    def pending(
        cls, service: ServiceRecord, replica_id: int, version: int, now: str, market: Market = Market.ON_DEMAND
    ) -> ReplicaRecord:
        """A just-claimed replica: its item exists, its instance does not yet."""
        return cls(
            market=market,
            name=service.name,
            uid=service.uid,
            replica_id=replica_id,
            version=version,
            status=ReplicaStatus.PENDING,
            created_at=now,
            updated_at=now,
        )


@dataclass(frozen=True)
class ServiceState:
    """Everything one Query on a service's partition returns for its current incarnation."""

    service: ServiceRecord
    versions: dict[int, VersionRecord] = field(default_factory=dict)
    replicas: dict[int, ReplicaRecord] = field(default_factory=dict)

    @property
    def target(self) -> VersionRecord | None:
        return self.versions.get(self.service.target_version)
