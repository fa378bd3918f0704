"""A worker's time budget: what is left of its invocation, and the margins it keeps.

A shard worker must return before Lambda kills it (its timeout) and before the next period hands the
same services out again (the shard's `not_after`). It checks the budget at two points only:

- before it starts a service: it needs `service_margin` seconds, or more once a service of this
  invocation took longer (the slowest seen, with a quarter on top);
- before a slow action inside a service (a launch): it needs `action_margin` seconds; short of it,
  the service stops there, exactly as a run killed at that point would (the crash sweep proves the
  next run completes it: claimed replicas stay PENDING and are launched then).

Correctness never rests on the margins: a kill at any AWS call is a state the next run completes.
The margins make a kill rare, and keep a cut-short run's report truthful.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

# The defaults (FLEETKEEPER_SERVICE_MARGIN_SECONDS, FLEETKEEPER_ACTION_MARGIN_SECONDS): a service step
# is its reads already done, the plan and its writes, well under a second, but a launch
# (RunInstances) can take several and a throttled call retries with backoff (10 s); one
# RunInstances with room for a retry, plus the write that records it (5 s).
from fleetkeeper.settings import DEFAULT_ACTION_MARGIN_SECONDS, DEFAULT_SERVICE_MARGIN_SECONDS

if TYPE_CHECKING:
    from collections.abc import Callable

# Above the slowest service seen: the next may be a little slower.
_SLOWEST_FACTOR = 1.25


@dataclass
class Budget:
    """`remaining()` is the seconds this worker may still use (it may fall below zero)."""

    remaining: Callable[[], float]
    service_margin: float = DEFAULT_SERVICE_MARGIN_SECONDS
    action_margin: float = DEFAULT_ACTION_MARGIN_SECONDS
    slowest_service: float = 0.0

    def may_start_service(self) -> bool:
        return self.remaining() > max(self.service_margin, self.slowest_service * _SLOWEST_FACTOR)

    def may_start_action(self) -> bool:
        return self.remaining() > self.action_margin

    def probe_seconds(self, wanted: float) -> float:
        """The probe phase's budget: `wanted`, less what must stay for starting a service after it."""
        return max(0.0, min(wanted, self.remaining() - self.service_margin))

    def observe_service(self, started_with: float) -> None:
        """A service step that began with `started_with` seconds remaining has ended."""
        self.slowest_service = max(self.slowest_service, started_with - self.remaining())
