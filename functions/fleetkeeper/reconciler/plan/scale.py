"""How many replicas the target version wants: the spec's count, or the autoscaler's target and the
write of its decision (`plan_autoscale`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.model import (
    Lifecycle,
    ReplicaStatus,
    ServiceState,
)
from fleetkeeper.reconciler import autoscale
from fleetkeeper.reconciler.plan.actions import RecordAutoscale
from fleetkeeper.wake import demand as wake

if TYPE_CHECKING:
    from datetime import datetime


def wanted_replicas(state: ServiceState) -> int:
    """The replicas the target version should run: the autoscaled target (the service item's
    autoscaler state, within the policy's bounds) when it autoscales, else the spec's count; plus
    `num_overprovision` (SkyPilot's get_final_target_num_replicas)."""
    target = state.target
    if target is None:
        return 0
    return scaled_target(state) + target.spec.overprovision


def scaled_target(state: ServiceState) -> int:
    """The autoscaler's target (or the spec's count), without the overprovisioned replicas."""
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
    after = autoscale.decide(policy, before, rate, now, _capacity(state, policy))
    return None if after is before else RecordAutoscale(before, after)


_LIVE = (ReplicaStatus.PROVISIONING, ReplicaStatus.STARTING, ReplicaStatus.READY)


def _capacity(state: ServiceState, policy: autoscale.ScalingPolicy) -> autoscale.Capacity:
    """What the target version's live replicas serve, for a target per accelerator (each replica's
    accelerator from the instance type it was launched as)."""
    if not policy.per_accelerator:
        return autoscale.NO_CAPACITY
    from fleetkeeper.spec.placement import accelerator_of

    live: list[float] = []
    ready: list[float] = []
    for record in sorted(state.replicas.values(), key=lambda r: r.replica_id):
        if record.version != state.service.target_version or record.status not in _LIVE:
            continue
        accelerator = accelerator_of(record.instance_type) if record.instance_type else None
        target = autoscale.replica_target(policy, accelerator)
        live.append(target)
        if record.status is ReplicaStatus.READY:
            ready.append(target)
    return autoscale.Capacity(tuple(live), tuple(ready))
