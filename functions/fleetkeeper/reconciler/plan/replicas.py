"""Which replicas run and which go (`_plan_replicas`): finished items deleted, the target scaled to
its wanted count in each market, an old version replaced rolling or blue-green, and the launches and
claims that fill the gap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetkeeper.choices import UpdateMode
from fleetkeeper.model import (
    Market,
    ReplicaRecord,
    ReplicaStatus,
    ServiceState,
    VersionState,
    from_iso,
    to_iso,
)
from fleetkeeper.reconciler.plan.actions import Action, Claim, Launch
from fleetkeeper.reconciler.plan.lifecycle import LEAVING
from fleetkeeper.reconciler.plan.markets import wanted_by_market
from fleetkeeper.reconciler.plan.observe import _may_be_unseen
from fleetkeeper.reconciler.plan.scale import wanted_replicas
from fleetkeeper.reconciler.plan.spot_warnings import _plan_warned

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Set
    from datetime import datetime

    from fleetkeeper.reconciler.driver import Instance
    from fleetkeeper.reconciler.plan.policy import Policy
    from fleetkeeper.reconciler.plan.work import _Work
    from fleetkeeper.spec.service import ServiceSpec


TERMINATED_BY_REQUEST = "terminated by request (fleetkeeper down --replica-id)"


def _removal_order(record: ReplicaRecord) -> tuple[bool, int]:
    """Which replicas go first when there are too many: not-ready ones, then the newest."""
    return (record.status is ReplicaStatus.READY, -record.replica_id)


@dataclass(frozen=True)
class _Rollout:
    """What an update mode decides from: the target's spec, the old version's READY replicas, and the
    target's replicas (`ready_new` READY of `new`; `wanted` in all, `total` with its fallback)."""

    spec: ServiceSpec
    old_ready: list[ReplicaRecord]
    ready_new: int
    wanted: int
    total: int
    new: int
    room: int  # replicas the target may still claim


def _blue_green(r: _Rollout) -> tuple[list[ReplicaRecord], int]:
    """SkyPilot's switch: once the new version has min_replicas READY (at least one), all traffic goes
    to it and the old version goes; the rest of `wanted` keeps booting."""
    going = r.old_ready if r.ready_new >= min(r.wanted, max(r.spec.min_replicas, 1)) else []
    return going, r.room


def _rolling(r: _Rollout) -> tuple[list[ReplicaRecord], int]:
    """Keep at least `wanted - max_unavailable` ready; oldest versions go first. The surge is over
    every replica the target wants, on-demand fallback ones included."""
    update = r.spec.update
    removable = max(r.ready_new + len(r.old_ready) - max(r.wanted - update.max_unavailable, 0), 0)
    going = sorted(r.old_ready, key=lambda record: (record.version, record.replica_id))[:removable]
    staying = len(r.old_ready) - len(going)
    return going, min(r.room, max(r.total + update.max_surge - r.new - staying, 0))


# How each update mode rolls out: the old version's READY replicas that go in this run, and the room
# the target has left to claim (tests/test_choices.py holds it to one per UpdateMode).
ROLLOUTS: Mapping[UpdateMode, Callable[[_Rollout], tuple[list[ReplicaRecord], int]]] = {
    UpdateMode.ROLLING: _rolling,
    UpdateMode.BLUE_GREEN: _blue_green,
}


