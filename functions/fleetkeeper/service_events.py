"""Service events: what the control plane decided or observed about a service, for people.

"Why is my service not READY?" An event is one such fact (created, a replica launched, a launch
refused by AWS, the breaker tripped...), with a `type` (Normal or Warning), a `reason` (one
CamelCase word, as in Kubernetes) and a message. Repeats are folded, as Kubernetes does: an event
with the same type, reason, message, replica, version and code as an earlier one of the same
incarnation is the same item, its `count` raised and its last-seen time moved (`fold_key`).

Pure: no client, no clock, no I/O. The store writes an event in the same DynamoDB call as the
state change it reports (store/events.py); this module only says which events a change is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from fleetkeeper.model import InterruptionKind, ReplicaStatus, ServiceStatus

if TYPE_CHECKING:
    from fleetkeeper.model import BalancerState, ReplicaRecord

# The newest events a service keeps (ECS keeps 100): older ones are never answered, and every event
# expires EVENT_TTL_SECONDS after it was last seen (DynamoDB TTL deletes it, late: reads filter).
EVENTS_KEPT = 100
EVENT_TTL_SECONDS = 7 * 24 * 3600


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    """One event as a writer reports it; `fold_key` identifies its repeats."""

    reason: str
    message: str
    type: EventType = EventType.NORMAL
    replica_id: int | None = None
    version: int | None = None
    # The typed failure code of a failed replica or a refused launch (invariant 10, docs/architecture/invariants.md).
    code: str | None = None

    @property
    def fold_key(self) -> str:
        """16 hex digits from everything that makes the event what it is (not its times)."""
        facts = [self.type.value, self.reason, self.message, self.replica_id, self.version, self.code]
        return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class EventRecord:
    """An event as stored: folded repeats counted, first and last seen (ISO 8601)."""

    event: Event
    first_seen: str
    last_seen: str
    count: int
    # When DynamoDB's TTL may delete it (epoch seconds); a read skips it from then on.
    expires_at: int
    # Orders events last seen at the same instant (one run's, written with its one `now`): when it was
    # written, in nanoseconds, increasing within the store that wrote it (store.events.EventSequence).
    # 0: an item written before events had one.
    sequence: int = 0


# --- what the api's writes report ---------------------------------------------------------------------


def created(version: int) -> Event:
    return Event("Created", f"service created at version {version}", version=version)


def updated(version: int, mode: str) -> Event:
    return Event("Updated", f"updated to version {version} ({mode})", version=version)


def rolled_back(version: int, previous: int) -> Event:
    message = f"rolled back from version {previous} to version {version} (by request)"
    return Event("RolledBack", message, version=version)


def deleting() -> Event:
    return Event("Deleting", "delete requested: draining and terminating every replica")


def access_changed(by: str, changes: list[str]) -> Event:
    """Who may read or change the service changed (fleetkeeper.owners.access): who did it, and what."""
    return Event("AccessChanged", f"access changed by {by or 'fleetkeeper'}: {'; '.join(changes)}")


def termination_requested(replica_id: int, by: str) -> Event:
    """A person asked for one replica to go (`fleetkeeper down NAME --replica-id N`)."""
    message = f"termination of replica {replica_id} requested by {by or 'fleetkeeper'}: it is drained and replaced"
    return Event("TerminationRequested", message, replica_id=replica_id)


# --- what the reconciler's writes report ---------------------------------------------------------------


def claimed(version: int, replica_ids: tuple[int, ...] | list[int]) -> Event:
    ids = ", ".join(str(rid) for rid in replica_ids)
    return Event("Claimed", f"replica(s) {ids} claimed for version {version}", version=version)


def version_ready(version: int) -> Event:
    return Event("VersionReady", f"version {version} has a READY replica", version=version)


def breaker_tripped(version: int, message: str, rollback_to: int | None) -> list[Event]:
    events = [Event("BreakerTripped", message, EventType.WARNING, version=version)]
    if rollback_to is not None:
        events.append(
            Event(
                "RolledBack",
                f"rolled back from version {version} to version {rollback_to} by the circuit breaker",
                EventType.WARNING,
                version=rollback_to,
            )
        )
    return events


def status_changed(before: ServiceStatus, after: ServiceStatus, message: str) -> list[Event]:
    """The service's status moved to another value (not merely another message)."""
    if before is after:
        return []
    kind = EventType.WARNING if after is ServiceStatus.FAILED else EventType.NORMAL
    reason = "Service" + "".join(part.capitalize() for part in after.value.split("_"))
    return [Event(reason, message, kind)]


