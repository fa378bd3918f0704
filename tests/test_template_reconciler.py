"""The reconciler's deployment: its schedule, and EC2 permissions enforced by the managed tag.

Invariant 7 (DESIGN.md): the control plane only touches instances carrying its managed tag, and its
IAM policy enforces that. These tests read the translated role, so a policy that says the right
thing in SAM shorthand but not in CloudFormation fails too.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.cfn import (
    Resolver,
    as_list,
    condition_keys,
    function_role,
    refers_to,
    resources_of_type,
    role_statements,
    statements_granting,
    translate,
)

MANAGED_TAG = "fleetkeeper:managed"
RESOURCE_TAG = f"aws:resourcetag/{MANAGED_TAG}"
REQUEST_TAG = f"aws:requesttag/{MANAGED_TAG}"
# What Lambda itself does with the function's role to attach it to its VPC (hyperplane ENIs);
# these touch network interfaces, never instances.
LAMBDA_VPC_ACTIONS = {
    "ec2:createnetworkinterface",
    "ec2:deletenetworkinterface",
    "ec2:assignprivateipaddresses",
    "ec2:unassignprivateipaddresses",
}


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    translated = translate()
    assert "ReconcilerFunction" in translated["Resources"]
    return translated


@pytest.fixture(scope="module")
def statements(translated: dict[str, Any]) -> list[dict[str, Any]]:
    return role_statements(translated, function_role(translated, "ReconcilerFunction"))


def tag_conditioned(statement: dict[str, Any], key: str) -> bool:
    """The statement only applies when `key` (a tag condition key) is present with a value."""
    keys = condition_keys(statement)
    return key in keys and all(str(v) for v in as_list(keys[key]))


@pytest.mark.parametrize("action", ["ec2:TerminateInstances", "ec2:CreateTags"])
def test_instance_changes_need_the_managed_tag(statements: list[dict[str, Any]], action: str) -> None:
    granting = statements_granting(statements, action)
    assert granting, f"the reconciler cannot {action}"
    for statement in granting:
        keys = condition_keys(statement)
        at_launch = str(keys.get("ec2:createaction", "")).lower() in {"runinstances", "['runinstances']"}
        if action == "ec2:CreateTags" and at_launch:
            # Tagging as part of RunInstances: the instance has no tags yet, the request must carry it.
            assert tag_conditioned(statement, REQUEST_TAG), statement
        else:
            assert tag_conditioned(statement, RESOURCE_TAG), statement


def test_launches_must_carry_the_managed_tag(translated: dict[str, Any], statements: list[dict[str, Any]]) -> None:
    resolver = Resolver(translated)
    granting = statements_granting(statements, "ec2:RunInstances")
    assert granting, "the reconciler cannot launch instances"
    creates_instances = []
    for statement in granting:
        resources = [str(r) for r in as_list(resolver.resolve(statement["Resource"]))]
        # RunInstances also authorizes the subnet, security group, image... those carry no request
        # tag; the statement that covers the instance itself must demand it.
        if any(r == "*" or re.search(r":instance/", r) for r in resources):
            creates_instances.append(statement)
            assert tag_conditioned(statement, REQUEST_TAG), statement
    assert creates_instances, "no RunInstances statement covers instance resources"


def test_no_other_instance_mutation_without_the_tag(statements: list[dict[str, Any]]) -> None:
    """Any EC2 action that is not a read must be tag-conditioned (ResourceTag or RequestTag)."""
    for statement in statements:
        for action in as_list(statement.get("Action", [])):
            name = str(action).lower()
            if not name.startswith("ec2:") or name.startswith(("ec2:describe", "ec2:get")):
                continue
            if name == "ec2:runinstances" or name in LAMBDA_VPC_ACTIONS:
                continue  # RunInstances is checked by resource type above
            keys = condition_keys(statement)
            assert RESOURCE_TAG in keys or REQUEST_TAG in keys, f"{action} without the managed tag: {statement}"


def test_pass_role_only_for_the_replicas_role(translated: dict[str, Any], statements: list[dict[str, Any]]) -> None:
    resolver = Resolver(translated)
    granting = statements_granting(statements, "iam:PassRole")
    assert granting, "the reconciler cannot pass the replicas' role (instances would launch without it)"
    for statement in granting:
        resources = [str(r) for r in as_list(resolver.resolve(statement["Resource"]))]
        assert resources, statement
        for arn in resources:
            assert "*" not in arn, f"PassRole on a pattern: {arn}"
            assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@/-]+", arn), f"not a role ARN: {arn}"
        passed_to = condition_keys(statement).get("iam:passedtoservice")
        if passed_to is not None:
            assert as_list(passed_to) == ["ec2.amazonaws.com"], passed_to
    # The role comes from the deployment (a parameter), not a name the template guesses.
    parameters = set(translated.get("Parameters", {}))
    assert any(
        refers_to(resource, name) or resource == {"Ref": name}
        for statement in granting
        for resource in as_list(statement["Resource"])
        for name in parameters
    ), "PassRole's resource is not derived from a parameter"


def schedule_of(translated: dict[str, Any]) -> tuple[str, Any]:
    rules = resources_of_type(translated, "AWS::Events::Rule")
    schedules = resources_of_type(translated, "AWS::Scheduler::Schedule")
    found = [
        (lid, body["Properties"]["ScheduleExpression"])
        for lid, body in {**rules, **schedules}.items()
        if "ScheduleExpression" in body["Properties"]
        and any(
            refers_to(target.get("Arn"), "ReconcilerFunction")
            for target in as_list(body["Properties"].get("Targets", body["Properties"].get("Target", [])))
        )
    ]
    assert len(found) == 1, f"expected one schedule targeting the reconciler, got {found}"
    return found[0]


def test_schedule_runs_at_the_parameters_rate(translated: dict[str, Any]) -> None:
    _, expression = schedule_of(translated)
    resolved = Resolver(translated).resolve(expression)
    assert re.fullmatch(r"rate\(\d+ minutes?\)", str(resolved)), resolved
    # Change every parameter that could hold the rate: the schedule must follow.
    rate_params = [name for name, value in translated["__parameter_values__"].items() if str(value) == str(resolved)]
    assert rate_params, f"{resolved} comes from no parameter"
    retranslated = translate(overrides=dict.fromkeys(rate_params, "rate(7 minutes)"))
    _, new_expression = schedule_of(retranslated)
    assert Resolver(retranslated).resolve(new_expression) == "rate(7 minutes)"


def test_default_rate_is_one_minute(translated: dict[str, Any]) -> None:
    _, expression = schedule_of(translated)
    assert Resolver(translated).resolve(expression) == "rate(1 minute)"


def test_reconciler_runs_in_the_deployments_vpc(translated: dict[str, Any]) -> None:
    """Its readiness probes reach replicas' private addresses (.checkov.yaml relies on this test)."""
    vpc = translated["Resources"]["ReconcilerFunction"]["Properties"].get("VpcConfig")
    assert vpc, "the reconciler is not in a VPC: it cannot probe replicas"
    parameters = translated.get("Parameters", {})
    for key in ("SubnetIds", "SecurityGroupIds"):
        assert any(vpc[key] == {"Ref": name} for name in parameters), f"{key} is not a parameter: {vpc[key]!r}"
