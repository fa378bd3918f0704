"""The wake target's deployment (fleetkeeper/wake/demand.py): a Lambda target group of the stack's ALB, its
function, the invoke permission the ALB needs, the function's least-privilege role, the reconciler's
setting and permission to move a route, as CloudFormation receives them.

AWS, *Lambda functions as targets*: the target group's type is `lambda`; "you must grant Elastic
Load Balancing permission to invoke your Lambda function" (lambda:InvokeFunction for principal
elasticloadbalancing.amazonaws.com), scoped here with SourceArn to the wake target group.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cfn import Resolver, as_list, translate
from tests.support.iam_evaluator import Decision, Request, allowed, evaluate
from tests.template.test_endpoints import deployed, props, reconciler_env
from tests.template.test_iam import parliament_findings

WAKE = ("WakeFunction", "WakeRole", "WakeLogGroup", "WakeInvokePermission", "WakeTargetGroup")


@pytest.fixture(scope="module")
def without_balancer() -> dict[str, Any]:
    return translate(overrides={"LoadBalancer": "none"})


def statements(translated: dict[str, Any], role: str) -> list[dict[str, Any]]:
    resolver = Resolver(translated)
    return [
        s
        for p in translated["Resources"][role]["Properties"]["Policies"]
        for s in resolver.resolve(p["PolicyDocument"])["Statement"]
    ]


def test_a_stack_with_a_load_balancer_has_the_wake_target_and_one_without_has_none(
    translated: dict[str, Any], without_balancer: dict[str, Any]
) -> None:
    assert set(WAKE) <= set(deployed(translated))
    assert not set(WAKE) & set(deployed(without_balancer))
    assert reconciler_env(without_balancer)["FLEETKEEPER_WAKE_TARGET_GROUP_ARN"] == ""


def test_the_wake_target_group_is_the_functions_and_only_the_alb_may_invoke_it_for_that_group(
    translated: dict[str, Any],
) -> None:
    resolver = Resolver(translated)
    group = props(translated, "WakeTargetGroup")
    function_arn = resolver.get_att("WakeFunction", "Arn")
    assert group["TargetType"] == "lambda"
    assert group["Targets"] == [{"Id": function_arn}]
    # Registering the function needs the permission first.
    assert "WakeInvokePermission" in as_list(translated["Resources"]["WakeTargetGroup"]["DependsOn"])
    permission = props(translated, "WakeInvokePermission")
    assert permission["Action"] == "lambda:InvokeFunction"
    assert permission["Principal"] == "elasticloadbalancing.amazonaws.com"
    assert permission["FunctionName"] == function_arn
    # SourceArn names the group (by its fixed name: the group depends on the permission).
    name = group["Name"]
    assert name.startswith("fkwake-") and len(name) <= 32
    assert permission["SourceArn"].endswith(f":targetgroup/{name}/*")
    # The reconciler's target group permissions (fk-*) do not reach it.
    assert not name.startswith("fk-")


def test_the_reconciler_knows_the_wake_target_and_may_move_a_services_listener(translated: dict[str, Any]) -> None:
    assert reconciler_env(translated)["FLEETKEEPER_WAKE_TARGET_GROUP_ARN"] == Resolver(translated).ref(
        "WakeTargetGroup"
    )
    granted = {
        action
        for s in Resolver(translated).resolve(
            translated["Resources"]["ReconcilerEndpointsPolicy"]["Properties"]["PolicyDocument"]
        )["Statement"]
        for action in as_list(s["Action"])
    }
    assert {"elasticloadbalancing:ModifyListener", "elasticloadbalancing:ModifyRule"} <= granted


def test_the_wake_function_runs_outside_the_vpc_quickly_with_its_own_role(translated: dict[str, Any]) -> None:
    function = props(translated, "WakeFunction")
    assert "VpcConfig" not in function
    assert function["Handler"] == "fleetkeeper.wake.handler.lambda_handler"
    assert function["Timeout"] <= 10
    assert function["Role"] == Resolver(translated).get_att("WakeRole", "Arn")
    env = function["Environment"]["Variables"]
    assert env["FLEETKEEPER_KICK_QUEUE_URL"] == Resolver(translated).ref("KickQueue")
    assert env["FLEETKEEPER_ALB_ARN"] == Resolver(translated).ref("LoadBalancerResource")


def test_the_wake_role_may_only_record_demand_on_service_items_kick_and_find_a_ports_service(
    translated: dict[str, Any],
) -> None:
    resolver = Resolver(translated)
    granted = statements(translated, "WakeRole")
    actions = {action for s in granted for action in as_list(s["Action"])}
    assert actions == {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "dynamodb:UpdateItem",
        "sqs:SendMessage",
        "elasticloadbalancing:DescribeLoadBalancers",  # a pool's, by its name
        "elasticloadbalancing:DescribeListeners",
        "elasticloadbalancing:DescribeTags",
    }
    table = resolver.get_att("Table", "Arn")
    role = resolver.get_att("WakeRole", "Arn")
    policy = {"Version": "2012-10-17", "Statement": granted}

    def may(action: str, key: str) -> bool:
        request = Request(role, action, table, {"dynamodb:LeadingKeys": [key]})
        return allowed(request, [policy])

    assert may("dynamodb:UpdateItem", "SVC#api")
    assert not may("dynamodb:UpdateItem", "IDEMPOTENCY#api")
    assert not may("dynamodb:DeleteItem", "SVC#api")
    assert not may("dynamodb:PutItem", "SVC#api")
    assert parliament_findings(policy) == []


def test_the_wake_role_may_send_to_the_kick_queue_despite_its_deny(translated: dict[str, Any]) -> None:
    resolver = Resolver(translated)
    policy = resolver.resolve(translated["Resources"]["KickQueuePolicy"]["Properties"]["PolicyDocument"])
    identity = [{"Version": "2012-10-17", "Statement": statements(translated, "WakeRole")}]
    request = Request(resolver.get_att("WakeRole", "Arn"), "sqs:SendMessage", resolver.get_att("KickQueue", "Arn"))
    assert evaluate(request, identity, resource=[policy]) is Decision.ALLOW