def terminated(record: ReplicaRecord) -> Event:
    """A leaving replica's item goes: its instance is gone."""
    instance = f" (instance {record.instance_id})" if record.instance_id else ""
    return Event(
        "Terminated",
        f"replica {record.replica_id}{instance} is gone",
        replica_id=record.replica_id,
        version=record.version,
    )


def scaled(previous: int, target: int, why: str) -> Event:
    """The autoscaler moved the target number of replicas (issue 13 writes it with its decision)."""
    return Event("Scaled", f"target replicas {previous} -> {target}: {why}")


_FAILED_REASONS = {
    ReplicaStatus.FAILED_PROVISION: "LaunchRefused",
    ReplicaStatus.FAILED_INITIAL_DELAY: "ReplicaFailed",
    ReplicaStatus.FAILED_PROBING: "ReplicaFailed",
    ReplicaStatus.FAILED: "ReplicaFailed",
    ReplicaStatus.PREEMPTED: "Preempted",
}


_WARNINGS = {
    InterruptionKind.SPOT_INTERRUPTION: "a spot interruption warning (AWS takes it back in two minutes)",
    InterruptionKind.REBALANCE: "a rebalance recommendation (elevated risk of interruption)",
}


def replica_changed(before: ReplicaRecord, after: ReplicaRecord) -> list[Event]:
    """The events of one replica write: its status transition, its instance, its endpoint state.

    A write that changes nothing a person cares about (a probe bookkeeping field, a revision bump)
    reports nothing; each event's message is deterministic, so a repeat folds into the earlier one.
    """
    rid, version = after.replica_id, after.version
    events: list[Event] = []

    def add(reason: str, message: str, kind: EventType = EventType.NORMAL, code: str | None = None) -> None:
        events.append(Event(reason, message, kind, replica_id=rid, version=version, code=code))

    if after.instance_id and after.instance_id != before.instance_id and after.status is ReplicaStatus.PROVISIONING:
        kind = f" ({after.market.value} {after.instance_type})" if after.instance_type else f" ({after.market.value})"
        add("Launched", f"replica {rid} launched: instance {after.instance_id}{kind}")
    if after.version != before.version:
        # An update that keeps replicas (fleetkeeper.reconciler.plan.in_place): no relaunch.
        add("UpdatedInPlace", f"replica {rid} serves version {after.version} in place (from version {before.version})")
    warning = after.interruption
    if warning is not None and warning != before.interruption:
        said = _WARNINGS[warning.kind]
        add("Interrupted", f"replica {rid}: AWS sent {said} for instance {warning.instance_id}", EventType.WARNING)
    refused_again = after.status is ReplicaStatus.FAILED_PROVISION and after.launch_attempts > before.launch_attempts
    reworded = after.status.failed and after.status_message != before.status_message
    changed = after.status is not before.status or reworded
    if changed or refused_again:
        status = after.status
        detail = f": {after.status_message}" if after.status_message else ""
        if status is ReplicaStatus.READY:
            add("ReplicaReady", f"replica {rid} is READY")
        elif status is ReplicaStatus.NOT_READY:
            add("ReplicaNotReady", f"replica {rid} is NOT_READY{detail}", EventType.WARNING)
        elif status in _FAILED_REASONS:
            add(_FAILED_REASONS[status], f"replica {rid} {status.value}{detail}", EventType.WARNING, after.failure_code)
        elif status is ReplicaStatus.SHUTTING_DOWN:
            add("Terminating", f"replica {rid} shutting down{detail}")
    if _draining(after.balancer) and not _draining(before.balancer):
        add("Draining", f"replica {rid} leaves the endpoint: draining its requests")
    elif _draining(before.balancer) and after.balancer is None:
        add("Drained", f"replica {rid} drained from the endpoint")
    return events


def _draining(state: BalancerState | None) -> bool:
    return state is not None and state.value == "DRAINING"
