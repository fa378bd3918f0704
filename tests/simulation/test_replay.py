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
