"""template.yaml's cleanup wiring, translated offline by samtranslator, and its stream filter evaluated
against the records moto's stream really produced for service, version and replica writes."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import MagicMock

import pytest

from fleetkeeper import aws
from fleetkeeper.cleanup import handler
from fleetkeeper.eventfilter import matches_any, patterns_of
from fleetkeeper.store.codec import to_raw
from fleetkeeper.store.keys import IDEMPOTENCY_PARTITION, SERVICE_SK, replica_sk, service_pk, version_sk
from fleetkeeper.template import load_template
from tests.cleanup_support import EVENT_PATH, CleanupContext, partition_keys, seed_children, stream_records
from tests.conftest import ApiClient, hello_spec


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    """The CloudFormation template SAM deploys, made offline (no AWS: the managed policy map is empty)."""
    from samtranslator.translator.managed_policy_translator import ManagedPolicyLoader
    from samtranslator.translator.transform import transform

    template = load_template()
    # `sam package` would upload functions/ and put its S3 location here.
    template["Globals"]["Function"]["CodeUri"] = "s3://fleetkeeper-artifacts/functions.zip"
    loader = MagicMock(spec=ManagedPolicyLoader)
    loader.load.return_value = {}
    out: dict[str, Any] = transform(template, {"AWS::Region": "us-east-1"}, loader)
    return out


def _of_type(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


@pytest.fixture(scope="module")
def mapping(translated: dict[str, Any]) -> dict[str, Any]:
    mappings = [
        m["Properties"]
        for m in _of_type(translated, "AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": "CleanupFunction"}
    ]
    assert len(mappings) == 1
    return mappings[0]


def test_the_mapping_reads_the_table_stream_with_partial_failures_bisect_and_bounded_retries(
    translated: dict[str, Any], mapping: dict[str, Any]
) -> None:
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": ["Table", "StreamArn"]}
    assert mapping["StartingPosition"] in {"TRIM_HORIZON", "LATEST"}
    assert 1 <= mapping["BatchSize"] <= 100
    assert mapping["BisectBatchOnFunctionError"] is True
    assert 0 <= mapping["MaximumRetryAttempts"] <= 10_000  # finite: -1 would retry until the record expires
    assert 60 <= mapping["MaximumRecordAgeInSeconds"] <= 86_400
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    destination = mapping["DestinationConfig"]["OnFailure"]["Destination"]
    assert destination == {"Fn::GetAtt": ["CleanupFailureQueue", "Arn"]}
    function = translated["Resources"]["CleanupFunction"]["Properties"]
    assert function["Handler"] == "fleetkeeper.cleanup.handler.lambda_handler"


def test_the_failure_queue_is_encrypted_keeps_14_days_and_is_alarmed(translated: dict[str, Any]) -> None:
    queue = translated["Resources"]["CleanupFailureQueue"]["Properties"]
    assert queue["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert queue.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in queue
    (alarm,) = [
        a["Properties"]
        for a in _of_type(translated, "AWS::CloudWatch::Alarm").values()
        if {"Name": "QueueName", "Value": {"Fn::GetAtt": ["CleanupFailureQueue", "QueueName"]}}
        in a["Properties"].get("Dimensions", [])
    ]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 0)
    assert "CleanupFailureQueueUrl" in translated["Outputs"]


def test_the_role_grants_only_what_cleanup_needs(translated: dict[str, Any]) -> None:
    function = translated["Resources"]["CleanupFunction"]["Properties"]
    assert function["Role"] == {"Fn::GetAtt": ["CleanupRole", "Arn"]}
    role = translated["Resources"]["CleanupRole"]["Properties"]
    assert not role.get("ManagedPolicyArns")  # SAM's stream policy would grant stream reads on "*"
    grants: dict[str, Any] = {}
    for policy in role["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow"
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            for action in actions:
                assert "*" not in action
                grants[action] = statement["Resource"]
    assert grants == {
        "dynamodb:Query": {"Fn::GetAtt": ["Table", "Arn"]},
        "dynamodb:BatchWriteItem": {"Fn::GetAtt": ["Table", "Arn"]},
        "dynamodb:DescribeStream": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "dynamodb:GetRecords": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "dynamodb:GetShardIterator": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "dynamodb:ListStreams": "*",  # the one action DynamoDB offers no resource-level permission for
        "sqs:SendMessage": {"Fn::GetAtt": ["CleanupFailureQueue", "Arn"]},
        "logs:CreateLogStream": {"Fn::GetAtt": ["CleanupLogGroup", "Arn"]},
        "logs:PutLogEvents": {"Fn::GetAtt": ["CleanupLogGroup", "Arn"]},
    }


def test_the_checked_in_event_passes_the_filter(mapping: dict[str, Any]) -> None:
    patterns = patterns_of(mapping["FilterCriteria"])
    (record,) = json.loads(EVENT_PATH.read_text())["Records"]
    assert matches_any(patterns, record)


def test_the_filter_admits_only_service_removals_of_real_stream_records(
    api: ApiClient, table: str, mapping: dict[str, Any]
) -> None:
    patterns = patterns_of(mapping["FilterCriteria"])
    assert patterns, "an empty filter would admit every record"
    client = aws.dynamodb()
    # Every kind of write the table sees: service and version INSERT (create), service MODIFY and
    # version INSERT (update), replica INSERT/MODIFY/REMOVE, version REMOVE, service REMOVE.
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers={"Idempotency-Key": "ci-run-1"})
    uid = created.body["uid"]
    assert (
        api.put("/v1/services/web", {"spec": hello_spec(run="python3 -m http.server $PORT --bind 0.0.0.0")}).status
        == 200
    )
    replica_key = {"PK": service_pk("web"), "SK": replica_sk(uid, 1)}
    client.put_item(TableName=table, Item=to_raw({**replica_key, "kind": "replica", "status": "PENDING"}))
    client.update_item(
        TableName=table,
        Key=to_raw(replica_key),
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues=to_raw({":s": "READY"}),
    )
    client.delete_item(TableName=table, Key=to_raw(replica_key))
    client.delete_item(TableName=table, Key=to_raw({"PK": service_pk("web"), "SK": version_sk(uid, 1)}))
    assert api.delete("/v1/services/web").status == 202  # MODIFY: lifecycle DELETING
    client.delete_item(TableName=table, Key=to_raw({"PK": service_pk("web"), "SK": SERVICE_SK}))
    # The idempotency record's expiry (TTL, which moto does not model) is a REMOVE too.
    (idempotency_key,) = [
        {"PK": i["PK"], "SK": i["SK"]}
        for i in client.scan(TableName=table)["Items"]
        if i["PK"]["S"] == IDEMPOTENCY_PARTITION
    ]
    client.delete_item(TableName=table, Key=idempotency_key)

    records = stream_records(table)
    kinds = {
        (r["eventName"], r["dynamodb"]["Keys"]["PK"]["S"][:3], r["dynamodb"]["Keys"]["SK"]["S"][:2]) for r in records
    }
    assert kinds == {
        ("INSERT", "SVC", "ME"), ("MODIFY", "SVC", "ME"), ("REMOVE", "SVC", "ME"),
        ("INSERT", "SVC", "V#"), ("REMOVE", "SVC", "V#"),
        ("INSERT", "SVC", "R#"), ("MODIFY", "SVC", "R#"), ("REMOVE", "SVC", "R#"),
        ("INSERT", "IDE", idempotency_key["SK"]["S"][:2]), ("MODIFY", "IDE", idempotency_key["SK"]["S"][:2]),
        ("REMOVE", "IDE", idempotency_key["SK"]["S"][:2]),
    }  # fmt: skip
    admitted = [r for r in records if matches_any(patterns, r)]
    assert [(r["eventName"], r["dynamodb"]["Keys"]["SK"]["S"]) for r in admitted] == [("REMOVE", SERVICE_SK)]
    assert admitted[0]["dynamodb"]["OldImage"]["uid"]["S"] == uid


def test_the_cleanups_own_deletes_do_not_trigger_it_again(api: ApiClient, table: str, mapping: dict[str, Any]) -> None:
    """The loop the filter exists for: cleanup deletes children, which must not reach cleanup."""
    patterns = patterns_of(mapping["FilterCriteria"])
    uid = api.post("/v1/services", {"name": "web", "spec": hello_spec()}).body["uid"]
    seed_children(table, "web", uid, versions=30, replicas=2)
    assert api.delete("/v1/services/web").status == 202
    aws.dynamodb().delete_item(TableName=table, Key=to_raw({"PK": service_pk("web"), "SK": SERVICE_SK}))
    before = stream_records(table)
    delivered = [r for r in before if matches_any(patterns, r)]
    assert len(delivered) == 1

    assert handler.lambda_handler({"Records": delivered}, CleanupContext()) == {"batchItemFailures": []}

    assert partition_keys(table, "web") == set()
    caused = stream_records(table)[len(before) :]
    assert len(caused) == 32 and {r["eventName"] for r in caused} == {"REMOVE"}
    assert not any(matches_any(patterns, r) for r in caused)
