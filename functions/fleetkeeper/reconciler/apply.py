"""Applying one service's planned actions, in order, through the store, the driver and the balancer.

The plan (fleetkeeper.reconciler.plan) returns actions; `Applier.one` dispatches each by its type to
the method that applies it. Each write carries the events it reports (service_events) in the same
DynamoDB call: an event exists exactly when its change does, and no change writes none. What the
applier wrote (replica records, version states, the endpoint) is kept for the rest of the service's
step: the status after refused launches, and the follow-up, are computed from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, assert_never

from fleetkeeper.aws import DeadlineReached
from fleetkeeper.model import FailureCause, ReplicaRecord, ReplicaStatus, VersionState, to_iso
from fleetkeeper.reconciler.balancer import EndpointRefused, Target
from fleetkeeper.reconciler.driver import Instance, LaunchRefused, LaunchRequest
from fleetkeeper.reconciler.plan import (
    Claim,
    DeleteReplica,
    DeleteService,
    Deregister,
    EnsureEndpoint,
    Launch,
    MarkVersion,
    RecordAutoscale,
    RecordReplica,
    RecordStatus,
    Register,
    RemoveEndpoint,
    RouteEndpoint,
    Terminate,
    TripBreaker,
    launched,
    launched_by_fleetkeeper,
    match_instances,
    refusal_cause,
    refused,
    registered,
    service_status,
    status_changed,
)
from fleetkeeper.service_events import breaker_tripped, claimed, replica_changed, scaled, terminated, version_ready
from fleetkeeper.service_events import status_changed as status_events

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from fleetkeeper.model import AutoscalerState, EndpointRecord, ServiceState
    from fleetkeeper.reconciler.balancer import LoadBalancer
    from fleetkeeper.reconciler.budget import ShardBudget
    from fleetkeeper.reconciler.driver import ReplicaDriver
    from fleetkeeper.reconciler.plan import Action
    from fleetkeeper.reconciler.report import RunReport
    from fleetkeeper.reconciler.run import Reconciler
    from fleetkeeper.store.runs import ReconcilerStore

logger = logging.getLogger(__name__)


class OutOfTime(Exception):
    """Raised before a launch the budget has no room for: the service stops there, as a crash would."""


@dataclass
class Applier:
    """Applies one service's actions in order, keeping the replica records it writes and the version
    states it marks current (the status after refused launches is computed from them)."""

    reconciler: Reconciler
    state: ServiceState
    instances: Sequence[Instance]
    now: datetime
    report: RunReport
    budget: ShardBudget | None = None
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

    @property
    def balancer(self) -> LoadBalancer:
        balancer = self.reconciler.balancer
        if balancer is None:
            raise RuntimeError("the plan has endpoint actions but the reconciler has no load balancer")
        return balancer

    @property
    def stamp(self) -> str:
        """The run's time as the items record it."""
        return to_iso(self.now)

    def all(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Launch) and self.budget is not None and not self.budget.may_start_action():
                raise OutOfTime
            self.report.actions[type(action).__name__] += 1
            self.one(action)
        if (self.endpoint_problem or self.unused) and not self.status_planned:
            # The plan saw nothing to record; the refusal is news (or still true: then nothing is written).
            self._record_status(self._status_after_refusals())

    def one(self, action: Action) -> None:
        """Apply one action: the method for its type."""
        match action:
            case RecordAutoscale():
                self._record_autoscale(action)
            case RecordReplica():
                self.records[action.before.replica_id] = self._put(action.before, action.after)
            case DeleteReplica():
                self._delete_replica(action)
            case Terminate():
                self._terminate(action)
            case MarkVersion():
                self._mark_version(action)
            case TripBreaker():
                self._trip_breaker(action)
            case Claim():
                self._claim(action)
            case Launch():
                self._launch(self.records[action.replica_id], fresh=action.fresh and action.replica_id in self.fresh)
            case RecordStatus():
                self.status_planned = True
                self._record_status(self._status_after_refusals() if self.refused or self.unused else action)
            case DeleteService():
                self.store.delete_service(self.state.service)
            case EnsureEndpoint():
                self._ensure_endpoint(action)
            case Register():
                self._register(action)
            case Deregister():
                if self.endpoint is not None:  # none recorded: nothing was ever registered
                    self.balancer.deregister(self.endpoint, self._targets(action.replica_ids))
            case RouteEndpoint():
                self._route_endpoint(action)
            case RemoveEndpoint():
                self.balancer.remove(self.state.service.name, self.state.service.uid, self.endpoint)
            case _:
                assert_never(action)

    # -- the service's own items --

    def _record_autoscale(self, action: RecordAutoscale) -> None:
        service = self.state.service
        before, after = action.before, action.after
        old = before.target if before is not None else None
        new = after.target if after is not None else None
        # A move of the target is an event (not the first state, nor one that goes away).
        moved = [] if old is None or new is None or old == new else [scaled(old, new, _scaling_why(after))]
        written = self.store.record_autoscaler(service, before, after, moved, self.stamp)
        if old != new:
            logger.info("service %s: autoscaled target %s -> %s", service.name, old, new)
        # What the rest of the run aims at (the status after refusals reads it).
        self.state = replace(self.state, service=replace(service, autoscaler=written))

    def _mark_version(self, action: MarkVersion) -> None:
        version, new_state = action.version, action.state
        events = [version_ready(version)] if new_state is VersionState.READY else []
        self.store.mark_version(
            self.state.service, version, action.expected, new_state, action.message, events, self.stamp
        )
        self.versions[version] = new_state

    def _trip_breaker(self, action: TripBreaker) -> None:
        service = self.state.service
        version, message, good = action.version, action.message, action.rollback_to
        self.status_planned = True
        logger.warning("service %s: %s (rolling back to %s)", service.name, message, good)
        self.store.trip_breaker(
            service,
            version,
            message,
            good,
            status_message=action.status_message,
            events=breaker_tripped(version, message, good),
            now=self.stamp,
        )

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
        self.store.record_status(service, status.status, status.message, status.observed_generation, events, self.stamp)
        self._log_status(status)

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

    def _status_after_refusals(self) -> RecordStatus | None:
        """The plan's status assumed its launches would go through; AWS refused some. The status of
        the records as they now are, so the message names the refusal in this very run (None: the
        item says it already; with an endpoint refusal to name, always the status)."""
        with_instance = set(match_instances(self.state, self.instances))
        records = [record for _, record in sorted(self.records.items())]
        status = service_status(self.state, records, self.versions, with_instance)
        return status if status_changed(self.state, status) or self.endpoint_problem else None

    # -- replicas --

    def _put(self, before: ReplicaRecord, after: ReplicaRecord) -> ReplicaRecord:
        """A replica's write, with the events its change reports (none: a plain PutItem)."""
        return self.store.put_replica(before, after, replica_changed(before, after), self.stamp)

    def _delete_replica(self, action: DeleteReplica) -> None:
        record = action.replica
        self.store.delete_replica(record, [terminated(record)], self.stamp)
        self.records.pop(record.replica_id, None)

    def _terminate(self, action: Terminate) -> None:
        for instance_id, reason in action.reasons:
            logger.info("service %s: terminating %s: %s", self.state.service.name, instance_id, reason)
        self.driver.terminate(action.instance_ids)

    def _claim(self, action: Claim) -> None:
        version = action.version
        claims = self.store.claim_replicas(
            self.state.service,
            version,
            action.replica_ids,
            self.stamp,
            lambda chunk: [claimed(version, list(chunk))],
            action.market,
        )
        for record in claims:
            self.records[record.replica_id] = record
            self.fresh.add(record.replica_id)

    def _launch(self, record: ReplicaRecord, *, fresh: bool) -> None:
        """Find-or-launch one replica's instance and record it (PROVISIONING) or the refusal."""
        if not fresh:
            # Left PENDING by an earlier run (crashed, or refused and now past its backoff). Bump the
            # revision first: of two runs recovering it at once, only one gets past this write.
            record = self._put(record, replace(record, updated_at=self.stamp))
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

    # -- the endpoint --

    def _ensure_endpoint(self, action: EnsureEndpoint) -> None:
        service = self.state.service
        try:
            endpoint = self.balancer.ensure(service.name, service.uid, action.config, self.endpoint)
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

    def _register(self, action: Register) -> None:
        service, ids = self.state.service, action.replica_ids
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

    def _route_endpoint(self, action: RouteEndpoint) -> None:
        if self.endpoint is None:
            return  # making the endpoint failed above: the next run routes it
        waking = action.waking
        # The route first, then its record: a run that dies between the two routes again
        # (the change is idempotent); a record never claims a route that was not made.
        self.balancer.route(self.endpoint, waking=waking)
        endpoint = replace(self.endpoint, waking_since=self.stamp if waking else None)
        self.store.record_endpoint(self.state.service, endpoint)
        logger.info(
            "service %s: endpoint routed to %s",
            self.state.service.name,
            "the wake target (no replica serving)" if waking else "its replicas",
        )
        self.endpoint = endpoint

    def _targets(self, replica_ids: Sequence[int]) -> list[Target]:
        live = match_instances(self.state, self.instances)
        return [
            target_of(self.state, self.records[rid], live.get(rid), self.driver)
            for rid in replica_ids
            if rid in self.records
        ]


def target_of(state: ServiceState, record: ReplicaRecord, instance: Instance | None, driver: ReplicaDriver) -> Target:
    """A replica as the balancer addresses it: its instance on its version's port, and its URL."""
    version = state.versions.get(record.version) or state.target
    port = version.spec.port if version is not None else 0
    instance_id = instance.instance_id if instance is not None else record.instance_id or ""
    url = driver.base_url(instance, port) if instance is not None else None
    return Target(replica_id=record.replica_id, instance_id=instance_id, port=port, url=url or record.url)


def _scaling_why(state: AutoscalerState | None) -> str:
    """The request rate behind an autoscaled target, in the Scaled event's words."""
    if state is None or not state.history:
        return "the request rate changed"
    latest = state.history[-1]
    return f"{latest.rate:g} req/s recommends {latest.replicas}"
