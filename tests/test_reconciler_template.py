"""The reconciler's IAM policy enforces invariant 7: it can only create and destroy managed instances."""

from __future__ import annotations

from typing import Any

from fleetkeeper.template import load_template, resource

MANAGED = "fleetkeeper:managed"


def _role_statements(role: str) -> list[dict[str, Any]]:
    policies = resource(load_template(), role)["Properties"]["Policies"]
    return [statement for policy in policies for statement in policy["PolicyDocument"]["Statement"]]


def _statements() -> list[dict[str, Any]]:
    function = resource(load_template(), "ReconcilerFunction")["Properties"]
    assert function["Role"] == {"Fn::GetAtt": ["ReconcilerRole", "Arn"]}
    assert "Policies" not in function  # no SAM-generated role with managed policies
    return _role_statements("ReconcilerRole")


def _actions(statement: dict[str, Any]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


def test_instances_and_volumes_can_only_be_launched_with_the_managed_tag() -> None:
    launches = [s for s in _statements() if "ec2:RunInstances" in _actions(s)]
    on_instances = [s for s in launches if any(":instance/" in str(r) for r in _resources(s))]
    assert on_instances and all(
        s["Condition"]["StringEquals"][f"aws:RequestTag/{MANAGED}"] == "true" for s in on_instances
    )
    assert all(":volume/" in str(_resources(s)) for s in on_instances)


def test_terminate_requires_the_managed_tag_and_tags_are_only_written_at_launch() -> None:
    by_action = {a: s for s in _statements() for a in _actions(s)}
    assert by_action["ec2:TerminateInstances"]["Condition"]["StringEquals"] == {f"aws:ResourceTag/{MANAGED}": "true"}
    assert by_action["ec2:CreateTags"]["Condition"]["StringEquals"] == {
        "ec2:CreateAction": "RunInstances",
        f"aws:RequestTag/{MANAGED}": "true",
    }


def test_only_describe_calls_get_every_resource() -> None:
    for statement in _statements():
        if statement["Resource"] == "*":
            assert all(a.startswith("ec2:Describe") for a in _actions(statement)), statement


def test_passrole_is_limited_to_the_replica_role_and_ec2() -> None:
    [passrole] = [s for s in _statements() if "iam:PassRole" in _actions(s)]
    assert passrole["Resource"] == {"Ref": "ReplicaRoleArn"}
    assert passrole["Condition"]["StringEquals"] == {"iam:PassedToService": "ec2.amazonaws.com"}


def test_the_api_may_kick_only_the_reconciler() -> None:
    api = resource(load_template(), "ApiFunction")["Properties"]
    assert api["Environment"]["Variables"]["RECONCILER_FUNCTION_NAME"] == {"Ref": "ReconcilerFunction"}
    assert api["Role"] == {"Fn::GetAtt": ["ApiFunctionRole", "Arn"]}
    invokes = [s for s in _role_statements("ApiFunctionRole") if "lambda:InvokeFunction" in _actions(s)]
    assert [s["Resource"] for s in invokes] == [{"Fn::GetAtt": ["ReconcilerFunction", "Arn"]}]


def test_the_schedule_is_a_parameter_defaulting_to_every_minute() -> None:
    template = load_template()
    assert template["Parameters"]["ReconcileSchedule"]["Default"] == "rate(1 minute)"
    events = resource(template, "ReconcilerFunction")["Properties"]["Events"]
    assert events["Tick"]["Properties"]["Schedule"] == {"Ref": "ReconcileSchedule"}


def _resources(statement: dict[str, Any]) -> list[Any]:
    value = statement["Resource"]
    return value if isinstance(value, list) else [value]
