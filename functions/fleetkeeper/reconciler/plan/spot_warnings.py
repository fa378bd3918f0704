"""Replicas AWS warned about (spot interruption warnings, rebalance recommendations): what is
recorded, when a warned replica's drain must start, and when it is replaced."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from fleetkeeper.model import (
    Interruption,
    InterruptionKind,
    ReplicaRecord,
    ReplicaStatus,
    VersionRecord,
    from_iso,
)
from fleetkeeper.reconciler.plan.lifecycle import LEAVING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetkeeper.reconciler.driver import Instance
    from fleetkeeper.reconciler.plan.policy import Policy
    from fleetkeeper.reconciler.plan.work import _Work


def warned(record: ReplicaRecord, interruption: Interruption) -> ReplicaRecord | None:
    """The record of a replica whose instance AWS warned about, or None: nothing to record (another
    instance's warning, a replica already leaving, or the same or a weaker warning recorded already)."""
    if record.status in LEAVING or record.instance_id not in (None, interruption.instance_id):
        return None
    known = record.interruption
    # A rebalance recommendation after the interruption warning adds nothing.
    stronger = known is not None and known.kind in (interruption.kind, InterruptionKind.SPOT_INTERRUPTION)
    if known is not None and known.instance_id == interruption.instance_id and stronger:
        return None
    return replace(record, interruption=interruption)


def drain_due(interruption: Interruption, version: VersionRecord | None, policy: Policy) -> datetime | None:
    """When a replica warned of a spot interruption must start its drain, so that the drain is over
    before AWS takes the instance: the notice, less the version's drain time, less the margin.
    None: a rebalance recommendation (no deadline)."""
    if interruption.kind is not InterruptionKind.SPOT_INTERRUPTION:
        return None
    drain = timedelta(seconds=version.spec.drain_seconds if version is not None else 0)
    due: datetime = from_iso(interruption.at) + policy.interruption_notice - drain - policy.warning_margin
    return due


def _plan_warned(
    work: _Work,
    live: Mapping[int, Instance],
    target: VersionRecord | None,
    wanted: int,
    now: datetime,
    policy: Policy,
) -> None:
    """Replicas AWS warned about: they hold no slot (their replacements are claimed in this plan) and
    serve until enough unwarned replicas of the target are READY to stand in for them, or until a
    spot interruption's deadline: a warned replica is drained early enough that its drain ends
    before AWS takes the instance (its notice, less the endpoint's drain time, less one run period
    of margin). A warned replica that is not READY goes at once: it serves nothing.
    """
    warned = [r for r in work.replicas.values() if r.interruption is not None and r.status not in LEAVING]
    if not warned:
        return
    target_number = target.version if target is not None else None
    ready_unwarned = sum(
        1
        for r in work.replicas.values()
        if r.version == target_number and r.interruption is None and r.status is ReplicaStatus.READY
    )
    for record in sorted(warned, key=lambda r: r.replica_id):
        notice = record.interruption
        assert notice is not None
        if notice.kind is InterruptionKind.SPOT_INTERRUPTION:
            what = f"spot interruption warning at {notice.at}: AWS takes instance {notice.instance_id} back"
            deadline = drain_due(notice, target, policy)
            due = deadline is not None and now >= deadline
        else:
            what = f"rebalance recommendation at {notice.at} for instance {notice.instance_id}"
            due = False
        if record.status is not ReplicaStatus.READY or due:
            why = what
        elif ready_unwarned >= wanted:
            why = f"replaced after a {what}"
        else:
            continue  # serving until its replacement is READY
        work.drain(record.replica_id, why, live)
