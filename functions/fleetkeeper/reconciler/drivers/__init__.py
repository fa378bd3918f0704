"""Replica drivers: `ec2` (production) and `process` (embedded mode), chosen by FLEETKEEPER_DRIVER."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetkeeper.reconciler.driver import ReplicaDriver

DRIVER_ENV = "FLEETKEEPER_DRIVER"


def make_driver() -> ReplicaDriver:
    """A driver for one reconciler run (read at call time, never at import)."""
    kind = os.environ.get(DRIVER_ENV, "ec2")
    if kind == "ec2":
        from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver

        return Ec2Driver.from_env()
    if kind == "process":
        # Embedded mode only: local processes that really serve HTTP. Imported here, not at the top:
        # a Lambda run never needs it.
        from fleetkeeper.local.process_driver import ProcessDriver

        return ProcessDriver.shared()
    raise ValueError(f"{DRIVER_ENV}={kind!r}: expected 'ec2' or 'process'")
