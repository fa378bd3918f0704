"""template.yaml: EC2's state-change notifications reach the worker through the kick queue, filtered
on the state by the rule's pattern and trimmed by its transformer; the queue policy lets that rule
send; the worker's role may send its own follow-ups."""

from __future__ import annotations

import json
from typing import Any

from fleetkeeper.local.template import load_template
from fleetkeeper.reconciler.state_changes import DETAIL_TYPE, SOURCE, STATES, StateChange, state_change_of
from tests.support.cfn import function_role, role_statements, statements_granting


def _rendered(instance_id: str, state: str) -> str:
    """The kick queue's message as the rule's input transformer makes it (a string value goes in as a
    JSON string, as EventBridge fills a placeholder outside quotes)."""
    rule = load_template()["Resources"]["InstanceStateRule"]["Properties"]
    transformer = rule["Targets"][0]["InputTransformer"]
    values = {"instance": instance_id, "state": state}
    assert set(transformer["InputPathsMap"]) == set(values)
    body = str(transformer["InputTemplate"])
    for name, value in values.items():
        body = body.replace(f"<{name}>", json.dumps(value))
    return body


def test_the_instance_state_rule_sends_only_the_states_that_end_a_replica(translated: dict[str, Any]) -> None:
    rule = translated["Resources"]["InstanceStateRule"]["Properties"]
    assert rule["EventPattern"] == {"source": [SOURCE], "detail-type": [DETAIL_TYPE], "detail": {"state": list(STATES)}}
    assert "pending" not in STATES and "running" not in STATES
    [target] = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["KickQueue", "Arn"]}
    assert target["InputTransformer"]["InputPathsMap"] == {
        "instance": "$.detail.instance-id",
        "state": "$.detail.state",
    }


def test_the_transformed_message_is_what_the_worker_reads() -> None:
    body = _rendered("i-0123456789abcdef0", "shutting-down")
    assert len(body.encode()) <= 1024  # the kick queue's MaximumMessageSize
    assert state_change_of(json.loads(body)) == StateChange("i-0123456789abcdef0", "shutting-down")


def test_the_kick_queue_lets_the_instance_state_rule_send(translated: dict[str, Any]) -> None:
    policy = translated["Resources"]["KickQueuePolicy"]["Properties"]["PolicyDocument"]
    [statement] = [s for s in policy["Statement"] if s.get("Sid") == "InstanceStateChanges"]
    assert statement == {
        "Sid": "InstanceStateChanges",
        "Effect": "Allow",
        "Principal": {"Service": "events.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": {"Fn::GetAtt": ["KickQueue", "Arn"]},
        "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["InstanceStateRule", "Arn"]}}},
    }


def test_the_worker_may_send_its_follow_ups_and_record_them(translated: dict[str, Any]) -> None:
    statements = role_statements(translated, function_role(translated, "ReconcilerFunction"))
    assert any(
        s.get("Resource") == {"Fn::GetAtt": ["KickQueue", "Arn"]}
        for s in statements_granting(statements, "sqs:SendMessage")
    )
    assert statements_granting(statements, "dynamodb:UpdateItem")


def test_the_instance_state_rule_gets_past_the_kick_queues_deny(translated: dict[str, Any]) -> None:
    """The queue policy's Deny of senders outside the stack (tests/template/test_kick_queue.py) lets
    the instance-state rule's deliveries through, and still no other rule's."""
    from tests.support.cfn import ACCOUNT, REGION, Resolver
    from tests.support.iam_evaluator import Decision, Request, evaluate

    resolver = Resolver(translated)
    policy = resolver.resolve(translated["Resources"]["KickQueuePolicy"]["Properties"]["PolicyDocument"])
    queue = resolver.get_att("KickQueue", "Arn")

    def send(source: str) -> Decision:
        request = Request("events.amazonaws.com", "sqs:SendMessage", queue, {"aws:SourceArn": source})
        return evaluate(request, [], resource=[policy])

    assert send(resolver.get_att("InstanceStateRule", "Arn")) is Decision.ALLOW
    assert send(resolver.get_att("InterruptionRule", "Arn")) is Decision.ALLOW
    assert send(f"arn:aws:events:{REGION}:{ACCOUNT}:rule/someone-elses-rule") is not Decision.ALLOW
