"""The cleanup function's stream mapping as CloudFormation receives it.

The filter is checked by behaviour (fleetkeeper.eventfilter evaluates it as Lambda does): REMOVE of
a service item goes through; the cleanup's own deletes of versions and replicas, and every INSERT or
MODIFY, do not.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.eventfilter import matches_any, patterns_of
from tests.cfn import (
    as_list,
    function_role,
    refers_to,
    resources_of_type,
    role_statements,
    statements_granting,
    translate,
)


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    translated = translate()
    assert "CleanupFunction" in translated["Resources"]
    return translated


@pytest.fixture(scope="module")
def mapping(translated: dict[str, Any]) -> dict[str, Any]:
    mappings = [
        body["Properties"]
        for body in resources_of_type(translated, "AWS::Lambda::EventSourceMapping").values()
        if refers_to(body["Properties"]["FunctionName"], "CleanupFunction")
    ]
    assert len(mappings) == 1, mappings
    return mappings[0]


def stream_record(event_name: str, sk: str) -> dict[str, Any]:
    keys = {"PK": {"S": "SVC#web"}, "SK": {"S": sk}}
    image = {**keys, "uid": {"S": "u1"}}
    dynamodb: dict[str, Any] = {"Keys": keys}
    if event_name != "INSERT":
        dynamodb["OldImage"] = image
    if event_name != "REMOVE":
        dynamodb["NewImage"] = image
    return {"eventName": event_name, "eventSource": "aws:dynamodb", "dynamodb": dynamodb}


def test_reads_the_tables_stream(mapping: dict[str, Any]) -> None:
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": ["Table", "StreamArn"]}


def test_filter_passes_only_removed_services(mapping: dict[str, Any]) -> None:
    patterns = patterns_of(mapping["FilterCriteria"])
    assert patterns, "no filter: the cleanup's own deletes would trigger it again"
    assert matches_any(patterns, stream_record("REMOVE", "META"))
    for event_name, sk in [
        ("INSERT", "META"),
        ("MODIFY", "META"),
        ("REMOVE", "V#u1#0000000001"),
        ("REMOVE", "R#u1#0000000001"),
    ]:
        assert not matches_any(patterns, stream_record(event_name, sk)), (event_name, sk)


def test_failures_are_bisected_retried_finitely_and_reported_per_item(mapping: dict[str, Any]) -> None:
    assert mapping["BisectBatchOnFunctionError"] is True
    retries = int(mapping["MaximumRetryAttempts"])
    assert 0 <= retries <= 100, f"retries must be finite (-1 is forever): {retries}"
    assert "ReportBatchItemFailures" in mapping["FunctionResponseTypes"]


def test_exhausted_records_go_to_an_alarmed_queue(translated: dict[str, Any], mapping: dict[str, Any]) -> None:
    destination = mapping["DestinationConfig"]["OnFailure"]["Destination"]
    queues = resources_of_type(translated, "AWS::SQS::Queue")
    targets = [lid for lid in queues if refers_to(destination, lid)]
    assert len(targets) == 1, destination
    queue = targets[0]
    alarms = [
        alarm["Properties"]
        for alarm in resources_of_type(translated, "AWS::CloudWatch::Alarm").values()
        if alarm["Properties"].get("Namespace") == "AWS/SQS"
        and any(refers_to(d["Value"], queue) for d in alarm["Properties"].get("Dimensions", []))
    ]
    assert alarms, f"no alarm on the depth of {queue}"
    role = function_role(translated, "CleanupFunction")
    senders = statements_granting(role_statements(translated, role), "sqs:SendMessage")
    assert senders and all(refers_to(r, queue) for s in senders for r in as_list(s["Resource"])), senders


def test_cleanup_only_queries_and_deletes_on_the_table(translated: dict[str, Any]) -> None:
    role = function_role(translated, "CleanupFunction")
    stream_reads = {
        "dynamodb:DescribeStream",
        "dynamodb:GetRecords",
        "dynamodb:GetShardIterator",
        "dynamodb:ListStreams",
    }
    table_actions = {"dynamodb:Query", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem", "dynamodb:GetItem"}
    for statement in role_statements(translated, role):
        actions = {str(a) for a in as_list(statement["Action"]) if str(a).startswith("dynamodb:")}
        assert actions <= stream_reads | table_actions, actions - stream_reads - table_actions
        if actions and actions != {"dynamodb:ListStreams"}:  # ListStreams has no resource-level permissions
            assert all(refers_to(r, "Table") for r in as_list(statement["Resource"])), statement
