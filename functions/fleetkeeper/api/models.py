"""Request and response bodies of the HTTPS API (also the OpenAPI document's schemas).

No `from __future__ import annotations` here: pydantic would evaluate every field's annotation
from its text (typing.ForwardRef compiles each one) when the api is imported; written as objects,
they cost nothing to read. The functions' annotations of types imported for type checking only are
quoted instead.
"""

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetkeeper.choices import UpdateMode
from fleetkeeper.model import to_iso, utcnow
from fleetkeeper.owners.access import MAX_GRANTS
from fleetkeeper.owners.principals import MAX_PRINCIPAL_LENGTH
from fleetkeeper.replicas.workdirs import MAX_WORKDIR_BYTES
from fleetkeeper.spec.service import NAME_PATTERN, WORKDIR_DIGEST, ServiceSpec

if TYPE_CHECKING:
    from datetime import datetime

    from fleetkeeper.model import ReplicaRecord, ServiceRecord, ServiceState, VersionRecord
    from fleetkeeper.service_events import EventRecord

# Every integer a client sends (a version, a generation in If-Match, a page size) is at most this:
# far below DynamoDB's 38 significant digits, and more versions or writes than a service will see.
MAX_CLIENT_INTEGER = 10**9
ServiceName = Annotated[str, Field(pattern=NAME_PATTERN, description="lower-case letters, digits and dashes")]


class _Model(BaseModel):
    # defer_build: a model's validator and serializer are built when a route first uses it, not when
    # the api is imported: an invocation builds those of its own route only (docs/PERFORMANCE.md).
    model_config = ConfigDict(defer_build=True)


class _Request(_Model):
    model_config = ConfigDict(extra="forbid")


class CreateServiceRequest(_Request):
    name: ServiceName
    spec: ServiceSpec


class UpdateServiceRequest(_Request):
    spec: ServiceSpec
    mode: UpdateMode | None = None


class RollbackRequest(_Request):
    version: Annotated[int, Field(ge=1, le=MAX_CLIENT_INTEGER)] | None = Field(
        default=None, description="the version to go back to; default: the newest earlier version that did not fail"
    )


class GrantRequest(_Request):
    principal: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_PRINCIPAL_LENGTH,
            description="an IAM principal ARN, `*` matching any characters: arn:aws:iam::ACCOUNT:role/NAME (a role "
            "matches by name, whatever its path), arn:aws:iam::ACCOUNT:user/NAME, ...",
        ),
    ]
    mode: Literal["read", "write"] = Field(
        description="read: GET the service, its versions and events, list it; write: change it too (update, "
        "roll back, delete, change its access)"
    )


class AccessChangeRequest(_Request):
    add: list[GrantRequest] = Field(
        default_factory=list,
        max_length=MAX_GRANTS,
        description="grants to add; a principal the service names already takes the new mode",
    )
    remove: list[Annotated[str, Field(min_length=1, max_length=MAX_PRINCIPAL_LENGTH)]] = Field(
        default_factory=list, max_length=MAX_GRANTS, description="principals (as granted) to revoke"
    )


class WorkdirUploadRequest(_Request):
    digest: Annotated[str, Field(pattern=WORKDIR_DIGEST.pattern, description="sha256:<64 hex digits> of the archive")]
    # Signed into the upload URL as its Content-Length: the upload must be exactly this size.
    size: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_WORKDIR_BYTES,
            description=f"the archive's size in bytes (at most {MAX_WORKDIR_BYTES}); the upload must be exactly this",
        ),
    ]
    service: ServiceName | None = Field(
        default=None, description="the service it is for: a digest its current incarnation has needs no upload"
    )


class UploadView(_Model):
    url: str = Field(description="where to send the archive (a presigned S3 URL on AWS)")
    method: str = Field(description="the HTTP method: PUT")
    headers: dict[str, str] = Field(description="headers the request must carry as they are (they are signed)")


class WorkdirUpload(_Model):
    digest: str
    upload: UploadView | None = Field(
        description="null: the archive is stored already; else send it with this one request, then name the digest "
        "in the spec's `workdir`"
    )
    max_bytes: int = Field(description="the largest archive a version may name")


