"""The circuit breaker: when a target version that never became READY has failed, and which version
the service rolls back to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.model import (
    ReplicaRecord,
    ReplicaStatus,
    ServiceState,
    VersionState,
)
from fleetkeeper.reconciler.plan.actions import TripBreaker
from fleetkeeper.reconciler.plan.status import _describe

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from fleetkeeper.reconciler.plan.policy import Policy
    from fleetkeeper.reconciler.plan.work import _Work


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
