"""The cleanup function's deployment as CloudFormation receives it: its stream mapping, its failure
queue and alarm, and its role.

The filter is checked by behaviour: fleetkeeper.aws.eventfilter (which the embedded mode's stream pump
uses too) evaluates it against records moto's stream really produced, and an independent matcher
written here the way AWS's Event Ruler works (flatten the record into leaf paths, then match each
pattern path) must agree with it on every one of them. Only a service item's REMOVE goes through;
the cleanup's own deletes of versions and replicas, and every INSERT or MODIFY, do not.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws
from fleetkeeper.aws.eventfilter import matches_any, patterns_of
from fleetkeeper.cleanup import handler
from fleetkeeper.store.codec import to_raw
from fleetkeeper.store.keys import IDEMPOTENCY_PARTITION, SERVICE_SK, replica_sk, service_pk, version_sk
from tests.support.cfn import as_list, refers_to, resources_of_type
from tests.support.cleanup_support import EVENT_PATH, CleanupContext, partition_keys, seed_children, stream_records
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def mapping(translated: dict[str, Any]) -> dict[str, Any]:
    mappings = [
        body["Properties"]
        for body in resources_of_type(translated, "AWS::Lambda::EventSourceMapping").values()
        if refers_to(body["Properties"]["FunctionName"], "CleanupFunction")
    ]
    assert len(mappings) == 1, mappings
    return mappings[0]


@pytest.fixture(scope="module")
def patterns(mapping: dict[str, Any]) -> list[dict[str, Any]]:
    found = patterns_of(mapping["FilterCriteria"])
    assert found, "no filter: the cleanup's own deletes would trigger it again"
    return found


# --- an independent matcher ----------------------------------------------------------------------


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every primitive of a JSON document with its path of keys; array elements share their array's path."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, (*path, key))
    elif isinstance(value, list):
        for child in value:
            yield from leaves(child, path)
    else:
        yield path, value


def pattern_paths(pattern: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], list[Any]]]:
    for key, rule in pattern.items():
        if isinstance(rule, dict):
            yield from pattern_paths(rule, (*path, key))
        else:
            yield (*path, key), rule


def same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, numbers) and isinstance(b, numbers):
        return a == b
    return type(a) is type(b) and a == b


def rule_holds(rule: Any, values: list[Any]) -> bool:
    """One alternative of a pattern path against the leaves at that path (none: the path is absent)."""
    if not isinstance(rule, dict):
        return any(same(rule, v) for v in values)
    ((operator, operand),) = rule.items()
    if operator == "exists":
        return bool(values) is operand
    if operator == "prefix":
        return any(isinstance(v, str) and v.startswith(operand) for v in values)
    if operator == "anything-but":
        excluded = operand if isinstance(operand, list) else [operand]
        return any(not any(same(v, x) for x in excluded) for v in values)
    if operator == "numeric":
        bounds = list(zip(operand[0::2], operand[1::2], strict=True))
        compare = {
            "=": lambda v, n: v == n,
            "<": lambda v, n: v < n,
            "<=": lambda v, n: v <= n,
            ">": lambda v, n: v > n,
            ">=": lambda v, n: v >= n,
        }
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        return any(all(compare[op](v, n) for op, n in bounds) for v in numbers)
    raise AssertionError(f"the independent matcher does not know {operator!r}")


def ruler_matches(pattern: dict[str, Any], record: Any) -> bool:
    at: dict[tuple[str, ...], list[Any]] = {}
    for path, value in leaves(record):
        at.setdefault(path, []).append(value)
    return all(any(rule_holds(rule, at.get(path, [])) for rule in rules) for path, rules in pattern_paths(pattern))


# Patterns beyond the template's, so the cross-check covers every operator eventfilter evaluates.
EXTRA_PATTERNS: list[dict[str, Any]] = [
    {"eventName": ["INSERT", "MODIFY"]},
    {"eventName": [{"anything-but": ["REMOVE"]}], "dynamodb": {"Keys": {"SK": {"S": [{"prefix": "V#"}]}}}},
    {"dynamodb": {"NewImage": {"lifecycle": {"S": ["DELETING"]}}}},
    {"dynamodb": {"OldImage": {"uid": {"S": [{"exists": True}]}, "status": {"S": [{"exists": False}]}}}},
    {"dynamodb": {"OldImage": [{"exists": True}]}},  # an object is no leaf: exists never matches it
    {"dynamodb": {"SizeBytes": [{"numeric": [">", 0, "<=", 400_000]}]}},
    {"eventSource": ["aws:dynamodb"], "dynamodb": {"Keys": {"PK": {"S": [{"prefix": IDEMPOTENCY_PARTITION}]}}}},
]


def admitted(patterns: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records the template's filter admits; both matchers must agree on every record and pattern."""
    for pattern in [*patterns, *EXTRA_PATTERNS]:
        for record in records:
            verdict = matches_any([pattern], record)
            assert verdict == ruler_matches(pattern, record), (pattern, record["eventName"], record["dynamodb"])
    return [r for r in records if matches_any(patterns, r)]


