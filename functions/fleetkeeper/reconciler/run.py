"""The reconciler's imperative shell: observe, plan, apply, record.

One run over a set of services: read each service's items (one Query each, `read_concurrency` at a
time), list their managed instances (ONE paginated DescribeInstances filtered on their uids),
probe every replica that has an address (in parallel, bounded: fleetkeeper.reconciler.probing), then
for each service call the pure `plan` and apply its actions through the store and the driver
(fleetkeeper.reconciler.apply). Nothing outlives the run (invariant 4): the next run rebuilds
everything from the table and EC2.

Three entry points: `run_shard` (a worker's share of the scheduled run, within a ShardBudget),
`sweep` (the orphan sweep, once a period, from the dispatcher), `run_one` (a kick after an api
write); `run_all` is both of the first two in one invocation, for a single process. EC2's events
about one instance (`interrupt`, `instance_changed`) are fleetkeeper.reconciler.instance_events'.

Crash safety comes from the order and the keys, not from locks: a replica is claimed (its item
exists) before it is launched, a launch is looked up by tag before it is retried, and every write
is conditioned on what the run observed. A run that dies between any two calls leaves a state the
next run completes; a run that loses a race to another raises Superseded for that service only,
writes nothing more for it, and the next run re-observes.
"""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from fleetkeeper.aws import DeadlineReached
from fleetkeeper.aws import reached as deadline_reached
from fleetkeeper.model import BalancerState, ServiceState, utcnow
from fleetkeeper.reconciler import autoscale, instance_events, legacy
from fleetkeeper.reconciler.apply import Applier, OutOfTime, target_of
from fleetkeeper.reconciler.followup import follow_up, next_reconcile
from fleetkeeper.reconciler.ownership import Ownership, ownership
from fleetkeeper.reconciler.plan import (
    Policy,
    ProbeResult,
    drain_targets,
    has_registered,
    launched_by_fleetkeeper,
    match_instances,
    observed,
    plan,
    plan_orphans,
)
from fleetkeeper.reconciler.probe import ProbeTarget, probe_all
from fleetkeeper.reconciler.probing import ProbePhase, by_service, invocation_seconds
from fleetkeeper.reconciler.report import RunReport
from fleetkeeper.store.errors import CorruptItem, Superseded

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence
    from concurrent.futures import Future
    from datetime import datetime

    from fleetkeeper.model import Interruption
    from fleetkeeper.reconciler.balancer import DrainState, LoadBalancer
    from fleetkeeper.reconciler.budget import ShardBudget
    from fleetkeeper.reconciler.driver import Instance, ReplicaDriver
    from fleetkeeper.reconciler.metrics import RequestRates
    from fleetkeeper.reconciler.state_changes import StateChange
    from fleetkeeper.store.runs import Listed, ReconcilerStore

logger = logging.getLogger(__name__)


