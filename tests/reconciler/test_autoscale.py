"""Table tests of the autoscaler's pure decision (fleetkeeper.reconciler.autoscale) over request-rate traces.

A trace is a list of (seconds since the start, requests a second), one decision each; every case
asserts the whole list of targets. `run` threads the state through the decisions as the table
would; `run_with_restarts` writes the state to a service item and reads it back between EVERY two
decisions (a reconciler that crashed, or was replaced, after each one): the targets must be the same.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.model import AutoscalerState, Lifecycle, Recommendation, ServiceRecord, ServiceStatus, to_iso
from fleetkeeper.reconciler.autoscale import (
    TIMES,
    Capacity,
    ScalingPolicy,
    current_target,
    decide,
    pending,
    policy_of,
    recommend,
    replica_target,
)
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.codec import from_raw, service_from_item, service_item, to_raw
from tests import REPO_ROOT

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# min 1, max 5, 2 req/s per replica, SkyPilot's default delays.
POLICY = ScalingPolicy(min_replicas=1, max_replicas=5, target_qps_per_replica=2.0)
Trace = list[tuple[int, float]]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def every(start: int, stop: int, rate: float, step: int = 60) -> Trace:
    return [(t, rate) for t in range(start, stop, step)]


def run(policy: ScalingPolicy, trace: Trace, state: AutoscalerState | None = None) -> list[int]:
    targets: list[int] = []
    for seconds, rate in trace:
        state = decide(policy, state, rate, at(seconds))
        targets.append(current_target(policy, state))
    return targets


def _through_the_table(state: AutoscalerState | None) -> AutoscalerState | None:
    """The state as a new reconciler reads it: written into a service item, marshalled, read back."""
    record = ServiceRecord(
        name="svc",
        uid="u1",
        generation=1,
        lifecycle=Lifecycle.ACTIVE,
        target_version=1,
        latest_version=1,
        status=ServiceStatus.READY,
        status_message="",
        observed_generation=1,
        created_at=to_iso(T0),
        updated_at=to_iso(T0),
        autoscaler=state,
    )
    return service_from_item(from_raw(to_raw(service_item(record)))).autoscaler


def run_with_restarts(policy: ScalingPolicy, trace: Trace, state: AutoscalerState | None = None) -> list[int]:
    targets: list[int] = []
    for seconds, rate in trace:
        state = _through_the_table(decide(policy, _through_the_table(state), rate, at(seconds)))
        targets.append(current_target(policy, state))
    return targets


def at_target(target: int, rate: float = 0.0, since: int = -100_000) -> AutoscalerState:
    """A service that has run at `target` with a steady recommendation for a long time."""
    return AutoscalerState(target=target, history=(Recommendation(to_iso(at(since)), target, rate),))


STEP_UP = every(0, 300, 1.0) + every(300, 900, 7.9)
SPIKE = every(0, 300, 1.0) + every(300, 480, 20.0) + every(480, 1200, 1.0)
STOP = every(0, 1800, 0.0)
ZERO_TO_ONE = every(0, 120, 0.0) + every(120, 600, 5.0)
MAX_CLAMP = every(0, 700, 100.0)
# A sustained rec of 4 with one noisy sample recommending 3 in the middle.
NOISY_DIP = [*every(0, 300, 7.9), (300, 5.0), *every(360, 1000, 7.9)]

CASES: list[tuple[str, ScalingPolicy, Trace, AutoscalerState | None, list[int]]] = [
    # 7.9 req/s from 300 s: ceil(7.9 / 2) = 4 once a whole upscale delay (300 s) agrees, at 600 s.
    ("step up", POLICY, STEP_UP, None, [1] * 10 + [4] * 5),
    # 20 req/s for 180 s, shorter than the upscale delay: nothing moves.
    ("spike shorter than the upscale delay", POLICY, SPIKE, None, [1] * 20),
    # Traffic stops at a service running 4: down to min only after the downscale delay (1200 s).
    ("traffic stopping", POLICY, STOP, at_target(4, 8.0), [4] * 20 + [1] * 10),
    # min 0: the first requests at zero scale at once straight to what they ask for, ceil(5 / 2) = 3
    # (SkyPilot's "faster scale up when there is no replica"); before, to 1, and to 3 after the delay.
    (
        "zero straight to the rate's target",
        replace(POLICY, min_replicas=0, max_replicas=3),
        ZERO_TO_ONE,
        at_target(0),
        [0, 0, 3, 3, 3, 3, 3, 3, 3, 3],
    ),
    # The same, bounded by max_replicas: 5 req/s asks for 3, the policy allows 2.
    (
        "zero straight to the rate's target, within max",
        replace(POLICY, min_replicas=0, max_replicas=2),
        ZERO_TO_ONE,
        at_target(0),
        [0, 0, 2, 2, 2, 2, 2, 2, 2, 2],
    ),
    # 100 req/s asks for 50: clamped to max 5, after the upscale delay.
    ("max clamp", POLICY, MAX_CLAMP, None, [1] * 5 + [5] * 7),
    # HPA, not SkyPilot's counter: the dip at 300 s does not restart the wait. The service goes up
    # on time (300 s after the load began) to the window's lowest recommendation (3), and to 4 once
    # the dip has left the window (660 s). SkyPilot's reset counter would hold 1 until 660 s.
    ("a noisy sample does not reset", POLICY, NOISY_DIP, None, [1] * 5 + [3] * 6 + [4] * 6),
]


@pytest.mark.parametrize(("policy", "trace", "start", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_targets_over_a_trace(
    policy: ScalingPolicy, trace: Trace, start: AutoscalerState | None, expected: list[int]
) -> None:
    assert run(policy, trace, start) == expected


@pytest.mark.parametrize(("policy", "trace", "start", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_restart_between_every_decision_gives_the_same_targets(
    policy: ScalingPolicy, trace: Trace, start: AutoscalerState | None, expected: list[int]
) -> None:
    assert run_with_restarts(policy, trace, start) == run(policy, trace, start) == expected


def test_the_same_inputs_give_the_same_state_at_any_decision() -> None:
    """Replaying a decision from the state the table holds gives the state the first run wrote."""
    state: AutoscalerState | None = None
    for seconds, rate in STEP_UP + every(900, 2400, 0.0):
        again = decide(POLICY, _through_the_table(state), rate, at(seconds))
        state = decide(POLICY, state, rate, at(seconds))
        assert _through_the_table(again) == _through_the_table(state)


def test_noise_around_the_threshold_changes_nothing_and_writes_nothing() -> None:
    """Within ±10% of what 3 replicas are sized for (6 req/s): the recommendation stays 3, so the
    state is the very object read (the shell writes nothing)."""
    state = at_target(3, 6.0)
    for step, rate in enumerate([6.0, 5.5, 6.5, 6.6, 5.4, 6.0, 6.59, 5.41] * 5):
        after = decide(POLICY, state, rate, at(60 * step))
        assert after is state
    # Without the tolerance 6.5 would have recommended ceil(3.25) = 4 and 5.5 ceil(2.75) = 3.
    assert recommend(POLICY, 6.5, 3) == 3
    assert recommend(POLICY, 6.7, 3) == 4
    assert recommend(POLICY, 5.3, 3) == 3  # ceil(2.65), outside the tolerance
    assert recommend(POLICY, 3.9, 3) == 2


def test_a_steady_rate_writes_nothing_after_the_change_settles() -> None:
    state: AutoscalerState | None = None
    writes = []
    for seconds, rate in STEP_UP + every(900, 3000, 7.9):
        after = decide(POLICY, state, rate, at(seconds))
        if after is not state:
            writes.append(seconds)
        state = after
    # The first decision, the new recommendation at 300 s, the scale-up at 600 s; nothing since.
    assert writes == [0, 300, 600]


def test_no_reading_changes_nothing() -> None:
    state = at_target(3, 6.0)
    assert decide(POLICY, state, None, at(0)) is state
    assert decide(POLICY, None, None, at(0)) is None


def test_a_target_outside_new_bounds_is_brought_inside_them() -> None:
    """An update narrowed the policy: the target follows at once (and is written)."""
    narrower = replace(POLICY, max_replicas=3)
    state = at_target(5, 10.0)
    assert current_target(narrower, state) == 3
    after = decide(narrower, state, 10.0, at(0))
    assert after is not None and after.target == 3


def test_scale_to_zero_waits_for_its_own_delay() -> None:
    policy = replace(POLICY, min_replicas=0, downscale_to_zero_delay_seconds=3600)
    targets = run(policy, every(0, 4200, 0.0), at_target(2, 4.0))
    # Down to 1 after the downscale delay (1200 s), to 0 only after the zero delay (3600 s).
    assert targets == [2] * 20 + [1] * 40 + [0] * 10
    shorter = replace(policy, downscale_to_zero_delay_seconds=600)
    assert run(shorter, every(0, 900, 0.0), at_target(2, 4.0)) == [2] * 10 + [0] * 5


def test_history_keeps_only_what_a_window_reaches() -> None:
    state: AutoscalerState | None = None
    for seconds, rate in [*every(0, 20000, 0.0), (20000, 9.0), (20060, 1.0), (20120, 9.0)]:
        state = decide(POLICY, state, rate, at(seconds))
    assert state is not None
    assert [(entry.replicas, entry.rate) for entry in state.history] == [(1, 0.0), (5, 9.0), (1, 1.0), (5, 9.0)]
    state = decide(POLICY, state, 1.0, at(20_120 + 1300))
    assert state is not None
    # The entries that ended more than the longest window (1200 s) ago are gone.
    assert [(entry.replicas, entry.rate) for entry in state.history] == [(5, 9.0), (1, 1.0)]


def test_pending_says_what_changes_when_and_why() -> None:
    state: AutoscalerState | None = None
    for seconds, rate in [*every(0, 300, 1.0), (300, 7.9), (360, 7.9), (420, 7.9)]:
        state = decide(replace(POLICY, max_replicas=3), state, rate, at(seconds))
    policy = replace(POLICY, max_replicas=3)
    change = pending(policy, state, at(480))
    assert change is not None
    assert (change.direction, change.replicas, change.at) == ("up", 3, at(600))
    assert change.describe(at(480)) == f"scaling up to 3 in 2m: 7.9 req/s > 2 {TIMES} 1"
    assert change.describe(at(420)) == f"scaling up to 3 in 3m: 7.9 req/s > 2 {TIMES} 1"
    assert change.describe(at(540)) == f"scaling up to 3 in 60s: 7.9 req/s > 2 {TIMES} 1"
    down = pending(POLICY, decide(POLICY, at_target(4, 8.0), 0.0, at(0)), at(60))
    assert down is not None
    assert (down.direction, down.replicas, down.at) == ("down", 1, at(1200))
    assert down.describe(at(60)) == f"scaling down to 1 in 19m: 0 req/s < 2 {TIMES} 4"
    assert pending(POLICY, at_target(3, 6.0), at(0)) is None


def test_pending_at_zero_is_at_once() -> None:
    policy = replace(POLICY, min_replicas=0)
    state = AutoscalerState(target=0, history=(Recommendation(to_iso(at(0)), 1, 0.5),))
    change = pending(policy, state, at(10))
    assert change is not None and change.describe(at(10)) == f"scaling up to 1 at the next run: 0.5 req/s > 2 {TIMES} 0"


def test_pending_at_zero_is_the_rates_target_at_once() -> None:
    policy = replace(POLICY, min_replicas=0)
    state = AutoscalerState(target=0, history=(Recommendation(to_iso(at(0)), 4, 7.9),))
    change = pending(policy, state, at(10))
    assert change is not None and change.describe(at(10)) == f"scaling up to 4 at the next run: 7.9 req/s > 2 {TIMES} 0"


# SkyPilot's InstanceAwareRequestRateAutoscaler: A100 replicas serve 5 req/s each, L4 ones 2.
AWARE = ScalingPolicy(
    min_replicas=1, max_replicas=6, target_qps_per_replica=5.0, per_accelerator=(("A100", 5.0), ("L4", 2.0))
)


@pytest.mark.parametrize(
    ("rate", "capacity", "expected"),
    [
        # No replica yet: the rate at the largest target, ceil(12 / 5).
        (12.0, Capacity(), 3),
        # Two L4 replicas serve 4: 8 more at 5 each is 2 more.
        (12.0, Capacity(live=(2.0, 2.0), ready=(2.0, 2.0)), 4),
        # Exactly what the live replicas serve: as many as now.
        (7.0, Capacity(live=(5.0, 2.0), ready=(5.0, 2.0)), 2),
        # Below what they serve: the fewest READY, largest first, that serve more than the rate.
        (4.0, Capacity(live=(5.0, 2.0, 2.0), ready=(2.0, 5.0, 2.0)), 1),
        (6.0, Capacity(live=(5.0, 2.0, 2.0), ready=(2.0, 5.0, 2.0)), 2),
        # None READY yet: one at the largest target at a time.
        (1.0, Capacity(live=(5.0, 2.0), ready=()), 1),
        # Clipped to the policy's bounds.
        (100.0, Capacity(), 6),
        (0.0, Capacity(live=(5.0,), ready=(5.0,)), 1),
    ],
)
def test_a_target_per_accelerator_recommends_as_skypilots_instance_aware_autoscaler(
    rate: float, capacity: Capacity, expected: int
) -> None:
    assert recommend(AWARE, rate, 3, capacity) == expected


def test_an_accelerator_without_a_target_counts_at_the_smallest() -> None:
    assert (replica_target(AWARE, "A100"), replica_target(AWARE, "L4"), replica_target(AWARE, None)) == (5.0, 2.0, 2.0)
    assert replica_target(POLICY, "A100") == 2.0


def test_a_decision_with_targets_per_accelerator_reads_the_replicas_capacity() -> None:
    live = Capacity(live=(2.0, 2.0), ready=(2.0, 2.0))
    state = decide(AWARE, at_target(2, 4.0), 12.0, at(0), live)
    assert state is not None and state.history[-1].replicas == 4
    assert "12 req/s > what 2 replica(s) serve (A100: 5, L4: 2 each)" in str(
        pending(AWARE, state, at(0)).describe(at(0))  # type: ignore[union-attr]
    )


def _spec(policy: dict[str, object]) -> ServiceSpec:
    return ServiceSpec.model_validate(
        {"service": {"readiness_probe": "/", "replica_policy": policy}, "run": "python -m http.server"}
    )


def test_policy_of_a_spec() -> None:
    assert policy_of(_spec({"min_replicas": 2})) is None
    assert policy_of(_spec({"min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": 2.5})) == ScalingPolicy(
        min_replicas=1, max_replicas=4, target_qps_per_replica=2.5
    )
    got = policy_of(
        _spec(
            {
                "min_replicas": 0,
                "max_replicas": 2,
                "target_qps_per_replica": 1,
                "upscale_delay_seconds": 5,
                "downscale_delay_seconds": 7,
                "downscale_to_zero_delay_seconds": 9,
            }
        )
    )
    assert got == ScalingPolicy(0, 2, 1.0, 5, 7, 9)


def test_rates_are_kept_to_thousandths_so_they_read_back_equal() -> None:
    state = decide(POLICY, None, 7.123456, at(0))
    assert state is not None and state.history[-1].rate == 7.123
    assert _through_the_table(state) == state


def test_the_example_autoscales() -> None:

    import yaml

    example = REPO_ROOT / "examples" / "autoscale" / "service.yaml"
    policy = policy_of(ServiceSpec.model_validate(yaml.safe_load(example.read_text())))
    assert policy == ScalingPolicy(1, 4, 2.0, 60, 300)
