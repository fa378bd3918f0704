"""A seed's replay is the same run, call for call: every clock the code and botocore read is the
simulation's (the strict layer's VirtualClock, botocore's retry pauses and its adaptive rate
limiter's clock included), so a failing seed found by `make soak` reproduces exactly."""

from __future__ import annotations

import pytest

from tests.simulation.sim import Simulation

# Enough steps for creates, updates, throttles, crashes and interleaved runs (about 300 calls).
STEPS = 80


def _calls(seed: int) -> list[tuple[str, str, str]]:
    simulation = Simulation(seed)
    simulation.strict.record_calls = True
    simulation.run(STEPS)
    return simulation.strict.call_log


@pytest.mark.parametrize("seed", [6, 15])
def test_a_seed_replays_call_for_call(seed: int) -> None:
    first, second = _calls(seed), _calls(seed)
    assert len(first) > 200  # a run that made calls: reads, launches, throttles and retries
    diverged = next((n for n, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), None)
    assert diverged is None, f"seed {seed} diverged at call {diverged}: {first[diverged]} != {second[diverged]}"
    assert len(first) == len(second)


def test_only_the_scheduled_run_counts_as_the_sweep() -> None:
    """`deleted-leaves-nothing` holds once a scheduled run (the one that sweeps orphans) has run past
    the grace period. A state change's or an interruption's run carries no service name either, and
    was counted as one: soak seed 2128164119 failed at step 1344 on a state change's run, with no
    sweep since its service's removal plus the grace (docs/architecture/simulation.md)."""
    from fleetkeeper.reconciler.interruptions import Interruption, InterruptionKind
    from fleetkeeper.reconciler.state_changes import StateChange

    simulation = Simulation(6)
    with simulation._world():
        stranger = "i-0123456789abcdef0"
        change = StateChange(stranger, "shutting-down")
        assert simulation._one_run(None, change=change)[0] == "done"
        warning = Interruption(InterruptionKind.SPOT_INTERRUPTION, stranger, "2026-01-01T00:00:00+00:00")
        assert simulation._one_run(None, interruption=warning)[0] == "done"
        assert simulation.full_runs_at == []
        assert simulation._one_run(None)[0] == "done"
        assert simulation.full_runs_at == [simulation.strict.clock.time()]
