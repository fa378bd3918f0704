"""Table tests of plan/failures.py: whose fault an ended instance is, from its state reason code alone,
as the plan records it.

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

import pytest

from fleetkeeper.model import FailureCause, ServiceStatus
from fleetkeeper.reconciler.driver import InstanceState
from fleetkeeper.reconciler.plan import RecordReplica, plan
from tests.support.builders import NOW, OK, C, S, instance, launches, mark_ready, moved, replica, state, status

# Why an instance ended, as EC2 (or a driver) reports it, and what the planner makes of it.
_ENDINGS = [
    # Only the state reason makes a spot reclaim; `spot` alone does not.
    ("Server.SpotInstanceTermination", True, C.SPOT_RECLAIM, "spot instance reclaimed by AWS"),
    ("Client.UserInitiatedShutdown", True, C.VERSION, "terminated outside fleetkeeper"),
    # AWS-side ends are the environment's.
    ("Server.InternalError", False, C.ENVIRONMENT, "terminated outside fleetkeeper"),
    ("Server.ScheduledStop", False, C.ENVIRONMENT, "terminated outside fleetkeeper"),
    # Shut down from inside the instance, or through the API by someone: the version's.
    ("Client.InstanceInitiatedShutdown", False, C.VERSION, "terminated outside fleetkeeper"),
    ("Client.UserInitiatedShutdown", False, C.VERSION, "terminated outside fleetkeeper"),
    # Ended during launch for the account's reasons (a customer managed EBS key the role may not
    # use: pending -> terminated; the volume quota): the environment's, with what to fix.
    ("Client.InternalError", False, C.ENVIRONMENT, "the reconciler's role needs that key: the stack's EbsKmsKeyArn"),
    ("Client.VolumeLimitExceeded", False, C.ENVIRONMENT, "EBS volume or storage quota"),
]


@pytest.mark.parametrize(("code", "spot", "cause", "told"), _ENDINGS)
def test_an_instance_that_ended_is_preempted_with_its_state_reason_code_and_cause(
    code: str, spot: bool, cause: FailureCause, told: str
) -> None:
    gone = instance(0, InstanceState.TERMINATED, spot=spot, state_reason_code=code, state_reason=f"{code}: why")
    ready = replica(0)
    actions = plan(state([ready, replica(1)]), [gone, instance(1)], {1: OK}, NOW)
    # The message: what EC2 said, then (for people) what it means, which `told` is part of.
    said = f"instance i-0 is terminated ({code}: why): "
    message = next(
        (a.after.status_message or "" for a in actions if isinstance(a, RecordReplica) and a.after.replica_id == 0),
        "",
    )
    assert message.startswith(said) and told in message, message
    assert actions == [
        moved(ready, status=S.PREEMPTED, status_message=message, failure_code=code, cause=cause),
        mark_ready(1),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 PREEMPTED: {message}; replica 2 PENDING"),
    ]


def test_a_replica_whose_app_exited_by_itself_is_failed_not_preempted() -> None:
    # The process driver's code: the replica's process ended on its own (the app crashed or its run
    # returned). A FAILED replica of the version's fault (counted by the breaker), never PREEMPTED.
    code = "Fleetkeeper.ProcessExited"
    reason = f"{code}: the replica process exited with code 1"
    gone = instance(0, InstanceState.TERMINATED, state_reason_code=code, state_reason=reason)
    ready = replica(0)
    actions = plan(state([ready, replica(1)]), [gone, instance(1)], {1: OK}, NOW)
    message = f"the replica's app ended by itself ({reason})"
    assert actions == [
        moved(ready, status=S.FAILED, status_message=message, failure_code=code, cause=C.VERSION),
        mark_ready(1),
        *launches(1, 2),
        status(ServiceStatus.READY, f"1/2 ready; replica 0 FAILED: {message}; replica 2 PENDING"),
    ]
