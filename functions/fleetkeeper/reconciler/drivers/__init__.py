"""Replica drivers: `ec2` (production) and `process` (embedded mode), chosen by Settings.driver."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetkeeper.reconciler.driver import ReplicaDriver
    from fleetkeeper.settings import Settings


def make_driver(settings: Settings) -> ReplicaDriver:
    """A driver for one reconciler run."""
    if settings.driver == "process":
        # Embedded mode only: local processes that really serve HTTP. Imported here, not at the top:
        # a Lambda run never needs it.
        from fleetkeeper.local.process_driver import ProcessDriver

        return ProcessDriver.shared()
    from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver

    return Ec2Driver.from_settings(settings.ec2)
