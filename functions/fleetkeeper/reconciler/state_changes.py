"""EC2's instance state-change notifications, as EventBridge delivers them: parsed, pure.

Detail type "EC2 Instance State-change Notification" (source `aws.ec2`) names one instance in
`detail.instance-id` and its new state in `detail.state`. The stack's InstanceStateRule
(template.yaml) sends the states that end a replica's service (stopping, stopped, shutting-down,
terminated) to the kick queue, trimmed by an input transformer to these fields, so the worker
reconciles the service whose replica it was at once instead of at the next scheduled run
(fleetkeeper.reconciler.instance_events.instance_changed). The event carries no tags: the rule
matches every instance of the account and Region, and the worker keeps only the stack's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SOURCE = "aws.ec2"
DETAIL_TYPE = "EC2 Instance State-change Notification"
# The states the rule lets through: the instance stops serving (the others, pending and running,
# are the reconciler's own launches, which it follows up by itself).
STATES = ("stopping", "stopped", "shutting-down", "terminated")
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")


@dataclass(frozen=True)
class StateChange:
    instance_id: str
    state: str


def is_state_change(event: Any) -> bool:
    """Whether `event` is one of EC2's state-change notifications (well-formed or not)."""
    return isinstance(event, dict) and event.get("source") == SOURCE and event.get("detail-type") == DETAIL_TYPE


def state_change_of(event: Any) -> StateChange | None:
    """The change an event carries; None when it is not one, names no instance, or another state."""
    if not is_state_change(event):
        return None
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return None
    instance_id, state = detail.get("instance-id"), detail.get("state")
    if not isinstance(instance_id, str) or not _INSTANCE_ID.match(instance_id) or state not in STATES:
        return None
    return StateChange(instance_id=instance_id, state=str(state))


def state_change_event(change: StateChange) -> dict[str, Any]:
    """The event EventBridge would deliver for `change`, trimmed as the rule's transformer trims it."""
    return {
        "source": SOURCE,
        "detail-type": DETAIL_TYPE,
        "detail": {"instance-id": change.instance_id, "state": change.state},
    }
