"""Helpers for the cleanup tests: seed an incarnation's children fast, read moto's stream, build
Lambda stream events, and a DynamoDB client with faults injected at the BatchWriteItem boundary."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.model import ReplicaRecord, ReplicaStatus, VersionRecord
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.codec import replica_item, to_raw, version_item
from fleetkeeper.store.keys import SERVICE_SK, child_prefixes, service_pk
from fleetkeeper.store.table import BATCH_WRITE_LIMIT
from tests import REPO_ROOT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

from tests.support.handler_client import FakeContext
from tests.support.specs import hello_spec

EVENT_PATH = REPO_ROOT / "events" / "cleanup_remove.json"


def seed_children(table: str, name: str, uid: str, *, versions: int, replicas: int = 0) -> None:
    """Version (and replica) items of one incarnation, as the api and reconciler write them, put with
    BatchWriteItem directly so 10,000 take seconds."""
    spec = ServiceSpec.model_validate(hello_spec())
    now = "2026-11-29T12:00:00.000Z"
    items = [
        version_item(VersionRecord(name=name, uid=uid, version=v, spec=spec, mode="rolling", created_at=now))
        for v in range(1, versions + 1)
    ] + [
        replica_item(
            ReplicaRecord(
                name=name,
                uid=uid,
                replica_id=r,
                version=max(versions, 1),
                status=ReplicaStatus.SHUTTING_DOWN,
                created_at=now,
                updated_at=now,
                instance_id=f"i-{r:017x}",
            )
        )
        for r in range(1, replicas + 1)
    ]
    client = aws.dynamodb()
    for start in range(0, len(items), BATCH_WRITE_LIMIT):
        chunk = items[start : start + BATCH_WRITE_LIMIT]
        response = client.batch_write_item(RequestItems={table: [{"PutRequest": {"Item": to_raw(i)}} for i in chunk]})
        assert not response.get("UnprocessedItems"), "moto does not defer writes"


def partition_keys(table: str, name: str) -> set[str]:
    """Every sort key under the service's partition (paginated)."""
    client = aws.dynamodb()
    keys: set[str] = set()
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "PK = :pk",
        "ExpressionAttributeValues": {":pk": {"S": service_pk(name)}},
        "ProjectionExpression": "SK",
    }
    while True:
        page = client.query(**kwargs)
        keys.update(item["SK"]["S"] for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return keys
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def children_of(keys: Iterable[str], uid: str) -> set[str]:
    prefixes = child_prefixes(uid)
    return {k for k in keys if k.startswith(prefixes)}


def count_calls(operation: str) -> list[dict[str, Any]]:
    """Records the parameters of every `operation` call the fleetkeeper DynamoDB client makes from now on."""
    calls: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        calls.append(params)

    aws.dynamodb().meta.events.register(f"provide-client-params.dynamodb.{operation}", record)
    return calls


class CleanupContext(FakeContext):
    """The cleanup function's Lambda context: 300 s to run (template.yaml's Timeout) unless told."""

    function_name = "fleetkeeper-cleanup"

    def __init__(self, remaining_ms: int = 300_000) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]
        return self.remaining_ms


# --- stream events ---------------------------------------------------------------------------------


def removal_record(
    name: str, uid: str, sequence_number: str, *, old_image: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A REMOVE record for service `name` (uid), shaped like events/cleanup_remove.json."""
    record = copy.deepcopy(json.loads(EVENT_PATH.read_text())["Records"][0])
    record["eventID"] = f"evt-{name}-{sequence_number}"
    record["dynamodb"]["Keys"] = to_raw({"PK": service_pk(name), "SK": SERVICE_SK})
    image = record["dynamodb"]["OldImage"]
    image.update(to_raw({"PK": service_pk(name), "list_sk": name, "name": name, "uid": uid}))
    if old_image is not None:
        record["dynamodb"]["OldImage"] = old_image
    record["dynamodb"]["SequenceNumber"] = sequence_number
    return record


def stream_records(table: str) -> list[dict[str, Any]]:
    """Every record moto's stream holds for the table, in the JSON shape Lambda hands to functions."""
    client = aws.dynamodb()
    streams = aws._client("dynamodbstreams")
    arn = client.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    records: list[dict[str, Any]] = []
    for shard in streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = streams.get_records(ShardIterator=iterator, Limit=1000)
            if not page["Records"]:
                break
            records.extend(page["Records"])
            iterator = page.get("NextShardIterator")
    return [_as_lambda_json(r, arn) for r in records]


def lambda_record(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A record of moto's stream shard (`StreamRecord.to_json()`, read from the backend without
    botocore) in the JSON shape Lambda hands to functions: what `stream_records` returns for it."""
    return _as_lambda_json(record, stream_arn)


def _as_lambda_json(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        if isinstance(value, datetime):
            # botocore parses the wire's timestamp as UTC; moto's backend holds it naive, in UTC.
            return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())
        return str(value)

    out: dict[str, Any] = json.loads(json.dumps(record, default=plain))
    out["eventSourceARN"] = stream_arn
    return out


# --- faults at the boundary ------------------------------------------------------------------------


def throttled(operation: str = "BatchWriteItem") -> ClientError:
    return ClientError(
        {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "Rate of requests exceeds"}},
        operation,
    )


def access_denied(operation: str = "BatchWriteItem") -> ClientError:
    return ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}, operation)


class FaultyClient:
    """The real (moto) DynamoDB client; each BatchWriteItem call first consults `fault`.

    `fault(request_items)` may raise (nothing is written), return a response to use instead of
    calling moto, or return None to let the real call through.
    """

    def __init__(self, real: Any, fault: Callable[[dict[str, Any], int], Any]) -> None:
        self.real = real
        self.fault = fault
        self.batch_calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def batch_write_item(self, **kwargs: Any) -> Any:
        self.batch_calls += 1
        replaced = self.fault(kwargs["RequestItems"], self.batch_calls)
        return replaced if replaced is not None else self.real.batch_write_item(**kwargs)


def defer_last(real: Any, request_items: dict[str, Any], deferred: int) -> dict[str, Any]:
    """Carry out all but the last `deferred` requests and hand those back as UnprocessedItems."""
    ((table, requests),) = request_items.items()
    done, left = requests[: len(requests) - deferred], requests[len(requests) - deferred :]
    if done:
        real.batch_write_item(RequestItems={table: done})
    return {"UnprocessedItems": {table: left} if left else {}}