class InterruptionView(_Model):
    kind: str = Field(description="spot-interruption or rebalance-recommendation")
    instance_id: str
    at: str = Field(description="when AWS sent it")


class ReplicaView(_Model):
    replica_id: int
    version: int
    status: str
    status_message: str
    instance_id: str | None
    url: str | None
    endpoint_state: str | None = Field(
        description="its place in the service's endpoint: REGISTERING, REGISTERED, DRAINING, or null (not in it)"
    )
    failure_code: str | None = Field(
        default=None,
        description="the typed code of its failure or refused launch (an EC2 error or state-reason code, or "
        "fleetkeeper's own, e.g. InsufficientInstanceCapacity, Server.SpotInstanceTermination); null: none",
    )
    cause: str | None = Field(
        default=None,
        description="whose fault that failure is: VERSION (counts toward the circuit breaker), ENVIRONMENT, "
        "SPOT_RECLAIM or UNRECORDED; null: no failure",
    )
    market: str = Field(description="how its instance is bought: spot or on-demand (decided when it was claimed)")
    instance_type: str | None = Field(description="the instance type it was launched as; null before its launch")
    interruption: InterruptionView | None = Field(
        description="the last warning AWS sent about its instance (a spot interruption warning or a rebalance "
        "recommendation); null: none"
    )
    terminate_requested_at: str | None = Field(
        default=None,
        description="when its termination was asked for (`fleetkeeper down NAME --replica-id N`): it is drained "
        "and replaced; null: not asked",
    )
    created_at: str
    updated_at: str


class GrantView(_Model):
    principal: str = Field(description="the principal ARN or pattern, as stored (a role without its path)")
    mode: Literal["read", "write"]


class ServiceSummary(_Model):
    name: str
    uid: str = Field(
        description="the incarnation's id: a service deleted and created again under its name gets another"
    )
    status: str = Field(
        description="NO_REPLICA, REPLICA_INIT, READY, UPDATING, FAILED or SHUTTING_DOWN, as the reconciler last "
        "recorded it: the status of generation `observed_generation`, not necessarily of `generation`"
    )
    status_message: str = Field(description="why, in words (of generation `observed_generation` too)")
    lifecycle: str = Field(description="ACTIVE or DELETING")
    target_version: int = Field(description="the version the service is moving to or runs")
    latest_version: int
    generation: int = Field(description="bumped by every write; the ETag, and what If-Match names")
    observed_generation: int = Field(description="the generation the reconciler last acted on")
    reconciled: bool = Field(
        description="whether status and status_message describe the current generation (observed_generation = "
        "generation); false right after a write, until the reconciler has acted on it"
    )
    endpoint: str | None = Field(
        description="the service's URL (its load balancer endpoint); null until the reconciler has made it, "
        "or when the stack has no load balancer"
    )
    owner: str = Field(
        description="the principal that created this incarnation (an IAM role's ARN for a role session); "
        "empty for a service created before owners existed (administrators only)"
    )
    access: list[GrantView] = Field(description="more principals the service answers to, and how")
    created_at: str
    updated_at: str


class AccessView(_Model):
    """Who may access a service: its owner, the stack's administrators, and its grants."""

    name: str
    owner: str
    access: list[GrantView]
    changed: bool = Field(description="false when the request named nothing new: nothing was written")


class PlacementView(_Model):
    """Where the spec's replicas run: its `resources` resolved against AWS's instance types
    (fleetkeeper.spec.placement) when the api accepted it."""

    instance_types: list[str] = Field(
        description="candidate instance types, smallest first: the reconciler launches the first; "
        "empty: the stack's default instance type"
    )
    notes: list[str] = Field(
        description="choices of the spec AWS cannot satisfy (dropped), or how the candidates were cut short"
    )


