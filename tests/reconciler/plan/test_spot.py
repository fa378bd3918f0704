"""Table tests of the planner's markets and interruptions: spot replicas, SkyPilot's on-demand
fallback (`base_ondemand_fallback_replicas`, `dynamic_ondemand_fallback`), and the warnings AWS sends
about a spot instance (an interruption warning, a rebalance recommendation).

Every case asserts the WHOLE action list, as the other planner tests do.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.model import (
    FailureCause,
    Interruption,
    InterruptionKind,
    Market,
    ReplicaRecord,
    ServiceStatus,
    to_iso,
)
from fleetkeeper.reconciler import plan as plan_module
from fleetkeeper.reconciler.plan import Claim, Launch, Policy, plan, wanted_by_market, warned
from fleetkeeper.spec.service import MarketPolicy, ServiceSpec
from tests.support.builders import (
    NOW,
    OK,
    READY,
    C,
    S,
    ago,
    drained,
    instance,
    refusal,
    replica,
    state,
    status,
    terminate,
    version,
)
from tests.support.specs import hello_spec

SPOT, OD = Market.SPOT, Market.ON_DEMAND
WARNED_AT = to_iso(NOW - timedelta(seconds=20))


def spot_spec(
    replicas: int = 2, *, base: int | None = None, dynamic: bool | None = None, drain: int = 30, **update: Any
) -> ServiceSpec:
    """A spot service; its drain is 30 s (not the default 120 s), so a warned replica serves on for a while."""
    data = hello_spec()
    data["service"] = {k: v for k, v in data["service"].items() if k != "replicas"}
    data["service"]["drain_seconds"] = drain
    data["service"]["readiness_probe"] = {"path": "/health", "initial_delay_seconds": 600}
    policy: dict[str, Any] = {"min_replicas": replicas}
    if base is not None:
        policy["base_ondemand_fallback_replicas"] = base
    if dynamic is not None:
        policy["dynamic_ondemand_fallback"] = dynamic
    data["service"]["replica_policy"] = policy
    data["resources"] = {**data.get("resources", {}), "use_spot": True}
    if update:
        data["update"] = update
    return ServiceSpec.model_validate(data)


def spot(rid: int, status: S = S.READY, **kw: Any) -> ReplicaRecord:
    return replica(rid, status, market=SPOT, **kw)


def notice(rid: int, kind: InterruptionKind = InterruptionKind.SPOT_INTERRUPTION) -> Interruption:
    return Interruption(kind=kind, instance_id=f"i-{rid}", at=WARNED_AT)


def claims(version_number: int, ids: tuple[int, ...], spot_ids: tuple[int, ...]) -> list[Any]:
    return [Claim(version_number, ids, spot_ids), *(Launch(rid, fresh=True) for rid in ids)]


# --- how many of each -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markets", "wanted", "spot_ready", "expected"),
    [
        (None, 3, 0, {SPOT: 0, OD: 3}),
        (MarketPolicy(spot=False), 3, 0, {SPOT: 0, OD: 3}),
        (MarketPolicy(spot=True), 3, 0, {SPOT: 3, OD: 0}),
        (MarketPolicy(spot=True, base_ondemand=1), 3, 0, {SPOT: 2, OD: 1}),
        # More base on-demand replicas than wanted: all on demand, no spot.
        (MarketPolicy(spot=True, base_ondemand=5), 3, 0, {SPOT: 0, OD: 3}),
        # Dynamic fallback: one on-demand replica per wanted spot replica not READY.
        (MarketPolicy(spot=True, dynamic_fallback=True), 3, 0, {SPOT: 3, OD: 3}),
        (MarketPolicy(spot=True, dynamic_fallback=True), 3, 2, {SPOT: 3, OD: 1}),
        (MarketPolicy(spot=True, dynamic_fallback=True), 3, 3, {SPOT: 3, OD: 0}),
        (MarketPolicy(spot=True, base_ondemand=1, dynamic_fallback=True), 3, 1, {SPOT: 2, OD: 2}),
        # Scaled to zero: nothing of either.
        (MarketPolicy(spot=True, base_ondemand=1, dynamic_fallback=True), 0, 0, {SPOT: 0, OD: 0}),
    ],
)
def test_the_split_between_spot_and_on_demand(
    markets: MarketPolicy | None, wanted: int, spot_ready: int, expected: dict[Market, int]
) -> None:
    assert wanted_by_market(markets, wanted, spot_ready) == expected


# --- claims -----------------------------------------------------------------------------------------


def test_a_spot_service_claims_spot_replicas() -> None:
    assert plan(state([], [version(1, spec=spot_spec(2))]), [], {}, NOW) == [
        *claims(1, (0, 1), (0, 1)),
        status(ServiceStatus.REPLICA_INIT, "0/2 ready; replica 0 PENDING; replica 1 PENDING"),
    ]


def test_base_on_demand_replicas_are_claimed_on_demand() -> None:
    assert plan(state([], [version(1, spec=spot_spec(3, base=1))]), [], {}, NOW) == [
        *claims(1, (0, 1, 2), (0, 1)),
        status(ServiceStatus.REPLICA_INIT, "0/3 ready; replica 0 PENDING; replica 1 PENDING; replica 2 PENDING"),
    ]


def test_dynamic_fallback_starts_an_on_demand_replica_for_each_spot_one_not_ready() -> None:
    assert plan(state([], [version(1, spec=spot_spec(2, dynamic=True))]), [], {}, NOW) == [
        *claims(1, (0, 1, 2, 3), (0, 1)),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/2 ready; replica 0 PENDING; replica 1 PENDING; replica 2 PENDING; and 1 more",
        ),
    ]


def test_spot_refused_everywhere_is_retried_in_place_and_on_demand_carries_the_service() -> None:
    """The spot replicas back off in place (no new items pile up, SkyPilot issue #3962); the two
    on-demand fallback replicas serve."""
    refused_spot = [
        replace_market(refusal(rid, "InsufficientInstanceCapacity", "no spot", C.ENVIRONMENT, retry_in=60))
        for rid in (0, 1)
    ]
    current = state([*refused_spot, replica(2), replica(3)], [version(1, READY, spec=spot_spec(2, dynamic=True))])
    assert plan(current, [instance(2), instance(3)], {2: OK, 3: OK}, NOW) == [
        status(
            ServiceStatus.READY,
            "2/2 ready; replica 0 FAILED_PROVISION: InsufficientInstanceCapacity: no spot; "
            "replica 1 FAILED_PROVISION: InsufficientInstanceCapacity: no spot",
        ),
    ]


def replace_market(record: ReplicaRecord) -> ReplicaRecord:
    return replace(record, market=SPOT)


def test_once_spot_is_ready_the_on_demand_fallback_is_drained_and_terminated() -> None:
    records = [spot(0), spot(1), replica(2), replica(3)]
    current = state(records, [version(1, READY, spec=spot_spec(2, dynamic=True))])
    why = "on-demand fallback retired: 2 spot replica(s) READY"
    assert plan(current, [instance(i) for i in range(4)], dict.fromkeys(range(4), OK), NOW) == [
        drained(records[2], why),
        drained(records[3], why),
        terminate(("i-2", f"replica 2: {why}"), ("i-3", f"replica 3: {why}")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_one_spot_ready_retires_one_fallback_the_not_ready_one_first() -> None:
    records = [
        spot(0),
        spot(1, S.STARTING, launched_at=ago(60)),
        replica(2),
        replica(3, S.STARTING, launched_at=ago(60)),
    ]
    current = state(records, [version(1, READY, spec=spot_spec(2, dynamic=True))])
    why = "on-demand fallback retired: 1 spot replica(s) READY"
    assert plan(current, [instance(i) for i in range(4)], {0: OK, 2: OK}, NOW) == [
        drained(records[3], why),
        terminate(("i-3", f"replica 3: {why}")),
        status(ServiceStatus.READY, "2/2 ready; replica 1 STARTING"),
    ]


def test_a_rolling_update_with_fallback_has_room_for_the_fallback_too() -> None:
    """v1's two spot replicas serve; v2 wants two spot replicas and, while they are not READY, two
    on-demand ones: the surge of 1 is over all four, so three are claimed (spot first)."""
    records = [spot(0), spot(1)]
    versions = [version(1, READY, spec=spot_spec(2)), version(2, spec=spot_spec(2, dynamic=True))]
    current = state(records, versions, target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *claims(2, (2, 3, 4), (2, 3)),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING; "
            "replica 3 PENDING; replica 4 PENDING",
        ),
    ]


# --- interruptions ----------------------------------------------------------------------------------


def test_an_interruption_warning_replaces_the_replica_at_once_and_it_serves_until_its_deadline() -> None:
    """Warned 20 s ago: its replacement is claimed now, and it serves on (its drain must start by
    warning + 120 s - 30 s of drain - 15 s of margin = warning + 75 s)."""
    records = [spot(0, interruption=notice(0)), spot(1)]
    current = state(records, [version(1, READY, spec=spot_spec(2))], status=ServiceStatus.READY, message="2/2 ready")
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *claims(1, (2,), (2,)),
        status(ServiceStatus.READY, "2/2 ready; replica 2 PENDING"),
    ]
    # 75 s after the warning, the replacement not READY yet: drained now, in time for its drain.
    late = Interruption(InterruptionKind.SPOT_INTERRUPTION, "i-0", to_iso(NOW - timedelta(seconds=75)))
    records = [spot(0, interruption=late), spot(1), spot(2, S.STARTING, launched_at=ago(30))]
    current = state(records, [version(1, READY, spec=spot_spec(2))], status=ServiceStatus.READY, message="2/2 ready")
    why = f"spot interruption warning at {late.at}: AWS takes instance i-0 back"
    assert plan(current, [instance(i) for i in range(3)], {0: OK, 1: OK}, NOW) == [
        drained(records[0], why),
        terminate(("i-0", f"replica 0: {why}")),
        status(ServiceStatus.READY, "1/2 ready; replica 2 STARTING"),
    ]


def test_with_the_default_drain_a_warned_replica_leaves_the_endpoint_at_once() -> None:
    """SkyPilot's 120 s drain is as long as EC2's notice: to finish before AWS takes the instance, the
    drain starts at the warning (before the change, with 30 s, it served on for 75 s)."""
    records = [spot(0, interruption=notice(0)), spot(1)]
    current = state(
        records, [version(1, READY, spec=spot_spec(2, drain=120))], status=ServiceStatus.READY, message="2/2 ready"
    )
    why = f"spot interruption warning at {WARNED_AT}: AWS takes instance i-0 back"
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        drained(records[0], why),
        terminate(("i-0", f"replica 0: {why}")),
        *claims(1, (2,), (2,)),
        status(ServiceStatus.READY, "1/2 ready; replica 2 PENDING"),
    ]


def test_an_interrupted_replica_goes_as_soon_as_its_replacement_is_ready() -> None:
    records = [spot(0, interruption=notice(0)), spot(1), spot(2)]
    current = state(
        records, [version(1, READY, spec=spot_spec(2))], status=ServiceStatus.READY, message="2/2 ready", observed=1
    )
    why = f"replaced after a spot interruption warning at {WARNED_AT}: AWS takes instance i-0 back"
    assert plan(current, [instance(i) for i in range(3)], dict.fromkeys(range(3), OK), NOW) == [
        drained(records[0], why),
        terminate(("i-0", f"replica 0: {why}")),
    ]


def test_with_dynamic_fallback_an_interrupted_spot_replica_also_gets_an_on_demand_stand_in() -> None:
    records = [spot(0, interruption=notice(0)), spot(1)]
    current = state(records, [version(1, READY, spec=spot_spec(2, dynamic=True))])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *claims(1, (2, 3), (2,)),
        status(ServiceStatus.READY, "2/2 ready; replica 2 PENDING; replica 3 PENDING"),
    ]


def test_a_rebalance_recommendation_keeps_the_replica_serving_until_its_replacement_is_ready() -> None:
    rebalance = notice(0, InterruptionKind.REBALANCE)
    records = [spot(0, interruption=rebalance), spot(1)]
    current = state(records, [version(1, READY, spec=spot_spec(2))])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *claims(1, (2,), (2,)),
        status(ServiceStatus.READY, "2/2 ready; replica 2 PENDING"),
    ]
    # The replacement is READY: now the warned one goes.
    records = [spot(0, interruption=rebalance), spot(1), spot(2)]
    current = state(records, [version(1, READY, spec=spot_spec(2))], status=ServiceStatus.READY)
    why = f"replaced after a rebalance recommendation at {WARNED_AT} for instance i-0"
    assert plan(current, [instance(i) for i in range(3)], dict.fromkeys(range(3), OK), NOW) == [
        drained(records[0], why),
        terminate(("i-0", f"replica 0: {why}")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_rebalance_recommendation_for_a_replica_not_serving_replaces_it_at_once() -> None:
    records = [spot(0, S.STARTING, launched_at=ago(60), interruption=notice(0, InterruptionKind.REBALANCE)), spot(1)]
    current = state(records, [version(1, READY, spec=spot_spec(2))])
    why = f"rebalance recommendation at {WARNED_AT} for instance i-0"
    assert plan(current, [instance(0), instance(1)], {1: OK}, NOW) == [
        drained(records[0], why),
        terminate(("i-0", f"replica 0: {why}")),
        *claims(1, (2,), (2,)),
        status(ServiceStatus.READY, "1/2 ready; replica 2 PENDING"),
    ]


@pytest.mark.parametrize(
    ("record", "warning", "recorded"),
    [
        # The first warning of the replica's instance is recorded.
        (spot(0), notice(0), True),
        (spot(0), notice(0, InterruptionKind.REBALANCE), True),
        # A launch not yet recorded (a run died after RunInstances): the tags named the replica.
        (spot(0, S.PENDING, instance_id=None), notice(0), True),
        # The interruption warning after a rebalance recommendation is recorded (it drains at once).
        (spot(0, interruption=notice(0, InterruptionKind.REBALANCE)), notice(0), True),
        # Nothing new: the same warning again, a rebalance recommendation after the interruption warning.
        (spot(0, interruption=notice(0)), notice(0), False),
        (spot(0, interruption=notice(0)), notice(0, InterruptionKind.REBALANCE), False),
        # Another instance (a duplicate launch, already being terminated) or a replica on its way out.
        (spot(0), notice(7), False),
        (spot(0, S.SHUTTING_DOWN), notice(0), False),
        (spot(0, S.PREEMPTED, failure_code="Server.SpotInstanceTermination", cause=C.SPOT_RECLAIM), notice(0), False),
    ],
)
def test_which_warnings_are_recorded(record: ReplicaRecord, warning: Interruption, recorded: bool) -> None:
    # Recording is all (nothing else of the record changes): the plan acts on it.
    assert warned(record, warning) == (replace(record, interruption=warning) if recorded else None)


def test_warned_replicas_never_count_toward_the_breaker_nor_pile_up() -> None:
    """A new version's spot replica interrupted before READY is replaced, once; the version stays NEW."""
    records = [spot(0, S.STARTING, launched_at=ago(60), interruption=notice(0))]
    current = state(records, [version(1, spec=spot_spec(1))])
    why = f"spot interruption warning at {WARNED_AT}: AWS takes instance i-0 back"
    actions = plan(current, [instance(0)], {}, NOW, Policy())
    assert actions == [
        drained(records[0], why),
        terminate(("i-0", f"replica 0: {why}")),
        *claims(1, (1,), (1,)),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 1 PENDING"),
    ]


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        # The account's doing, or about one ClientToken, never the version's (issue 24's findings).
        ("AuthFailure.ServiceLinkedRoleCreationNotPermitted", FailureCause.ENVIRONMENT),
        ("IdempotentInstanceTerminated", FailureCause.ENVIRONMENT),
        ("IdempotentParameterMismatch", FailureCause.ENVIRONMENT),
        ("InsufficientInstanceCapacity", FailureCause.ENVIRONMENT),
        # A missing image, a bad parameter, a denied permission: the version's.
        ("InvalidAMIID.NotFound", FailureCause.VERSION),
        ("UnauthorizedOperation", FailureCause.VERSION),
    ],
)
def test_whose_fault_a_refused_launch_is(code: str, cause: FailureCause) -> None:
    assert plan_module.refusal_cause(code) is cause
