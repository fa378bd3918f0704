"""How the target's wanted replicas split between spot and on demand, with the on-demand fallback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.model import (
    Market,
)

if TYPE_CHECKING:
    from fleetkeeper.spec.service import MarketPolicy


def wanted_by_market(
    markets: MarketPolicy | None, wanted: int, spot_ready: int, overprovision: int = 0
) -> dict[Market, int]:
    """How many of the target's `wanted` replicas are bought each way, SkyPilot's way: without spot,
    all on demand; with it, `base_ondemand_fallback_replicas` on demand and the rest spot, plus (with
    `dynamic_ondemand_fallback`) one on-demand replica for each wanted spot replica not READY; never
    more on demand than the target without its `overprovision` (FallbackRequestRateAutoscaler: no
    on-demand fallback for overprovisioned replicas). Every Market is a key, spot first: the order
    the planner scales them down in (tests/test_choices.py)."""
    if markets is None or not markets.spot:
        return {Market.SPOT: 0, Market.ON_DEMAND: wanted}
    target = max(wanted - overprovision, 0)
    base = min(markets.base_ondemand, target)
    spot = wanted - base
    extra = max(spot - spot_ready, 0) if markets.dynamic_fallback else 0
    return {Market.SPOT: spot, Market.ON_DEMAND: min(base + extra, target)}
