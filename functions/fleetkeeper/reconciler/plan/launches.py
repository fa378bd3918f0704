"""The record the shell writes after a launch: `launched` (PROVISIONING) or `refused` (FAILED_PROVISION,
retried after a backoff)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fleetkeeper.model import (
    FailureCause,
    ReplicaRecord,
    ReplicaStatus,
    to_iso,
)
from fleetkeeper.reconciler.plan.failures import refusal_cause

if TYPE_CHECKING:
    from datetime import datetime

    from fleetkeeper.reconciler.plan.policy import Policy


def refused(
    record: ReplicaRecord, refusal_code: str, message: str, now: datetime, policy: Policy, *, tried: int = 1
) -> ReplicaRecord:
    """The record of a replica whose launch AWS refused in every pool this run tried (`tried` attempts,
    each its own pool and ClientToken; the shell writes it on LaunchRefused).

    FAILED_PROVISION with the last refusal's code and whose fault it is, retried in place (from the next
    pool) once a backoff that doubles with each refused run has passed (`plan` launches it again then).
    """
    runs = record.refused_runs + 1
    cause = refusal_cause(refusal_code)
    return replace(
        record,
        status=ReplicaStatus.FAILED_PROVISION,
        status_message=f"{refusal_code}: {message}",
        failure_code=refusal_code,
        cause=cause,
        launch_attempts=record.launch_attempts + tried,
        refused_runs=runs,
        version_refusals=record.version_refusals + (1 if cause is FailureCause.VERSION else 0),
        next_attempt_at=to_iso(now + policy.backoff(runs)),
        updated_at=to_iso(now),
    )


def launched(
    record: ReplicaRecord, instance_id: str, now: datetime, *, instance_type: str | None = None, tried: int = 0
) -> ReplicaRecord:
    """The record of a replica whose instance was just launched (as `instance_type`, after `tried`
    refused attempts in this run), or found by tag: PROVISIONING."""
    stamp = to_iso(now)
    return replace(
        record,
        instance_id=instance_id,
        instance_type=instance_type or record.instance_type,
        status=ReplicaStatus.PROVISIONING,
        status_message="",
        failure_code=None,
        cause=None,
        launch_attempts=record.launch_attempts + tried,
        launched_at=stamp,
        next_attempt_at=None,
        updated_at=stamp,
    )