class ServiceTarget(ServiceSummary):
    """What a write answers: the service and its target, without replicas (a write never changes
    them, and a service of 1,000 replicas would make every response, and every Idempotency-Key
    record, hundreds of KB)."""

    spec: dict[str, Any] | None = Field(description="the target version's spec")
    placement: PlacementView | None = Field(description="the target version's candidate instance types")
    mode: str | None = Field(description=f"how the target version rolls out: {' or '.join(UpdateMode)}")


class PendingScaling(_Model):
    direction: Literal["up", "down"]
    replicas: int = Field(description="the target it goes to")
    at: str = Field(description="when, if the request rate stays where it is (the next run at or after it acts)")
    reason: str = Field(
        description="the rate against what the current target is sized for: rate > (or <) "
        "target_qps_per_replica times the target, e.g. 7.9 req/s > 2 times 3"
    )
    message: str = Field(description="what `fleetkeeper status` prints: scaling up to 3 in 2m: <reason>")


class AutoscalingView(_Model):
    """The request-rate autoscaler of a service whose target version has a `replica_policy` with
    `target_qps_per_replica`: its target, the rate behind its current recommendation, what it will
    do next."""

    target_replicas: int = Field(description="the autoscaled target: the replicas the service runs now")
    min_replicas: int
    max_replicas: int
    target_qps_per_replica: float = Field(
        description="one replica's target rate; with a target per accelerator, the largest of them"
    )
    request_rate: float | None = Field(
        description="requests a second through the endpoint when the recommendation last changed (a rate "
        "within 10% of what the target is sized for does not change it); null before the first reading"
    )
    request_rate_at: str | None = Field(description="when that rate was measured")
    request_rate_window_seconds: int | None = Field(
        default=None, description="the window the rate is measured over (requests in it / its length)"
    )
    recommended_replicas: int | None = Field(description="what that rate recommends")
    pending: PendingScaling | None = Field(description="the next change, if the rate stays; null: none")
    waking: bool = Field(
        default=False,
        description="true while no replica serves and the endpoint routes to the wake target: a request gets "
        "503 with Retry-After and starts a replica (a service at zero wakes on its first request)",
    )


class ServiceWritten(ServiceTarget):
    """What a write answers: the service and its target, and whether the request changed it."""

    changed: bool = Field(
        description="false when the request changed nothing (an update identical to the target version, "
        "a rollback to the current target, a delete of a service already being deleted): nothing was written"
    )


class ServiceView(ServiceTarget):
    replicas: list[ReplicaView]
    autoscaling: AutoscalingView | None = Field(
        default=None, description="the autoscaler's state; null when the target version does not autoscale"
    )


class ReplicaTerminating(ServiceView):
    """What `DELETE /v1/services/{name}/replicas/{replica_id}` answers: the service with its replicas."""

    changed: bool = Field(
        description="false when the replica was asked for already, or is already leaving: nothing was written"
    )


class ServiceList(_Model):
    services: list[ServiceSummary]
    next_token: str | None


class VersionView(_Model):
    version: int
    mode: str
    state: str
    state_message: str
    created_at: str
    spec: dict[str, Any]
    placement: PlacementView


class VersionList(_Model):
    name: str
    target_version: int
    versions: list[VersionView] = Field(description="a page of versions, oldest first")
    next_token: str | None = Field(description="pass as next_token for the next page; null on the last")


class EventView(_Model):
    time: str = Field(description="when it was last seen (ISO 8601)")
    first_seen: str = Field(description="when it was first seen (ISO 8601)")
    count: int = Field(description="how many times it was seen: repeats are folded into one event")
    type: Literal["Normal", "Warning"]
    reason: str = Field(description="one CamelCase word: Created, Launched, LaunchRefused, ReplicaReady, ...")
    message: str
    replica_id: int | None = Field(default=None, description="the replica it is about, if any")
    version: int | None = Field(default=None, description="the version it is about, if any")
    code: str | None = Field(default=None, description="the typed failure code (a refused launch, a failed replica)")


class EventList(_Model):
    events: list[EventView] = Field(description="a page of the service's newest 100 events, newest first")
    next_token: str | None = Field(description="pass as next_token for the next page; null on the last")


