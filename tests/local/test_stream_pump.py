"""The stream pump: the table's real stream (moto), the template-style filter, batches, redelivery.

The pump is given its handler, so these tests prove it with small handlers of their own; the
cleanup function is only plugged in by the embedded server.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from fleetkeeper import aws
from fleetkeeper.local.stream_pump import StreamPump, StreamSource

if TYPE_CHECKING:
    from collections.abc import Callable

# What the cleanup's event source declares: only REMOVE of service items (SK = META).
SERVICE_REMOVALS = {"eventName": ["REMOVE"], "dynamodb": {"Keys": {"SK": {"S": ["META"]}}}}


def source(**overrides: Any) -> StreamSource:
    settings: dict[str, Any] = {
        "function_name": "CleanupFunction",
        "patterns": [SERVICE_REMOVALS],
        "batch_size": 10,
    }
    settings.update(overrides)
    return StreamSource(**settings)


class Recorder:
    """A handler that records what it was given and fails as told (by the record's service name)."""

    def __init__(self, fail: Callable[[str, int], bool] | None = None, raise_on: set[str] | None = None) -> None:
        self.batches: list[list[str]] = []
        self.fail = fail or (lambda _name, _attempt: False)
        self.raise_on = raise_on or set()
        self.attempts: dict[str, int] = {}

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        assert context.get_remaining_time_in_millis() > 0
        names = [r["dynamodb"]["Keys"]["PK"]["S"].removeprefix("SVC#") for r in event["Records"]]
        self.batches.append(names)
        if self.raise_on & set(names):
            raise RuntimeError("boom")
        failures = []
        for record, name in zip(event["Records"], names, strict=True):
            self.attempts[name] = self.attempts.get(name, 0) + 1
            if self.fail(name, self.attempts[name]):
                failures.append({"itemIdentifier": record["dynamodb"]["SequenceNumber"]})
        return {"batchItemFailures": failures}

    @property
    def delivered(self) -> list[str]:
        return [name for batch in self.batches for name in batch]


def put(table: str, pk: str, sk: str, **extra: str) -> None:
    item = {"PK": {"S": pk}, "SK": {"S": sk}, **{k: {"S": v} for k, v in extra.items()}}
    aws.dynamodb().put_item(TableName=table, Item=item)


def remove(table: str, pk: str, sk: str) -> None:
    aws.dynamodb().delete_item(TableName=table, Key={"PK": {"S": pk}, "SK": {"S": sk}})


def make_pump(table: str, handler: Any, **overrides: Any) -> StreamPump:
    arn = aws.dynamodb().describe_table(TableName=table)["Table"]["LatestStreamArn"]
    client = boto3.client("dynamodbstreams", region_name="us-east-1")
    return StreamPump(client, arn, source(**overrides), handler)


def drain(pump: StreamPump, polls: int = 10) -> None:
    for _ in range(polls):
        pump.poll_once()


def removed_services(table: str, *names: str) -> None:
    """Create and then remove each service item, with a version item written and removed too."""
    for name in names:
        put(table, f"SVC#{name}", "META", uid="u")
        put(table, f"SVC#{name}", "V#u#0000000001", uid="u")
    for name in names:
        remove(table, f"SVC#{name}", "V#u#0000000001")
        remove(table, f"SVC#{name}", "META")


def test_only_records_the_filter_admits_reach_the_handler(table: str) -> None:
    handler = Recorder()
    pump = make_pump(table, handler)
    put(table, "SVC#a", "META", uid="u")  # INSERT: filtered out
    put(table, "SVC#a", "META", uid="u2")  # MODIFY: filtered out
    put(table, "SVC#a", "V#u#0000000001")
    remove(table, "SVC#a", "V#u#0000000001")  # REMOVE of a version item: filtered out
    remove(table, "SVC#a", "META")  # REMOVE of the service item: delivered
    drain(pump)
    assert handler.delivered == ["a"]
    assert pump.delivered == 1


def test_records_are_shaped_as_lambda_delivers_them(table: str) -> None:
    seen: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        seen.extend(event["Records"])
        return {"batchItemFailures": []}

    pump = make_pump(table, handler)
    removed_services(table, "web")
    drain(pump)
    (record,) = seen
    assert record["eventName"] == "REMOVE" and record["eventSource"] == "aws:dynamodb"
    assert record["eventSourceARN"] == pump.stream_arn
    assert record["dynamodb"]["OldImage"]["uid"] == {"S": "u"}
    assert isinstance(record["dynamodb"]["ApproximateCreationDateTime"], int)
    json.dumps(record)  # plain JSON, as Lambda hands it over


def test_batches_are_no_larger_than_the_batch_size_and_keep_stream_order(table: str) -> None:
    handler = Recorder()
    pump = make_pump(table, handler, batch_size=2)
    names = [f"s{i}" for i in range(5)]
    removed_services(table, *names)
    drain(pump)
    assert handler.delivered == names
    assert [len(b) for b in handler.batches] == [2, 2, 1]


def test_batch_item_failures_are_redelivered_from_the_first_failed_record(table: str) -> None:
    handler = Recorder(fail=lambda name, attempt: name == "b" and attempt == 1)
    pump = make_pump(table, handler)
    removed_services(table, "a", "b", "c")
    drain(pump)
    # a is checkpointed; b failed, so b and everything after it in the batch come again.
    assert handler.batches == [["a", "b", "c"], ["b", "c"]]
    assert pump.delivered == 3 and pump.discarded == 0


def test_a_handler_error_retries_the_batch_bisected_when_the_template_says_so(table: str) -> None:
    handler = Recorder(raise_on={"b"})
    pump = make_pump(table, handler, bisect_on_error=True, maximum_retry_attempts=2)
    removed_services(table, "a", "b", "c", "d")
    drain(pump)
    # Each failure halves the next batch until the bad record is alone; it is then retried on its
    # own until the retry limit, and the records after it flow again.
    assert handler.batches == [
        ["a", "b", "c", "d"],
        ["a", "b"],
        ["a"],
        ["b", "c", "d"],
        ["b"],
        ["b"],
        ["c", "d"],
    ]
    assert pump.discarded == 1 and pump.delivered == 3


def test_a_record_that_keeps_failing_is_discarded_after_maximum_retry_attempts(table: str) -> None:
    handler = Recorder(fail=lambda name, _attempt: name == "poison")
    pump = make_pump(table, handler, maximum_retry_attempts=2, batch_size=2)
    removed_services(table, "ok1", "poison", "ok2")
    drain(pump)
    assert handler.batches == [["ok1", "poison"], ["poison"], ["poison"], ["ok2"]]
    assert handler.attempts["poison"] == 3  # the first attempt and 2 retries
    assert pump.discarded == 1 and pump.delivered == 2


def test_records_retried_with_a_poisoned_one_are_discarded_with_it_as_in_lambda(table: str) -> None:
    handler = Recorder(fail=lambda name, _attempt: name == "poison")
    pump = make_pump(table, handler, maximum_retry_attempts=1, batch_size=10)
    removed_services(table, "ok1", "poison", "ok2")
    drain(pump)
    assert handler.batches == [["ok1", "poison", "ok2"], ["poison", "ok2"]]
    assert pump.discarded == 2 and pump.delivered == 1


def test_without_a_retry_limit_a_failing_record_blocks_its_shard(table: str) -> None:
    handler = Recorder(fail=lambda name, attempt: name == "slow" and attempt < 5)
    pump = make_pump(table, handler)  # MaximumRetryAttempts -1: retry until it succeeds
    removed_services(table, "slow", "next")
    drain(pump, polls=3)
    assert pump.delivered == 0  # nothing is checkpointed past the failing record
    assert all(batch == ["slow", "next"] for batch in handler.batches)
    drain(pump, polls=5)
    assert pump.delivered == 2 and pump.discarded == 0


def test_an_unknown_item_identifier_fails_the_whole_batch(table: str) -> None:
    calls: list[int] = []

    def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        calls.append(len(event["Records"]))
        return {"batchItemFailures": [{"itemIdentifier": "nonsense"}]} if len(calls) == 1 else {}

    pump = make_pump(table, handler)
    removed_services(table, "a", "b")
    drain(pump)
    assert calls == [2, 2]


def test_records_written_later_are_picked_up_by_later_polls(table: str) -> None:
    handler = Recorder()
    pump = make_pump(table, handler)
    removed_services(table, "first")
    drain(pump, polls=2)
    removed_services(table, "second")
    drain(pump, polls=2)
    assert handler.delivered == ["first", "second"]


# --- settings from template.yaml ------------------------------------------------------------------------


def cleanup_template(**event_props: Any) -> dict[str, Any]:
    return {
        "Globals": {"Function": {"Timeout": 30}},
        "Resources": {
            "CleanupFunction": {
                "Type": "AWS::Serverless::Function",
                "Properties": {
                    "Timeout": 120,
                    "Events": {
                        "Schedule": {"Type": "Schedule", "Properties": {}},
                        "Stream": {"Type": "DynamoDB", "Properties": event_props},
                    },
                },
            }
        },
    }


def test_settings_come_from_the_templates_cleanup_event_source() -> None:
    template = cleanup_template(
        Stream="arn",
        StartingPosition="LATEST",
        BatchSize=25,
        MaximumRetryAttempts=4,
        BisectBatchOnFunctionError=True,
        FilterCriteria={"Filters": [{"Pattern": json.dumps(SERVICE_REMOVALS)}]},
    )
    settings = StreamSource.from_template(template)
    assert settings == StreamSource(
        function_name="CleanupFunction",
        patterns=[SERVICE_REMOVALS],
        batch_size=25,
        starting_position="LATEST",
        maximum_retry_attempts=4,
        bisect_on_error=True,
        timeout_seconds=120,
    )


def test_lambda_defaults_apply_where_the_template_is_silent() -> None:
    template = cleanup_template(Stream="arn")
    del template["Resources"]["CleanupFunction"]["Properties"]["Timeout"]
    settings = StreamSource.from_template(template)
    assert settings is not None
    assert (settings.batch_size, settings.maximum_retry_attempts, settings.bisect_on_error) == (
        100,
        -1,
        False,
    )
    assert settings.patterns == [] and settings.timeout_seconds == 30


def test_no_cleanup_event_source_means_no_pump() -> None:
    assert StreamSource.from_template({"Resources": {}}) is None


def test_the_real_templates_filter_admits_service_removals_only(table: str) -> None:
    from fleetkeeper.local.template import load_template

    settings = StreamSource.from_template(load_template())
    assert settings is not None
    handler = Recorder()
    arn = aws.dynamodb().describe_table(TableName=table)["Table"]["LatestStreamArn"]
    pump = StreamPump(boto3.client("dynamodbstreams", region_name="us-east-1"), arn, settings, handler)
    removed_services(table, "web")
    drain(pump)
    assert handler.delivered == ["web"]


def test_removals_after_a_cancelled_transaction_still_reach_the_handler(table: str) -> None:
    # moto restores a copy of the table (its stream shard included) when a transaction is
    # cancelled, as a duplicate create or a stale If-Match cancels one; an iterator chained from
    # before that point reads the discarded shard and never sees a record again.
    handler = Recorder()
    pump = make_pump(table, handler)
    removed_services(table, "first")
    drain(pump)
    duplicate = {"TableName": table, "Item": {"PK": {"S": "SVC#x"}, "SK": {"S": "META"}}}
    put(table, "SVC#x", "META")
    with pytest.raises(aws.dynamodb().exceptions.TransactionCanceledException):
        aws.dynamodb().transact_write_items(
            TransactItems=[{"Put": {**duplicate, "ConditionExpression": "attribute_not_exists(PK)"}}]
        )
    removed_services(table, "second")
    drain(pump)
    assert handler.delivered == ["first", "second"]


def test_the_checkpoint_stops_before_a_record_to_be_delivered_again(table: str) -> None:
    # What the pump is done with (delivered, or filtered out) the embedded mode drops from the
    # in-memory stream; a record that failed, and everything after it, must stay.
    handler = Recorder(fail=lambda name, _attempt: name == "b")
    checkpoints: list[tuple[str, int]] = []
    pump = make_pump(table, handler, maximum_retry_attempts=-1)
    pump.on_checkpoint = lambda shard, sequence: checkpoints.append((shard, sequence))
    removed_services(table, "a", "b")
    drain(pump, polls=3)
    first_b = next(
        int(record["dynamodb"]["SequenceNumber"])
        for record in pump._shards[checkpoints[0][0]].pending
        if record["dynamodb"]["Keys"]["PK"]["S"] == "SVC#b"
    )
    assert [sequence for _, sequence in checkpoints] == [first_b - 1]  # reported once, not per poll
    handler.fail = lambda _name, _attempt: False
    drain(pump, polls=1)
    assert handler.delivered[-1] == "b" and checkpoints[-1][1] == first_b  # b was the last record
