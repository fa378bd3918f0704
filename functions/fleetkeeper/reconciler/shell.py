"""The reconciler's imperative shell: observe, plan, apply, record.

One run over a set of services: read each service's items (one Query each, `read_concurrency` at a
time), list their managed instances (ONE paginated DescribeInstances filtered on their uids),
probe every replica that has an address (in parallel, bounded), then for each service call the pure
`plan` and apply its actions through the store and the driver. Nothing outlives the run
(invariant 4): the next run rebuilds everything from the table and EC2.

Three entry points: `run_shard` (a worker's share of the scheduled run, within a time Budget),
`sweep` (the orphan sweep, once a period, from the dispatcher), `run_one` (a kick after an api
write); `run_all` is both of the first two in one invocation, for a single process.

Crash safety comes from the order and the keys, not from locks: a replica is claimed (its item
exists) before it is launched, a launch is looked up by tag before it is retried, and every write
is conditioned on what the run observed. A run that dies between any two calls leaves a state the
next run completes; a run that loses a race to another raises Superseded for that service only,
writes nothing more for it, and the next run re-observes.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fleetkeeper.aws import DeadlineReached
from fleetkeeper.aws import reached as deadline_reached
from fleetkeeper.model import (
    BalancerState,
    FailureCause,
    ReplicaRecord,
    ReplicaStatus,
    ServiceState,
    VersionState,
    to_iso,
    utcnow,
)
from fleetkeeper.reconciler import autoscale
from fleetkeeper.reconciler.balancer import EndpointRefused, Target
from fleetkeeper.reconciler.driver import Instance, LaunchRefused, LaunchRequest
from fleetkeeper.reconciler.followup import follow_up, next_reconcile
from fleetkeeper.reconciler.ownership import Ownership, ownership
from fleetkeeper.reconciler.plan import (
    Action,
    Claim,
    DeleteReplica,
    DeleteService,
    Deregister,
    EnsureEndpoint,
    Launch,
    MarkVersion,
    Policy,
    ProbeResult,
    RecordAutoscale,
    RecordReplica,
    RecordStatus,
    Register,
    RemoveEndpoint,
    RouteEndpoint,
    Terminate,
    TripBreaker,
    drain_due,
    drain_targets,
    has_registered,
    launched,
    launched_by_fleetkeeper,
    match_instances,
    observed,
    plan,
    plan_orphans,
    probe_targets,
    refusal_cause,
    refused,
    registered,
    service_status,
    status_changed,
    warned,
)
from fleetkeeper.reconciler.probe import ProbeTarget, probe_all, rotated
from fleetkeeper.service_events import breaker_tripped, claimed, replica_changed, scaled, terminated, version_ready
from fleetkeeper.service_events import status_changed as status_events
from fleetkeeper.settings import MAX_PROBE_TIMEOUT_SECONDS, PROBE_HEADROOM_SECONDS
from fleetkeeper.store.errors import CorruptItem, Superseded

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Sequence
    from datetime import datetime

    from fleetkeeper.model import AutoscalerState, EndpointRecord, Interruption, VersionRecord
    from fleetkeeper.reconciler.balancer import DrainState, LoadBalancer
    from fleetkeeper.reconciler.budget import Budget
    from fleetkeeper.reconciler.driver import ReplicaDriver
    from fleetkeeper.reconciler.metrics import RequestRates
    from fleetkeeper.reconciler.state_changes import StateChange
    from fleetkeeper.spec.service import ReadinessProbe
    from fleetkeeper.store.reconciler import Listed, ReconcilerStore

logger = logging.getLogger(__name__)
# Reads and writes of a warned replica before giving up on recording its warning (each retry follows a
# concurrent write of the same replica, which a reconcile run makes at most a few times).
_WARNING_WRITE_TRIES = 5


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
    # stack's (seen by uid): left alone.
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

    # -- entry points --

    def run_all(self) -> RunReport:
        """Every service, then the orphan sweep, in this one invocation: one listing of the index and
        ONE DescribeInstances shared by both (a single process: the tests, the benchmarks).

        A service that cannot be loaded is logged, reported and skipped; the others and the sweep
        go on (its instances are spared: the sweep cannot tell they are not orphans).

        The listing is the sweep's (instances tagged with this stack's id): replicas from before
        stacks had ids are adopted by the workers' runs (`run_shard`, `run_one`), which list by uid.
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

    def run_shard(self, names: Sequence[str], budget: Budget | None = None) -> RunReport:
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
            uids = sorted({state.service.uid for state in states})
            instances = self._owned(self.driver.list_instances(uids=uids), report, set(uids)) if uids else []
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
            state = self._load(name, report)
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
        """EC2 warned about an instance (fleetkeeper.reconciler.interruptions): record the warning on
        the replica whose instance it is, then reconcile that service at once (the plan drains and
        replaces it, fleetkeeper.reconciler.plan.spot_warnings._plan_warned).

        The warning names an instance only: the instance's tags and ClientToken say whose it is (an
        instance fleetkeeper did not launch, or another stack launched, is ignored, as every
        unmanaged one in the account is; EC2's rule sends every stack every warning).
        The write is conditioned on the replica's revision: a run that changed the replica meanwhile
        makes this read it again, so the warning is never lost to a concurrent write.
        """
        instance = self._managed_instance(interruption.instance_id)
        if instance is None:
            logger.info("%s for %s: not a managed instance, ignored", interruption.kind, interruption.instance_id)
            return RunReport()
        if instance.stack and instance.stack != self.driver.stack_id:
            logger.info("%s for %s: another stack's instance, ignored", interruption.kind, interruption.instance_id)
            return RunReport()
        if not instance.spot:
            # EC2 sends both warnings for spot instances only (its InstanceLifecycle, as described now,
            # is the truth): one about an on-demand replica is forged or misrouted, and acting on it
            # would drain a healthy replica; repeated, every replica of the service.
            logger.warning(
                "%s for %s: replica %d of service %s is not a spot instance, warning ignored",
                interruption.kind,
                interruption.instance_id,
                instance.replica_id,
                instance.service,
            )
            return RunReport()
        stamp = to_iso(self.now())
        for _ in range(_WARNING_WRITE_TRIES):
            report = RunReport()
            state = self._load(instance.service, report)
            record = state.replicas.get(instance.replica_id) if state and state.service.uid == instance.uid else None
            after = warned(record, interruption) if record is not None else None
            if record is None or after is None:
                break
            try:
                self.store.put_replica(record, after, replica_changed(record, after), stamp)
            except Superseded:
                continue  # the replica changed since it was read: read it again
            logger.warning(
                "service %s: replica %d warned: %s for %s",
                record.name,
                record.replica_id,
                interruption.kind,
                interruption.instance_id,
            )
            self._wake_for_drain(state, after)
            break
        if not instance.stack:
            # From before stacks had ids: this stack's only if its service here has the instance's uid.
            state = self._load(instance.service, RunReport())
            if state is None or state.service.uid != instance.uid:
                logger.info(
                    "%s for %s: not this stack's instance, ignored", interruption.kind, interruption.instance_id
                )
                return RunReport()
        return self.run_one(instance.service)

    def instance_changed(self, change: StateChange) -> RunReport:
        """EC2 says an instance is stopping, stopped or going (fleetkeeper.reconciler.state_changes):
        when it is one of this stack's replicas, reconcile its service at once (the plan replaces a
        replica whose instance is gone, and probes one that stopped), instead of at the next
        scheduled run. Any other instance of the account costs this one DescribeInstances."""
        instance = self._managed_instance(change.instance_id)
        if instance is None:
            logger.debug("instance %s is %s: not a managed instance, ignored", change.instance_id, change.state)
            return RunReport()
        logger.info(
            "service %s: instance %s of replica %d is %s",
            instance.service,
            change.instance_id,
            instance.replica_id,
            change.state,
        )
        return self.run_one(instance.service)

    def _managed_instance(self, instance_id: str) -> Instance | None:
        """The instance, when it is one fleetkeeper launched for this stack (the check every event
        about an instance goes through before anything is done about it), else None. One without a
        stack id (launched before stacks had ids) is passed on: the run of its service adopts it only
        if the service's uid is its own (fleetkeeper.reconciler.ownership), and leaves it alone otherwise."""
        instance = self.driver.instance(instance_id)
        if instance is None or not launched_by_fleetkeeper(instance):
            return None
        return None if instance.stack and instance.stack != self.driver.stack_id else instance

    def _wake_for_drain(self, state: ServiceState | None, record: ReplicaRecord) -> None:
        """Ask for a run of the service when the warned replica's drain must start (plan.drain_due),
        which is mostly between two scheduled runs."""
        if state is None or record.interruption is None or self.kick is None:
            return
        due = drain_due(record.interruption, state.target, self.policy)
        if due is None:
            return
        delay = math.ceil((due - self.now()).total_seconds())
        if delay > 0:
            self.kick(state.service.name, delay)

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

    def _load_all(self, names: Sequence[str], report: RunReport) -> list[ServiceState]:
        """Each service's items, `read_concurrency` Queries at a time; in the order of `names`."""
        if self.read_concurrency <= 1 or len(names) <= 1:
            loaded = [self._load(name, report) for name in names]
        else:
            with ThreadPoolExecutor(max_workers=min(self.read_concurrency, len(names))) as pool:
                # Each read runs in a copy of the caller's context: whatever the caller's context
                # carries (a logger's keys, a test's actor) holds for its reads too.
                futures = [pool.submit(contextvars.copy_context().run, self._load, name, report) for name in names]
                loaded = [future.result() for future in futures]
        return [state for state in loaded if state is not None]

    def _load(self, name: str, report: RunReport) -> ServiceState | None:
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

    def _owned(self, instances: Sequence[Instance], report: RunReport, own_uids: set[str]) -> list[Instance]:
        """The instances this stack launched (invariants 7 and 11: fleetkeeper.reconciler.ownership);
        the others are logged and left alone. Its replicas from before stacks had ids (their uid is
        one of `own_uids`, its own table's) are adopted: tagged with its id, then kept."""
        stack_id = self.driver.stack_id
        mine: list[Instance] = []
        legacy: list[Instance] = []
        for instance in instances:
            whose = ownership(instance, stack_id, own_uids)
            if whose is Ownership.OURS:
                mine.append(instance)
            elif whose is Ownership.LEGACY:
                legacy.append(instance)
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
        if legacy:
            mine.extend(self._adopt(legacy, report))
        return mine

    def _adopt(self, legacy: Sequence[Instance], report: RunReport) -> list[Instance]:
        """Tag this stack's replicas from before stacks had ids with its id, so that its sweep and its
        IAM policy (which terminates only instances tagged with its id) know them from now on.

        A failed tagging is logged and the instances still count as this stack's in this run (they are
        its own services' replicas: not counting them would launch duplicates); the next run tags again.
        """
        ids = [instance.instance_id for instance in legacy]
        try:
            self.driver.adopt(ids)
        except DeadlineReached:
            raise
        except Exception:
            logger.exception("could not tag this stack's earlier replicas %s with its id; the next run retries", ids)
            report.errors.append("adopt")
            return list(legacy)
        logger.info("adopted this stack's replicas launched before stacks had ids: %s", ", ".join(ids))
        report.adopted.extend(ids)
        return [replace(instance, stack=self.driver.stack_id) for instance in legacy]

    # -- observe --

    def _reconcile_all(
        self,
        states: Sequence[ServiceState],
        instances: Sequence[Instance],
        now: datetime,
        report: RunReport,
        budget: Budget | None = None,
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
        probes: dict[str, dict[int, ProbeResult]] = {}
        probe_seconds = self.probe_budget_seconds if budget is None else budget.probe_seconds(self.probe_budget_seconds)
        try:
            answered, long_probes = self._probe(states, by_uid, now, probe_seconds, _invocation_seconds(budget))
            rates = self._request_rates(states, now, report)
        except DeadlineReached as reached:
            return _stopped_before_any_service(report, [state.service.name for state in states], reached)
        for (uid, replica_id), result in answered.items():
            probes.setdefault(uid, {})[replica_id] = result
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
        if long_probes is not None and deadline_reached():
            # No AWS call can be made any more: their verdicts could not be recorded. The probes end by
            # their own timeouts on their thread; the next run probes those replicas again.
            logger.warning("out of time: the long readiness probes' verdicts are left for the next run")
        elif long_probes is not None:
            try:
                verdicts = long_probes.result()
            except Exception:  # the prober's own failure: no verdict this run, the next run probes again
                logger.exception("the long readiness probes failed; their replicas are decided next run")
                report.errors.append("long probes")
            else:
                self._plan_long_probes(states, verdicts, report, budget)
        return report

    def _plan_long_probes(
        self,
        states: Sequence[ServiceState],
        results: dict[Hashable, ProbeResult],
        report: RunReport,
        budget: Budget | None,
    ) -> None:
        """The second pass: the services whose replicas had probes longer than the run's probe budget,
        planned again with those verdicts, re-read (the first pass changed them) and re-observed.

        The long probes started with the run's own and ran while it reconciled its services, so
        they cost the run no time of its critical path; each ended by its own timeout, the phase by
        what the invocation could give it (`_invocation_seconds`). Their verdicts are recorded on the
        replicas by this pass's plan, as any probe's, before the invocation ends: a Lambda cannot
        keep a connection for the next invocation, so a probe never spans runs.
        """
        by_uid: dict[str, dict[int, ProbeResult]] = {}
        for key, result in results.items():
            if isinstance(key, tuple):
                by_uid.setdefault(key[0], {})[key[1]] = result
        left_alone = set(report.skipped) | set(report.cut_short) | set(report.errors)
        names = [s.service.name for s in states if s.service.uid in by_uid and s.service.name not in left_alone]
        if not names:
            return
        try:
            fresh = [s for s in self._load_all(names, report) if observed(s) and s.service.uid in by_uid]
            uids = sorted({s.service.uid for s in fresh})
            instances = self._owned(self.driver.list_instances(uids=uids), report, set(uids)) if uids else []
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

    def _probe(
        self,
        states: Iterable[ServiceState],
        by_uid: dict[str, list[Instance]],
        now: datetime,
        budget_seconds: float,
        invocation_seconds: float = math.inf,
    ) -> tuple[dict[tuple[str, int], ProbeResult], Future[dict[Hashable, ProbeResult]] | None]:
        """The verdicts of the probes that fit the run's probe budget, and the long probes started
        (those whose timeout does not fit it), running in the background until their own timeouts or
        what the invocation can give them, whichever comes first."""
        targets: list[ProbeTarget] = []
        unprobed: dict[tuple[str, int], ProbeResult] = {}
        probed: dict[tuple[str, int], Instance] = {}
        secrets = _ProbeSecrets(self.store.table.name)
        for state in states:
            for replica_id, instance in probe_targets(state, by_uid.get(state.service.uid, [])).items():
                version = state.versions.get(state.replicas[replica_id].version)
                if version is None:
                    continue
                base_url = self.driver.base_url(instance, version.spec.port)
                if base_url is not None:
                    key = (state.service.uid, replica_id)
                    try:
                        probe = secrets.probe(state.service.name, version, state.service.owner)
                    except _SecretsUnreadable as exc:
                        unprobed[key] = ProbeResult(url=base_url, ok=False, detail=str(exc))
                        continue
                    targets.append(ProbeTarget(key, base_url, probe))
                    probed[key] = instance
        # Long: a timeout the run's probe budget is not made to hold (settings keep the budget at
        # least MAX_PROBE_TIMEOUT_SECONDS plus a probe's headroom).
        long = [t for t in targets if t.probe.timeout_seconds > MAX_PROBE_TIMEOUT_SECONDS]
        targets = [t for t in targets if t.probe.timeout_seconds <= MAX_PROBE_TIMEOUT_SECONDS]
        pending = self._start_long_probes(long, now, invocation_seconds)
        if not targets or budget_seconds <= 0:
            # No time to probe: this run plans without verdicts (no replica changes state), except
            # for the probes that could not be made at all.
            return unprobed, pending
        # Probes start in this order: rotated by the run's time so that, when there are more probes
        # than the budget lets finish, it is not the same replicas that go without a verdict.
        results = self.prober(rotated(targets, now), budget_seconds)
        # The run's phase holds every short probe's timeout: one it cut was queued behind hung ones, a
        # failed probe (a READY replica that cannot answer in time is not ready).
        answered = {key: replace(result, answered=True) for key, result in results.items() if isinstance(key, tuple)}
        # A driver that can tell why a replica does not answer (the process driver: an app listening
        # on another port than its $PORT) says so instead of "connection refused".
        diagnose = getattr(self.driver, "diagnose", None)
        if diagnose is not None:
            for key, result in answered.items():
                hint = None if result.ok or key not in probed else diagnose(probed[key])
                if hint:
                    answered[key] = replace(result, detail=hint)
        return {**unprobed, **answered}, pending

    def _start_long_probes(
        self, long: Sequence[ProbeTarget], now: datetime, invocation_seconds: float
    ) -> Future[dict[Hashable, ProbeResult]] | None:
        """The probes too long for the run's probe budget, started now on a thread of their own (the
        prober's pool under it), so the run goes on to its services meanwhile. Their phase lasts the
        longest of their timeouts (plus a probe's headroom), never more than the invocation can give:
        a hung replica's probe ends at its own timeout, and the phase at that bound, with "no verdict"
        for what is left, as in the run's own phase. None: no long probe, or no time for one."""
        if not long:
            return None
        seconds = min(max(t.probe.timeout_seconds for t in long) + PROBE_HEADROOM_SECONDS, invocation_seconds)
        if seconds <= 0:
            return None  # no verdicts: nothing changes for these replicas this run
        starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="long-probes")
        try:
            return starter.submit(
                contextvars.copy_context().run, _long_verdicts, self.prober, rotated(long, now), seconds, now
            )
        finally:
            starter.shutdown(wait=False)

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

    # -- plan and apply --

    def _reconcile(
        self,
        state: ServiceState,
        instances: Sequence[Instance],
        probes: dict[int, ProbeResult],
        now: datetime,
        report: RunReport,
        budget: Budget | None = None,
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
            applied = _Apply(self, state, instances, now, report, budget)
            applied.all(actions)
            unjudged = {replica_id for replica_id, probe in probes.items() if not probe.answered}
            self._follow_up(applied, instances, now, followup, unjudged)
        except _OutOfTime:
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
        applied: _Apply,
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


def _may_start_service(budget: Budget | None) -> bool:
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


def _long_verdicts(
    prober: Callable[[Sequence[ProbeTarget], float], dict[Hashable, ProbeResult]],
    targets: Sequence[ProbeTarget],
    seconds: float,
    started: datetime,
) -> dict[Hashable, ProbeResult]:
    """The long probes' verdicts, each judged at the moment it was sent (the plan that records them
    runs later, in the second pass). A probe the phase cut before its own timeout is no verdict (not a
    failed probe): the run had no more time for it, and its service's follow-up (a run of its own, with
    the whole invocation) probes it again."""
    verdicts = prober(targets, seconds)
    timeouts = {target.key: target.probe.timeout_seconds for target in targets}
    out: dict[Hashable, ProbeResult] = {}
    for key, result in verdicts.items():
        # Cut by a phase shorter than its timeout: no verdict. Cut by one that held its timeout: failed.
        held = timeouts.get(key, 0) + PROBE_HEADROOM_SECONDS <= seconds
        out[key] = replace(result, started_at=started, answered=result.answered or held)
    return out


def _invocation_seconds(budget: Budget | None) -> float:
    """How long the long probes may run: what the invocation has left after the service margin (a
    worker's Budget); unbounded without one (a single process: the embedded mode, the tests, where
    each probe's own timeout bounds them)."""
    if budget is None:
        return math.inf
    return max(0.0, budget.remaining() - budget.service_margin)


def target_of(state: ServiceState, record: ReplicaRecord, instance: Instance | None, driver: ReplicaDriver) -> Target:
    """A replica as the balancer addresses it: its instance on its version's port, and its URL."""
    version = state.versions.get(record.version) or state.target
    port = version.spec.port if version is not None else 0
    instance_id = instance.instance_id if instance is not None else record.instance_id or ""
    url = driver.base_url(instance, port) if instance is not None else None
    return Target(replica_id=record.replica_id, instance_id=instance_id, port=port, url=url or record.url)


class _OutOfTime(Exception):
    """Raised before a launch the budget has no room for: the service stops there, as a crash would."""


class _SecretsUnreadable(Exception):
    """A probe that names a secret (`$TOKEN` in a header) whose values could not be read."""


@dataclass
class _ProbeSecrets:
    """The readiness probes of one run with `$NAME`s filled from envs and secrets. A version whose
    probe names a secret costs one Parameter Store read per run (values are never kept longer)."""

    table_name: str
    _values: dict[tuple[str, str], dict[str, str] | str] = field(default_factory=dict)

    def probe(self, service: str, version: VersionRecord, owner: str = "") -> ReadinessProbe:
        spec = version.spec
        if not spec.probe_needs_secrets or version.secrets_ref is None:
            return spec.probe_for({})
        key = (version.uid, version.secrets_ref)
        if key not in self._values:
            from fleetkeeper.replicas.secrets import SecretStore, parameter_prefix

            try:
                self._values[key] = SecretStore(parameter_prefix(self.table_name)).get(
                    service, version.uid, version.secrets_ref, owner
                )
            except DeadlineReached:
                raise  # not the secrets' fault: no status may say they could not be read
            except Exception as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
                logger.warning("service %s: the secrets its readiness probe names could not be read: %s", service, code)
                # Deterministic (a status message shows it): the error code, never a value.
                self._values[key] = f"the secrets the readiness probe names could not be read ({code})"
        values = self._values[key]
        if isinstance(values, str):
            raise _SecretsUnreadable(values)
        return spec.probe_for(values)


@dataclass
class _Apply:
    """Applies one service's actions in order, keeping the replica records it writes and the version
    states it marks current (the status after refused launches is computed from them)."""

    reconciler: Reconciler
    state: ServiceState
    instances: Sequence[Instance]
    now: datetime
    report: RunReport
    budget: Budget | None = None
    records: dict[int, ReplicaRecord] = field(default_factory=dict)
    versions: dict[int, VersionState] = field(default_factory=dict)
    fresh: set[int] = field(default_factory=set)
    refused: bool = False
    # A registered replica the balancer will not use (Target.NotInUse): its record says so, and the
    # service's status must too, in this run (the plan's status was made before the registration).
    unused: bool = False

    endpoint: EndpointRecord | None = None
    # What the balancer refused this run for a reason the users must see (EndpointRefused: a quota).
    endpoint_problem: str | None = None
    status_planned: bool = False  # the plan recorded the status (RecordStatus, TripBreaker)

    def __post_init__(self) -> None:
        self.records = dict(self.state.replicas)
        self.endpoint = self.state.service.endpoint
        self.versions = {number: version.state for number, version in self.state.versions.items()}

    @property
    def store(self) -> ReconcilerStore:
        return self.reconciler.store

    @property
    def driver(self) -> ReplicaDriver:
        return self.reconciler.driver

    def all(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Launch) and self.budget is not None and not self.budget.may_start_action():
                raise _OutOfTime
            self.report.actions[type(action).__name__] += 1
            self.one(action)
        if (self.endpoint_problem or self.unused) and not self.status_planned:
            # The plan saw nothing to record; the refusal is news (or still true: then nothing is written).
            self._record_status(self._status_after_refusals())

    def _record_status(self, status: RecordStatus | None) -> None:
        """Write the service's status, naming this run's endpoint refusal (a quota) if there was one.

        The plan never knows of the refusal, so while it lasts the plan's status differs from the
        recorded one every run; the status named here is the same each time, and is written only
        when it differs from what the item holds (a steady refusal writes nothing)."""
        if status is None:
            return
        if self.endpoint_problem:
            status = replace(status, message=f"{status.message}; no endpoint: {self.endpoint_problem}")
            if not status_changed(self.state, status):
                return
        service = self.state.service
        events = status_events(service.status, status.status, status.message)
        self.store.record_status(
            service, status.status, status.message, status.observed_generation, events, to_iso(self.now)
        )
        self._log_status(status)

    def one(self, action: Action) -> None:
        """Apply one action. Each write carries the events it reports (service_events), in the same
        DynamoDB call: an event exists exactly when its change does, and no change writes none."""
        service = self.state.service
        stamp = to_iso(self.now)
        match action:
            case RecordAutoscale(before=before, after=after):
                old = before.target if before is not None else None
                new = after.target if after is not None else None
                # A move of the target is an event (not the first state, nor one that goes away).
                moved = [] if old is None or new is None or old == new else [scaled(old, new, _scaling_why(after))]
                written = self.store.record_autoscaler(service, before, after, moved, stamp)
                if old != new:
                    logger.info("service %s: autoscaled target %s -> %s", service.name, old, new)
                # What the rest of the run aims at (the status after refusals reads it).
                self.state = replace(self.state, service=replace(service, autoscaler=written))
            case RecordReplica(before=before, after=after):
                self.records[before.replica_id] = self._put(before, after)
            case DeleteReplica(replica=record):
                self.store.delete_replica(record, [terminated(record)], stamp)
                self.records.pop(record.replica_id, None)
            case Terminate():
                for instance_id, reason in action.reasons:
                    logger.info("service %s: terminating %s: %s", service.name, instance_id, reason)
                self.driver.terminate(action.instance_ids)
            case MarkVersion(version=version, expected=expected, state=new_state, message=message):
                events = [version_ready(version)] if new_state is VersionState.READY else []
                self.store.mark_version(service, version, expected, new_state, message, events, stamp)
                self.versions[version] = new_state
            case TripBreaker(version=version, message=message, rollback_to=good):
                self.status_planned = True
                logger.warning("service %s: %s (rolling back to %s)", service.name, message, good)
                self.store.trip_breaker(
                    service,
                    version,
                    message,
                    good,
                    status_message=action.status_message,
                    events=breaker_tripped(version, message, good),
                    now=stamp,
                )
            case Claim(version=version, replica_ids=ids):
                claims = self.store.claim_replicas(
                    service, version, ids, stamp, lambda chunk: [claimed(version, list(chunk))], action.market
                )
                for record in claims:
                    self.records[record.replica_id] = record
                    self.fresh.add(record.replica_id)
            case Launch(replica_id=replica_id, fresh=fresh):
                self._launch(self.records[replica_id], fresh=fresh and replica_id in self.fresh)
            case RecordStatus():
                self.status_planned = True
                self._record_status(self._status_after_refusals() if self.refused or self.unused else action)
            case DeleteService():
                self.store.delete_service(service)
            case EnsureEndpoint(config=config):
                try:
                    endpoint = self.balancer.ensure(service.name, service.uid, config, self.endpoint)
                except EndpointRefused as exc:
                    # A quota: the service's users must see it (its status), not only the logs.
                    logger.warning("service %s: no endpoint: %s", service.name, exc)
                    self.endpoint_problem = str(exc)
                    return
                except DeadlineReached:
                    raise
                except Exception:
                    # The endpoint must not hold the replicas hostage (a quota, a permission): they
                    # are still launched, probed and replaced; registration waits for the next run.
                    logger.exception("service %s: could not make its endpoint; retrying next run", service.name)
                    self.report.errors.append(service.name)
                    return
                # `ensure` leaves the route where it was (the wake target or the target group).
                endpoint = replace(endpoint, waking_since=self.endpoint.waking_since if self.endpoint else None)
                self.store.record_endpoint(service, endpoint)
                if self.endpoint is None or endpoint.url != self.endpoint.url:
                    logger.info("service %s: endpoint %s", service.name, endpoint.url)
                self.endpoint = endpoint
            case Register(replica_ids=ids):
                if self.endpoint is None:
                    return  # making the endpoint failed above: the records stay REGISTERING
                targets = self._targets(ids)
                try:
                    unused = self.balancer.register(self.endpoint, targets)
                except EndpointRefused as exc:
                    # The records stay REGISTERING: the next run registers them again.
                    logger.warning("service %s: replicas %s not registered: %s", service.name, list(ids), exc)
                    self.endpoint_problem = str(exc)
                    return
                why = {t.replica_id: unused[t.instance_id] for t in targets if t.instance_id in unused}
                for replica_id in ids:
                    record = self.records[replica_id]
                    after = registered(record, self.now, why.get(replica_id))
                    if replica_id in why:
                        self.unused = True
                        logger.warning("service %s: replica %s: %s", service.name, replica_id, after.status_message)
                    self.records[replica_id] = self._put(record, after)
            case Deregister(replica_ids=ids):
                if self.endpoint is not None:  # none recorded: nothing was ever registered
                    self.balancer.deregister(self.endpoint, self._targets(ids))
            case RouteEndpoint(waking=waking):
                if self.endpoint is None:
                    return  # making the endpoint failed above: the next run routes it
                # The route first, then its record: a run that dies between the two routes again
                # (the change is idempotent); a record never claims a route that was not made.
                self.balancer.route(self.endpoint, waking=waking)
                endpoint = replace(self.endpoint, waking_since=stamp if waking else None)
                self.store.record_endpoint(service, endpoint)
                logger.info(
                    "service %s: endpoint routed to %s",
                    service.name,
                    "the wake target (no replica serving)" if waking else "its replicas",
                )
                self.endpoint = endpoint
            case RemoveEndpoint():
                self.balancer.remove(service.name, service.uid, self.endpoint)

    def _log_status(self, status: RecordStatus) -> None:
        """One structured line per recorded status (a change): the dashboard's ready-vs-target table."""
        service = self.state.service
        target = self.state.target
        ready = sum(
            1 for r in self.records.values() if r.version == service.target_version and r.status is ReplicaStatus.READY
        )
        logger.info(
            "status recorded",
            extra={
                "fleetkeeper_service": service.name,
                "status": status.status.value,
                "ready_replicas": ready,
                "target_replicas": 0 if target is None else target.spec.target_replicas,
            },
        )

    def _put(self, before: ReplicaRecord, after: ReplicaRecord) -> ReplicaRecord:
        """A replica's write, with the events its change reports (none: a plain PutItem)."""
        return self.store.put_replica(before, after, replica_changed(before, after), to_iso(self.now))

    @property
    def balancer(self) -> LoadBalancer:
        balancer = self.reconciler.balancer
        if balancer is None:
            raise RuntimeError("the plan has endpoint actions but the reconciler has no load balancer")
        return balancer

    def _targets(self, replica_ids: Sequence[int]) -> list[Target]:
        live = match_instances(self.state, self.instances)
        return [
            target_of(self.state, self.records[rid], live.get(rid), self.driver)
            for rid in replica_ids
            if rid in self.records
        ]

    def _status_after_refusals(self) -> RecordStatus | None:
        """The plan's status assumed its launches would go through; AWS refused some. The status of
        the records as they now are, so the message names the refusal in this very run (None: the
        item says it already; with an endpoint refusal to name, always the status)."""
        with_instance = set(match_instances(self.state, self.instances))
        records = [record for _, record in sorted(self.records.items())]
        status = service_status(self.state, records, self.versions, with_instance)
        return status if status_changed(self.state, status) or self.endpoint_problem else None

    def _launch(self, record: ReplicaRecord, *, fresh: bool) -> None:
        """Find-or-launch one replica's instance and record it (PROVISIONING) or the refusal."""
        if not fresh:
            # Left PENDING by an earlier run (crashed, or refused and now past its backoff). Bump the
            # revision first: of two runs recovering it at once, only one gets past this write.
            record = self._put(record, replace(record, updated_at=to_iso(self.now)))
            found = self.driver.find_instance(record.uid, record.replica_id)
            if found is not None and launched_by_fleetkeeper(found):  # the crashed run did launch it: adopt
                self._record_launched(record, found)
                return
        version = self.state.versions[record.version]
        request = LaunchRequest(
            service=record.name,
            uid=record.uid,
            version=record.version,
            replica_id=record.replica_id,
            spec=version.spec,
            attempt=record.launch_attempts,
            secrets_ref=version.secrets_ref,
            market=record.market,
            owner=self.state.service.owner,
        )
        # Walk the capacity pools (instance type x subnet) from where the last run stopped, each
        # attempt with its own ClientToken, until one launches or a refusal is about the version.
        # A run that dies midway loses nothing: the next one looks the replica up by tag first, and
        # retries the attempt it recorded, whose token and pool are the same.
        pools = min(self.driver.pool_count(request), self.reconciler.policy.pools_per_run)
        tried = 0
        while True:
            try:
                instance = self.driver.launch(replace(request, attempt=record.launch_attempts + tried))
            except LaunchRefused as refusal:
                tried += 1
                logger.warning(
                    "service %s: replica %d refused (attempt %d): %s",
                    record.name,
                    record.replica_id,
                    record.launch_attempts + tried,
                    refusal,
                )
                if tried < pools and refusal_cause(refusal.code) is FailureCause.ENVIRONMENT:
                    continue
                self.refused = True
                after = refused(record, refusal.code, refusal.message, self.now, self.reconciler.policy, tried=tried)
                self.records[record.replica_id] = self._put(record, after)
                return
            self._record_launched(record, instance, tried=tried)
            return

    def _record_launched(self, record: ReplicaRecord, instance: Instance, *, tried: int = 0) -> None:
        after = launched(record, instance.instance_id, self.now, instance_type=instance.instance_type, tried=tried)
        self.records[record.replica_id] = self._put(record, after)


def _scaling_why(state: AutoscalerState | None) -> str:
    """The request rate behind an autoscaled target, in the Scaled event's words."""
    if state is None or not state.history:
        return "the request rate changed"
    latest = state.history[-1]
    return f"{latest.rate:g} req/s recommends {latest.replicas}"
