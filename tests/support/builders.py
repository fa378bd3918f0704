"""Records, states and expected actions for the planner's table tests (tests/reconciler/plan/ and the
tests of what the planner's records feed: follow-ups, the wake view, regressions).

One service, "svc" of incarnation UID, observed at NOW; a record's times are given as `ago(seconds)`.
Builders make the planner's inputs (`version`, `replica`, `refusal`, `instance`, `state`); the
expected actions are built from the input records (`moved`, `drained`, `became_ready`...), never
read back from a plan's output.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetkeeper.model import (
    AutoscalerState,
    BalancerState,
    EndpointConfig,
    EndpointRecord,
    FailureCause,
    Lifecycle,
    Recommendation,
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
    Launch,
    MarkVersion,
    ProbeResult,
    RecordReplica,
    RecordStatus,
    Terminate,
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


def rolling_state(new: list[ReplicaRecord], old: list[ReplicaRecord], **update: Any) -> ServiceState:
    versions = [version(1, READY), version(2, spec=spec(2, **update))]
    return state(old + new, versions, target=2)


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


# --- a load-balanced endpoint, an autoscaled service ------------------------------------------------


# The spec's probe: GET /health within 15 s (SkyPilot's default timeout), which the ALB can send.
CONFIG = EndpointConfig(
    port=8080,
    policy="least_load",
    drain_seconds=120,  # the spec's default, SkyPilot's
    health_path="/health",
    health_codes="200",
    health_timeout_seconds=15,
    health_interval_seconds=16,
)
ENDPOINT = EndpointRecord(
    url="http://alb.example:10000",
    config=CONFIG,
    target_group="arn:tg",
    route="arn:listener",
    dimensions=(("LoadBalancer", "app/a/1"), ("TargetGroup", "targetgroup/fk-u1/2")),
)
REG, REGING, DRAIN = BalancerState.REGISTERED, BalancerState.REGISTERING, BalancerState.DRAINING


def served(current: ServiceState, endpoint: EndpointRecord | None = ENDPOINT) -> ServiceState:
    return replace(current, service=replace(current.service, endpoint=endpoint))


def autoscaled(mode: str = "rolling", **policy: Any) -> ServiceSpec:
    data = hello_spec()
    service = {k: v for k, v in data["service"].items() if k != "replicas"}
    service["readiness_probe"] = {"path": "/health", "initial_delay_seconds": 600}
    service["replica_policy"] = {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_qps_per_replica": 2,
        "upscale_delay_seconds": 300,
        "downscale_delay_seconds": 1200,
        **policy,
    }
    data["service"] = service
    data["update"] = {"mode": mode}
    return ServiceSpec.model_validate(data)


def holding(current: ServiceState, autoscaler: AutoscalerState | None) -> ServiceState:
    return replace(current, service=replace(current.service, autoscaler=autoscaler))


def since(seconds: float, replicas: int, rate: float) -> Recommendation:
    return Recommendation(to_iso(NOW - timedelta(seconds=seconds)), replicas, rate)
