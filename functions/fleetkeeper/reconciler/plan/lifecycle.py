"""Which replicas are on their way out (`LEAVING`: never probed, never counted toward the target,
replaced) and which instance states are gone (`GONE_STATES`)."""

from __future__ import annotations

from fleetkeeper.model import (
    ReplicaStatus,
)
from fleetkeeper.reconciler.driver import InstanceState

GONE_STATES = frozenset({InstanceState.SHUTTING_DOWN, InstanceState.TERMINATED})
# Replicas on their way out: never probed, never counted toward the target, replaced.
LEAVING = frozenset(
    {
        ReplicaStatus.SHUTTING_DOWN,
        ReplicaStatus.FAILED_INITIAL_DELAY,
        ReplicaStatus.FAILED_PROBING,
        ReplicaStatus.PREEMPTED,
        ReplicaStatus.FAILED,
    }
)