def test_the_independent_matcher_can_disagree() -> None:
    """It is no copy of eventfilter: it tells records apart by their leaves."""
    record = {"eventName": "REMOVE", "dynamodb": {"Keys": {"SK": {"S": "META"}}}}
    assert ruler_matches({"dynamodb": {"Keys": {"SK": {"S": ["META"]}}}}, record)
    assert not ruler_matches({"dynamodb": {"Keys": {"SK": {"S": ["V#"]}}}}, record)
    assert not ruler_matches({"dynamodb": {"Keys": [{"exists": True}]}}, record)
    assert ruler_matches({"dynamodb": {"Keys": {"PK": {"S": [{"exists": False}]}}}}, record)
    assert not ruler_matches({"eventName": [{"anything-but": "REMOVE"}]}, record)


# --- the mapping ---------------------------------------------------------------------------------


def test_the_mapping_reads_the_table_stream_in_small_bisected_batches(
    translated: dict[str, Any], mapping: dict[str, Any]
) -> None:
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": ["Table", "StreamArn"]}
    # Removals from before the mapping existed (last 24 h) are cleaned up too.
    assert mapping["StartingPosition"] == "TRIM_HORIZON"
    assert 1 <= mapping["BatchSize"] <= 100
    assert mapping["BisectBatchOnFunctionError"] is True
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert 60 <= mapping["MaximumRecordAgeInSeconds"] <= 86_400  # the stream keeps records 24 h
    function = translated["Resources"]["CleanupFunction"]["Properties"]
    assert function["Handler"] == "fleetkeeper.cleanup.handler.lambda_handler"


def test_retries_continue_a_long_cleanup_and_give_up_before_the_record_expires(
    translated: dict[str, Any], mapping: dict[str, Any]
) -> None:
    """A long history takes several attempts, each up to the function's timeout: at least one retry.
    After the last one the record goes to the failure queue, and that must happen by the retry count,
    not by the record's age: every attempt fits in MaximumRecordAgeInSeconds. (-1, retry forever,
    would block the shard's later removals for 24 h.)"""
    retries = int(mapping["MaximumRetryAttempts"])
    timeout = int(translated["Resources"]["CleanupFunction"]["Properties"]["Timeout"])
    assert retries >= 1, f"retries must be finite and continue a long cleanup: {retries}"
    assert (retries + 1) * timeout <= int(mapping["MaximumRecordAgeInSeconds"]), (retries, timeout)


