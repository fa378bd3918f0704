"""Who may put a message on the kick queue: the translated KickQueuePolicy, evaluated for each kind
of sender (tests/support/iam_evaluator.py, IAM's documented evaluation logic).

A message on the kick queue drains a replica (an interruption warning) or runs the reconciler: a
principal of the account allowed sqs:SendMessage on "*" must not be able to send one. Only the api's,
the reconciler's and the wake target's roles (tests/template/test_wake.py), and the stack's InterruptionRule
(through EventBridge), may.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cfn import ACCOUNT, REGION, Resolver
from tests.support.iam_evaluator import Decision, Request, evaluate

SEND_ANYWHERE = {"Statement": [{"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}]}
ADMIN = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
EVENTBRIDGE = "events.amazonaws.com"


@pytest.fixture(scope="module")
def stack(translated: dict[str, Any]) -> dict[str, Any]:
    resolver = Resolver(translated)
    role = {lid: resolver.get_att(lid, "Arn") for lid in ("ApiFunctionRole", "ReconcilerRole", "DispatcherRole")}
    return {
        "policy": resolver.resolve(translated["Resources"]["KickQueuePolicy"]["Properties"]["PolicyDocument"]),
        "queue": resolver.get_att("KickQueue", "Arn"),
        "rule": resolver.get_att("InterruptionRule", "Arn"),
        "roles": role,
        # Each role's own policies (the api's and the reconciler's grant SendMessage on the queue).
        "identity": {
            lid: [resolver.resolve(p["PolicyDocument"]) for p in translated["Resources"][lid]["Properties"]["Policies"]]
            for lid in role
        },
    }


def _send(
    stack: dict[str, Any],
    who: str,
    identity: list[dict[str, Any]] | None = None,
    *,
    context: dict[str, str | list[str]] | None = None,
) -> Decision:
    """sqs:SendMessage on the kick queue by `who` (a role's ARN, or a service principal's name)."""
    request = Request(who, "sqs:SendMessage", stack["queue"], context or {})
    return evaluate(request, identity or [], resource=[stack["policy"]])


def test_the_stacks_roles_may_send(stack: dict[str, Any]) -> None:
    for lid in ("ApiFunctionRole", "ReconcilerRole"):
        assert _send(stack, stack["roles"][lid], stack["identity"][lid]) is Decision.ALLOW, lid


def test_the_stacks_interruption_rule_may_send_through_eventbridge(stack: dict[str, Any]) -> None:
    delivered = _send(stack, EVENTBRIDGE, context={"aws:SourceArn": stack["rule"]})
    assert delivered is Decision.ALLOW


def test_another_rule_of_the_account_may_not(stack: dict[str, Any]) -> None:
    other = f"arn:aws:events:{REGION}:{ACCOUNT}:rule/someone-elses-rule"
    assert _send(stack, EVENTBRIDGE, context={"aws:SourceArn": other}) is not Decision.ALLOW
    # EventBridge without a source (it always sets one; a policy must not rely on that).
    assert _send(stack, EVENTBRIDGE) is not Decision.ALLOW


@pytest.mark.parametrize(
    ("who", "identity"),
    [
        (f"arn:aws:iam::{ACCOUNT}:role/ci-deployer", [SEND_ANYWHERE]),
        (f"arn:aws:iam::{ACCOUNT}:user/alice", [SEND_ANYWHERE]),
        # The account's administrators too (for SendMessage only, below): nobody needs to forge a kick.
        (f"arn:aws:iam::{ACCOUNT}:role/Admin", [ADMIN]),
        (f"arn:aws:iam::{ACCOUNT}:root", []),
    ],
)
def test_any_other_principal_of_the_account_is_denied_whatever_its_policies(
    stack: dict[str, Any], who: str, identity: list[dict[str, Any]]
) -> None:
    # (A caller cannot claim the rule's aws:SourceArn: AWS sets it only on a service's own call.)
    assert _send(stack, who, identity) is Decision.EXPLICIT_DENY


def test_another_role_of_this_stack_may_not_send_kicks(stack: dict[str, Any]) -> None:
    dispatcher = stack["roles"]["DispatcherRole"]
    assert _send(stack, dispatcher, [SEND_ANYWHERE]) is Decision.EXPLICIT_DENY


def test_administrators_may_read_its_attributes_but_neither_drain_nor_rewrite_it(
    stack: dict[str, Any], translated: dict[str, Any]
) -> None:
    """Denying SendMessage alone held nothing: SetQueueAttributes rewrote the policy and PurgeQueue,
    ReceiveMessage or DeleteMessage drained the warnings. Now the worker's role (its event source
    polls with it) consumes, the deployers (CloudFormation's credentials) manage, nobody else either."""
    admin = f"arn:aws:iam::{ACCOUNT}:role/Admin"
    assert evaluate(Request(admin, "sqs:GetQueueAttributes", stack["queue"]), [ADMIN], resource=[stack["policy"]]) is (
        Decision.ALLOW
    )
    changes = (
        "sqs:SetQueueAttributes",
        "sqs:AddPermission",
        "sqs:RemovePermission",
        "sqs:PurgeQueue",
        "sqs:DeleteQueue",
    )
    consuming = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility")
    for action in changes + consuming:
        request = Request(admin, action, stack["queue"])
        assert evaluate(request, [ADMIN], resource=[stack["policy"]]) is Decision.EXPLICIT_DENY, action
    reconciler = stack["roles"]["ReconcilerRole"]
    for action in consuming:
        request = Request(reconciler, action, stack["queue"])
        assert evaluate(request, [ADMIN], resource=[stack["policy"]]) is Decision.ALLOW, action
    for deployer in Resolver(translated).ref("DeployerPrincipalArns"):
        for action in changes:
            request = Request(deployer, action, stack["queue"])
            assert evaluate(request, [ADMIN], resource=[stack["policy"]]) is Decision.ALLOW, (deployer, action)


def test_plain_http_is_denied_even_to_the_stacks_roles(stack: dict[str, Any]) -> None:
    api = stack["roles"]["ApiFunctionRole"]
    plain = _send(stack, api, stack["identity"]["ApiFunctionRole"], context={"aws:SecureTransport": "false"})
    assert plain is Decision.EXPLICIT_DENY


# --- the reconcile queue: the dispatcher's shards only ----------------------------------------------------


def test_only_the_dispatcher_queues_shards(translated: dict[str, Any], stack: dict[str, Any]) -> None:
    resolver = Resolver(translated)
    policy = resolver.resolve(translated["Resources"]["ReconcileQueuePolicy"]["Properties"]["PolicyDocument"])
    queue = resolver.get_att("ReconcileQueue", "Arn")

    def send(who: str, identity: list[dict[str, Any]], **context: str) -> Decision:
        return evaluate(Request(who, "sqs:SendMessage", queue, dict(context)), identity, resource=[policy])

    dispatcher = stack["roles"]["DispatcherRole"]
    assert send(dispatcher, stack["identity"]["DispatcherRole"]) is Decision.ALLOW
    plain = send(dispatcher, stack["identity"]["DispatcherRole"], **{"aws:SecureTransport": "false"})
    assert plain is Decision.EXPLICIT_DENY
    for other in (stack["roles"]["ApiFunctionRole"], f"arn:aws:iam::{ACCOUNT}:role/Admin"):
        assert send(other, [ADMIN]) is Decision.EXPLICIT_DENY, other
    admin = Request(f"arn:aws:iam::{ACCOUNT}:role/Admin", "sqs:PurgeQueue", queue)
    assert evaluate(admin, [ADMIN], resource=[policy]) is Decision.EXPLICIT_DENY
    worker = Request(stack["roles"]["ReconcilerRole"], "sqs:ReceiveMessage", queue)
    assert evaluate(worker, [ADMIN], resource=[policy]) is Decision.ALLOW