class RatePoint(_Model):
    at: str = Field(description="the start of the bucket (ISO 8601)")
    rate: float = Field(description="requests a second through the endpoint in that bucket")


class RecommendationView(_Model):
    at: str = Field(description="when the autoscaler's recommendation became this")
    replicas: int = Field(description="the replicas it recommended")
    rate: float = Field(description="the request rate that made it")


class MetricsView(_Model):
    """A service's request rate over time against what its replicas are sized for: the points a
    dashboard plots (the endpoint's RequestCount in CloudWatch, as the autoscaler reads it)."""

    name: str
    period_seconds: int = Field(description="the buckets' length: the autoscaler's metric window")
    request_rate: list[RatePoint] = Field(
        description="oldest first; a bucket without a data point is absent (no requests, or not published yet), "
        "never answered as zero; empty without an endpoint"
    )
    target_replicas: int = Field(description="the replicas the service runs now (the autoscaled target, or its count)")
    target_qps_per_replica: float | None = Field(
        description="the autoscaler's requests a second per replica; null: the service does not autoscale"
    )
    recommendations: list[RecommendationView] = Field(
        description="the autoscaler's recent recommendations, oldest first, as change points (the table keeps "
        "those its windows still reach); empty without autoscaling"
    )


class ErrorDetail(_Model):
    code: str
    message: str
    details: list[dict[str, Any]]


class ErrorBody(_Model):
    error: ErrorDetail


def summary(service: "ServiceRecord") -> dict[str, Any]:
    return {
        "name": service.name,
        "uid": service.uid,
        "status": service.status.value,
        "status_message": service.status_message,
        "lifecycle": service.lifecycle.value,
        "target_version": service.target_version,
        "latest_version": service.latest_version,
        "generation": service.generation,
        "observed_generation": service.observed_generation,
        "reconciled": service.observed_generation >= service.generation,
        "endpoint": service.endpoint.url if service.endpoint is not None else None,
        "owner": service.owner,
        "access": access_list(service),
        "created_at": service.created_at,
        "updated_at": service.updated_at,
    }


def access_list(service: "ServiceRecord") -> list[dict[str, str]]:
    return [{"principal": g.principal, "mode": g.mode} for g in service.access]


def access_view(service: "ServiceRecord") -> dict[str, Any]:
    return {"name": service.name, "owner": service.owner, "access": access_list(service)}


def replica_view(replica: "ReplicaRecord") -> dict[str, Any]:
    return {
        "replica_id": replica.replica_id,
        "version": replica.version,
        "status": replica.status.value,
        "status_message": replica.status_message,
        "instance_id": replica.instance_id,
        "url": replica.url,
        "endpoint_state": replica.balancer.value if replica.balancer is not None else None,
        "failure_code": replica.failure_code,
        "cause": replica.cause.value if replica.cause is not None else None,
        "market": replica.market.value,
        "instance_type": replica.instance_type,
        "interruption": (
            None
            if replica.interruption is None
            else {
                "kind": replica.interruption.kind.value,
                "instance_id": replica.interruption.instance_id,
                "at": replica.interruption.at,
            }
        ),
        "terminate_requested_at": replica.terminate_requested_at,
        "created_at": replica.created_at,
        "updated_at": replica.updated_at,
    }


def target_view(state: "ServiceState") -> dict[str, Any]:
    """A write's answer: the service and its target version's spec, no replicas."""
    target = state.target
    return {
        **summary(state.service),
        "spec": target.spec.to_json_dict() if target else None,
        "placement": placement_view(target.spec) if target else None,
        "mode": target.mode if target else None,
    }


def service_view(
    state: "ServiceState",
    now: "datetime | None" = None,
    *,
    rate_window_seconds: int | None = None,
    simulated_accelerators: bool = False,
) -> dict[str, Any]:
    """A GET's answer. `rate_window_seconds`: the autoscaler's metric window (shown with its rate);
    `simulated_accelerators`: replicas are local processes (embedded mode), which use no GPU."""
    view = {
        **target_view(state),
        "replicas": [replica_view(state.replicas[r]) for r in sorted(state.replicas)],
        "autoscaling": autoscaling_view(state, now or utcnow(), rate_window_seconds),
    }
    target = state.target
    if simulated_accelerators and target is not None and view["placement"] is not None:
        view["placement"]["notes"].extend(simulated_notes(target.spec))
    return view


