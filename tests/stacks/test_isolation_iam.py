"""The stack's id in template.yaml's IAM conditions, and in the names and tokens it goes into.

What the functions are allowed to change carries this stack's id (tag `fleetkeeper:stack`, or the
id in the resource's name); what they create must carry it; the adoption of untagged resources adds
that one tag only where there is none, and goes away with AdoptUntaggedReplicas=false.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.reconciler.balancer import MAX_TARGET_GROUP_NAME, target_group_name
from fleetkeeper.reconciler.driver import MAX_CLIENT_TOKEN_LENGTH, Instance, InstanceState, client_token
from fleetkeeper.reconciler.ownership import Ownership, ownership
from fleetkeeper.settings import STACK_ID_ENV, SettingsError, stack_id_of
from tests.support.cfn import Resolver, as_list, function_role, role_statements, translate

STACK_KEY = "0123456789ab"  # tests/support/cfn.py's AWS::StackId, as template.yaml derives it
STACK = "fleetkeeper:stack"
MANAGED = "fleetkeeper:managed"


def resolved(translated: dict[str, Any], value: Any) -> Any:
    return Resolver(translated).resolve(value)


def all_statements(translated: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """A role's inline statements and those of the RolePolicy resources attached to it."""
    statements = list(role_statements(translated, role))
    for body in translated["Resources"].values():
        deployed = "Condition" not in body or Resolver(translated).condition(body["Condition"])
        if body["Type"] == "AWS::IAM::RolePolicy" and body["Properties"]["RoleName"] == {"Ref": role} and deployed:
            statements.extend(as_list(body["Properties"]["PolicyDocument"]["Statement"]))
    return [resolved(translated, s) for s in statements]


