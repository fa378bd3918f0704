"""Alarms: each one watches what the operations section says, and notifies the topic when given."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cfn import Resolver, refers_to, resources_of_type, sam_template, translate

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
