"""The custom resource `UninstallCleanup`: on the stack's deletion, remove what its code made.

Create and Update do nothing but answer SUCCESS, with one physical id for the resource's whole life
(a new id would make CloudFormation Delete the old one, and so clean a live stack). Delete cleans
(fleetkeeper.uninstall.cleanup) only while the stack itself is going: DescribeStacks on the event's
StackId says DELETE_IN_PROGRESS (the stack is deleted) or ROLLBACK_IN_PROGRESS (a first creation is
undone: the stack goes too). CloudFormation also deletes a custom resource when an update replaces
or removes it, or when a failed update that added it rolls back; the stack stays then, so nothing is
touched and SUCCESS is answered.

The answer is one PUT to the event's pre-signed S3 URL (AWS CloudFormation, *Custom resource
response objects*,
https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/crpg-ref-responses.html),
always given, within the invocation's time: the cleanup stops starting AWS calls `RESERVE_SECONDS`
before Lambda's timeout, and what it could not finish is answered FAILED with what is left (the
stack is then DELETE_FAILED, and deleting it again continues: every step is idempotent). Only an
https URL of an S3 endpoint is answered (`response_url_allowed`): the URL comes in the event, and
this function's answer must go nowhere else.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from fleetkeeper import aws
from fleetkeeper.deploy import cfn_response
from fleetkeeper.settings import STACK_ID_ENV, stack_id_of
from fleetkeeper.uninstall.cleanup import StackScope, Uninstall

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

logger = logging.getLogger(__name__)

PHYSICAL_ID = "fleetkeeper-uninstall-cleanup"
# Stack statuses in which a Delete of this resource means the stack goes (AWS CloudFormation, *Stack
# status codes*, https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/view-stack-events.html).
CLEANS_DURING = frozenset({"DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS"})
# No AWS call of the cleanup starts with less than this left of the invocation: the last one (with
# botocore's retries) and the answer to CloudFormation fit in it.
RESERVE_SECONDS = 30.0


def stack_status(stack_id: str) -> str:
    """The stack's status now (DescribeStacks by its unique id: a deleted stack is still described)."""
    stacks = aws.cloudformation().describe_stacks(StackName=stack_id).get("Stacks", [])
    return str(stacks[0].get("StackStatus", "")) if stacks else ""


def scope_of(properties: Mapping[str, Any]) -> StackScope:
    """The custom resource's properties (all strings, as CloudFormation passes them), checked."""

    def text(name: str, *, required: bool = False) -> str:
        value = properties.get(name, "")
        if not isinstance(value, str) or (required and not value):
            raise ValueError(f"property {name} must be a non-empty string, got {value!r}")
        return value

    listeners = properties.get("ListenerArns") or []
    if isinstance(listeners, str):
        listeners = listeners.split(",")
    return StackScope(
        stack_id=stack_id_of({STACK_ID_ENV: text("StackKey", required=True)}),
        table_name=text("TableName", required=True),
        workdir_bucket=text("WorkdirBucket", required=True),
        replica_policy_arn=text("ReplicaOwnerPolicyArn", required=True),
        load_balancer_arn=text("LoadBalancerArn"),
        listener_arns=tuple(str(arn) for arn in listeners if str(arn)),
        security_group_id=text("LoadBalancerSecurityGroupId"),
        hosted_zone_id=text("HostedZoneId"),
        domain_name=text("DomainName"),
    )


def lambda_handler(event: dict[str, Any], context: Any) -> None:
    remaining: Callable[[], float] = (
        (lambda: context.get_remaining_time_in_millis() / 1000.0) if context is not None else (lambda: 900.0)
    )
    answer(event, *decide(event, remaining))


def decide(
    event: Mapping[str, Any],
    remaining: Callable[[], float],
    *,
    status_of: Callable[[str], str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, str]:
    """(succeeded, reason) for CloudFormation's request; never raises."""
    try:
        if event.get("RequestType") != "Delete":
            return True, "nothing to do until the stack is deleted"
        status = (status_of or stack_status)(str(event.get("StackId", "")))
        if status not in CLEANS_DURING:
            return True, f"the stack is {status or 'not found'}, not being deleted: nothing removed"
        scope = scope_of(event.get("ResourceProperties") or {})
        report = Uninstall(scope, remaining=remaining, sleep=sleep, reserve_seconds=RESERVE_SECONDS).run()
        logger.info("uninstall cleanup: %s", report.summary())
        return report.complete, report.summary()
    except Exception as exc:  # answered, never raised: a custom resource that never answers holds the stack
        logger.exception("uninstall cleanup failed")
        return False, f"the cleanup could not run: {type(exc).__name__}: {exc}. Delete the stack again to retry"


def answer(event: Mapping[str, Any], succeeded: bool, reason: str) -> None:
    """PUT the response object to the event's pre-signed URL (only an S3 one: fleetkeeper.deploy.cfn_response)."""
    cfn_response.send(event, succeeded=succeeded, reason=reason, physical_id=PHYSICAL_ID, timeout=10)