def test_exhausted_records_go_to_an_encrypted_alarmed_queue_kept_14_days(
    translated: dict[str, Any], mapping: dict[str, Any]
) -> None:
    destination = mapping["DestinationConfig"]["OnFailure"]["Destination"]
    assert destination == {"Fn::GetAtt": ["CleanupFailureQueue", "Arn"]}
    queue = translated["Resources"]["CleanupFailureQueue"]["Properties"]
    assert queue["MessageRetentionPeriod"] == 14 * 24 * 3600
    assert queue.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in queue
    (alarm,) = [
        a["Properties"]
        for a in resources_of_type(translated, "AWS::CloudWatch::Alarm").values()
        if any(refers_to(d["Value"], "CleanupFailureQueue") for d in a["Properties"].get("Dimensions", []))
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
        for statement in as_list(policy["PolicyDocument"]["Statement"]):
            assert statement["Effect"] == "Allow"
            for action in as_list(statement["Action"]):
                assert "*" not in action
                grants[action] = statement["Resource"]
    assert grants == {
        # GetItem: the service item re-read before anything is deleted (a forged record deletes nothing).
        "dynamodb:GetItem": {"Fn::GetAtt": ["Table", "Arn"]},
        "dynamodb:Query": {"Fn::GetAtt": ["Table", "Arn"]},
        "dynamodb:BatchWriteItem": {"Fn::GetAtt": ["Table", "Arn"]},
        "dynamodb:DescribeStream": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "dynamodb:GetRecords": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "dynamodb:GetShardIterator": {"Fn::GetAtt": ["Table", "StreamArn"]},
        "dynamodb:ListStreams": "*",  # the one action DynamoDB offers no resource-level permission for
        "sqs:SendMessage": {"Fn::GetAtt": ["CleanupFailureQueue", "Arn"]},
        "logs:CreateLogStream": {"Fn::GetAtt": ["CleanupLogGroup", "Arn"]},
        "logs:PutLogEvents": {"Fn::GetAtt": ["CleanupLogGroup", "Arn"]},
        # What an incarnation keeps outside the table: its secrets, its workdir copies (services/ only).
        "ssm:GetParametersByPath": {"Fn::Sub": SECRETS_ARN},
        "ssm:DeleteParameters": {"Fn::Sub": SECRETS_ARN},
        "s3:ListBucket": {"Fn::GetAtt": ["WorkdirBucket", "Arn"]},
        "s3:DeleteObject": {"Fn::Sub": "${WorkdirBucket.Arn}/services/*"},
    }


SECRETS_ARN = "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter/fleetkeeper/${Table}/*"


# --- the filter ----------------------------------------------------------------------------------


def synthetic_record(event_name: str, sk: str) -> dict[str, Any]:
    keys = {"PK": {"S": "SVC#web"}, "SK": {"S": sk}}
    image = {**keys, "uid": {"S": "u1"}}
    dynamodb: dict[str, Any] = {"Keys": keys}
    if event_name != "INSERT":
        dynamodb["OldImage"] = image
    if event_name != "REMOVE":
        dynamodb["NewImage"] = image
    return {"eventName": event_name, "eventSource": "aws:dynamodb", "dynamodb": dynamodb}


def test_the_filter_passes_only_removed_services(patterns: list[dict[str, Any]]) -> None:
    records = [
        synthetic_record(event_name, sk)
        for event_name in ("INSERT", "MODIFY", "REMOVE")
        for sk in ("META", "V#u1#0000000001", "R#u1#0000000001")
    ]
    assert [(r["eventName"], r["dynamodb"]["Keys"]["SK"]["S"]) for r in admitted(patterns, records)] == [
        ("REMOVE", "META")
    ]


def test_the_checked_in_event_passes_the_filter(patterns: list[dict[str, Any]]) -> None:
    (record,) = json.loads(EVENT_PATH.read_text())["Records"]
    assert admitted(patterns, [record]) == [record]


def test_the_filter_admits_only_service_removals_of_real_stream_records(
    api: HandlerClient, table: str, patterns: list[dict[str, Any]]
) -> None:
    client = aws.dynamodb()
    # Every kind of write the table sees: service and version INSERT (create), service MODIFY and
    # version INSERT (update), replica INSERT/MODIFY/REMOVE, version REMOVE, service MODIFY (delete)
    # and REMOVE, the cleanup's own deletes, and a re-create of the name (a new uid).
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers={"Idempotency-Key": "ci-run-1"})
    uid = created.body["uid"]
    update = {"spec": hello_spec(run="python3 -m http.server $PORT --bind 0.0.0.0")}
    assert api.put("/v1/services/web", update).status == 200
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
    removal = [r for r in stream_records(table) if matches_any(patterns, r)]
    assert handler.lambda_handler({"Records": removal}, CleanupContext()) == {"batchItemFailures": []}
    recreated = api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert recreated.status == 201 and recreated.body["uid"] != uid

    records = stream_records(table)
    idempotency = idempotency_key["SK"]["S"][:2]
    kinds = {
        (r["eventName"], r["dynamodb"]["Keys"]["PK"]["S"][:3], r["dynamodb"]["Keys"]["SK"]["S"][:2]) for r in records
    }
    assert kinds == {
        ("INSERT", "SVC", "ME"), ("MODIFY", "SVC", "ME"), ("REMOVE", "SVC", "ME"),
        ("INSERT", "SVC", "V#"), ("REMOVE", "SVC", "V#"),
        ("INSERT", "SVC", "R#"), ("MODIFY", "SVC", "R#"), ("REMOVE", "SVC", "R#"),
        ("INSERT", "SVC", "E#"), ("REMOVE", "SVC", "E#"),
        ("INSERT", "IDE", idempotency), ("MODIFY", "IDE", idempotency), ("REMOVE", "IDE", idempotency),
    }  # fmt: skip
    passed = admitted(patterns, records)
    assert [(r["eventName"], r["dynamodb"]["Keys"]["SK"]["S"]) for r in passed] == [("REMOVE", SERVICE_SK)]
    assert passed[0]["dynamodb"]["OldImage"]["uid"]["S"] == uid


def test_the_cleanups_own_deletes_do_not_trigger_it_again(
    api: HandlerClient, table: str, patterns: list[dict[str, Any]]
) -> None:
    """The loop the filter exists for: cleanup deletes children, which must not reach cleanup."""
    uid = api.post("/v1/services", {"name": "web", "spec": hello_spec()}).body["uid"]
    seed_children(table, "web", uid, versions=30, replicas=2)
    assert api.delete("/v1/services/web").status == 202
    aws.dynamodb().delete_item(TableName=table, Key=to_raw({"PK": service_pk("web"), "SK": SERVICE_SK}))
    before = stream_records(table)
    delivered = admitted(patterns, before)
    assert len(delivered) == 1

    assert handler.lambda_handler({"Records": delivered}, CleanupContext()) == {"batchItemFailures": []}

    assert partition_keys(table, "web") == set()
    caused = stream_records(table)[len(before) :]
    # 30 versions, 2 replicas, and the service's 2 events (Created, Deleting).
    assert len(caused) == 34 and {r["eventName"] for r in caused} == {"REMOVE"}
    assert admitted(patterns, caused) == []