def _plan_replicas(
    state: ServiceState,
    live: Mapping[int, Instance],
    work: _Work,
    versions: Mapping[int, VersionState],
    now: datetime,
    policy: Policy,
    described: Set[str],
) -> list[Action]:
    """Scale, roll and replace: drains go into `work`, claims and launches are returned. `described`:
    the ids of the service's instances DescribeInstances listed, in any state."""
    service = state.service
    target_number = service.target_version
    target = state.target
    target_failed = target is None or versions.get(target_number) is VersionState.FAILED
    wanted = 0 if target is None or target_failed else wanted_replicas(state)

    def retrying(record: ReplicaRecord) -> bool:
        """A refused launch of the live target is retried in place; any other refusal is dropped."""
        return record.version == target_number and not target_failed

    def holds_slot(record: ReplicaRecord) -> bool:
        if record.interruption is not None:
            return False  # warned by AWS: replaced at once (_plan_warned)
        if record.status is ReplicaStatus.FAILED_PROVISION:
            return retrying(record)
        return record.status not in LEAVING

    # Items whose replica is over and whose instance is gone. The target's failures stay while the
    # circuit breaker may still need to count them (the version is neither READY nor FAILED yet).
    for replica_id, before in sorted(work.original.items()):
        refused = before.status is ReplicaStatus.FAILED_PROVISION
        over = before.status in LEAVING or (refused and not retrying(before))
        counted = before.status.failed and before.version == target_number
        counted = counted and versions.get(target_number) is VersionState.NEW
        if over and replica_id not in live and not counted and not _may_be_unseen(before, described, now, policy):
            work.delete.append(before)

    _plan_warned(work, live, target, wanted, now, policy)
    # Asked for by a person (`fleetkeeper down NAME --replica-id N`): drained and terminated now; it
    # holds no slot from here, so its replacement is claimed in this plan, as SkyPilot's
    # `sky serve down --replica-id` has the autoscaler launch another.
    for record in sorted(work.replicas.values(), key=lambda r: r.replica_id):
        if record.terminate_requested_at is not None and record.status not in LEAVING:
            work.drain(record.replica_id, TERMINATED_BY_REQUEST, live)
    new = [r for r in work.replicas.values() if holds_slot(r) and r.version == target_number]
    old = [r for r in work.replicas.values() if holds_slot(r) and r.version != target_number]

    markets = target.spec.markets if target is not None else None
    spot_ready = sum(1 for r in new if r.market is Market.SPOT and r.status is ReplicaStatus.READY)
    overprovision = target.spec.overprovision if target is not None else 0
    wanted_by = wanted_by_market(markets, wanted, spot_ready, overprovision)
    for market in wanted_by:  # spot first, then its on-demand fallback
        bought = [r for r in new if r.market is market]
        if len(bought) <= wanted_by[market]:
            continue
        if target_failed:
            why = f"version {target_number} FAILED"
        elif market is Market.ON_DEMAND and markets is not None and markets.dynamic_fallback and spot_ready:
            why = f"on-demand fallback retired: {spot_ready} spot replica(s) READY"
        else:
            why = f"scaling down to {wanted}"
        excess = sorted(bought, key=_removal_order)[: len(bought) - wanted_by[market]]
        for record in excess:
            work.drain(record.replica_id, why, live)
        new = [r for r in new if r not in excess]

    ready_new = sum(1 for r in new if r.status is ReplicaStatus.READY)
    total = sum(wanted_by.values())
    room = total - len(new)
    if old and target is not None:
        replaced = f"replaced by version {target_number} ({target.mode})"
        # Old replicas that serve nothing go at once in both modes: they hold no availability.
        old_ready = [r for r in old if r.status is ReplicaStatus.READY]
        for record in old:
            if record.status is not ReplicaStatus.READY:
                work.drain(record.replica_id, replaced, live)
        if target_failed:
            # Nothing replaces them (a FAILED target launches nothing): what still serves keeps
            # serving until the user updates the service or rolls back to a READY version.
            going: list[ReplicaRecord] = []
        else:
            going, room = ROLLOUTS[target.mode](
                _Rollout(target.spec, old_ready, ready_new, wanted, total, len(new), room)
            )
        for record in going:
            work.drain(record.replica_id, replaced, live)

    return _launches(state, new, live, work, wanted_by, room, now, policy)


def _launches(
    state: ServiceState,
    new: list[ReplicaRecord],
    live: Mapping[int, Instance],
    work: _Work,
    wanted_by: Mapping[Market, int],
    room: int,
    now: datetime,
    policy: Policy,
) -> list[Action]:
    """The target's launches: its claimed replicas not launched yet (after their backoff), then claims
    for the `room` left (spot first), within the run's launch cap."""
    service, target, target_number = state.service, state.target, state.service.target_version
    actions: list[Action] = []
    for record in sorted(new, key=lambda r: r.replica_id):
        waiting = record.instance_id is not None or record.replica_id in live
        if waiting or record.status not in (ReplicaStatus.PENDING, ReplicaStatus.FAILED_PROVISION):
            continue
        if record.next_attempt_at is not None and from_iso(record.next_attempt_at) > now:
            continue  # AWS refused it: exponential backoff
        actions.append(Launch(record.replica_id, fresh=False))
    room = min(room, policy.max_launches_per_run - len(actions))
    if room > 0 and target is not None:
        # Spot first (what the service is meant to run on), then on-demand (its fallback).
        spot_room = min(room, max(wanted_by[Market.SPOT] - sum(1 for r in new if r.market is Market.SPOT), 0))
        ids = tuple(range(service.replica_seq, service.replica_seq + room))
        spot_ids = ids[:spot_room]
        actions.append(Claim(target_number, ids, spot_ids))
        actions.extend(Launch(replica_id, fresh=True) for replica_id in ids)
        stamp = to_iso(now)
        for replica_id in ids:
            market = Market.SPOT if replica_id in spot_ids else Market.ON_DEMAND
            work.claimed.append(ReplicaRecord.pending(service, replica_id, target_number, stamp, market))
    return actions
