"""Table tests of SkyPilot's paces in the planner (issue 35, Deliver 3 and 4): a blue-green update switches
once `min_replicas` new replicas are READY; from zero the autoscaler goes straight to ceil(rate /
target); `num_overprovision` replicas over the target; a target per accelerator reads the replicas'
instance types. Like the other planner tests, every case asserts the WHOLE action list.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fleetkeeper.model import AutoscalerState, Market, Recommendation, ServiceStatus, VersionState
from fleetkeeper.reconciler.plan import Claim, Launch, RecordAutoscale, plan, wanted_by_market
from fleetkeeper.spec.service import MarketPolicy, ServiceSpec
from tests.support.builders import (
    NOW,
    OK,
    STAMP,
    S,
    ago,
    autoscaled,
    drained,
    holding,
    instance,
    launches,
    mark_ready,
    replica,
    since,
    state,
    status,
    terminate,
    version,
)
from tests.support.specs import hello_spec

READY = VersionState.READY


def test_blue_green_switches_once_min_replicas_new_are_ready() -> None:
    """Autoscaled to 3 (min 1): one READY replica of version 2 takes the traffic and every old one goes,
    as SkyPilot's blue-green does; before, the old ones stayed until all 3 new were READY."""
    held = AutoscalerState(target=3, history=(since(10_000, 3, 6.0),), rev=2)
    old = [replica(0), replica(1), replica(2)]
    new = [
        replica(3, v=2),
        replica(4, S.STARTING, v=2, launched_at=ago(60)),
        replica(5, S.STARTING, v=2, launched_at=ago(60)),
    ]
    blue_green = autoscaled("blue_green", upscale_delay_seconds=60)
    current = holding(
        state(old + new, [version(1, READY, spec=autoscaled()), version(2, spec=blue_green)], target=2), held
    )
    probes = {0: OK, 1: OK, 2: OK, 3: OK}
    replaced = "replaced by version 2 (blue_green)"
    assert plan(current, [instance(i) for i in range(6)], probes, NOW, request_rate=6.0) == [
        drained(old[0], replaced),
        drained(old[1], replaced),
        drained(old[2], replaced),
        mark_ready(2),
        terminate(*((f"i-{i}", f"replica {i}: {replaced}") for i in range(3))),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (blue_green): 1/3 new ready, 3 old replica(s) left; replica 4 STARTING; "
            "replica 5 STARTING",
        ),
    ]


def test_blue_green_with_min_replicas_2_waits_for_two() -> None:
    held = AutoscalerState(target=3, history=(since(10_000, 3, 6.0),), rev=2)
    old = [replica(0), replica(1), replica(2)]
    starting = [replica(4, S.STARTING, v=2, launched_at=ago(60)), replica(5, S.STARTING, v=2, launched_at=ago(60))]
    specs = [
        version(1, READY, spec=autoscaled(min_replicas=2)),
        version(2, spec=autoscaled("blue_green", min_replicas=2)),
    ]
    current = holding(state([*old, replica(3, v=2), *starting], specs, target=2), held)
    assert plan(current, [instance(i) for i in range(6)], {0: OK, 1: OK, 2: OK, 3: OK}, NOW, request_rate=6.0) == [
        mark_ready(2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (blue_green): 1/3 new ready, 3 old replica(s) left; replica 4 STARTING; "
            "replica 5 STARTING",
        ),
    ]


def test_from_zero_straight_to_what_the_rate_asks_for() -> None:
    """7.9 req/s at 2 per replica: 4 at once (before: 1, then 4 after the upscale delay)."""
    held = AutoscalerState(target=0, history=(since(10_000, 0, 0.0),), rev=4)
    current = holding(
        state([], [version(1, READY, spec=autoscaled(min_replicas=0))], message="0/0 ready", observed=1), held
    )
    after = AutoscalerState(target=4, history=(since(10_000, 0, 0.0), Recommendation(STAMP, 4, 7.9)), rev=4)
    assert plan(current, [], {}, NOW, request_rate=7.9) == [
        RecordAutoscale(held, after),
        *launches(1, 0, 1, 2, 3),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/4 ready; replica 0 PENDING; replica 1 PENDING; replica 2 PENDING; and 1 more",
        ),
    ]


def fixed(replicas: int, **policy: Any) -> ServiceSpec:
    data = hello_spec()
    data["service"] = {k: v for k, v in data["service"].items() if k != "replicas"}
    data["service"]["replica_policy"] = {"min_replicas": replicas, **policy}
    if policy.get("base_ondemand_fallback_replicas") or policy.get("dynamic_ondemand_fallback"):
        data["resources"] = {**data.get("resources", {}), "use_spot": True}
    return ServiceSpec.model_validate(data)


