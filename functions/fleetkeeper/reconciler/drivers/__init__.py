"""Replica drivers: `ec2` (production) and `process` (embedded mode), chosen by FLEETKEEPER_DRIVER.

Only `ec2` lives here. The embedded mode registers `process` when it configures itself
(`fleetkeeper.local.server.configure_environment`), so the code deployed to Lambda never imports
the embedded mode: an import-linter contract in pyproject.toml holds it to that.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetkeeper.reconciler.driver import ReplicaDriver

DRIVER_ENV = "FLEETKEEPER_DRIVER"
EMBEDDED_DRIVER = "process"

_registered: dict[str, Callable[[], ReplicaDriver]] = {}


def register_driver(kind: str, factory: Callable[[], ReplicaDriver]) -> None:
    """Make `FLEETKEEPER_DRIVER=kind` mean `factory()` in this process (the embedded mode's `process`)."""
    _registered[kind] = factory


def make_driver() -> ReplicaDriver:
    """A driver for one reconciler run (read at call time, never at import)."""
    kind = os.environ.get(DRIVER_ENV, "ec2")
    if kind == "ec2":
        from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver

        return Ec2Driver.from_env()
    factory = _registered.get(kind)
    if factory is not None:
        return factory()
    if kind == EMBEDDED_DRIVER:
        raise ValueError(f"{DRIVER_ENV}={kind!r} is the embedded mode's driver: only `fleetkeeper local` provides it")
    raise ValueError(f"{DRIVER_ENV}={kind!r}: expected 'ec2' or 'process'")
