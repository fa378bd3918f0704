"""Table tests of the planner's endpoint part: the endpoint made before anything is registered,
exactly the serving replicas registered, and a leaving replica drained before its instance goes.

Like the other planner tests, every case asserts the WHOLE action list. `balanced=False` (no load
balancer) is every case of that file: none of them has an endpoint action.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleetkeeper.model import (
    Lifecycle,
    ServiceState,
    ServiceStatus,
    VersionState,
)
from fleetkeeper.reconciler.balancer import DrainState
from fleetkeeper.reconciler.driver import InstanceState
from fleetkeeper.reconciler.plan import (
    DeleteReplica,
    DeleteService,
    Deregister,
    EnsureEndpoint,
    Register,
    RemoveEndpoint,
    drain_targets,
    endpoint_config,
    plan,
    registered,
)
from tests.support.builders import (
    CONFIG,
    DOWN,
    DRAIN,
    ENDPOINT,
    NOW,
    OK,
    REG,
    REGING,
    STAMP,
    S,
    ago,
    became_ready,
    instance,
    launches,
    mark_ready,
    moved,
    replica,
    served,
    spec,
    state,
    status,
    terminate,
    version,
)


def steady(replicas: list[Any], **kw: Any) -> ServiceState:
    """A service whose recorded status already says `message` (so no RecordStatus is planned)."""
    message = kw.pop("message", "2/2 ready")
    kind = kw.pop("kind", ServiceStatus.READY)
    return served(state(replicas, [version(1, VERSION_READY)], status=kind, message=message, observed=1, **kw))


VERSION_READY = VersionState.READY


def draining(rid: int, since: float, **kw: Any) -> Any:
    return replica(
        rid, S.SHUTTING_DOWN, status_message="scaling down to 1", balancer=DRAIN, drain_started_at=ago(since), **kw
    )


def test_the_endpoint_is_made_before_the_first_replica_is_launched() -> None:
    assert plan(state([]), [], {}, NOW, balanced=True) == [
        EnsureEndpoint(CONFIG),
        *launches(1, 0, 1),
        status(ServiceStatus.REPLICA_INIT, "0/2 ready; replica 0 PENDING; replica 1 PENDING"),
    ]
    assert endpoint_config(spec()) == CONFIG


def test_a_replica_that_becomes_ready_is_recorded_registering_then_registered() -> None:
    booting = replica(0, S.STARTING)
    current = served(state([booting, replica(1, balancer=REG)]))
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, balanced=True) == [
        replace(became_ready(booting), after=replace(became_ready(booting).after, balancer=REGING)),
        Register((0,)),
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    assert registered(replace(booting, balancer=REGING), NOW) == replace(booting, balancer=REG, updated_at=STAMP)


def test_a_steady_served_service_plans_nothing() -> None:
    current = steady([replica(0, balancer=REG), replica(1, balancer=REG)])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, balanced=True) == []


def test_a_registration_a_crashed_run_did_not_confirm_is_made_again() -> None:
    current = steady([replica(0, balancer=REGING), replica(1, balancer=REG)])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, balanced=True) == [Register((0,))]


def test_a_ready_replica_whose_record_has_no_balancer_state_is_registered() -> None:
    """A service that ran before the stack had a load balancer: its replicas join the endpoint."""
    ready = replica(0)
    current = steady([ready, replica(1, balancer=REG)])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, balanced=True) == [
        moved(ready, balancer=REGING),
        Register((0,)),
    ]


def test_scaling_down_deregisters_and_holds_the_instance_for_the_drain() -> None:
    going = replica(1, balancer=REG)
    current = steady([replica(0, balancer=REG), going], message="x")
    current = replace(current, versions={1: version(1, VERSION_READY, spec=spec(replicas=1))})
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, balanced=True) == [
        moved(
            going, status=S.SHUTTING_DOWN, status_message="scaling down to 1", balancer=DRAIN, drain_started_at=STAMP
        ),
        Deregister((1,)),
        status(ServiceStatus.READY, "1/1 ready"),
    ]


def one_left(replicas: list[Any]) -> ServiceState:
    current = steady(replicas, message="1/1 ready")
    return replace(current, versions={1: version(1, VERSION_READY, spec=spec(replicas=1))})


def test_a_draining_replica_is_left_alone_while_the_balancer_drains_it() -> None:
    current = one_left([replica(0, balancer=REG), draining(1, since=10)])
    drains = {1: DrainState.DRAINING}
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW, balanced=True, drains=drains) == []


def test_a_drained_replica_is_terminated() -> None:
    current = one_left([replica(0, balancer=REG), draining(1, since=10)])
    drains = {1: DrainState.DRAINED}
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW, balanced=True, drains=drains) == [
        terminate(("i-1", "replica 1: SHUTTING_DOWN")),
    ]


def test_a_replica_still_draining_at_its_deadline_is_terminated() -> None:
    current = one_left([replica(0, balancer=REG), draining(1, since=120)])
    drains = {1: DrainState.DRAINING}
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW, balanced=True, drains=drains) == [
        terminate(("i-1", "replica 1: SHUTTING_DOWN")),
    ]
    # One second earlier it is still held; with no report at all (not asked yet) too.
    held = one_left([replica(0, balancer=REG), draining(1, since=119)])
    assert plan(held, [instance(0), instance(1)], {0: OK}, NOW, balanced=True, drains=drains) == []
    assert plan(held, [instance(0), instance(1)], {0: OK}, NOW, balanced=True) == []


def test_a_lost_deregistration_is_made_again_and_the_drain_starts_over() -> None:
    """A run died between recording DRAINING and deregistering: the balancer still routes to it."""
    lost = draining(1, since=300)
    current = one_left([replica(0, balancer=REG), lost])
    drains = {1: DrainState.IN_SERVICE}
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW, balanced=True, drains=drains) == [
        moved(lost, drain_started_at=STAMP),
        Deregister((1,)),
    ]


def test_a_replica_that_stops_answering_leaves_the_endpoint_but_keeps_its_instance() -> None:
    failing = replica(1, balancer=REG)
    current = steady([replica(0, balancer=REG), failing])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: DOWN}, NOW, balanced=True) == [
        moved(
            failing,
            status=S.NOT_READY,
            probe_failures=1,
            failing_since=STAMP,
            status_message="readiness probe failing: connection refused",
            balancer=DRAIN,
            drain_started_at=STAMP,
        ),
        Deregister((1,)),
        status(ServiceStatus.READY, "1/2 ready; replica 1 NOT_READY: readiness probe failing: connection refused"),
    ]


def test_a_drained_replica_that_stays_is_forgotten_by_the_balancer_and_rejoins_when_ready() -> None:
    sick = replica(1, S.NOT_READY, probe_failures=1, balancer=DRAIN, drain_started_at=ago(130))
    message = "1/2 ready; replica 1 NOT_READY"
    current = steady([replica(0, balancer=REG), sick], message=message)
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW, balanced=True) == [
        moved(sick, balancer=None, drain_started_at=None),
    ]
    back = replica(1, S.NOT_READY, probe_failures=1, balancer=DRAIN, drain_started_at=ago(5))
    current = steady([replica(0, balancer=REG), back], message=message)
    recovered = moved(back, status=S.READY, probe_failures=0, ready_at=STAMP, last_probe_ok_at=STAMP, status_message="")
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, balanced=True) == [
        replace(recovered, after=replace(recovered.after, balancer=REGING, drain_started_at=None)),
        Register((1,)),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_registered_replica_whose_instance_died_is_deregistered_then_deleted() -> None:
    gone = replica(1, S.PREEMPTED, balancer=REG, status_message="gone")
    current = steady([replica(0, balancer=REG), gone], message="1/2 ready; replica 1 PREEMPTED: gone")
    current = replace(current, versions={1: version(1, VERSION_READY, spec=spec(replicas=1))})
    assert plan(current, [instance(0)], {0: OK}, NOW, balanced=True) == [
        Deregister((1,)),
        DeleteReplica(gone),
        status(ServiceStatus.READY, "1/1 ready"),
    ]


def test_a_spec_that_changes_the_endpoint_reconfigures_it() -> None:
    new_spec = spec().model_copy(
        update={"service": spec().service.model_copy(update={"load_balancing_policy": "round_robin"})}
    )
    current = steady([replica(0, balancer=REG), replica(1, balancer=REG)])
    current = replace(current, versions={1: version(1, VERSION_READY, spec=new_spec)})
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, balanced=True) == [
        EnsureEndpoint(replace(CONFIG, policy="round_robin")),
    ]


def test_delete_drains_every_registered_replica_before_terminating_it() -> None:
    first, second = replica(0, balancer=REG), replica(1, balancer=REG)
    current = served(state([first, second], lifecycle=Lifecycle.DELETING))
    why = {"status": S.SHUTTING_DOWN, "status_message": "service is being deleted"}
    assert plan(current, [instance(0), instance(1)], {}, NOW, balanced=True) == [
        moved(first, **why, balancer=DRAIN, drain_started_at=STAMP),
        moved(second, **why, balancer=DRAIN, drain_started_at=STAMP),
        Deregister((0, 1)),
        status(ServiceStatus.SHUTTING_DOWN, "deleting: draining 2 replica(s), terminating 0 instance(s)"),
    ]


def test_delete_removes_the_endpoint_before_the_service_item() -> None:
    gone = replica(0, S.SHUTTING_DOWN, balancer=DRAIN, drain_started_at=ago(100))
    current = served(state([gone], lifecycle=Lifecycle.DELETING))
    dead = instance(0, InstanceState.TERMINATED)
    # (Its replica items are the cleanup function's, once the service item is gone.)
    assert plan(current, [dead], {}, NOW, balanced=True) == [RemoveEndpoint(), DeleteService()]
    # Without a recorded endpoint too: a crashed first run may have made one it never recorded.
    assert plan(served(state([], lifecycle=Lifecycle.DELETING), None), [], {}, NOW, balanced=True) == [
        RemoveEndpoint(),
        DeleteService(),
    ]
    assert plan(served(state([], lifecycle=Lifecycle.DELETING), None), [], {}, NOW) == [DeleteService()]


def test_only_draining_replicas_with_a_live_instance_are_asked_about() -> None:
    current = one_left([replica(0, balancer=REG), draining(1, since=5), draining(2, since=5)])
    live = [instance(0), instance(1), instance(2, InstanceState.TERMINATED)]
    assert drain_targets(current, live) == {1: live[1]}


def test_the_drain_deadline_is_the_recorded_endpoints() -> None:
    """The deadline comes from the drain_seconds the balancer was configured with (recorded with the
    endpoint): 500 s into a 600 s drain the replica is held, though the spec now says 30 s."""
    long = replace(ENDPOINT, config=replace(CONFIG, drain_seconds=600))
    current = served(one_left([replica(0, balancer=REG), draining(1, since=500)]), long)
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW, balanced=True) == [EnsureEndpoint(CONFIG)]
    current = served(one_left([replica(0, balancer=REG), draining(1, since=600)]), long)
    assert plan(current, [instance(0), instance(1)], {0: OK}, NOW, balanced=True) == [
        EnsureEndpoint(CONFIG),
        terminate(("i-1", "replica 1: SHUTTING_DOWN")),
    ]
