"""The embedded mode's event source mapping: the table's stream, read and handed to a handler.

It does locally what Lambda's DynamoDB event source mapping does for the cleanup function, with
the settings template.yaml declares for it (read at startup, never restated here):

- reads every shard with the dynamodbstreams API (DescribeStream, GetShardIterator, GetRecords);
- drops records the mapping's FilterCriteria rejects (`fleetkeeper.aws.eventfilter`), so the cleanup's
  own deletes of version and replica items never reach it, as in AWS;
- hands the rest over in batches of at most BatchSize, as Lambda shapes them;
- ReportBatchItemFailures: the shard's checkpoint stops at the lowest failed SequenceNumber, and
  that record and every later one are delivered again;
- a handler that raises fails the whole batch; with BisectBatchOnFunctionError the retry carries
  half the batch;
- a retry carries the same records (from the failed one on), never newer ones;
- after MaximumRetryAttempts failed deliveries the retried batch is discarded (in AWS: described to
  the OnFailure destination) and logged, so one poisoned record cannot block the shard forever.

Each shard's checkpoint (every record up to it delivered, discarded or filtered out) goes to
`on_checkpoint` when it moves: embedded mode drops those records from the in-memory stream
(`fleetkeeper.local.moto_memory.trim_stream`), whose only reader the pump is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper.aws.eventfilter import matches_any, patterns_of
from fleetkeeper.local.context import LocalContext, function_timeout
from fleetkeeper.local.template import resource

if TYPE_CHECKING:
    import threading

    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

# Outside the `fleetkeeper` logger tree: Powertools' logger there would stamp these with a handler's context.
logger = logging.getLogger("local.stream_pump")

Handler = Callable[[dict[str, Any], Any], Any]
# (shard id, sequence number): every record of the shard up to that one is done with.
Checkpoint = Callable[[str, int], object]
CLEANUP_FUNCTION = "CleanupFunction"


@dataclass(frozen=True)
class StreamSource:
    """An event source mapping's settings (the SAM `DynamoDB` event's properties)."""

    function_name: str
    patterns: list[dict[str, Any]] = field(default_factory=list)
    batch_size: int = 100
    starting_position: str = "TRIM_HORIZON"
    maximum_retry_attempts: int = -1  # Lambda's default: retry until the records expire
    bisect_on_error: bool = False
    timeout_seconds: int = 30

    @classmethod
    def from_template(cls, template: dict[str, Any], logical_id: str = CLEANUP_FUNCTION) -> StreamSource | None:
        """The function's DynamoDB event from template.yaml, or None when the template has none."""
        try:
            events = resource(template, logical_id).get("Properties", {}).get("Events", {})
        except KeyError:
            return None
        for event in events.values():
            if event.get("Type") != "DynamoDB":
                continue
            props = event.get("Properties", {})
            return cls(
                function_name=logical_id,
                patterns=patterns_of(props.get("FilterCriteria", {})),
                batch_size=int(props.get("BatchSize", 100)),
                starting_position=str(props.get("StartingPosition", "TRIM_HORIZON")),
                maximum_retry_attempts=int(props.get("MaximumRetryAttempts", -1)),
                bisect_on_error=bool(props.get("BisectBatchOnFunctionError", False)),
                timeout_seconds=function_timeout(template, logical_id),
            )
        return None


@dataclass
class _Shard:
    shard_id: str
    # The position the shard was started from; only used until a first record has been read.
    position: str
    # Only kept for a LATEST start before anything was read (see `_next_iterator`).
    iterator: str | None
    last_sequence: str | None = None
    closed: bool = False  # a closed shard read to its end
    # Records read and admitted by the filter but not yet delivered successfully, in stream order.
    pending: list[dict[str, Any]] = field(default_factory=list)
    failed_attempts: int = 0
    # Shrinks when a failing batch is bisected; back to the batch size after a success.
    batch_limit: int = 0
    # The last checkpoint handed to `on_checkpoint`.
    reported: int | None = None

    def checkpoint(self) -> int | None:
        """The sequence number up to which every record read is done with (None: none read yet)."""
        if self.pending:
            return int(self.pending[0]["dynamodb"]["SequenceNumber"]) - 1
        return None if self.last_sequence is None else int(self.last_sequence)


