"""A claim's market per replica id: the ids it lists in `spot` are bought as spot instances, the
others on demand (the shell passes `Claim.market` to the store when it records the claim; the
planner's table tests compare whole claims, so nothing else there asks it)."""

from __future__ import annotations

from fleetkeeper.model import Market
from fleetkeeper.reconciler.plan import Claim


def test_a_claim_buys_its_spot_ids_as_spot_and_the_others_on_demand() -> None:
    claim = Claim(version=3, replica_ids=(4, 5, 6), spot=(5,))
    assert [claim.market(replica_id) for replica_id in claim.replica_ids] == [
        Market.ON_DEMAND,
        Market.SPOT,
        Market.ON_DEMAND,
    ]


def test_a_claim_without_spot_ids_is_all_on_demand() -> None:
    assert {Claim(version=1, replica_ids=(1, 2)).market(r) for r in (1, 2)} == {Market.ON_DEMAND}
