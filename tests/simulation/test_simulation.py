"""The seeded simulation of the whole control plane (tests/simulation/sim.py;
docs/architecture/simulation.md).

`make test` runs the fixed SEEDS; `SIM_SEED=n` replays one seed (and only it); `make soak SEEDS=N`
runs N random seeds (printed) through `SIM_SOAK`. A failing seed prints itself and its steps. A
seed that ends on a defect another branch is fixing (and on nothing else) is an xfail naming it.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.simulation.sim import KNOWN_DEFECTS, Simulation, SimulationFailure

# 200 steps per fixed seed: the four fit in about a minute of `make test` on 2 cores. `make soak`
# runs far longer seeds (SIM_STEPS, 2000 by default there).
STEPS = int(os.environ.get("SIM_STEPS", "200"))
SEEDS = [2, 6, 11, 15]
# Seeds run with a neighbouring stack of the template in the same account and Region (invariant 11):
# the simulated stack never touches its instances, nor it the simulated stack's. SIM_STACKS=2 runs
# SIM_SEED (or the soak's seeds) that way.
TWO_STACK_SEEDS = [3, 8]


def _seeds() -> list[int]:
    if os.environ.get("SIM_SEED"):
        return [int(os.environ["SIM_SEED"])]
    soak = int(os.environ.get("SIM_SOAK", "0"))
    if soak:
        # Every xdist worker must collect the same seeds: they come from one base, chosen by make.
        picker = random.Random(int(os.environ.get("SIM_SOAK_BASE", "0")))
        return [picker.randrange(2**31) for _ in range(soak)]
    return SEEDS


def _two_stack_seeds() -> list[int]:
    if os.environ.get("SIM_SEED") or os.environ.get("SIM_SOAK"):
        return _seeds() if os.environ.get("SIM_STACKS") == "2" else []
    return TWO_STACK_SEEDS


@pytest.mark.parametrize("seed", _seeds())
def test_simulation_keeps_every_invariant(seed: int) -> None:
    if os.environ.get("SIM_STACKS") == "2":
        pytest.skip("SIM_STACKS=2: the seed runs in test_simulation_beside_another_stack")
    _run(seed, stacks=1)


@pytest.mark.parametrize("seed", _two_stack_seeds())
def test_simulation_beside_another_stack_keeps_every_invariant(seed: int) -> None:
    _run(seed, stacks=2)


def _run(seed: int, *, stacks: int) -> None:
    print(f"simulation seed {seed} ({stacks} stack(s))")
    try:
        Simulation(seed, stacks=stacks).run(STEPS)
    except SimulationFailure as failure:
        # Only known defects (being fixed on other branches) make a seed an xfail, and only when
        # nothing else was violated: any other violation fails the test, known seed or not.
        if failure.known is not None:
            pytest.xfail(f"seed {seed}: known defect {failure.known}: {KNOWN_DEFECTS[failure.known]}\n{failure}")
        raise
