"""The service's status and its message, from every replica, and whether it changed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.choices import DEFAULT_UPDATE_MODE
from fleetkeeper.model import (
    ReplicaRecord,
    ReplicaStatus,
    ServiceState,
    ServiceStatus,
    VersionState,
    ready_of,
)
from fleetkeeper.reconciler.plan.actions import RecordStatus
from fleetkeeper.reconciler.plan.failures import NOT_IN_USE
from fleetkeeper.reconciler.plan.lifecycle import LEAVING
from fleetkeeper.reconciler.plan.scale import wanted_replicas

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence, Set


_MESSAGE_PROBLEMS = 3


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
        mode = target.mode if target is not None else DEFAULT_UPDATE_MODE
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
        progress = ready_of(ready, wanted)

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
