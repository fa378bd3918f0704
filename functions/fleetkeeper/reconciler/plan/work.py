"""What one plan accumulates (`_Work`: records, drains, terminations, deletions, claims) and how it
becomes actions in apply order."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleetkeeper.model import (
    ReplicaRecord,
    ReplicaStatus,
    to_iso,
)
from fleetkeeper.reconciler.plan.actions import Action, DeleteReplica, RecordReplica, Terminate

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from fleetkeeper.reconciler.driver import Instance


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
