"""What one reconcile run did (`RunReport`): its log line and the worker's return value.

Every part of a run writes into the one report it is handed (fleetkeeper.reconciler.run, .apply,
.instance_events, .legacy); the handler logs it and returns `as_dict()` (fleetkeeper.reconciler.handler).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunReport:
    """What one run did: for the log line and the handler's return value."""

    services: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    superseded: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    # Services read mid-transaction (the target version not visible yet): nothing written for them.
    unobserved: list[str] = field(default_factory=list)
    # Services whose items could not be loaded (corrupt, another schema, or the read failed), with
    # why: skipped this run, and their instances spared by the orphan sweep.
    unloadable: dict[str, str] = field(default_factory=dict)
    # Instances carrying fleetkeeper's tags without a ClientToken fleetkeeper derives, or another
    # stack's (seen by uid): left alone. With the adoption off, this stack's own replicas from before
    # stacks had ids too (fleetkeeper.reconciler.legacy).
    foreign: list[str] = field(default_factory=list)
    # This stack's replicas from before stacks had ids, tagged with its id by this run.
    adopted: list[str] = field(default_factory=list)
    # A bounded run's shortfall, done by the next: services not started for lack of time, and
    # services stopped before a launch (as a crash there would; their claims stay PENDING).
    skipped: list[str] = field(default_factory=list)
    cut_short: list[str] = field(default_factory=list)
    # A follow-up kick that was no longer the service's pending one: nothing was done.
    void_followup: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "services": self.services,
            "actions": dict(sorted(self.actions.items())),
            "superseded": self.superseded,
            "errors": self.errors,
            "orphans_terminated": self.orphans,
            "unobserved": self.unobserved,
            "unloadable": dict(sorted(self.unloadable.items())),
            "foreign_instances": self.foreign,
            "adopted_instances": self.adopted,
            "skipped": self.skipped,
            "cut_short": self.cut_short,
        }
