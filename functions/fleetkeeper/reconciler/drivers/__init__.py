"""Replica drivers: `ec2` (production) and `process` (embedded mode), chosen by Settings.driver.

Only `ec2` lives here. The embedded mode registers `process` when it configures itself
(`fleetkeeper.local.server.configure_environment`), so the code deployed to Lambda never imports
the embedded mode: an import-linter contract in pyproject.toml holds it to that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.settings import DRIVER_ENV

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetkeeper.reconciler.driver import ReplicaDriver
    from fleetkeeper.settings import Settings

EMBEDDED_DRIVER = "process"

_registered: dict[str, Callable[[], ReplicaDriver]] = {}


def register_driver(kind: str, factory: Callable[[], ReplicaDriver]) -> None:
    """Make `FLEETKEEPER_DRIVER=kind` mean `factory()` in this process (the embedded mode's `process`)."""
    _registered[kind] = factory


def make_driver(settings: Settings) -> ReplicaDriver:
    """A driver for one reconciler run."""
    if settings.driver == "ec2":
        from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver

        return Ec2Driver.from_settings(settings.ec2)
    factory = _registered.get(settings.driver)
    if factory is None:
        raise ValueError(
            f"{DRIVER_ENV}={settings.driver!r} is the embedded mode's driver: only `fleetkeeper local` provides it"
        )
    return factory()
