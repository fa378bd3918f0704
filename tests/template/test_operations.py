"""Alarms: each one watches what the operations section says, and notifies the topic when given."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cfn import Resolver, refers_to, resources_of_type, sam_template, translate

TOPIC = "arn:aws:sns:us-east-1:123456789012:fleetkeeper-alarms"


def alarms(translated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {lid: a["Properties"] for lid, a in resources_of_type(translated, "AWS::CloudWatch::Alarm").items()}


def alarms_on(translated: dict[str, Any], namespace: str, metric: str) -> list[dict[str, Any]]:
    return [a for a in alarms(translated).values() if a["Namespace"] == namespace and a["MetricName"] == metric]


def test_every_alarm_notifies_the_topic_only_when_one_is_given() -> None:
    silent = translate()
    notifying = translate(overrides={"AlarmTopicArn": TOPIC})
    assert alarms(silent)
    for lid in alarms(silent):
        assert Resolver(silent).resolve(alarms(silent)[lid].get("AlarmActions")) in (None, []), lid
        assert Resolver(notifying).resolve(alarms(notifying)[lid].get("AlarmActions")) == [TOPIC], lid


def test_api_5xx_and_api_function_errors_are_alarmed(translated: dict[str, Any]) -> None:
    (server_errors,) = alarms_on(translated, "AWS/ApiGateway", "5XXError")
    dimensions = {d["Name"]: Resolver(translated).resolve(d["Value"]) for d in server_errors["Dimensions"]}
    # The API's name as deployed, and its one stage: a typo here is an alarm that never fires.
    api = translated["Resources"]["Api"]["Properties"]
    assert dimensions == {"ApiName": Resolver(translated).resolve(api["Name"]), "Stage": "api"}
    function_errors = alarms_on(translated, "AWS/Lambda", "Errors")
    assert any(refers_to(a["Dimensions"][0]["Value"], "ApiFunction") for a in function_errors)


def test_a_kick_queue_backlog_is_alarmed_on_visible_messages_only(translated: dict[str, Any]) -> None:
    """Spot warnings share the kick queue with the account's EC2 state changes and the api's kicks:
    a backlog there is a late drain. Delayed follow-ups are not visible, so they never trip it."""
    on_kicks = [
        a
        for a in alarms_on(translated, "AWS/SQS", "ApproximateNumberOfMessagesVisible")
        if [d["Value"] for d in a["Dimensions"] if d["Name"] == "QueueName"]
        == [{"Fn::GetAtt": ["KickQueue", "QueueName"]}]
    ]
    (behind,) = on_kicks
    assert len(behind["Dimensions"]) == 1
    assert behind["Statistic"] == "Maximum" and behind["Period"] == 60
    assert behind["EvaluationPeriods"] == behind["DatapointsToAlarm"] == 2
    assert behind["TreatMissingData"] == "notBreaching"  # an idle queue reports nothing
    assert "ReconcilerKickConcurrency" in behind["AlarmDescription"]


def test_the_services_indexs_throttled_writes_are_alarmed(translated: dict[str, Any]) -> None:
    """Every service item writes to the index's one partition key: its throttling (which throttles the
    table's write too) is alarmed, on the index's own metric (both dimensions, or it is the table's)."""
    from fleetkeeper.store.keys import SERVICES_INDEX

    (throttled,) = alarms_on(translated, "AWS/DynamoDB", "WriteThrottleEvents")
    dimensions = {d["Name"]: d["Value"] for d in throttled["Dimensions"]}
    assert dimensions == {"TableName": {"Ref": "Table"}, "GlobalSecondaryIndexName": SERVICES_INDEX}
    indexes = translated["Resources"]["Table"]["Properties"]["GlobalSecondaryIndexes"]
    assert [index["IndexName"] for index in indexes] == [SERVICES_INDEX]
    assert throttled["TreatMissingData"] == "notBreaching"


@pytest.fixture(scope="module")
def with_reconciler(translated: dict[str, Any]) -> dict[str, Any]:
    assert "ReconcilerFunction" in translated["Resources"]
    return translated


def test_reconciler_errors_are_alarmed(with_reconciler: dict[str, Any]) -> None:
    errors = alarms_on(with_reconciler, "AWS/Lambda", "Errors")
    assert any(
        d["Name"] == "FunctionName" and refers_to(d["Value"], "ReconcilerFunction")
        for a in errors
        for d in a["Dimensions"]
    ), errors


def test_a_reconciler_that_stops_completing_runs_is_alarmed_within_five_minutes(
    with_reconciler: dict[str, Any],
) -> None:
    (stalled,) = alarms_on(with_reconciler, "fleetkeeper", "ReconcileCompleted")
    # A reconciler that never starts emits nothing: missing data must count as "no run completed".
    assert stalled["TreatMissingData"] == "breaching"
    assert stalled["ComparisonOperator"] == "LessThanThreshold"
    assert float(stalled["Threshold"]) == 1
    assert stalled["Statistic"] == "Sum"
    window = int(stalled["Period"]) * int(stalled["EvaluationPeriods"])
    assert window == 300, f"the alarm looks at {window}s, not 5 minutes"
    assert int(stalled.get("DatapointsToAlarm", stalled["EvaluationPeriods"])) == int(stalled["EvaluationPeriods"])
    # Powertools Metrics adds a `service` dimension; the alarm must name the same one, or it
    # watches a metric nobody emits.
    service = sam_template()["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
    reconciler_env = with_reconciler["Resources"]["ReconcilerFunction"]["Properties"]["Environment"]["Variables"]
    assert reconciler_env.get("POWERTOOLS_SERVICE_NAME", service) == service
    assert reconciler_env.get("POWERTOOLS_METRICS_NAMESPACE") == "fleetkeeper"
    assert {d["Name"]: d["Value"] for d in stalled["Dimensions"]} == {"service": service}


# --- the dashboard ------------------------------------------------------------------------------------


def dashboard(translated: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's body as JSON, with each ${...} of its Fn::Sub replaced by what it names."""
    import json
    import re

    (body,) = resources_of_type(translated, "AWS::CloudWatch::Dashboard").values()
    text = body["Properties"]["DashboardBody"]["Fn::Sub"]
    names = set(translated["Resources"]) | {"AWS::Region", "AWS::StackName"}
    for ref in re.findall(r"\$\{([^}]+)\}", text):
        assert ref.split(".")[0] in names, f"the dashboard names {ref}, which the stack lacks"
    return dict(json.loads(re.sub(r"\$\{([^}]+)\}", r"<\1>", text)))


def test_the_dashboard_shows_what_the_issue_asks_for(with_reconciler: dict[str, Any]) -> None:
    widgets = dashboard(with_reconciler)["widgets"]
    metrics = {(m[0], m[1], m[3]) for w in widgets if w["type"] == "metric" for m in w["properties"]["metrics"]}
    assert {
        ("AWS/Lambda", "Invocations", "<ReconcilerFunction>"),  # reconcile runs
        ("AWS/Lambda", "Duration", "<ReconcilerFunction>"),  # and their duration
        ("AWS/Lambda", "Errors", "<ApiFunction>"),
        ("AWS/Lambda", "Errors", "<ReconcilerFunction>"),
        ("AWS/Lambda", "Errors", "<DispatcherFunction>"),
        ("AWS/Lambda", "Errors", "<CleanupFunction>"),
        ("AWS/ApiGateway", "4XXError", "<AWS::StackName>-api"),
        ("AWS/ApiGateway", "5XXError", "<AWS::StackName>-api"),
        ("AWS/ApiGateway", "Latency", "<AWS::StackName>-api"),
        ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "<CleanupFailureQueue.QueueName>"),  # the DLQ
    } <= metrics
    # Ready vs target per service: the reconciler's "status recorded" lines (reconciler/apply.py).
    (table,) = [w for w in widgets if w["type"] == "log"]
    query = table["properties"]["query"]
    assert "SOURCE '<ReconcilerLogGroup>'" in query and "filter message = 'status recorded'" in query
    assert "ready_replicas" in query and "target_replicas" in query and "by fleetkeeper_service" in query