def simulated_notes(spec: ServiceSpec) -> list[str]:
    """Embedded mode's note for a spec that asks for accelerators: they are simulated."""
    from fleetkeeper.spec.task_variables import accelerators_of, first_instance_type

    count = accelerators_of(first_instance_type(spec))
    if count == 0:
        return []
    return [
        f"embedded mode: GPUs simulated: the replica runs on this machine's CPU with "
        f"SKYPILOT_NUM_GPUS_PER_NODE={count}, and no GPU is used"
    ]


def autoscaling_view(
    state: "ServiceState", now: "datetime", rate_window_seconds: int | None = None
) -> dict[str, Any] | None:
    # Imported here: only a GET of one service shows its autoscaler.
    from fleetkeeper.reconciler import autoscale

    target = state.target
    policy = autoscale.policy_of(target.spec) if target is not None else None
    if policy is None:
        return None
    scaler = state.service.autoscaler
    last = scaler.history[-1] if scaler is not None and scaler.history else None
    change = autoscale.pending(policy, scaler, now)
    return {
        "target_replicas": autoscale.current_target(policy, scaler),
        "min_replicas": policy.min_replicas,
        "max_replicas": policy.max_replicas,
        "target_qps_per_replica": policy.target_qps_per_replica,
        "request_rate": last.rate if last is not None else None,
        "request_rate_at": last.at if last is not None else None,
        "request_rate_window_seconds": rate_window_seconds,
        "recommended_replicas": policy.clip(last.replicas) if last is not None else None,
        "waking": state.service.endpoint is not None and state.service.endpoint.waking,
        "pending": None
        if change is None
        else {
            "direction": change.direction,
            "replicas": change.replicas,
            "at": to_iso(change.at),
            "reason": change.reason,
            "message": change.describe(now),
        },
    }


def version_view(version: "VersionRecord") -> dict[str, Any]:
    return {
        "version": version.version,
        "mode": version.mode,
        "state": version.state.value,
        "state_message": version.state_message,
        "created_at": version.created_at,
        "spec": version.spec.to_json_dict(),
        "placement": placement_view(version.spec),
    }


def placement_view(spec: ServiceSpec) -> dict[str, Any]:
    placed = spec.resources.placement
    return {"instance_types": list(placed.instance_types), "notes": list(placed.notes)}


def event_view(record: "EventRecord") -> dict[str, Any]:
    event = record.event
    view: dict[str, Any] = {
        "time": record.last_seen,
        "first_seen": record.first_seen,
        "count": record.count,
        "type": event.type.value,
        "reason": event.reason,
        "message": event.message,
    }
    for key, value in (("replica_id", event.replica_id), ("version", event.version), ("code", event.code)):
        if value is not None:
            view[key] = value
    return view


def metrics_view(state: "ServiceState", points: "list[tuple[datetime, float]]", period_seconds: int) -> dict[str, Any]:
    # Imported here: only GET of one service (or of its metrics) reads the autoscaler.
    from fleetkeeper.reconciler import autoscale

    target = state.target
    policy = autoscale.policy_of(target.spec) if target is not None else None
    scaler = state.service.autoscaler
    if policy is not None:
        replicas = autoscale.current_target(policy, scaler)
    else:
        replicas = target.spec.target_replicas if target is not None else 0
    history = scaler.history if policy is not None and scaler is not None else ()
    return {
        "name": state.service.name,
        "period_seconds": period_seconds,
        "request_rate": [{"at": to_iso(at), "rate": round(rate, 3)} for at, rate in points],
        "target_replicas": replicas,
        "target_qps_per_replica": policy.target_qps_per_replica if policy is not None else None,
        "recommendations": [{"at": r.at, "replicas": r.replicas, "rate": r.rate} for r in history],
    }
