"""Table tests of the planner's autoscaling part: the autoscaler's state written first, and the
rest of the plan aimed at the target it holds; nothing written for a steady service; a rolling
update keeps the autoscaled target.

Like the other planner tests, every case asserts the WHOLE action list.
"""

from __future__ import annotations

from fleetkeeper.model import AutoscalerState, Recommendation, ServiceStatus, VersionState
from fleetkeeper.reconciler.plan import RecordAutoscale, plan, wanted_replicas
from tests.support.builders import (
    NOW,
    OK,
    STAMP,
    autoscaled,
    drained,
    holding,
    instance,
    launches,
    replica,
    since,
    state,
    status,
    version,
)

READY = VersionState.READY


def test_a_new_autoscaled_service_starts_at_its_minimum_and_records_its_first_recommendation() -> None:
    current = state([], [version(1, spec=autoscaled())])
    first = AutoscalerState(target=1, history=(Recommendation(STAMP, 1, 0.0),))
    assert plan(current, [], {}, NOW, request_rate=0.0) == [
        RecordAutoscale(None, first),
        *launches(1, 0),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 PENDING"),
    ]


def test_without_a_reading_an_autoscaled_service_runs_at_its_minimum_and_writes_no_state() -> None:
    current = state([], [version(1, spec=autoscaled(min_replicas=2))])
    assert plan(current, [], {}, NOW) == [
        *launches(1, 0, 1),
        status(ServiceStatus.REPLICA_INIT, "0/2 ready; replica 0 PENDING; replica 1 PENDING"),
    ]


def test_a_scale_up_is_recorded_before_the_new_replicas_are_claimed() -> None:
    """7.9 req/s recommended 4 for the whole upscale delay: the target goes 1 -> 4 in this run."""
    before = AutoscalerState(target=1, history=(since(10_000, 1, 1.0), since(300, 4, 7.9)), rev=3)
    current = holding(
        state([replica(0)], [version(1, READY, spec=autoscaled())], status=ServiceStatus.READY, message="1/1 ready"),
        before,
    )
    after = AutoscalerState(target=4, history=(since(10_000, 1, 1.0), since(300, 4, 7.9)), rev=3)
    assert plan(current, [instance(0)], {0: OK}, NOW, request_rate=7.9) == [
        RecordAutoscale(before, after),
        *launches(1, 1, 2, 3),
        status(ServiceStatus.READY, "1/4 ready; replica 1 PENDING; replica 2 PENDING; replica 3 PENDING"),
    ]


def test_a_steady_autoscaled_service_plans_nothing() -> None:
    held = AutoscalerState(target=2, history=(since(10_000, 2, 4.0),), rev=7)
    current = holding(
        state(
            [replica(0), replica(1)],
            [version(1, READY, spec=autoscaled())],
            status=ServiceStatus.READY,
            message="2/2 ready",
            observed=1,
        ),
        held,
    )
    # 3.7 and 4.3 req/s are within 10% of the 4 two replicas are sized for.
    for rate in (4.0, 3.7, 4.3):
        assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, request_rate=rate) == []
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == []


def test_a_scale_down_drains_the_newest_after_the_downscale_delay() -> None:
    before = AutoscalerState(target=2, history=(since(10_000, 2, 4.0), since(1200, 1, 0.5)), rev=1)
    current = holding(
        state(
            [replica(0), replica(1)],
            [version(1, READY, spec=autoscaled())],
            status=ServiceStatus.READY,
            message="2/2 ready",
            observed=1,
        ),
        before,
    )
    after = AutoscalerState(target=1, history=(since(1200, 1, 0.5),), rev=1)
    actions = plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, request_rate=0.5)
    assert actions[0] == RecordAutoscale(before, after)
    assert actions[1] == drained(replica(1), "scaling down to 1")
    assert actions[-1] == status(ServiceStatus.READY, "1/1 ready")


def test_a_rolling_update_keeps_the_autoscaled_target() -> None:
    """Version 2 of a service autoscaled to 3: the update rolls 3 replicas, not min_replicas (1)."""
    held = AutoscalerState(target=3, history=(since(10_000, 3, 6.0),), rev=2)
    old = [replica(0), replica(1), replica(2)]
    current = holding(
        state(
            old,
            [version(1, READY, spec=autoscaled()), version(2, spec=autoscaled(upscale_delay_seconds=60))],
            target=2,
            status=ServiceStatus.READY,
            message="3/3 ready",
            observed=1,
        ),
        held,
    )
    assert wanted_replicas(current) == 3
    actions = plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK, 2: OK}, NOW, request_rate=6.0)
    # max_surge 1: one new replica at a time, the old ones all kept while it starts; no state write.
    assert actions == [
        *launches(2, 3),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/3 new ready, 3 old replica(s) left; replica 3 PENDING",
        ),
    ]


def test_a_target_version_that_no_longer_autoscales_drops_the_state_once() -> None:
    held = AutoscalerState(target=3, history=(since(10_000, 3, 6.0),), rev=2)
    current = holding(
        state(
            [replica(0), replica(1)], [version(1, READY)], status=ServiceStatus.READY, message="2/2 ready", observed=1
        ),
        held,
    )
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW, request_rate=6.0) == [
        RecordAutoscale(held, None)
    ]
    assert plan(holding(current, None), [instance(0), instance(1)], {0: OK, 1: OK}, NOW, request_rate=6.0) == []


def test_scale_from_zero_on_the_first_request() -> None:
    held = AutoscalerState(target=0, history=(since(10_000, 0, 0.0),), rev=4)
    current = holding(
        state([], [version(1, READY, spec=autoscaled(min_replicas=0))], message="0/0 ready", observed=1),
        held,
    )
    assert plan(current, [], {}, NOW, request_rate=0.0) == []
    after = AutoscalerState(target=1, history=(since(10_000, 0, 0.0), Recommendation(STAMP, 1, 0.1)), rev=4)
    assert plan(current, [], {}, NOW, request_rate=0.1) == [
        RecordAutoscale(held, after),
        *launches(1, 0),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 PENDING"),
    ]
