"""The dispatcher: the scheduled run's first step, once a period, in one small invocation.

It lists the services from the index (one paginated Query), sends them to the reconcile queue in
shards (fleetkeeper.reconciler.fanout), then runs the orphan sweep: the one step that needs every
managed instance (a full DescribeInstances) and every live uid, so it runs here, once a period,
and never in the workers, which describe only their shard's instances. For the same reason it keeps
the replica identities (fleetkeeper.replicas.identity): before the shards go out it makes (and records)
the role and instance profile of every listed owner that lacks one, so the workers find them, and after
them it removes those of owners with no service left. IAM is reachable from here and not from the
workers' VPC, which is the other reason this is the dispatcher's work.

Its time: the handler holds every AWS call to the invocation's deadline (fleetkeeper.aws.deadline).
The identities come first and may cost many IAM calls, so they get a deadline of their own that ends
IDENTITIES_LEAVE_SECONDS earlier (`aws.keeping`): what they cannot make in it waits for the next
period, and the shards still go out. A call the invocation's deadline stops ends the dispatch there
(`out_of_time` in its report): what it did not do, the next period's does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetkeeper import aws
from fleetkeeper.reconciler.fanout import make_shards, run_index

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from fleetkeeper.reconciler.queue import ShardQueue
    from fleetkeeper.reconciler.report import RunReport
    from fleetkeeper.reconciler.run import Reconciler
    from fleetkeeper.replicas.identity import IdentityKeeper
    from fleetkeeper.store.runs import Listed

logger = logging.getLogger(__name__)

# A worker starts no service in the last seconds before the next dispatch hands its services out
# again: two workers on one service are harmless (one loses a condition) but pay twice.
NEXT_DISPATCH_SLACK_SECONDS = 5.0
# What the identities leave of the invocation for the rest of the dispatch: the worst case of the
# shards' first SendMessageBatch attempt (3 s to connect, 10 s to read: fleetkeeper.aws), with 2 s to
# spare. At the function's 60 s (less 1 s to return), IAM calls may start while 13 s of the 44 s
# left to them remain: a steady period makes one ListInstanceProfiles call, a new owner 4-5 IAM writes.
IDENTITIES_LEAVE_SECONDS = 15.0


@dataclass
class DispatchReport:
    services: int = 0
    shards: int = 0
    send_calls: int = 0
    unsent: list[int] = field(default_factory=list)  # shard indices SQS would not take
    unsent_services: int = 0
    sweep: dict[str, Any] = field(default_factory=dict)
    identities_made: list[str] = field(default_factory=list)  # owners' scopes
    identities_refused: dict[str, str] = field(default_factory=dict)  # scope -> why IAM would not
    identities_removed: list[str] = field(default_factory=list)  # owners' scopes
    pools_retired: list[str] = field(default_factory=list)  # load balancers the stack made and deleted
    # The call the invocation's deadline stopped (its steps after it were not done), else None.
    out_of_time: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "out_of_time": self.out_of_time,
            "identities_made": self.identities_made,
            "identities_refused": self.identities_refused,
            "identities_removed": self.identities_removed,
            "pools_retired": self.pools_retired,
            "services": self.services,
            "shards": self.shards,
            "send_calls": self.send_calls,
            "unsent_shards": self.unsent,
            "unsent_services": self.unsent_services,
            "sweep": self.sweep,
        }


@dataclass
class Dispatcher:
    reconciler: Reconciler  # its store lists the services; its driver serves the sweep
    queue: ShardQueue
    shard_size: int
    period_seconds: int
    # Replica identity "owner": the owners' roles, made here for the listed owners and removed once
    # their owner has no service.
    identities: IdentityKeeper | None = None

    def run(self) -> DispatchReport:
        report = DispatchReport()
        try:
            self._run(report)
        except aws.DeadlineReached as reached:
            logger.warning("out of time (%s): the rest of this dispatch is left for the next period", reached)
            report.out_of_time = str(reached)
        return report

    def _run(self, report: DispatchReport) -> None:
        now = self.reconciler.now()
        listed = list(self.reconciler.store.list_services())
        shards = make_shards(
            (entry.name for entry in listed),
            size=self.shard_size,
            run=run_index(now, self.period_seconds),
            not_after=now.timestamp() + self.period_seconds - NEXT_DISPATCH_SLACK_SECONDS,
        )
        report.services, report.shards = len({entry.name for entry in listed}), len(shards)
        if self.identities is not None:
            self._ensure_identities(listed, report)
        unsent = self.queue.send(shards)
        report.send_calls = self.queue.calls
        if unsent:
            report.unsent = [shard.index for shard in unsent]
            report.unsent_services = sum(len(shard.services) for shard in unsent)
            logger.error(
                "%d of %d shards (%d services) could not be queued; the next dispatch hands them out again",
                len(unsent),
                len(shards),
                report.unsent_services,
            )
        sweep: RunReport = self.reconciler.sweep(listed)
        report.sweep = {
            key: value
            for key, value in sweep.as_dict().items()
            if key in ("orphans_terminated", "errors", "foreign_instances", "unloadable")
        }
        if self.identities is not None:
            report.identities_removed = self._sweep_identities(listed)
        report.pools_retired = self._retire_pools(now)

    def _retire_pools(self, now: datetime) -> list[str]:
        """The load balancers the stack made for more endpoints and no longer uses go (their own
        grace period keeps one a worker may be placing a service on); a failure is logged, and the
        next period tries again."""
        balancer = self.reconciler.balancer
        if balancer is None:
            return []
        try:
            retired = balancer.retire_pools(now)
        except aws.DeadlineReached:
            raise
        except Exception:
            logger.exception("the sweep of load balancer pools failed; the next dispatch retries")
            return []
        for name in retired:
            logger.info("load balancer pool %s deleted: it carried no service any more", name)
        return retired

    def _ensure_identities(self, listed: Sequence[Listed], report: DispatchReport) -> None:
        """Make the identities the listed owners lack, before the workers need them; a failure is
        logged (those owners' launches wait, as environment refusals), and the next period tries again."""
        assert self.identities is not None
        try:
            # Their own deadline, earlier than the invocation's: the shards must still go out after them.
            with aws.keeping(IDENTITIES_LEAVE_SECONDS):
                made = self.identities.ensure(entry.owner for entry in listed if entry.owner)
        except aws.DeadlineReached as reached:
            # Before the first make (IAM's listing, the records' read): all wait for the next period.
            logger.warning("out of time for the owners' replica identities (%s); the next dispatch makes them", reached)
            return
        except Exception:
            logger.exception("making the owners' replica identities failed; the next dispatch retries")
            return
        report.identities_made = made.made
        report.identities_refused = made.refused
        if made.deferred:
            logger.info("%d new owners' replica identities are left for the next dispatch", made.deferred)

    def _sweep_identities(self, listed: Sequence[Listed]) -> list[str]:
        """Remove the roles of owners none of the listed services has. A listing with an unreadable
        item removes nothing (that item's owner is unknown); a failure is logged, and the next
        period tries again."""
        if any(entry.uid is None for entry in listed):
            return []
        assert self.identities is not None
        try:
            return self.identities.sweep(entry.owner for entry in listed)
        except aws.DeadlineReached:
            raise
        except Exception:
            logger.exception("the sweep of owners' replica identities failed; the next dispatch retries")
            return []