def test_every_function_gets_the_stack_id_derived_from_the_stack(translated: dict[str, Any]) -> None:
    expression = translated["Globals"]["Function"]["Environment"]["Variables"] if "Globals" in translated else None
    for function in [r for r in translated["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]:
        variables = function["Properties"]["Environment"]["Variables"]
        assert resolved(translated, variables[STACK_ID_ENV]) == STACK_KEY
    assert expression is None  # SAM folded Globals into each function
    assert stack_id_of({STACK_ID_ENV: STACK_KEY}) == STACK_KEY


@pytest.mark.parametrize("role_of", ["ReconcilerFunction", "DispatcherFunction"])
def test_instances_are_terminated_only_when_tagged_with_this_stack(translated: dict[str, Any], role_of: str) -> None:
    statements = all_statements(translated, function_role(translated, role_of))
    terminating = [s for s in statements if "ec2:TerminateInstances" in as_list(s["Action"])]
    assert terminating
    for statement in terminating:
        assert statement["Condition"]["StringEquals"][f"aws:ResourceTag/{STACK}"] == STACK_KEY


def test_every_ec2_and_elb_mutation_requires_this_stacks_id(translated: dict[str, Any]) -> None:
    """Every write the reconciler may make on EC2 instances or ELB resources names the stack's id:
    as the tag it must create with, the tag the resource must carry, or (listeners and rules) the
    stack's own load balancer in the resource ARN."""
    alb = Resolver(translated).get_att("LoadBalancerResource", "LoadBalancerFullName")
    statements = all_statements(translated, function_role(translated, "ReconcilerFunction"))
    vpc = {"ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface"}
    vpc |= {"ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses"}
    checked = 0
    for statement in statements:
        actions = [a for a in as_list(statement["Action"]) if a.startswith(("ec2:", "elasticloadbalancing:"))]
        writes = [a for a in actions if a.split(":")[1].split("Describe")[0] and a not in vpc]
        if not writes:
            continue
        if writes == ["ec2:RunInstances"] and "Condition" not in statement:
            continue  # the image, subnet... a launch also authorizes: they carry no request tag
        checked += 1
        equals = statement.get("Condition", {}).get("StringEquals", {})
        names_stack = STACK_KEY in {equals.get(f"aws:RequestTag/{STACK}"), equals.get(f"aws:ResourceTag/{STACK}")}
        on_own_alb = all(f"/{alb}/" in r for r in as_list(statement["Resource"]))
        assert names_stack or on_own_alb, statement
    assert checked >= 8


def test_target_groups_are_created_only_under_this_stacks_name(translated: dict[str, Any]) -> None:
    statements = all_statements(translated, function_role(translated, "ReconcilerFunction"))
    creates = [s for s in statements if "elasticloadbalancing:CreateTargetGroup" in as_list(s["Action"])]
    # The services' target groups, and the wake groups of the load balancers the stack makes.
    assert sorted(r for create in creates for r in as_list(create["Resource"])) == [
        f"arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/fk-{STACK_KEY}-*/*",
        f"arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/fkwake-{STACK_KEY}-*/*",
    ]


def test_adoption_adds_only_this_stacks_id_and_only_where_there_is_none() -> None:
    # Off by default (a stack upgraded in place turns it on for its first runs).
    translated = translate(overrides={"AdoptUntaggedReplicas": "true"})
    statements = all_statements(translated, function_role(translated, "ReconcilerFunction"))
    adopting = [s for s in statements if s.get("Sid", "").startswith("AdoptUntagged")]
    assert {s["Sid"] for s in adopting} == {"AdoptUntaggedReplicas", "AdoptUntaggedTargetGroups"}
    for statement in adopting:
        condition = statement["Condition"]
        assert condition["StringEquals"] == {f"aws:ResourceTag/{MANAGED}": "true", f"aws:RequestTag/{STACK}": STACK_KEY}
        assert condition["ForAllValues:StringEquals"] == {"aws:TagKeys": [STACK]}
        assert condition["Null"] == {f"aws:ResourceTag/{STACK}": "true"}


def test_without_adoption_no_statement_may_tag_an_existing_resource(translated: dict[str, Any]) -> None:
    assert translated["__parameter_values__"]["AdoptUntaggedReplicas"] == "false"  # the default
    policy = translated["Resources"]["ReconcilerAdoptionPolicy"]
    assert policy["Condition"] == "AdoptsUntagged" and not Resolver(translated).condition("AdoptsUntagged")
    statements = all_statements(translated, function_role(translated, "ReconcilerFunction"))
    for statement in statements:
        if {"ec2:CreateTags", "elasticloadbalancing:AddTags"} & set(as_list(statement["Action"])):
            equals = statement["Condition"]["StringEquals"]
            assert "ec2:CreateAction" in equals or "elasticloadbalancing:CreateAction" in equals, statement


def test_parameters_and_workdir_copies_are_tagged_with_this_stacks_id_only(translated: dict[str, Any]) -> None:
    statements = all_statements(translated, function_role(translated, "ApiFunction"))
    tagging = [s for s in statements if "ssm:AddTagsToResource" in as_list(s["Action"])]
    assert len(tagging) == 2  # the secrets' path and the request HMAC key
    for ssm in tagging:
        assert ssm["Condition"] == {
            "StringEquals": {f"aws:RequestTag/{STACK}": STACK_KEY},
            "ForAllValues:StringEquals": {"aws:TagKeys": [STACK]},
        }
    (s3,) = [s for s in statements if "s3:PutObjectTagging" in as_list(s["Action"])]
    assert s3["Condition"] == {
        "StringEquals": {f"s3:RequestObjectTag/{STACK}": STACK_KEY},
        "ForAllValues:StringEquals": {"s3:RequestObjectTagKeys": [STACK]},
    }


# --- names, tokens, ids ---------------------------------------------------------------------------


def test_the_longest_names_and_tokens_fit_aws_limits() -> None:
    stack, uid = "f" * 12, "0" * 16
    assert len(target_group_name(uid, stack)) == MAX_TARGET_GROUP_NAME
    assert len(client_token(uid, 10**6, 10**9, stack=stack)) <= MAX_CLIENT_TOKEN_LENGTH
    with pytest.raises(ValueError, match="over ELB's 32"):
        target_group_name(uid, stack + "x")


@pytest.mark.parametrize("raw", ["ABC", "a-b", "a" * 13, "a b", "abc\n"])
def test_a_stack_id_that_would_not_fit_names_and_tokens_is_refused(raw: str) -> None:
    with pytest.raises(SettingsError, match=STACK_ID_ENV):
        stack_id_of({STACK_ID_ENV: raw})


def _instance(stack: str, token: str, uid: str = "u1") -> Instance:
    return Instance("i-1", InstanceState.RUNNING, "web", uid, 1, 0, stack=stack, client_token=token)


@pytest.mark.parametrize(
    ("stack", "token", "own_uids", "expected"),
    [
        ("a", client_token("u1", 0, stack="a"), set(), Ownership.OURS),
        ("a", client_token("u1", 0, 3, stack="a"), set(), Ownership.OURS),
        ("a", client_token("u1", 0), set(), Ownership.OURS),  # adopted earlier: keeps its old token
        ("b", client_token("u1", 0, stack="b"), {"u1"}, Ownership.FOREIGN),  # another stack's
        ("a", client_token("u1", 0, stack="b"), {"u1"}, Ownership.FOREIGN),  # our tag copied onto b's
        ("", client_token("u1", 0), {"u1"}, Ownership.LEGACY),  # ours from before stack ids
        ("", client_token("u1", 0), {"u2"}, Ownership.FOREIGN),  # nothing says it is ours
        ("", client_token("u1", 0, stack="a"), {"u1"}, Ownership.FOREIGN),  # its stack tag was removed
        ("a", "somebody-elses", {"u1"}, Ownership.FOREIGN),
    ],
)
def test_ownership(stack: str, token: str, own_uids: set[str], expected: Ownership) -> None:
    assert ownership(_instance(stack, token), "a", own_uids) is expected