def test_num_overprovision_launches_as_many_over_the_target() -> None:
    current = state([], [version(1, spec=fixed(2, num_overprovision=1))])
    assert plan(current, [], {}, NOW) == [
        *launches(1, 0, 1, 2),
        status(ServiceStatus.REPLICA_INIT, "0/3 ready; replica 0 PENDING; replica 1 PENDING; replica 2 PENDING"),
    ]


def test_overprovisioned_spot_replicas_get_no_on_demand_fallback() -> None:
    """SkyPilot's FallbackRequestRateAutoscaler: spot = final target - base; on demand at most the target."""
    current = state([], [version(1, spec=fixed(2, num_overprovision=1, base_ondemand_fallback_replicas=1))])
    assert plan(current, [], {}, NOW) == [
        Claim(1, (0, 1, 2), (0, 1)),
        *(Launch(rid, fresh=True) for rid in (0, 1, 2)),
        status(ServiceStatus.REPLICA_INIT, "0/3 ready; replica 0 PENDING; replica 1 PENDING; replica 2 PENDING"),
    ]


@pytest.mark.parametrize(
    ("markets", "wanted", "spot_ready", "overprovision", "expected"),
    [
        (MarketPolicy(spot=False), 3, 0, 1, (0, 3)),
        (MarketPolicy(spot=True, base_ondemand=1), 3, 0, 1, (2, 1)),
        # dynamic: one on demand per spot not READY, but never more than the target (2) on demand
        (MarketPolicy(spot=True, base_ondemand=1, dynamic_fallback=True), 3, 0, 1, (2, 2)),
        (MarketPolicy(spot=True, dynamic_fallback=True), 3, 0, 1, (3, 2)),
        (MarketPolicy(spot=True, dynamic_fallback=True), 3, 3, 1, (3, 0)),
        (MarketPolicy(spot=True, dynamic_fallback=True), 3, 0, 0, (3, 3)),
    ],
)
def test_wanted_by_market_with_overprovision(
    markets: MarketPolicy, wanted: int, spot_ready: int, overprovision: int, expected: tuple[int, int]
) -> None:
    got = wanted_by_market(markets, wanted, spot_ready, overprovision)
    assert (got[Market.SPOT], got[Market.ON_DEMAND]) == expected


def per_accelerator(**policy: Any) -> ServiceSpec:
    data = hello_spec()
    data["service"] = {k: v for k, v in data["service"].items() if k != "replicas"}
    data["service"]["readiness_probe"] = {"path": "/health", "initial_delay_seconds": 600}
    data["service"]["replica_policy"] = {
        "min_replicas": 1,
        "max_replicas": 6,
        "target_qps_per_replica": {"L4": 2, "A10G": 5},
        "upscale_delay_seconds": 0,
        **policy,
    }
    data["resources"] = {"accelerators": {"L4:1": None, "A10G:1": None}}
    return ServiceSpec.model_validate(data)


def test_a_target_per_accelerator_sizes_the_target_by_the_replicas_instance_types() -> None:
    """Two READY L4 replicas serve 2 req/s each; 12 req/s is 8 more, 2 more replicas at A10G's 5."""
    records = [replica(0, instance_type="g6.xlarge"), replica(1, instance_type="g6.xlarge")]
    held = AutoscalerState(target=2, history=(since(10_000, 2, 4.0),), rev=1)
    current = holding(
        state(records, [version(1, READY, spec=per_accelerator())], status=ServiceStatus.READY, message="2/2 ready"),
        held,
    )
    after = AutoscalerState(target=4, history=(since(10_000, 2, 4.0), Recommendation(STAMP, 4, 12.0)), rev=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, request_rate=12.0) == [
        RecordAutoscale(held, after),
        *launches(1, 2, 3),
        status(ServiceStatus.READY, "2/4 ready; replica 2 PENDING; replica 3 PENDING"),
    ]
    # The same two replicas on A10G (g5.xlarge) serve 10: 12 req/s needs one more.
    on_a10g = [replace(r, instance_type="g5.xlarge") for r in records]
    current = replace(current, replicas={r.replica_id: r for r in on_a10g})
    after = AutoscalerState(target=3, history=(since(10_000, 2, 4.0), Recommendation(STAMP, 3, 12.0)), rev=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, request_rate=12.0) == [
        RecordAutoscale(held, after),
        *launches(1, 2),
        status(ServiceStatus.READY, "2/3 ready; replica 2 PENDING"),
    ]


def test_a_target_per_accelerator_at_steady_capacity_plans_nothing() -> None:
    records = [replica(0, instance_type="g5.xlarge"), replica(1, instance_type="g6.xlarge")]
    held = AutoscalerState(target=2, history=(since(10_000, 2, 6.0),), rev=1)
    current = holding(
        state(
            records,
            [version(1, READY, spec=per_accelerator())],
            status=ServiceStatus.READY,
            message="2/2 ready",
            observed=1,
        ),
        held,
    )
    # 6 req/s: below the 7 they serve, and one A10G alone (5) does not serve it: both stay.
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, request_rate=6.0) == []
