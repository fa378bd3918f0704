"""The reconciler's functional core: what to do about one service, given what was observed.

`plan(...)` is pure: no AWS, no clock, no I/O. It gets the service's records, the instances EC2
reports for its incarnation, the readiness probe results and `now`, and returns actions for the
shell to apply, in the order it must apply them. Everything it decides is derived from that input,
so two runs that observe the same world plan the same thing, and a run that observes a steady
world plans only a no-op (invariant 6).

Replica lifecycle (SkyPilot Serve's vocabulary; docs/architecture/reconciler.md):

    PENDING (claimed) -> PROVISIONING (launched) -> STARTING (running) -> READY (probe 200)
    READY -> NOT_READY (probe failing) -> FAILED_PROBING (failing for its probe's consecutive-failure
        window, SkyPilot's 180 s by default, from the first failed probe)
    not READY by `initial_delay_seconds` after provisioning -> FAILED_INITIAL_DELAY
    launch refused by AWS -> FAILED_PROVISION (`refused`; retried in place, exponential backoff)
    instance terminated by AWS (spot reclaim) or outside fleetkeeper -> PREEMPTED
    the replica's app exited by itself (APP_EXITED, the process driver's code) -> FAILED
    chosen for removal -> SHUTTING_DOWN (recorded before the instance is terminated)

Failed and shutting-down replicas are replaced by new replica ids; their items are deleted once
their instance is gone, except the failures of a target version that has not yet been decided,
which the circuit breaker counts.

A failed replica carries typed facts: `failure_code` (the AWS error code of a refused launch, the
StateReason code of an ended instance, or fleetkeeper's own) and `cause` (whose fault: the version's,
the environment's, a spot reclaim), decided here from codes alone. The breaker counts by `cause`;
status messages are for people and are never read back.

The shell only observes and applies. What it records after a launch is decided here too: `launched`
and `refused` give the replica's next record, and `service_status` the status of the records as they
are once AWS refused launches the plan expected to go through.

The package, one module per concern around `plan` here (each opens with what it decides):

    policy.py        the knobs (`Policy`) and the launch backoff
    actions.py       the action types the shell applies
    lifecycle.py     which replica statuses are leaving, which instance states are gone
    failures.py      whose fault a failure is, from its code (`refusal_cause`, `termination_cause`)
    observe.py       one replica's next record from its instance and probe; ownership and matching
    work.py          what a plan accumulates, and its replica and cleanup actions
    scale.py         how many replicas the target wants; the autoscaler's write (`plan_autoscale`)
    in_place.py      updates that keep replicas: a change they do not run, recorded on the READY ones
    replicas.py      scale down, rolling and blue-green replacement, launches and claims
    markets.py       the spot / on-demand split and the on-demand fallback
    spot_warnings.py interruption warnings and rebalance recommendations: record, drain deadline, replace
    breaker.py       the circuit breaker and the version it rolls back to
    endpoints.py     the endpoint: config and health check, register, drain, deregister, route
    launches.py      the record after a launch (`launched`) or a refusal (`refused`)
    status.py        the service status and its message
    delete.py        taking a DELETING service down
    orphans.py       instances of no live service (the scheduled sweep)

Everything other modules use is imported from here (`fleetkeeper.reconciler.plan`), not from the
concern modules.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fleetkeeper.model import Lifecycle, ReplicaStatus, VersionState
from fleetkeeper.reconciler.plan.actions import (
    Action,
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
)
from fleetkeeper.reconciler.plan.breaker import _circuit_breaker
from fleetkeeper.reconciler.plan.delete import _plan_delete
from fleetkeeper.reconciler.plan.endpoints import _Balance, drain_targets, endpoint_config, has_registered, registered
from fleetkeeper.reconciler.plan.failures import (
    APP_EXITED,
    ENVIRONMENT_REFUSALS,
    INITIAL_DELAY_EXCEEDED,
    INSTANCE_LOST,
    NOT_IN_USE,
    PROBE_FAILED,
    SPOT_RECLAIMED,
    SPOT_RECLAIMS,
    refusal_cause,
    termination_cause,
)
from fleetkeeper.reconciler.plan.in_place import _update_in_place
from fleetkeeper.reconciler.plan.launches import launched, refused
from fleetkeeper.reconciler.plan.lifecycle import GONE_STATES, LEAVING
from fleetkeeper.reconciler.plan.markets import wanted_by_market
from fleetkeeper.reconciler.plan.observe import (
    ProbeResult,
    _launch_order,
    _observe,
    _terminate_strays,
    initial_delay_origin,
    is_live,
    launched_by_fleetkeeper,
    match_instances,
    observed,
    probe_targets,
)
from fleetkeeper.reconciler.plan.orphans import plan_orphans
from fleetkeeper.reconciler.plan.policy import Policy
from fleetkeeper.reconciler.plan.replicas import _plan_replicas
from fleetkeeper.reconciler.plan.scale import plan_autoscale, wanted_replicas
from fleetkeeper.reconciler.plan.spot_warnings import drain_due, warned
from fleetkeeper.reconciler.plan.status import service_status, status_changed
from fleetkeeper.reconciler.plan.work import _Work

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from fleetkeeper.model import ServiceState
    from fleetkeeper.reconciler.balancer import DrainState
    from fleetkeeper.reconciler.driver import Instance

# The planner's API: what the shell, the follow-ups, ownership and the tests import from here.
__all__ = [
    "APP_EXITED",
    "ENVIRONMENT_REFUSALS",
    "GONE_STATES",
    "INITIAL_DELAY_EXCEEDED",
    "INSTANCE_LOST",
    "LEAVING",
    "NOT_IN_USE",
    "PROBE_FAILED",
    "SPOT_RECLAIMED",
    "SPOT_RECLAIMS",
    "Action",
    "Claim",
    "DeleteReplica",
    "DeleteService",
    "Deregister",
    "EnsureEndpoint",
    "Launch",
    "MarkVersion",
    "Policy",
    "ProbeResult",
    "RecordAutoscale",
    "RecordReplica",
    "RecordStatus",
    "Register",
    "RemoveEndpoint",
    "RouteEndpoint",
    "Terminate",
    "TripBreaker",
    "drain_due",
    "drain_targets",
    "endpoint_config",
    "has_registered",
    "initial_delay_origin",
    "is_live",
    "launched",
    "launched_by_fleetkeeper",
    "match_instances",
    "observed",
    "plan",
    "plan_autoscale",
    "plan_orphans",
    "probe_targets",
    "refusal_cause",
    "refused",
    "registered",
    "service_status",
    "status_changed",
    "termination_cause",
    "wanted_by_market",
    "wanted_replicas",
    "warned",
]


def plan(
    state: ServiceState,
    instances: Sequence[Instance],
    probes: Mapping[int, ProbeResult],
    now: datetime,
    policy: Policy | None = None,
    *,
    balanced: bool = False,
    drains: Mapping[int, DrainState] | None = None,
    request_rate: float | None = None,
    balancer_serves: bool | None = None,
) -> list[Action]:
    """The actions that move one service toward its target, in apply order.

    `instances`: what EC2 reports for this service's uid (any state). `probes`: by replica id, for
    the replicas that were probed. `balanced`: the stack gives services an endpoint (a load
    balancer); `drains`: by replica id, what the balancer reported for the DRAINING replicas
    (`drain_targets`); `request_rate`: the service's requests a second over the last metric window
    (None: no reading this run); `balancer_serves`: while the endpoint routes to the wake target, whether
    the balancer would send a request to one of the service's registered replicas now (the ALB: one
    healthy; None: not asked). Order: the autoscaler's state (the target the rest aims at), the
    endpoint (created before anything is registered), replica records
    (a draining replica leaves READY, and leaves the endpoint, before its instance goes),
    registrations and deregistrations, version marks / breaker, terminations, item deletions, claims
    and launches, and the service status last, so a run that dies midway never records a status it
    did not reach. A service that is not `observed` (its target version not visible yet) gets no
    action at all.
    """
    policy = policy or Policy()
    if not observed(state):
        return []  # half a transaction: the target version is not visible yet
    scaling = plan_autoscale(state, request_rate, now)
    if scaling is not None:
        state = replace(state, service=replace(state.service, autoscaler=scaling.after))
    head: list[Action] = [scaling] if scaling is not None else []
    service = state.service
    mine = [i for i in instances if i.uid == service.uid and launched_by_fleetkeeper(i)]
    described = {i.instance_id: i for i in mine}
    live = match_instances(state, mine)
    work = _Work(original=state.replicas, replicas={}, terminate={}, delete=[], claimed=[])

    _terminate_strays(state, mine, live, work)
    # The latest dead instance of each replica id (a launch that was never recorded may have died).
    dead = {i.replica_id: i for i in sorted(mine, key=_launch_order) if not is_live(i)}
    for replica_id, record in state.replicas.items():
        seen = described.get(record.instance_id) if record.instance_id else dead.get(replica_id)
        work.replicas[replica_id] = _observe(
            record, live.get(replica_id), seen, probes.get(replica_id), state, now, policy
        )

    # Failed and shutting-down replicas lose their instance (again, if a run died before it could).
    for replica_id, record in work.replicas.items():
        if record.status in LEAVING and replica_id in live:
            work.terminate[live[replica_id].instance_id] = f"replica {replica_id}: {record.status.value}"

    balance = _Balance(balanced=balanced, drains=drains or {}, serves=balancer_serves)
    if service.lifecycle is Lifecycle.DELETING:
        return _plan_delete(state, mine, live, work, now, balance)

    versions = {number: record.state for number, record in state.versions.items()}
    # Before the marks: a target taken in place by READY replicas is READY with them in this run.
    _update_in_place(state, work, versions)
    marks: list[Action] = []
    for number in sorted({r.version for r in work.replicas.values() if r.status is ReplicaStatus.READY}):
        if versions.get(number) is VersionState.NEW:
            marks.append(MarkVersion(number, VersionState.NEW, VersionState.READY))
            versions[number] = VersionState.READY

    tripped = _circuit_breaker(state, work, versions, policy)
    if tripped is not None:
        # The target moves (or the service fails): the next run plans against the new target.
        ensure, moves = balance.plan(state, live, work, now)
        return [*head, *ensure, *work.replica_actions(now), *moves, *marks, tripped, *work.cleanup_actions()]

    launches = _plan_replicas(state, live, work, versions, now, policy, described.keys())
    ensure, moves = balance.plan(state, live, work, now)
    status = service_status(state, work.current(), versions, set(live))
    actions: list[Action] = [
        *head,
        *ensure,
        *work.replica_actions(now),
        *moves,
        *marks,
        *work.cleanup_actions(),
        *launches,
    ]
    if status_changed(state, status):
        actions.append(status)
    return actions
