"""Who may put a message on the kick queue: the translated KickQueuePolicy, evaluated for each kind
of sender (tests/iam_eval.py, IAM's documented evaluation logic).

A message on the kick queue drains a replica (an interruption warning) or runs the reconciler: a
principal of the account allowed sqs:SendMessage on "*" must not be able to send one. Only the api's
and the reconciler's roles, and the stack's InterruptionRule (through EventBridge), may.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cfn import ACCOUNT, REGION, Resolver
from tests.iam_eval import Request, decide

SEND_ANYWHERE = {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}
ADMIN = {"Effect": "Allow", "Action": "*", "Resource": "*"}


@pytest.fixture(scope="module")
def stack(translated: dict[str, Any]) -> dict[str, Any]:
    resolver = Resolver(translated)
    role = {lid: resolver.get_att(lid, "Arn") for lid in ("ApiFunctionRole", "ReconcilerRole", "DispatcherRole")}
    return {
        "policy": resolver.resolve(translated["Resources"]["KickQueuePolicy"]["Properties"]["PolicyDocument"]),
        "queue": resolver.get_att("KickQueue", "Arn"),
        "rule": resolver.get_att("InterruptionRule", "Arn"),
        "roles": role,
        # Each role's own statements (the api's and the reconciler's grant SendMessage on the queue).
        "identity": {
            lid: tuple(
                s
                for p in translated["Resources"][lid]["Properties"]["Policies"]
                for s in resolver.resolve(p["PolicyDocument"])["Statement"]
            )
            for lid in role
        },
    }


def _send(stack: dict[str, Any], **caller: Any) -> str:
    return decide(stack["policy"], Request(action="sqs:SendMessage", resource=stack["queue"], **caller))


def test_the_stacks_roles_may_send(stack: dict[str, Any]) -> None:
    for lid in ("ApiFunctionRole", "ReconcilerRole"):
        assert _send(stack, principal_arn=stack["roles"][lid], identity=stack["identity"][lid]) == "Allow", lid


def test_the_stacks_interruption_rule_may_send_through_eventbridge(stack: dict[str, Any]) -> None:
    delivered = _send(stack, service="events.amazonaws.com", context={"aws:SourceArn": stack["rule"]})
    assert delivered == "Allow"


def test_another_rule_of_the_account_may_not(stack: dict[str, Any]) -> None:
    other = f"arn:aws:events:{REGION}:{ACCOUNT}:rule/someone-elses-rule"
    assert _send(stack, service="events.amazonaws.com", context={"aws:SourceArn": other}) != "Allow"
    # EventBridge without a source (it always sets one; a policy must not rely on that).
    assert _send(stack, service="events.amazonaws.com") != "Allow"


@pytest.mark.parametrize(
    ("who", "identity"),
    [
        (f"arn:aws:iam::{ACCOUNT}:role/ci-deployer", (SEND_ANYWHERE,)),
        (f"arn:aws:iam::{ACCOUNT}:user/alice", (SEND_ANYWHERE,)),
        # The account's administrators too (for SendMessage only, below): nobody needs to forge a kick.
        (f"arn:aws:iam::{ACCOUNT}:role/Admin", (ADMIN,)),
        (f"arn:aws:iam::{ACCOUNT}:root", ()),
    ],
)
def test_any_other_principal_of_the_account_is_denied_whatever_its_policies(
    stack: dict[str, Any], who: str, identity: tuple[dict[str, Any], ...]
) -> None:
    # (A caller cannot claim the rule's aws:SourceArn: AWS sets it only on a service's own call.)
    assert _send(stack, principal_arn=who, identity=identity) == "ExplicitDeny"


def test_another_role_of_this_stack_may_not_send_kicks(stack: dict[str, Any]) -> None:
    dispatcher = stack["roles"]["DispatcherRole"]
    assert _send(stack, principal_arn=dispatcher, identity=(SEND_ANYWHERE,)) == "ExplicitDeny"


def test_only_sending_is_denied_administrators_still_manage_the_queue(stack: dict[str, Any]) -> None:
    admin = f"arn:aws:iam::{ACCOUNT}:role/Admin"
    for action in ("sqs:GetQueueAttributes", "sqs:PurgeQueue", "sqs:SetQueueAttributes", "sqs:ReceiveMessage"):
        request = Request(action=action, resource=stack["queue"], principal_arn=admin, identity=(ADMIN,))
        assert decide(stack["policy"], request) == "Allow", action


def test_plain_http_is_denied_even_to_the_stacks_roles(stack: dict[str, Any]) -> None:
    api = stack["roles"]["ApiFunctionRole"]
    request = Request(
        action="sqs:SendMessage",
        resource=stack["queue"],
        principal_arn=api,
        identity=stack["identity"]["ApiFunctionRole"],
        context={"aws:SecureTransport": "false"},
    )
    assert decide(stack["policy"], request) == "ExplicitDeny"


# --- the reconcile queue: the dispatcher's shards only ----------------------------------------------------


def test_only_the_dispatcher_queues_shards(translated: dict[str, Any], stack: dict[str, Any]) -> None:
    resolver = Resolver(translated)
    policy = resolver.resolve(translated["Resources"]["ReconcileQueuePolicy"]["Properties"]["PolicyDocument"])
    queue = resolver.get_att("ReconcileQueue", "Arn")

    def send(who: str, identity: tuple[dict[str, Any], ...], **context: str) -> str:
        request = Request(
            action="sqs:SendMessage", resource=queue, principal_arn=who, identity=identity, context=context
        )
        return decide(policy, request)

    dispatcher = stack["roles"]["DispatcherRole"]
    assert send(dispatcher, stack["identity"]["DispatcherRole"]) == "Allow"
    assert send(dispatcher, stack["identity"]["DispatcherRole"], **{"aws:SecureTransport": "false"}) == "ExplicitDeny"
    for other in (stack["roles"]["ApiFunctionRole"], f"arn:aws:iam::{ACCOUNT}:role/Admin"):
        assert send(other, (ADMIN,)) == "ExplicitDeny", other
    admin = Request(
        action="sqs:PurgeQueue", resource=queue, principal_arn=f"arn:aws:iam::{ACCOUNT}:role/Admin", identity=(ADMIN,)
    )
    assert decide(policy, admin) == "Allow"


def test_the_evaluator_follows_iams_documented_rules() -> None:
    """tests/iam_eval.py on small policies whose outcome AWS's documentation states."""
    arn = "arn:aws:sqs:us-east-1:123456789012:q"
    role = f"arn:aws:iam::{ACCOUNT}:role/r"
    allow_all = {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}

    def deny_unless(operator: str) -> dict[str, Any]:
        condition = {operator: {"aws:SourceArn": "arn:aws:events:us-east-1:123456789012:rule/x"}}
        statement = {"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": arn}
        return {"Statement": [{**statement, "Condition": condition}]}

    send = Request(action="sqs:SendMessage", resource=arn, principal_arn=role, identity=(allow_all,))
    # A negated operator is true when the key is absent; a positive one is false.
    assert decide(deny_unless("ArnNotEquals"), send) == "ExplicitDeny"
    assert decide(deny_unless("ArnEquals"), send) == "Allow"
    # Several values of a negated operator: NOR.
    two = {"ArnNotEquals": {"aws:PrincipalArn": [role, f"arn:aws:iam::{ACCOUNT}:role/other"]}}
    statement = {"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": arn, "Condition": two}
    assert decide({"Statement": [statement]}, send) == "Allow"
    # No Allow anywhere: implicitly denied; an operator it cannot judge fails loudly.
    assert decide({"Statement": []}, Request(action="sqs:SendMessage", resource=arn, principal_arn=role)) == (
        "ImplicitDeny"
    )
    unknown = {**statement, "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020-01-01T00:00:00Z"}}}
    with pytest.raises(AssertionError, match="cannot judge"):
        decide({"Statement": [unknown]}, send)
