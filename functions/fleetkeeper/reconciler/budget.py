"""A shard worker's time budget (`ShardBudget`): what is left of its invocation, and the margins it keeps.

(Not the cleanup's `fleetkeeper.cleanup.logic.Budget`, which gates each DynamoDB call on the
invocation's time alone.)

A shard worker must return before Lambda kills it (its timeout) and before the next period hands the
same services out again (the shard's `not_after`). It checks the budget at two points only:

- before it starts a service: it needs `service_margin` seconds, or more once a service of this
  invocation took longer (the slowest seen, with a quarter on top);
- before a slow action inside a service (a launch): it needs `action_margin` seconds; short of it,
  the service stops there, exactly as a run killed at that point would (the crash sweep proves the
  next run completes it: claimed replicas stay PENDING and are launched then).

Between those points the AWS calls are held to the invocation's deadline (fleetkeeper.aws.deadline,
which the handler sets to the invocation's remaining time less the same 1 s return reserve as this
budget's): an attempt starts only with its worst case in hand (connect + read timeout, 3 + 10 s; EC2's
adaptive client 2 s more for its rate limiter's token), a retry only with its longest backoff pause
and the next attempt's worst case. A call the deadline stops raises `aws.DeadlineReached`: the
service in progress stops there as a killed run would (`cut_short`) and the rest is `skipped`.

The arithmetic. `remaining()` here is min(invocation, period) - 1 s, so it is never more than the
deadline's remaining time. Without the deadline, one AWS call begun with the margins in hand could
last 6 attempts of 13 s and 56 s of backoff pauses (aws.WORST_CASE_RETRY_WAIT_SECONDS): 134 s,
more than the function's whole timeout. With it, no AWS attempt or pause runs past the deadline
(under the attempt's assumptions: each read on the socket ends within the read timeout, and
fleetkeeper's answers take few), so the worst overshoot past it is bounded by the work that is not
an AWS call: the CPU between calls (planning, parsing: milliseconds per service) and what the
budget bounds itself (the probe phase, within `probe_seconds`, and the long probes, within what is
left after a service margin). The handler therefore returns with about its 1 s reserve before
Lambda's timeout, its report logged. The period's end (`not_after`) is the budget's only, not the
deadline's: a service started before it may run past it by what that service takes, never past
the deadline (a second worker on the service then loses a condition, which is harmless).

The margins keep their meaning: they say where a run stops starting work, the deadline where its
calls stop. A margin below one attempt's worst case is consistent with it, not contradicted: a
service (or a launch) started with less than 13-15 s to the deadline is stopped by the deadline at
its first call instead, with the same outcome (`cut_short`, claims PENDING). When the period binds
(the default: a 120 s timeout and a 55 s period), the deadline is a minute away and never does.

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
class ShardBudget:
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
