"""Load balancers: `alb` (production) and `local` (embedded mode), chosen by Settings.balancer.

Only `alb` lives here. The embedded mode registers `local` when it configures itself
(`fleetkeeper.local.server.configure_environment`), as it registers the `process` driver, so the
code deployed to Lambda never imports the embedded mode (nor aiohttp, which it runs on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.settings import BALANCER_ENV

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetkeeper.reconciler.balancer import LoadBalancer
    from fleetkeeper.settings import Settings

EMBEDDED_BALANCER = "local"

_registered: dict[str, Callable[[], LoadBalancer]] = {}


def register_balancer(kind: str, factory: Callable[[], LoadBalancer]) -> None:
    """Make `FLEETKEEPER_LOAD_BALANCER=kind` mean `factory()` in this process (embedded mode's `local`)."""
    _registered[kind] = factory


def make_balancer(settings: Settings) -> LoadBalancer | None:
    """The load balancer of one reconciler run; None when the stack has none."""
    if settings.balancer == "none":
        return None
    if settings.balancer == "alb":
        from fleetkeeper.reconciler.balancers.alb import AlbBalancer

        settings.alb.check()
        return AlbBalancer(settings.alb)
    factory = _registered.get(settings.balancer)
    if factory is None:
        raise ValueError(
            f"{BALANCER_ENV}={settings.balancer!r} is the embedded mode's load balancer: only `fleetkeeper local` "
            "provides it"
        )
    return factory()
