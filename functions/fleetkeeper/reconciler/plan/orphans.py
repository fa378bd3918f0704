"""Which managed instances belong to no live service and are terminated (the scheduled sweep)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.reconciler.plan.actions import Terminate
from fleetkeeper.reconciler.plan.observe import _seconds_since, is_live, launched_by_fleetkeeper
from fleetkeeper.reconciler.plan.policy import Policy

if TYPE_CHECKING:
    from collections.abc import Sequence, Set
    from datetime import datetime

    from fleetkeeper.reconciler.driver import Instance


def plan_orphans(
    live_uids: Set[str],
    instances: Sequence[Instance],
    now: datetime,
    policy: Policy | None = None,
    *,
    spared_services: Set[str] = frozenset(),
    stack_id: str | None = None,
) -> Terminate | None:
    """Managed instances of no live service (deleted, or an old incarnation), past the grace period.

    Only the scheduled run sweeps, and only instances the driver listed, which are all managed: an
    instance without the managed tag is never even seen. An instance fleetkeeper did not launch
    (`launched_by_fleetkeeper`) is never an orphan, nor is one of `spared_services`: services this
    run could not load, whose uid it therefore cannot vouch for. With `stack_id`, nor is one not
    tagged with that stack (another stack's, or one launched before stacks had ids: nothing proves
    an untagged one is this stack's, fleetkeeper.reconciler.ownership).
    """
    policy = policy or Policy()
    reasons: dict[str, str] = {}
    for instance in instances:
        if not is_live(instance) or instance.uid in live_uids or not launched_by_fleetkeeper(instance):
            continue
        if stack_id is not None and instance.stack != stack_id:
            continue
        if instance.service in spared_services:
            continue
        age = _seconds_since(instance.launched_at, now)
        if age is not None and age < policy.orphan_grace.total_seconds():
            continue  # maybe a service created after this run listed the services
        owner = f"{instance.service or '?'} (uid {instance.uid or '?'})"
        reasons[instance.instance_id] = f"orphan: service {owner} no longer exists"
    return Terminate(tuple(sorted(reasons.items()))) if reasons else None
