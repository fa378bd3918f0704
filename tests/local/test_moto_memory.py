"""The in-memory AWS keeps what a session's history would grow bounded (fleetkeeper/local/moto_memory.py).

Counted, not timed: moto's tracked model objects, live table objects (a cancelled transaction's
orphaned copies included), stream records and shard iterators after a few rounds of the writes a
rolling update makes, and after ten times as many. Memory itself is the soak bench's
(bench/local_soak.py).
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError

from fleetkeeper.local import moto_memory
from fleetkeeper.local.auth import new_access_key_id
from fleetkeeper.local.in_memory_aws import InMemoryAws
from fleetkeeper.local.stream_pump import StreamPump, StreamSource
from fleetkeeper.local.template import create_table

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
TABLE = "fk-memory"
REMOVALS = {"eventName": ["REMOVE"], "dynamodb": {"Keys": {"SK": {"S": ["META"]}}}}


class Aws:
    def __init__(self, endpoint: str, key: str) -> None:
        self.endpoint, self.key = endpoint, key

    def client(self, service: str) -> Any:
        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key,
            aws_secret_access_key="x",
        )


@pytest.fixture
def in_memory() -> Iterator[Aws]:
    key = new_access_key_id()
    server = InMemoryAws("127.0.0.1", key)
    server.start()
    aws = Aws(server.endpoint, key)
    create_table(aws.client("dynamodb"), TABLE)
    try:
        yield aws
    finally:
        aws.client("dynamodb").delete_table(TableName=TABLE)
        server.stop()


def item(pk: str, sk: str, **values: str) -> dict[str, Any]:
    return {"PK": {"S": pk}, "SK": {"S": sk}, **{k: {"S": v} for k, v in values.items()}}


def a_round(ddb: Any, number: int) -> None:
    """What one rolling update writes, in kind: items put, updated and read, a transaction that
    commits and one whose condition fails (moto then restores its backup), a service removed."""
    ddb.put_item(TableName=TABLE, Item=item("SVC#web", f"V#{number}", spec="x" * 200))
    ddb.update_item(
        TableName=TABLE,
        Key={"PK": {"S": "SVC#web"}, "SK": {"S": "META"}},
        UpdateExpression="SET generation = :g",
        ExpressionAttributeValues={":g": {"N": str(number)}},
    )
    ddb.transact_write_items(
        TransactItems=[{"Put": {"TableName": TABLE, "Item": item("SVC#web", "R#0", version=str(number))}}]
    )
    with pytest.raises(ClientError):
        ddb.transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": TABLE,
                        "Item": item("SVC#web", "META"),
                        "ConditionExpression": "attribute_not_exists(PK)",
                    }
                }
            ]
        )
    ddb.get_item(TableName=TABLE, Key={"PK": {"S": "SVC#web"}, "SK": {"S": "META"}})
    ddb.query(TableName=TABLE, KeyConditionExpression="PK = :pk", ExpressionAttributeValues={":pk": {"S": "SVC#web"}})
    ddb.put_item(TableName=TABLE, Item=item(f"SVC#gone-{number}", "META"))
    ddb.delete_item(TableName=TABLE, Key={"PK": {"S": f"SVC#gone-{number}"}, "SK": {"S": "META"}})
    ddb.delete_item(TableName=TABLE, Key={"PK": {"S": "SVC#web"}, "SK": {"S": f"V#{number}"}})


def test_what_the_in_memory_aws_retains_does_not_grow_with_the_rounds(in_memory: Aws) -> None:
    ddb = in_memory.client("dynamodb")
    arn = ddb.describe_table(TableName=TABLE)["Table"]["LatestStreamArn"]
    delivered: list[str] = []

    def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        delivered.extend(r["dynamodb"]["Keys"]["PK"]["S"] for r in event["Records"])
        return {"batchItemFailures": []}

    pump = StreamPump(
        in_memory.client("dynamodbstreams"),
        arn,
        StreamSource("CleanupFunction", patterns=[REMOVALS]),
        handler,
        on_checkpoint=lambda shard, sequence: moto_memory.trim_stream(TABLE, shard, sequence),
    )

    def rounds(start: int, count: int) -> moto_memory.Retained:
        for number in range(start, start + count):
            a_round(ddb, number)
            pump.poll_once()
        return moto_memory.retained()

    early = rounds(0, 3)
    late = rounds(3, 27)
    assert delivered == [f"SVC#gone-{n}" for n in range(30)]  # the trimming lost no record
    assert late.tracked_models == early.tracked_models == 0
    assert late.tables == early.tables == 1  # no cancelled transaction's orphaned table left alive
    assert late.stream_records == early.stream_records == 0  # every record read is done with
    assert late.shard_iterators <= moto_memory.MAX_SHARD_ITERATORS


def test_a_read_below_the_trim_horizon_is_refused_as_dynamodb_refuses_it(in_memory: Aws) -> None:
    ddb, streams = in_memory.client("dynamodb"), in_memory.client("dynamodbstreams")
    for n in range(3):
        ddb.put_item(TableName=TABLE, Item=item(f"SVC#{n}", "META"))
    arn = ddb.describe_table(TableName=TABLE)["Table"]["LatestStreamArn"]
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]
    first = int(shard["SequenceNumberRange"]["StartingSequenceNumber"])

    assert moto_memory.trim_stream(TABLE, shard["ShardId"], first + 1) == 2

    horizon = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]
    assert int(horizon["SequenceNumberRange"]["StartingSequenceNumber"]) == first + 2
    oldest = streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")
    records = streams.get_records(ShardIterator=oldest["ShardIterator"])["Records"]
    assert [r["dynamodb"]["Keys"]["PK"]["S"] for r in records] == ["SVC#2"]
    trimmed = streams.get_shard_iterator(
        StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="AT_SEQUENCE_NUMBER", SequenceNumber=str(first)
    )
    with pytest.raises(ClientError) as refused:
        streams.get_records(ShardIterator=trimmed["ShardIterator"])
    assert refused.value.response["Error"]["Code"] == "TrimmedDataAccessException"


def test_an_iterator_reads_the_tables_stream_after_a_cancelled_transaction(in_memory: Aws) -> None:
    # moto puts its backup copy in the table's place when it cancels a transaction: an iterator
    # that held the old table's shard read a stream that never grew again (and kept the table alive).
    ddb, streams = in_memory.client("dynamodb"), in_memory.client("dynamodbstreams")
    arn = ddb.describe_table(TableName=TABLE)["Table"]["LatestStreamArn"]
    shard_id = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard_id, ShardIteratorType="LATEST")["ShardIterator"]
    ddb.put_item(TableName=TABLE, Item=item("SVC#x", "META"))
    with pytest.raises(ClientError):
        ddb.transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": TABLE,
                        "Item": item("SVC#x", "META"),
                        "ConditionExpression": "attribute_not_exists(PK)",
                    }
                }
            ]
        )
    ddb.put_item(TableName=TABLE, Item=item("SVC#y", "META"))
    records = streams.get_records(ShardIterator=iterator)["Records"]
    assert [r["dynamodb"]["Keys"]["PK"]["S"] for r in records] == ["SVC#x", "SVC#y"]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_shard_iterators_are_kept_for_their_lifetime_and_up_to_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.core.exceptions import JsonRESTError

    clock = _Clock()
    monkeypatch.setattr(moto_memory.time, "monotonic", clock.monotonic)
    kept = moto_memory.RecentIterators(lifetime=900, limit=3)
    for n in range(5):
        kept[f"it-{n}"] = n
    assert list(kept) == ["it-2", "it-3", "it-4"]  # the oldest go first
    with pytest.raises(JsonRESTError) as gone:
        kept["it-0"]
    assert gone.value.error_type == "ExpiredIteratorException"
    clock.now += 600
    assert kept["it-2"] == 2  # 600 s old: still good
    clock.now += 301  # 901 s old: expired, as a DynamoDB Streams iterator is after 15 minutes
    with pytest.raises(JsonRESTError):
        kept["it-3"]
    assert list(kept) == []


def test_moto_is_pinned_to_the_release_the_patches_were_checked_against() -> None:
    # moto_memory replaces internals of moto's DynamoDB, DynamoDB Streams and BaseModel: another
    # release may have moved them.
    local = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["local"]
    pins = [re.fullmatch(r"moto\[[^\]]*\]==(\S+)", entry) for entry in local if entry.startswith("moto")]
    assert [p.group(1) for p in pins if p] == [moto_memory.CHECKED_MOTO]
    assert version("moto") == moto_memory.CHECKED_MOTO
