"""Updates that keep replicas (`_update_in_place`): a READY replica of another version than the
target takes the target in place when the change between them touches nothing it runs
(fleetkeeper.spec.changes.replica_visible): no launch, no termination, the target's version recorded
on it (one write, conditioned on its revision, as every replica write). Any other replica of another
version is replaced, rolling or blue-green (replicas.py). A rollback follows the same rule: it is an
update to an older version."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fleetkeeper.model import ReplicaStatus, VersionState
from fleetkeeper.spec.changes import replica_visible

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetkeeper.model import ServiceState
    from fleetkeeper.reconciler.plan.work import _Work


def _update_in_place(state: ServiceState, work: _Work, versions: Mapping[int, VersionState]) -> None:
    """Record the target's version on the READY replicas that run exactly what it would run."""
    target = state.target
    if target is None or versions.get(target.version) is VersionState.FAILED:
        return  # a FAILED target takes nothing over: what still serves keeps its own version
    for replica_id, record in sorted(work.replicas.items()):
        if record.version == target.version or record.status is not ReplicaStatus.READY:
            continue
        running = state.versions.get(record.version)
        if running is None:
            continue  # its version's item is gone: what it runs cannot be told, so it is replaced
        same_secrets = running.secrets_ref == target.secrets_ref
        if not replica_visible(running.spec, target.spec, same_secrets=same_secrets):
            work.replicas[replica_id] = replace(record, version=target.version)