@dataclass
class Reconciler:
    store: ReconcilerStore
    driver: ReplicaDriver
    now: Callable[[], datetime] = utcnow
    policy: Policy = field(default_factory=Policy)
    # The whole probe phase's budget; each probe is also bounded by its own timeout.
    probe_budget_seconds: float = 20.0
    prober: Callable[[Sequence[ProbeTarget], float], dict[Hashable, ProbeResult]] = probe_all
    # Gives each service one endpoint (None: the stack has no load balancer).
    balancer: LoadBalancer | None = None
    # Reads the endpoints' request rates for the autoscaler (None: no signal; targets hold).
    rates: RequestRates | None = None

    # Services read at once (each a Query); 1 reads them one after another on the calling thread.
    read_concurrency: int = 1
    # Wakes the reconciler for one service `delay` seconds from now (fleetkeeper.kick; None: only the
    # schedule): a warned replica's drain must start between two scheduled runs.
    kick: Callable[[str, int], None] | None = None
    # Asks for a service's follow-up run `delay` seconds from now, due at `due` (epoch seconds):
    # `follow_up(name, delay, due)` (fleetkeeper.kick; None: no follow-ups, only the schedule).
    follow_up: Callable[[str, int, int], None] | None = None
    # Whether this stack's replicas from before stacks had ids are adopted (Settings.adopt_untagged_replicas;
    # fleetkeeper.reconciler.legacy). Off: they are left alone, as foreign instances are.
    adopt_untagged_replicas: bool = False

    # -- entry points --

    def run_all(self) -> RunReport:
        """Every service, then the orphan sweep, in this one invocation: one listing of the index and
        ONE DescribeInstances shared by both (a single process: the tests, the benchmarks).

        A service that cannot be loaded is logged, reported and skipped; the others and the sweep
        go on (its instances are spared: the sweep cannot tell they are not orphans).

        The listing is the sweep's (instances tagged with this stack's id): replicas from before
        stacks had ids are adopted (fleetkeeper.reconciler.legacy) by the workers' runs (`run_shard`,
        `run_one`), which list by uid.
        """
        now = self.now()
        report = RunReport()
        listed = list(self.store.list_services())
        states = self._load_all([entry.name for entry in listed], report)
        own_uids = {entry.uid for entry in listed if entry.uid} | {s.service.uid for s in states}
        instances = self._owned(self.driver.list_instances(), report, own_uids)
        self._reconcile_all(states, instances, now, report)
        self._sweep(listed, states, instances, now, report)
        return report

    def run_shard(self, names: Sequence[str], budget: ShardBudget | None = None) -> RunReport:
        """A worker's shard: these services, in this order, their instances only, within `budget`.

        The services' items are read first (they are what the instance listing filters on: the
        uids as loaded, not as the dispatcher listed them, since a service may have been recreated
        in between); each service is then started only while the budget allows one more.
        """
        now = self.now()
        report = RunReport()
        if budget is not None and not budget.may_start_service():
            report.skipped.extend(names)
            logger.warning("out of time before the first of %d service(s): all left for the next run", len(names))
            return report
        try:
            states = self._load_all(names, report)
            instances = self._instances_of(states, report)
        except DeadlineReached as reached:
            return _stopped_before_any_service(report, names, reached)
        return self._reconcile_all(states, instances, now, report, budget)

    def sweep(self, listed: Sequence[Listed]) -> RunReport:
        """The orphan sweep, once a period (the dispatcher's): this stack's managed instances of no
        listed service (the listing is of instances tagged with this stack's id only)."""
        now = self.now()
        report = RunReport()
        instances = self._owned(self.driver.list_instances(), report, {entry.uid for entry in listed if entry.uid})
        # A service the index lists without a readable uid cannot vouch for its instances: spare them.
        for entry in listed:
            if entry.uid is None:
                report.unloadable[entry.name] = "no readable uid in the index"
        self._sweep(listed, [], instances, now, report)
        return report

    def run_one(self, name: str, followup: int | None = None) -> RunReport:
        """A kick after an api write: that one service, its instances only (no orphan sweep).

        `followup`: the kick is the follow-up due then (fleetkeeper.reconciler.followup). It runs only
        while the service item still names it: a duplicate delivery, or a follow-up a newer one
        replaced, stops after the read (`report.void_followup`)."""
        now = self.now()
        report = RunReport()
        try:
            state = self.load(name, report)
            if state is None:
                return report
            if followup is not None and state.service.followup_at != followup:
                logger.debug("service %s: follow-up due %s is no longer the pending one: nothing to do", name, followup)
                report.void_followup = True
                return report
            uid = state.service.uid
            instances = self._owned(self.driver.list_instances(uids=[uid]), report, {uid})
        except DeadlineReached as reached:
            return _stopped_before_any_service(report, [name], reached)
        return self._reconcile_all([state], instances, now, report, followup=followup)

    def interrupt(self, interruption: Interruption) -> RunReport:
        """EC2 warned about an instance: fleetkeeper.reconciler.instance_events.interrupt."""
        return instance_events.interrupt(self, interruption)

    def instance_changed(self, change: StateChange) -> RunReport:
        """EC2 says an instance is stopping, stopped or going: instance_events.instance_changed."""
        return instance_events.instance_changed(self, change)

    # -- observe --

    def load(self, name: str, report: RunReport) -> ServiceState | None:
        """One service's items; None when it is gone or cannot be loaded (then reported: `unloadable`)."""
        try:
            return self.store.load(name)
        except CorruptItem as exc:
            logger.error("service %s: skipped, its items do not load: %s", name, exc)
            report.unloadable[name] = f"{exc.sk}: {exc.problem}"
        except DeadlineReached:
            raise  # the run's end: this service (and what follows) is left for the next run
        except Exception as exc:
            # A throttled or failed read of one service: the next run tries again.
            logger.exception("service %s: skipped, could not be read", name)
            report.unloadable[name] = type(exc).__name__
        return None

    def _load_all(self, names: Sequence[str], report: RunReport) -> list[ServiceState]:
        """Each service's items, `read_concurrency` Queries at a time; in the order of `names`."""
        if self.read_concurrency <= 1 or len(names) <= 1:
            loaded = [self.load(name, report) for name in names]
        else:
            with ThreadPoolExecutor(max_workers=min(self.read_concurrency, len(names))) as pool:
                # Each read runs in a copy of the caller's context: whatever the caller's context
                # carries (a logger's keys, a test's actor) holds for its reads too.
                futures = [pool.submit(contextvars.copy_context().run, self.load, name, report) for name in names]
                loaded = [future.result() for future in futures]
        return [state for state in loaded if state is not None]

    def _instances_of(self, states: Sequence[ServiceState], report: RunReport) -> list[Instance]:
        """The instances of these services (listed by their uids, as loaded), this stack's only."""
        uids = sorted({state.service.uid for state in states})
        return self._owned(self.driver.list_instances(uids=uids), report, set(uids)) if uids else []

    def _owned(self, instances: Sequence[Instance], report: RunReport, own_uids: set[str]) -> list[Instance]:
        """The instances this stack launched (invariants 7 and 11: fleetkeeper.reconciler.ownership);
        the others are logged and left alone. Its replicas from before stacks had ids (their uid is
        one of `own_uids`, its own table's) are fleetkeeper.reconciler.legacy's to adopt or leave."""
        stack_id = self.driver.stack_id
        mine: list[Instance] = []
        untagged: list[Instance] = []
        for instance in instances:
            whose = ownership(instance, stack_id, own_uids)
            if whose is Ownership.OURS:
                mine.append(instance)
            elif whose is Ownership.LEGACY:
                untagged.append(instance)
            elif not launched_by_fleetkeeper(instance):
                logger.warning(
                    "instance %s carries fleetkeeper's tags (service %r, replica %s) but its ClientToken "
                    "%r is not one fleetkeeper derives: neither adopted nor terminated",
                    instance.instance_id,
                    instance.service,
                    instance.replica_id,
                    instance.client_token,
                )
                report.foreign.append(instance.instance_id)
            else:
                logger.warning(
                    "instance %s (service %r, uid %s) is not this stack's (its stack tag is %r, this stack is %r): "
                    "neither adopted nor terminated",
                    instance.instance_id,
                    instance.service,
                    instance.uid,
                    instance.stack,
                    stack_id,
                )
                report.foreign.append(instance.instance_id)
        mine.extend(legacy.take(untagged, self.driver, report, adopt=self.adopt_untagged_replicas))
        return mine

    def _request_rates(
        self, states: Sequence[ServiceState], now: datetime, report: RunReport
    ) -> dict[str, float | None]:
        """The request rate of every autoscaled service with an endpoint, in ceil(n / 500)
        GetMetricData calls for the whole run; None for a service whose newest data point may be
        late (metrics.RequestRates.read). A failed read is logged: no service's target moves this
        run (a missing reading is not zero requests), and the next run reads again."""
        if self.rates is None:
            return {}
        dimensions: dict[str, tuple[tuple[str, str], ...]] = {}
        for state in states:
            endpoint = state.service.endpoint
            target = state.target
            if endpoint is None or not endpoint.dimensions or target is None:
                continue
            if autoscale.policy_of(target.spec) is not None:
                dimensions[state.service.name] = endpoint.dimensions
        if not dimensions:
            return {}
        try:
            return self.rates.read(dimensions, now)
        except DeadlineReached:
            raise
        except Exception:
            logger.exception("could not read the request rates of %d service(s); targets hold", len(dimensions))
            report.errors.append("request rates")
            return {}

    def _drain_states(self, state: ServiceState, instances: Sequence[Instance]) -> dict[int, DrainState]:
        """What the balancer says of this service's DRAINING replicas: one call, and only while
        something drains (a steady service costs no balancer call)."""
        endpoint = state.service.endpoint
        if self.balancer is None or endpoint is None:
            return {}
        draining = drain_targets(state, instances)
        if not draining:
            return {}
        targets = [target_of(state, state.replicas[rid], instance, self.driver) for rid, instance in draining.items()]
        reported = self.balancer.drain_states(endpoint, targets)
        return {t.replica_id: reported[t.instance_id] for t in targets if t.instance_id in reported}

    def _balancer_serves(self, state: ServiceState, instances: Sequence[Instance]) -> bool | None:
        """While the endpoint routes to the wake target and a replica is registered: whether the
        balancer serves it yet (one DescribeTargetHealth on AWS; only while a service wakes). None:
        not asked (the route stays where it is), or the question failed (asked again next run)."""
        endpoint = state.service.endpoint
        if self.balancer is None or endpoint is None or not endpoint.waking or not has_registered(state):
            return None
        live = match_instances(state, instances)
        targets = [
            target_of(state, record, live[rid], self.driver)
            for rid, record in state.replicas.items()
            if record.balancer is BalancerState.REGISTERED and rid in live
        ]
        try:
            return self.balancer.serves(endpoint, targets)
        except DeadlineReached:
            raise
        except Exception:
            logger.exception("service %s: could not ask the load balancer about its replicas", state.service.name)
            return None

    # -- the sweep --

    def _sweep(
        self,
        listed: Sequence[Listed],
        states: Sequence[ServiceState],
        instances: Sequence[Instance],
        now: datetime,
        report: RunReport,
    ) -> None:
        # A uid listed by the index or loaded is live, even if its item went away since.
        live_uids = {entry.uid for entry in listed if entry.uid} | {s.service.uid for s in states}
        orphans = plan_orphans(
            live_uids,
            instances,
            now,
            self.policy,
            spared_services=set(report.unloadable),
            stack_id=self.driver.stack_id,
        )
        if orphans is None:
            return
        for instance_id, reason in orphans.reasons:
            logger.info("terminating %s: %s", instance_id, reason)
        try:
            self.driver.terminate(orphans.instance_ids)
        except DeadlineReached:
            raise  # the run's end (its caller's to report), not a failure of the sweep
        except Exception:
            # Every service has been reconciled already; an orphan that cannot go now (say IAM
            # refuses it) is retried by the next sweep and must not fail this run.
            logger.exception("could not terminate orphans %s", orphans.instance_ids)
            report.errors.append("orphan sweep")
        else:
            report.orphans.extend(orphans.instance_ids)

    # -- the services, one after another --

    def _reconcile_all(
        self,
        states: Sequence[ServiceState],
        instances: Sequence[Instance],
        now: datetime,
        report: RunReport,
        budget: ShardBudget | None = None,
        *,
        followup: int | None = None,
    ) -> RunReport:
        report.services += len(states)
        if self.balancer is not None:
            self.balancer.forget()  # what it learnt of the load balancers is this run's only
        for state in states:
            if not observed(state):
                # Half of the api's transaction: acting on it would fail a healthy service.
                logger.info(
                    "service %s: target version not visible yet; leaving it to the next run", state.service.name
                )
                report.unobserved.append(state.service.name)
        states = [state for state in states if observed(state)]
        by_uid: dict[str, list[Instance]] = {}
        for instance in instances:
            by_uid.setdefault(instance.uid, []).append(instance)
        probe_seconds = self.probe_budget_seconds if budget is None else budget.probe_seconds(self.probe_budget_seconds)
        phase = ProbePhase(self.driver, self.prober, self.store.table.name)
        try:
            answered, long_probes = phase.run(states, by_uid, now, probe_seconds, invocation_seconds(budget))
            rates = self._request_rates(states, now, report)
        except DeadlineReached as reached:
            return _stopped_before_any_service(report, [state.service.name for state in states], reached)
        probes = by_service(answered)
        for position, state in enumerate(states):
            if not _may_start_service(budget):
                report.skipped.extend(later.service.name for later in states[position:])
                logger.warning(
                    "out of time: %d service(s) left for the next run: %s",
                    len(states) - position,
                    ", ".join(report.skipped),
                )
                break
            uid = state.service.uid
            started_with = budget.remaining() if budget is not None else 0.0
            rate = rates.get(state.service.name)
            self._reconcile(state, by_uid.get(uid, []), probes.get(uid, {}), now, report, budget, rate, followup)
            if budget is not None:
                budget.observe_service(started_with)
        self._finish_long_probes(states, long_probes, report, budget)
        return report

    def _finish_long_probes(
        self,
        states: Sequence[ServiceState],
        long_probes: Future[dict[Hashable, ProbeResult]] | None,
        report: RunReport,
        budget: ShardBudget | None,
    ) -> None:
        """The long probes' verdicts, once the services are done, planned in a second pass."""
        if long_probes is None:
            return
        if deadline_reached():
            # No AWS call can be made any more: their verdicts could not be recorded. The probes end by
            # their own timeouts on their thread; the next run probes those replicas again.
            logger.warning("out of time: the long readiness probes' verdicts are left for the next run")
            return
        try:
            verdicts = long_probes.result()
        except Exception:  # the prober's own failure: no verdict this run, the next run probes again
            logger.exception("the long readiness probes failed; their replicas are decided next run")
            report.errors.append("long probes")
        else:
            self._plan_long_probes(states, verdicts, report, budget)

    def _plan_long_probes(
        self,
        states: Sequence[ServiceState],
        results: dict[Hashable, ProbeResult],
        report: RunReport,
        budget: ShardBudget | None,
    ) -> None:
        """The second pass: the services whose replicas had probes longer than the run's probe budget,
        planned again with those verdicts, re-read (the first pass changed them) and re-observed.

        The long probes started with the run's own and ran while it reconciled its services, so
        they cost the run no time of its critical path; each ended by its own timeout, the phase by
        what the invocation could give it (probing.invocation_seconds). Their verdicts are recorded on
        the replicas by this pass's plan, as any probe's, before the invocation ends: a Lambda cannot
        keep a connection for the next invocation, so a probe never spans runs.
        """
        by_uid = by_service(results)
        left_alone = set(report.skipped) | set(report.cut_short) | set(report.errors)
        names = [s.service.name for s in states if s.service.uid in by_uid and s.service.name not in left_alone]
        if not names:
            return
        try:
            fresh = [s for s in self._load_all(names, report) if observed(s) and s.service.uid in by_uid]
            instances = self._instances_of(fresh, report)
        except DeadlineReached as reached:
            # Reconciled once already; what their long probes said is what the run could not finish.
            logger.warning("out of time before the long probes' pass (%s): the next run goes on from here", reached)
            report.cut_short.extend(names)
            return
        live: dict[str, list[Instance]] = {}
        for instance in instances:
            live.setdefault(instance.uid, []).append(instance)
        for state in fresh:
            if not _may_start_service(budget):
                report.skipped.append(state.service.name)
                continue
            # Only the long probes' verdicts: the other replicas were decided in the first pass and
            # have none here (no verdict changes nothing); no request rate either (targets hold).
            self._reconcile(
                state, live.get(state.service.uid, []), by_uid[state.service.uid], self.now(), report, budget
            )

    # -- plan and apply, one service --

    def _reconcile(
        self,
        state: ServiceState,
        instances: Sequence[Instance],
        probes: dict[int, ProbeResult],
        now: datetime,
        report: RunReport,
        budget: ShardBudget | None = None,
        request_rate: float | None = None,
        followup: int | None = None,
    ) -> None:
        name = state.service.name
        try:
            drains = self._drain_states(state, instances)
            serves = self._balancer_serves(state, instances)
            actions = plan(
                state,
                instances,
                probes,
                now,
                self.policy,
                balanced=self.balancer is not None,
                drains=drains,
                request_rate=request_rate,
                balancer_serves=serves,
            )
            applied = Applier(self, state, instances, now, report, budget)
            applied.all(actions)
            unjudged = {replica_id for replica_id, probe in probes.items() if not probe.answered}
            self._follow_up(applied, instances, now, followup, unjudged)
        except OutOfTime:
            logger.warning("service %s: out of time before a launch; the next run goes on from here", name)
            report.cut_short.append(name)
        except DeadlineReached as reached:
            # An AWS call that would have outlasted the invocation was not made: the service stops
            # there, as a run killed at that call would, and the next run goes on from it.
            logger.warning("service %s: out of time (%s); the next run goes on from here", name, reached)
            report.cut_short.append(name)
        except Superseded as exc:
            # Another run or an api write got there first: stop here; the next run re-observes.
            logger.info("service %s: %s; leaving it to the next run", name, exc)
            report.superseded.append(name)
        except Exception:
            # One service's trouble must not starve the others; the schedule retries it.
            logger.exception("service %s: reconcile failed", name)
            report.errors.append(name)

    def _follow_up(
        self,
        applied: Applier,
        instances: Sequence[Instance],
        now: datetime,
        running: int | None,
        unjudged: set[int] | None = None,
    ) -> None:
        """Ask for this service's next run when the state the run left it in changes next, unless a
        follow-up early enough is pending already. The due time is written first (conditioned on the
        one read), then the kick sent: of two runs only the one whose write lands sends, and a kick
        that is lost leaves a due time in the past, which the next run (the schedule's) replaces."""
        if self.follow_up is None:
            return
        state = applied.state
        after = replace(state, replicas=dict(applied.records))
        moment = next_reconcile(after, set(match_instances(state, instances)), now, self.policy, unjudged or set())
        wanted = follow_up(moment, state.service.followup_at, now, self.policy, running=running)
        if wanted is None:
            return
        try:
            self.store.record_followup(state.service, wanted.seen, wanted.due)
        except Superseded:
            return  # another run asked for one meanwhile (or the service went): theirs stands
        except DeadlineReached:
            raise
        except Exception:
            # The service's run went through; only its follow-up is lost: the schedule comes instead.
            logger.warning("service %s: could not record its follow-up", state.service.name, exc_info=True)
            return
        applied.report.actions["FollowUp"] += 1
        self.follow_up(state.service.name, wanted.delay_seconds, wanted.due)


def _may_start_service(budget: ShardBudget | None) -> bool:
    """Whether the run may start one more service: its budget allows one (a shard worker's), and no
    AWS call of the invocation has been stopped by its deadline (after one, every later call would be)."""
    return not deadline_reached() and (budget is None or budget.may_start_service())


def _stopped_before_any_service(report: RunReport, names: Sequence[str], reached: DeadlineReached) -> RunReport:
    """The deadline stopped a call of the run's common steps (the reads, the instance listing, the
    probes' secrets, the request rates): no service was started, all are left for the next run."""
    left = [name for name in names if name not in report.unloadable]
    report.skipped.extend(left)
    logger.warning("out of time (%s): %d service(s) left for the next run", reached, len(left))
    return report
