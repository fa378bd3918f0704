"""A DELETING service: every replica drained and its instance terminated, then the endpoint and the
service item deleted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.model import (
    ReplicaStatus,
    ServiceState,
    ServiceStatus,
)
from fleetkeeper.reconciler.plan.actions import Action, DeleteService, RecordStatus, RemoveEndpoint
from fleetkeeper.reconciler.plan.observe import is_live

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from fleetkeeper.reconciler.driver import Instance
    from fleetkeeper.reconciler.plan.endpoints import _Balance
    from fleetkeeper.reconciler.plan.work import _Work


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
