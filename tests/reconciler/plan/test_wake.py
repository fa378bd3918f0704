"""Table tests of wake from zero in the planner (fleetkeeper.wake.demand): the route of an autoscaled service
with no replica in its endpoint goes to the wake target, and back to the target group in the run that
registers a replica; demand the wake target recorded is a rate > 0 to the autoscaler (so a service at
zero goes to one), but only demand recorded while the route was on the wake target, and only while
it is recent. Every case asserts the WHOLE action list, as the other plan tests do.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.model import AutoscalerState, Recommendation, ServiceState, ServiceStatus, to_iso
from fleetkeeper.reconciler.plan import EnsureEndpoint, RecordAutoscale, Register, RouteEndpoint, plan
from fleetkeeper.wake import demand as wake
from tests.support.builders import (
    CONFIG,
    ENDPOINT,
    NOW,
    OK,
    REG,
    REGING,
    STAMP,
    S,
    ago,
    autoscaled,
    became_ready,
    holding,
    instance,
    launches,
    replica,
    served,
    state,
    status,
)
from tests.support.builders import version as version_of

ZERO_POLICY: dict[str, Any] = {"min_replicas": 0, "max_replicas": 2, "downscale_to_zero_delay_seconds": 60}
AT_ZERO = AutoscalerState(target=0, history=(Recommendation(ago(3600), 0, 0.0),), rev=4)
WAKING = replace(ENDPOINT, waking_since=ago(600))


def at_zero(endpoint: Any = WAKING, wake_at: str | None = None, **kw: Any) -> ServiceState:
    from fleetkeeper.model import VersionState

    current = state(
        [], [version_of(1, VersionState.READY, spec=autoscaled(**ZERO_POLICY))], status=ServiceStatus.NO_REPLICA, **kw
    )
    current = holding(served(current, endpoint), AT_ZERO)
    return replace(current, service=replace(current.service, wake_at=wake_at))


def test_a_service_at_zero_with_no_demand_plans_nothing() -> None:
    """The steady state of scale to zero: no request, no write, no balancer call."""
    current = at_zero(message="0/0 ready", observed=1)
    assert plan(current, [], {}, NOW, balanced=True, request_rate=0.0) == []


def test_a_new_service_at_zero_gets_its_endpoint_then_its_route_on_the_wake_target() -> None:
    current = at_zero(endpoint=None)
    current = replace(current, service=replace(current.service, autoscaler=None))
    assert plan(current, [], {}, NOW, balanced=True) == [
        EnsureEndpoint(CONFIG),
        RouteEndpoint(waking=True),
        status(ServiceStatus.NO_REPLICA, "0/0 ready"),
    ]


def test_demand_recorded_by_the_wake_target_scales_a_service_at_zero_to_one_at_once() -> None:
    """The metric reads 0 (the ALB counted no request: no target); the wake target's demand is the rate."""
    current = at_zero(wake_at=ago(5), message="0/0 ready", observed=1)
    woken = AutoscalerState(
        target=1, history=(*AT_ZERO.history, Recommendation(STAMP, 1, wake.WAKE_DEMAND_RATE)), rev=4
    )
    assert plan(current, [], {}, NOW, balanced=True, request_rate=0.0) == [
        RecordAutoscale(AT_ZERO, woken),
        *launches(1, 0),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 PENDING"),
    ]
    # Without a metric reading (none yet, or the read failed) the demand alone decides.
    assert plan(current, [], {}, NOW, balanced=True)[0] == RecordAutoscale(AT_ZERO, woken)


@pytest.mark.parametrize(
    ("wake_at", "endpoint", "why"),
    [
        (ago(wake.WAKE_DEMAND_SECONDS + 1), WAKING, "too old"),
        (ago(700), WAKING, "recorded before the route went to the wake target (the last time it was up)"),
        (ago(5), ENDPOINT, "the route is not on the wake target"),
        ("garbage", WAKING, "not a time"),
    ],
)
def test_demand_that_is_not_current_wakes_nothing(wake_at: str, endpoint: Any, why: str) -> None:
    current = at_zero(endpoint=endpoint, wake_at=wake_at, message="0/0 ready", observed=1)
    actions = plan(current, [], {}, NOW, balanced=True, request_rate=0.0)
    assert not any(isinstance(action, RecordAutoscale) for action in actions), why


