"""The endpoint's part of a plan: its configuration and health check, which replicas are registered,
deregistered and drained, when a leaving replica's instance may go, and where the route points (the
wake target or the target group)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleetkeeper.model import (
    BalancerState,
    EndpointConfig,
    Lifecycle,
    ReplicaRecord,
    ReplicaStatus,
    ServiceState,
    to_iso,
)
from fleetkeeper.reconciler import autoscale, health_check
from fleetkeeper.reconciler.balancer import DrainState
from fleetkeeper.reconciler.driver import Instance, InstanceState
from fleetkeeper.reconciler.plan.actions import Action, Deregister, EnsureEndpoint, Register, RouteEndpoint
from fleetkeeper.reconciler.plan.failures import NOT_IN_USE
from fleetkeeper.reconciler.plan.lifecycle import LEAVING
from fleetkeeper.reconciler.plan.observe import _seconds_since, match_instances

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

    from fleetkeeper.reconciler.plan.work import _Work
    from fleetkeeper.spec.service import ServiceSpec


def drain_targets(state: ServiceState, instances: Sequence[Instance]) -> dict[int, Instance]:
    """Replicas whose drain the balancer must report on: DRAINING, with a live instance."""
    return {
        replica_id: instance
        for replica_id, instance in match_instances(state, instances).items()
        if state.replicas[replica_id].balancer is BalancerState.DRAINING
    }


def endpoint_config(spec: ServiceSpec, serving: Iterable[ServiceSpec] = ()) -> EndpointConfig:
    """What the endpoint is configured with: the target version's spec, and the health check every
    target in it passes (`serving`: the specs of the versions registered in it once this run's
    registrations and deregistrations are made; none: the target version's own check).

    A version's own health check applies only while the endpoint holds that version's targets
    alone; mid-rollout it is the fallback both versions pass (fleetkeeper.reconciler.health_check).
    """
    check = health_check.shared_check(
        health_check.alb_check(s.service.readiness_probe, s.envs) for s in serving
    ) or health_check.alb_check(spec.service.readiness_probe, spec.envs)
    return EndpointConfig(
        port=spec.port,
        policy=spec.load_balancing_policy,
        drain_seconds=spec.drain_seconds,
        health_path=check.path,
        health_codes=check.codes,
        health_timeout_seconds=check.timeout_seconds,
        health_interval_seconds=check.interval_seconds,
    )


def registered(record: ReplicaRecord, now: datetime, unused: str | None = None) -> ReplicaRecord:
    """The record of a replica the shell just registered with the endpoint (after `Register`).

    `unused`: why the balancer took it but will send it no request (`Target.NotInUse`); the replica
    stays READY and registered, and its message (and the service's) says that it serves nothing."""
    message = f"{NOT_IN_USE}: registered, but the load balancer sends it no requests ({unused})" if unused else ""
    return replace(
        record,
        balancer=BalancerState.REGISTERED,
        drain_started_at=None,
        updated_at=to_iso(now),
        status_message=message,
    )


@dataclass(frozen=True)
class _Balance:
    """The endpoint's part of a plan: create it, keep exactly the serving replicas registered, and
    hold a leaving replica's termination until its drain is over."""

    balanced: bool
    drains: Mapping[int, DrainState]
    serves: bool | None = None

    def plan(
        self, state: ServiceState, live: Mapping[int, Instance], work: _Work, now: datetime
    ) -> tuple[list[Action], list[Action]]:
        """(EnsureEndpoint, planned before the records), (Register, Deregister, planned after them).

        A replica serves (is registered) while the service is ACTIVE, the replica READY and its
        instance running. One that stops serving is recorded DRAINING and deregistered in the same
        run; its instance is terminated only once the balancer reports it drained, or
        `drain_seconds` after its drain began. Updates `work`: the records' balancer states, and the
        terminations held back.
        """
        if not self.balanced:
            return [], []
        service = state.service
        active = service.lifecycle is Lifecycle.ACTIVE
        endpoint = service.endpoint
        drain_seconds = endpoint.config.drain_seconds if endpoint is not None else 0
        deleted = {record.replica_id for record in work.delete}
        register: list[int] = []
        deregister: list[int] = []
        stamp = to_iso(now)
        in_endpoint = (BalancerState.REGISTERING, BalancerState.REGISTERED)
        for replica_id, record in sorted(work.replicas.items()):
            current = record.balancer
            instance = live.get(replica_id)
            if replica_id in deleted:
                if current in in_endpoint:
                    deregister.append(replica_id)  # its instance is gone: nothing to drain
                continue
            running = instance is not None and instance.state is InstanceState.RUNNING
            if active and record.status is ReplicaStatus.READY and running:
                if current is not BalancerState.REGISTERED:
                    if current is not BalancerState.REGISTERING:
                        work.replicas[replica_id] = replace(
                            record, balancer=BalancerState.REGISTERING, drain_started_at=None
                        )
                    register.append(replica_id)
                continue
            hold = False
            if current in in_endpoint:
                work.replicas[replica_id] = replace(record, balancer=BalancerState.DRAINING, drain_started_at=stamp)
                deregister.append(replica_id)
                hold = True
            elif current is BalancerState.DRAINING and instance is not None:
                seen = self.drains.get(replica_id)
                if seen is DrainState.IN_SERVICE:
                    # The deregistration was lost (a run died before making it): again, and the
                    # drain starts over from now.
                    work.replicas[replica_id] = replace(record, drain_started_at=stamp)
                    deregister.append(replica_id)
                    hold = True
                else:
                    since = _seconds_since(record.drain_started_at, now)
                    hold = seen is not DrainState.DRAINED and since is not None and since < drain_seconds
                    if not hold and record.status not in LEAVING:
                        # Drained and staying (NOT_READY, say): nothing more to ask the balancer.
                        work.replicas[replica_id] = replace(record, balancer=None, drain_started_at=None)
            if hold and instance is not None:
                work.terminate.pop(instance.instance_id, None)
        ensure: list[Action] = []
        if active and state.target is not None:
            # After the loop: the health check follows the versions the endpoint holds once this
            # run's moves are made (ensured first, so a new version's target is checked with the
            # shared check from its registration on, and the old ones keep passing).
            serving = sorted(
                {
                    record.version
                    for replica_id, record in work.replicas.items()
                    if record.balancer in in_endpoint and replica_id not in deleted
                }
            )
            specs = [state.versions[v].spec for v in serving if v in state.versions]
            config = endpoint_config(state.target.spec, specs)
            if endpoint is None or endpoint.config != config:
                ensure.append(EnsureEndpoint(config))
        moves: list[Action] = []
        if register:
            moves.append(Register(tuple(register)))
        if deregister:
            moves.append(Deregister(tuple(deregister)))
        route = self._route(state, work, endpoint is not None or bool(ensure))
        if route is not None:
            moves.append(route)
        return ensure, moves

    def _route(self, state: ServiceState, work: _Work, has_endpoint: bool) -> RouteEndpoint | None:
        """Wake target or target group. To the wake target once an ACTIVE autoscaled service has no
        replica in its endpoint (after this run's deregistrations); back to the target group once a
        replica registered by an earlier run is one the balancer sends requests to (`serves`: the
        ALB answers 503 itself while its only targets are still in their first health checks, and
        the wake target's 503 says when to retry). A change only: a steady service plans nothing."""
        service = state.service
        if not has_endpoint or service.lifecycle is not Lifecycle.ACTIVE or state.target is None:
            return None
        in_endpoint = any(
            record.balancer in (BalancerState.REGISTERING, BalancerState.REGISTERED)
            for record in work.replicas.values()
        )
        recorded = service.endpoint.waking if service.endpoint is not None else False
        if autoscale.policy_of(state.target.spec) is None:
            waking = False
        elif recorded:
            # A replica registered by an earlier run that stays in the endpoint, and the balancer serves.
            stays = any(
                work.replicas.get(replica_id, record).balancer is BalancerState.REGISTERED
                for replica_id, record in state.replicas.items()
                if record.balancer is BalancerState.REGISTERED and replica_id not in {r.replica_id for r in work.delete}
            )
            waking = not (self.serves and stays)
        else:
            waking = not in_endpoint
        return RouteEndpoint(waking) if waking != recorded else None


def has_registered(state: ServiceState) -> bool:
    """Some replica is recorded REGISTERED (by an earlier run): what the shell asks the balancer
    about while the endpoint routes to the wake target."""
    return any(record.balancer is BalancerState.REGISTERED for record in state.replicas.values())