def lambda_record(raw: dict[str, Any], stream_arn: str, region: str) -> dict[str, Any]:
    """A stream record (as GetRecords returns it) in the shape Lambda hands to a function."""
    dynamodb = dict(raw.get("dynamodb", {}))
    created = dynamodb.get("ApproximateCreationDateTime")
    if isinstance(created, datetime):  # boto3 parses it; Lambda sends epoch seconds
        dynamodb["ApproximateCreationDateTime"] = int(created.timestamp())
    return {
        "eventID": raw.get("eventID"),
        "eventName": raw.get("eventName"),
        "eventVersion": raw.get("eventVersion", "1.1"),
        "eventSource": raw.get("eventSource", "aws:dynamodb"),
        "awsRegion": raw.get("awsRegion", region),
        "dynamodb": dynamodb,
        "eventSourceARN": stream_arn,
    }


class StreamPump:
    """Delivers one stream's records to `handler` as Lambda would (see the module docstring)."""

    def __init__(
        self,
        client: DynamoDBStreamsClient,
        stream_arn: str,
        source: StreamSource,
        handler: Handler,
        *,
        region: str = "us-east-1",
        on_checkpoint: Checkpoint | None = None,
    ) -> None:
        self.client = client
        self.on_checkpoint = on_checkpoint
        self.stream_arn = stream_arn
        self.source = source
        self.handler = handler
        self.region = region
        self._shards: dict[str, _Shard] = {}
        self._first_discovery = True
        self.delivered = 0  # records a handler accepted
        self.discarded = 0  # records given up on after MaximumRetryAttempts

    def poll_once(self) -> int:
        """One pass over every shard: read what is new, deliver what is pending. Returns records accepted."""
        self._discover_shards()
        before = self.delivered
        for shard in list(self._shards.values()):
            self._pump(shard)
            self._report(shard)
        return self.delivered - before

    def _report(self, shard: _Shard) -> None:
        checkpoint = shard.checkpoint()
        if self.on_checkpoint is None or checkpoint is None or checkpoint == shard.reported:
            return
        self.on_checkpoint(shard.shard_id, checkpoint)
        shard.reported = checkpoint

    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        """Poll until `stop` is set; errors are logged and the next poll tries again."""
        while not stop.is_set():
            try:
                busy = self.poll_once() > 0
            except Exception:
                logger.exception("stream pump: polling %s failed; retrying", self.stream_arn)
                busy = False
            if not busy:
                stop.wait(interval)

    # -- reading ---------------------------------------------------------------------------------------

    def _discover_shards(self) -> None:
        start: str | None = None
        while True:
            kwargs: dict[str, Any] = {"StreamArn": self.stream_arn}
            if start:
                kwargs["ExclusiveStartShardId"] = start
            description = self.client.describe_stream(**kwargs)["StreamDescription"]
            for shard in description.get("Shards", []):
                shard_id = shard["ShardId"]
                if shard_id not in self._shards:
                    # The mapping's StartingPosition applies to the shards it starts with; shards
                    # that appear later (splits) are read from their beginning, as Lambda does.
                    position = self.source.starting_position if self._first_discovery else "TRIM_HORIZON"
                    iterator = self._iterator(shard_id, position) if position == "LATEST" else None
                    self._shards[shard_id] = _Shard(shard_id, position, iterator)
            start = description.get("LastEvaluatedShardId")
            if not start:
                break
        self._first_discovery = False

    def _iterator(self, shard_id: str, position: str, after: str | None = None) -> str | None:
        kwargs: dict[str, Any] = {"StreamArn": self.stream_arn, "ShardId": shard_id}
        if after is not None:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=after)
        else:
            kwargs["ShardIteratorType"] = position
        iterator: str | None = self.client.get_shard_iterator(**kwargs).get("ShardIterator")
        return iterator

    def _next_iterator(self, shard: _Shard) -> str | None:
        """A fresh iterator for the shard's next unread record.

        Every poll asks for a new one rather than following NextShardIterator: when moto cancels a
        TransactWriteItems (a duplicate create, a stale If-Match) it restores a copy of the table,
        stream shard included, and an iterator chained from before that point keeps reading the
        discarded shard, which never grows again (its id is unchanged, so discovery cannot tell).
        Records read but not yet delivered stay in `pending`, so reading after the last record read
        never skips one that has to be redelivered.
        """
        if shard.last_sequence is not None:
            return self._iterator(shard.shard_id, shard.position, after=shard.last_sequence)
        if shard.position != "LATEST":
            return self._iterator(shard.shard_id, shard.position)
        # LATEST asked again would skip what was written between two polls, so until a first record
        # is read the iterator taken at discovery is followed.
        return shard.iterator

    def _read(self, shard: _Shard) -> None:
        if shard.closed:
            return
        iterator = self._next_iterator(shard)
        if iterator is None:
            shard.closed = True
            return
        try:
            page = self.client.get_records(ShardIterator=iterator, Limit=1000)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ExpiredIteratorException":
                raise
            shard.iterator = None
            if shard.position == "LATEST" and shard.last_sequence is None:
                shard.iterator = self._iterator(shard.shard_id, "LATEST")
            return
        shard.iterator = page.get("NextShardIterator")
        shard.closed = shard.iterator is None  # no next iterator: the shard is closed and read to its end
        for raw in page.get("Records", []):
            record = lambda_record(dict(raw), self.stream_arn, self.region)
            shard.last_sequence = record["dynamodb"].get("SequenceNumber", shard.last_sequence)
            if matches_any(self.source.patterns, record):
                shard.pending.append(record)

    # -- delivering ------------------------------------------------------------------------------------

    def _pump(self, shard: _Shard) -> None:
        if not shard.pending:
            self._read(shard)
        while shard.pending:
            limit = shard.batch_limit or self.source.batch_size
            batch = shard.pending[:limit]
            failed_from = self._invoke(shard, batch)
            if failed_from is None:
                shard.pending = shard.pending[len(batch) :]
                shard.failed_attempts, shard.batch_limit = 0, 0
                self.delivered += len(batch)
                continue
            self.delivered += failed_from  # the records before the first failure are checkpointed
            retry = batch[failed_from:]
            shard.pending = retry + shard.pending[len(batch) :]
            # The retry is the same batch from the failed record on (never topped up with newer
            # records), or half of it when a function error bisects it.
            shard.batch_limit = min(shard.batch_limit or len(retry), len(retry))
            shard.failed_attempts += 1
            limit_reached = 0 <= self.source.maximum_retry_attempts < shard.failed_attempts
            if limit_reached:
                self._discard(retry)
                shard.pending = shard.pending[len(retry) :]
                shard.failed_attempts, shard.batch_limit = 0, 0
                continue
            return  # retried on the next poll, after the pump's interval

    def _invoke(self, shard: _Shard, batch: list[dict[str, Any]]) -> int | None:
        """Deliver one batch. None on success, else the index of the first record to deliver again."""
        context = LocalContext(self.source.function_name, self.source.timeout_seconds)
        try:
            response = self.handler({"Records": batch}, context)
        except Exception:
            logger.exception("%s failed on a batch of %d records", self.source.function_name, len(batch))
            shard.batch_limit = len(batch)
            if self.source.bisect_on_error and len(batch) > 1:
                shard.batch_limit = len(batch) // 2
            return 0
        failures = response.get("batchItemFailures") or [] if isinstance(response, dict) else []
        if not failures:
            return None
        sequence = [r["dynamodb"].get("SequenceNumber") for r in batch]
        positions = [
            sequence.index(f.get("itemIdentifier")) if f.get("itemIdentifier") in sequence else 0 for f in failures
        ]
        first = min(positions)  # an unknown identifier fails the whole batch, as in Lambda
        logger.warning(
            "%s reported %d failed record(s); redelivering from sequence number %s",
            self.source.function_name,
            len(failures),
            sequence[first],
        )
        return first

    def _discard(self, records: list[dict[str, Any]]) -> None:
        self.discarded += len(records)
        for record in records:
            logger.error(
                "%s: giving up on record %s after %d attempts (in AWS it goes to the OnFailure destination): %s",
                self.source.function_name,
                record["dynamodb"].get("SequenceNumber"),
                self.source.maximum_retry_attempts + 1,
                json.dumps(record["dynamodb"].get("Keys"), sort_keys=True),
            )