def test_the_route_goes_back_to_the_target_group_once_the_balancer_serves_a_registered_replica() -> None:
    """The run that registers the first replica leaves the route on the wake target (the ALB would
    answer 503 itself while its only target is in its first health checks); a later run, told the
    balancer serves it, routes back."""
    booting = replica(0, S.STARTING)
    current = at_zero(wake_at=ago(5))
    current = replace(current, replicas={0: booting})
    current = holding(current, AutoscalerState(target=1, history=(Recommendation(ago(5), 1, wake.WAKE_DEMAND_RATE),)))
    actions = plan(current, [instance(0)], {0: OK}, NOW, balanced=True, request_rate=0.0)
    ready = became_ready(booting)
    assert actions == [
        replace(ready, after=replace(ready.after, balancer=REGING)),
        Register((0,)),
        status(ServiceStatus.READY, "1/1 ready"),
    ]
    registered_now = replace(current, replicas={0: replica(0, balancer=REG)})
    registered_now = replace(
        registered_now,
        service=replace(
            registered_now.service, status=ServiceStatus.READY, status_message="1/1 ready", observed_generation=1
        ),
    )
    for serves in (None, False):
        assert plan(registered_now, [instance(0)], {0: OK}, NOW, balanced=True, balancer_serves=serves) == []
    assert plan(registered_now, [instance(0)], {0: OK}, NOW, balanced=True, balancer_serves=True) == [
        RouteEndpoint(waking=False)
    ]
    # Served, but the replica leaves the endpoint in this very run: the route stays on the wake target.
    leaving = replace(registered_now, replicas={0: replica(0, S.NOT_READY, balancer=REG)})
    actions = plan(leaving, [instance(0)], {}, NOW, balanced=True, balancer_serves=True)
    assert not any(isinstance(action, RouteEndpoint) for action in actions)


def test_the_run_that_takes_the_last_replica_out_routes_to_the_wake_target() -> None:
    going = replica(0, balancer=REG)
    current = at_zero(endpoint=ENDPOINT)
    current = replace(current, replicas={0: going})
    actions = plan(current, [instance(0)], {0: OK}, NOW, balanced=True, request_rate=0.0)
    route = [action for action in actions if isinstance(action, RouteEndpoint)]
    assert route == [RouteEndpoint(waking=True)]
    kinds = [type(action).__name__ for action in actions]
    assert kinds.index("Deregister") < kinds.index("RouteEndpoint")


def test_a_service_that_does_not_autoscale_is_never_routed_to_the_wake_target() -> None:
    """Fixed replicas that are all down: the ALB's own 503 (waking would change nothing)."""
    current = served(state([replica(0, S.NOT_READY)]))
    actions = plan(current, [instance(0)], {}, NOW, balanced=True)
    assert not any(isinstance(action, RouteEndpoint) for action in actions)
    # One left on the wake target by an autoscaled version goes back to the target group.
    current = served(state([replica(0, balancer=REG)]), WAKING)
    assert RouteEndpoint(waking=False) in plan(current, [instance(0)], {0: OK}, NOW, balanced=True)


def test_demand_rate_is_at_least_one_request_a_minute_and_keeps_a_higher_metric() -> None:
    since = to_iso(NOW - timedelta(seconds=60))
    assert wake.demand_rate(0.0, ago(1), since, NOW) == wake.WAKE_DEMAND_RATE > 0
    assert wake.demand_rate(None, ago(1), since, NOW) == wake.WAKE_DEMAND_RATE
    assert wake.demand_rate(3.5, ago(1), since, NOW) == 3.5
    assert wake.demand_rate(None, None, since, NOW) is None
    assert wake.demand_rate(0.0, ago(1), None, NOW) == 0.0
