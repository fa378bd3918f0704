"""Follow-ups: when a service in motion should be reconciled next, between two scheduled runs.

A run that leaves a service in a state that will change soon (a replica booting or probing, a drain,
an instance on its way out, a refused launch whose backoff ends, a warned replica's drain deadline)
asks for that one service's next run at the moment it matters: a delayed kick (SQS DelaySeconds,
fleetkeeper.kick). `next_reconcile` is that moment, pure: no AWS, no clock. A steady service has
none, so it costs nothing beyond the schedule (invariant 6).

`follow_up` turns the moment into a decision against the follow-up already pending on the service
item (`ServiceRecord.followup_at`): a service never has more than one live follow-up, and never two
closer than `Policy.follow_up_min_gap`. The shell writes the new due time (conditioned on the one it
read) before it sends the kick, and the worker runs a follow-up kick only while the item still names
it: a duplicate, or one a newer follow-up replaced, costs one read and nothing more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from fleetkeeper.model import BalancerState, Lifecycle, ReplicaRecord, ReplicaStatus, ServiceState, from_iso
from fleetkeeper.reconciler.plan import LEAVING, Policy, drain_due, initial_delay_origin

if TYPE_CHECKING:
    from collections.abc import Iterable, Set

# SQS's longest DelaySeconds: a moment further off is left to the schedule, which comes first.
MAX_DELAY_SECONDS = 900
# Replicas on their way up: looked at every `follow_up_interval` until READY or failed.
_IN_MOTION = frozenset({ReplicaStatus.PROVISIONING, ReplicaStatus.STARTING, ReplicaStatus.NOT_READY})


def next_reconcile(
    state: ServiceState, live: Set[int], now: datetime, policy: Policy, unjudged: Set[int] = frozenset()
) -> datetime | None:
    """The next moment a run of this service would change something, or None (steady: nothing to wait
    for). `state`: the service as the run left it (its records as written); `live`: the replica ids
    whose instance the run saw live; `unjudged`: the replicas whose long probe was still in flight when
    the run had no more time for it (a READY one too: a run of its own, which has a whole invocation,
    judges it). Never earlier than `now`: a deadline already past is the plan's to act on in this very
    run, not a reason to come back at once."""
    soon = now + policy.follow_up_interval
    if state.service.lifecycle is Lifecycle.DELETING:
        return soon  # instances going: the item goes once a run sees them gone
    if any(rid in state.replicas and state.replicas[rid].status not in LEAVING for rid in unjudged):
        return soon
    moments = [
        moment
        for record in state.replicas.values()
        for moment, polled in _moments(record, state, live, now, policy)
        if polled or moment > now
    ]
    return min(moments, default=None)


def _moments(
    record: ReplicaRecord, state: ServiceState, live: Set[int], now: datetime, policy: Policy
) -> Iterable[tuple[datetime, bool]]:
    """When this replica's record or instance is next worth a look: (moment, polled). A polled moment
    is `soon` (or `now`), for a replica in motion; the others are deadlines, worth a run only while
    ahead."""
    soon = now + policy.follow_up_interval
    status = record.status
    # A refused launch of the target is retried in place; one of another version is dropped.
    retried = record.version == state.service.target_version
    if status in LEAVING:
        if record.replica_id in live:
            drain = list(_drain_over(record, state)) if record.balancer is BalancerState.DRAINING else []
            if drain and drain[0][0] > now:
                # Held for its drain: terminated when the balancer reports it drained, or at its end.
                yield soon, True
                yield from drain
            else:
                # Terminated by this run: the next run sees it gone, and its item goes (with it the
                # update's "old replica(s) left"), as soon as the minimum gap allows.
                yield now, True
        else:
            # Kept while an instance DescribeInstances does not show yet may still appear
            # (plan.observe._may_be_unseen): the item goes once that grace is over.
            since = from_iso(record.launched_at or record.updated_at)
            yield since + policy.lost_instance_grace, False
        return
    if record.balancer is BalancerState.DRAINING:
        yield soon, True  # the balancer may report it drained before its deadline
        yield from _drain_over(record, state)
    if status in _IN_MOTION:
        yield soon, True
        version = state.versions.get(record.version)
        origin = initial_delay_origin(record)
        if version is not None and origin is not None and status is not ReplicaStatus.NOT_READY:
            delay = version.spec.service.readiness_probe.initial_delay_seconds
            # One second past the delay: the plan fails a replica strictly after it.
            yield from_iso(origin) + timedelta(seconds=delay + 1), False
    elif status is ReplicaStatus.PENDING and record.instance_id is None:
        # Claimed and not launched (a run cut short): launched by the next run.
        yield (from_iso(record.next_attempt_at), False) if record.next_attempt_at else (soon, True)
    elif status is ReplicaStatus.FAILED_PROVISION and record.next_attempt_at is not None and retried:
        yield from_iso(record.next_attempt_at), False  # its backoff ends: launched again
    if record.interruption is not None and status is ReplicaStatus.READY:
        deadline = drain_due(record.interruption, state.target, policy)
        if deadline is not None:
            yield deadline, False  # the warned replica's drain must start


def _drain_over(record: ReplicaRecord, state: ServiceState) -> Iterable[tuple[datetime, bool]]:
    """A draining replica's deadline (the endpoint's drain time after its drain began): its instance
    is terminated then, drained or not (plan.endpoints._Balance)."""
    endpoint = state.service.endpoint
    if record.drain_started_at is not None and endpoint is not None:
        yield from_iso(record.drain_started_at) + timedelta(seconds=endpoint.config.drain_seconds + 1), False


@dataclass(frozen=True)
class FollowUp:
    """A follow-up to ask for: a kick `delay_seconds` from now, due at `due` (epoch seconds), replacing
    the pending one the run read (`seen`)."""

    delay_seconds: int
    due: int
    seen: int | None


def follow_up(
    moment: datetime | None, pending: int | None, now: datetime, policy: Policy, *, running: int | None = None
) -> FollowUp | None:
    """Whether to ask for a follow-up at `moment`, given the one pending on the service (`pending`: its
    due time in epoch seconds, as the run read it; None: none ever) and the follow-up this run is
    (`running`, None for any other run). None: nothing to send, because nothing is due, it is further
    off than SQS can delay (the schedule comes first), or the pending one is early enough (not later
    than the moment by more than the minimum gap)."""
    if moment is None:
        return None
    gap = policy.follow_up_min_gap.total_seconds()
    delay = max(math.ceil((moment - now).total_seconds()), math.ceil(gap))
    if delay > MAX_DELAY_SECONDS:
        return None
    now_seconds = math.floor(now.timestamp())
    due = now_seconds + delay
    on_its_way = pending is not None and pending != running and pending > now_seconds
    if on_its_way and pending is not None and pending <= due + gap:
        return None  # one is on its way, early enough: coalesced
    return FollowUp(delay_seconds=delay, due=due, seen=pending)
