"""EC2's warnings about a spot instance, as EventBridge delivers them: parsed, pure.

Two detail types (source `aws.ec2`), each naming one instance in `detail.instance-id`:

- "EC2 Spot Instance Interruption Warning": AWS takes the instance back two minutes later;
- "EC2 Instance Rebalance Recommendation": the instance is at elevated risk of interruption.

The stack's InterruptionRule (template.yaml) puts each on the kick queue, trimmed by an input
transformer to the fields read here, so the worker records the warning on the replica and reconciles
its service at once (fleetkeeper.reconciler.instance_events.interrupt). A whole EventBridge event,
as a direct invoke or `fleetkeeper local`'s simulation sends it, reads the same.
"""

from __future__ import annotations

import re
from typing import Any

from fleetkeeper.model import Interruption, InterruptionKind

SOURCE = "aws.ec2"
DETAIL_TYPES = {
    "EC2 Spot Instance Interruption Warning": InterruptionKind.SPOT_INTERRUPTION,
    "EC2 Instance Rebalance Recommendation": InterruptionKind.REBALANCE,
}
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$|^local-[0-9]+-pid[0-9]+$")
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def is_warning(event: Any) -> bool:
    """Whether `event` is one of EC2's two warnings (well-formed or not)."""
    return isinstance(event, dict) and event.get("source") == SOURCE and event.get("detail-type") in DETAIL_TYPES


def interruption_of(event: Any) -> Interruption | None:
    """The warning an event carries; None when it is not one, or names no instance."""
    if not is_warning(event):
        return None
    detail = event.get("detail")
    instance_id = detail.get("instance-id") if isinstance(detail, dict) else None
    at = event.get("time")
    if not isinstance(instance_id, str) or not _INSTANCE_ID.fullmatch(instance_id):
        return None
    if not isinstance(at, str) or not _TIME.fullmatch(at):
        return None
    return Interruption(kind=DETAIL_TYPES[str(event["detail-type"])], instance_id=instance_id, at=at)


def warning_event(interruption: Interruption) -> dict[str, Any]:
    """The event EventBridge would deliver for `interruption` (trimmed as the rule's transformer
    trims it): what `fleetkeeper local` sends to simulate one."""
    detail_type = next(name for name, kind in DETAIL_TYPES.items() if kind is interruption.kind)
    detail: dict[str, str] = {"instance-id": interruption.instance_id}
    if interruption.kind is InterruptionKind.SPOT_INTERRUPTION:
        detail["instance-action"] = "terminate"
    return {"source": SOURCE, "detail-type": detail_type, "time": interruption.at, "detail": detail}
