"""The reclaim wave of issue 14, on fixed seeds (tests/simulation/reclaim.py says what one is):
READY capacity never drops below target - (replicas reclaimed before a replacement was READY).
`bench/reclaim_wave.py` runs many seeds and prints the figures docs/PERFORMANCE.md quotes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.simulation.reclaim import run_wave

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import World

# Seed 7: no fallback, a replacement refused until after its replica was reclaimed (a dip of 1 = L);
# seed 13: dynamic fallback, spot refused 16 times (no dip). `bench/reclaim_wave.py` prints both.
# seed -> (lowest READY capacity, L): pinned, so a wave that measured nothing would fail.
EXPECTED = {7: (5, 1), 13: (6, 0)}


@pytest.mark.parametrize("seed", sorted(EXPECTED))
def test_a_reclaim_wave_keeps_ready_capacity_within_its_bound(seed: int, world: World, strict_aws: StrictAws) -> None:
    result = run_wave(seed, world, strict_aws)
    assert result.holds, (result.min_ready, result.bound, result.timeline)
    assert (result.min_ready, result.lost) == EXPECTED[seed], result.timeline
    assert result.recovered_after is not None, result.timeline  # back to target once the wave is over
