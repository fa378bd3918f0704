"""What keeps the in-memory AWS's memory flat while `fleetkeeper local` stays open all day.

moto keeps (checked against the release in `CHECKED_MOTO`, which pyproject.toml pins exactly):

- every model object it ever made, of every service, in its class's `instances_tracked` list, for
  its dashboard (`/moto-api/`, which the embedded mode's gate never lets a browser read anyway):
  every DynamoDB `Item` (a GetItem, a Query and a transaction's backup each make copies), every
  SQS message, stream record and shard iterator, every table copy. This alone held every
  byte the in-memory AWS ever handled;
- every stream record ever written, in the table's `StreamShard.items` (DynamoDB keeps 24 hours);
- a `copy.deepcopy` of every table a TransactWriteItems names, taken before it starts (to restore
  a cancelled one): the whole table, stream shard and every record included. Kept only for the
  call, but a cancelled one puts the copy in the table's place and orphans the live table;
- every shard iterator it ever handed out (GetShardIterator, and each GetRecords' NextShardIterator)
  in `DynamoDBStreamsBackend.shard_iterators`, forever; each holds the shard, which holds its table,
  so every table a cancelled transaction orphaned stayed alive, with all its records (the
  reconciler's conditional writes lose races by design: about 30 cancelled transactions per rolling
  update, so 30 orphaned tables).

`fleetkeeper local` went from 140 MB to 11 GB over 40 rolling updates (bench/local_soak.py). Here:

- `untracked_models`: moto's models are made without being tracked (the dashboard's data.json
  lists none; S3's reset, which disposes of tracked keys, never runs here: nothing resets the
  in-memory AWS while it serves), so each is freed once moto lets go of it;
- `trim_stream`: the stream pump (the cleanup's event source mapping, the stream's one reader in
  embedded mode) calls it with each shard's checkpoint; the records up to it are dropped, and the
  shard's trim horizon (its StartingSequenceNumber) moves on, as DynamoDB's does when records expire.
  A read below the horizon answers TrimmedDataAccessException, as DynamoDB does;
- `lean_transaction_backups` (with `share_stream_records`): the backup copies only the items the
  transaction names, and shares every other item and every stream record, which no write changes in
  place (an item is changed in place only by a write to its own key); the partitions and the
  record list are containers of the backup's own, so a rollback restores them as they were;
- `iterators_by_table`: an iterator names its table, and reads the shard that table has when it
  is used (DynamoDB never rolls a stream back; an iterator taken before a cancelled transaction no
  longer reads the discarded copy's shard), so it holds no table alive;
- `bounded_shard_iterators`: an iterator expires 15 minutes after it was handed out, as DynamoDB
  Streams' do (https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_streams_GetShardIterator.html),
  and at most `MAX_SHARD_ITERATORS` are kept (the oldest go first); a GetRecords with one that is
  gone answers ExpiredIteratorException, which every reader handles by asking for a new one.

`retained()` counts what these bound (the tests and the soak bench read it). The suite's own moto
(tests/support/moto_tuning.py) installs the first two as well.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

CHECKED_MOTO = "5.2.5"
ITERATOR_LIFETIME_SECONDS = 15 * 60
MAX_SHARD_ITERATORS = 1000

# moto's DynamoDB is not isolated: its operations (and the streams' reads, and `trim_stream`) run one
# at a time in this process (fleetkeeper.local.in_memory_aws.serialise_dynamodb).
DYNAMODB_LOCK = threading.RLock()


@dataclass(frozen=True)
class Retained:
    """What the in-memory DynamoDB holds that could grow with a session's history."""

    tables: int  # live moto Table objects, orphaned copies included
    tracked_models: int  # model objects in moto's `instances_tracked` lists
    stream_records: int  # records in the stream shards of the tables the backends hold
    shard_iterators: int  # iterators the streams backends keep


def install() -> None:
    """Every bound above (idempotent); before the in-memory AWS serves its first request."""
    untracked_models()
    share_stream_records()
    lean_transaction_backups()
    iterators_by_table()
    bounded_shard_iterators()
    trimmed_reads()


# -- moto's instance tracking --------------------------------------------------------------------------


def untracked_models() -> None:
    from moto.core.common_models import BaseModel

    if getattr(BaseModel.__dict__.get("__new__"), "untracked", False):
        return

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        # BaseModel's own __new__, less `cls.instances_tracked.append(instance)`.
        return super(BaseModel, cls).__new__(cls)  # type: ignore[misc]

    __new__.untracked = True  # type: ignore[attr-defined]
    BaseModel.__new__ = staticmethod(__new__)  # type: ignore[method-assign]
    from moto.core.model_instances import reset_model_data

    reset_model_data()  # what was tracked before (the models made at import) goes too


def tracked_models() -> int:
    from moto.core.model_instances import model_data

    return sum(
        len(getattr(model, "instances_tracked", ())) for models in model_data.values() for model in models.values()
    )


# -- the stream's records ----------------------------------------------------------------------------


def _dynamodb_backends() -> list[Any]:
    from moto.dynamodb.models import dynamodb_backends

    return [backend for account in list(dynamodb_backends.values()) for backend in list(account.values())]


def trim_stream(table_name: str, shard_id: str, through_sequence: int) -> int:
    """Drop the records of `table_name`'s stream shard up to `through_sequence` (included); returns
    how many."""
    dropped = 0
    with DYNAMODB_LOCK:
        for backend in _dynamodb_backends():
            table = backend.tables.get(table_name)
            shard = getattr(table, "stream_shard", None)
            if shard is None or shard.id != shard_id:
                continue
            count = min(len(shard.items), through_sequence + 1 - shard.starting_sequence_number)
            if count > 0:
                del shard.items[:count]
                shard.starting_sequence_number += count
                dropped += count
    return dropped


def trimmed_reads() -> None:
    """A read that starts below a shard's trim horizon is refused as DynamoDB refuses it (moto's own
    check is an `assert`, a 500)."""
    from moto.core.exceptions import JsonRESTError
    from moto.dynamodb.models.table import StreamShard

    original = StreamShard.get
    if getattr(original, "trimmed", False):
        return

    def get(self: Any, start: int, quantity: int) -> list[dict[str, Any]]:
        if start < self.starting_sequence_number:
            raise JsonRESTError(
                "TrimmedDataAccessException",
                f"sequence number {start} is below the shard's trim horizon {self.starting_sequence_number}",
            )
        return original(self, start, quantity)

    get.trimmed = True  # type: ignore[attr-defined]
    StreamShard.get = get  # type: ignore[method-assign]


# -- transactions' backups -----------------------------------------------------------------------------


def _copy_shard(shard: Any, memo: dict[int, Any]) -> Any:
    """`copy.deepcopy` of moto's StreamShard: its own list of the very same (immutable) records."""
    clone = copy.copy(shard)
    memo[id(shard)] = clone
    clone.table = copy.deepcopy(shard.table, memo)
    clone.items = list(shard.items)
    return clone


def share_stream_records() -> None:
    from moto.dynamodb.models.table import StreamShard

    StreamShard.__deepcopy__ = _copy_shard  # type: ignore[attr-defined]


# The keys a TransactWriteItems on this thread names, per table, while moto backs its tables up
# (None outside one: every other deepcopy of a table is a whole one).
_TRANSACTION = threading.local()


def _transaction_keys(backend: Any, transact_items: Any) -> dict[str, list[tuple[Any, Any]]] | None:
    """(hash, range) DynamoTypes of every item the transaction names, per table; None when the
    request is malformed (moto then refuses it, after a whole backup, as it always did)."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    keys: dict[str, list[tuple[Any, Any]]] = {}
    try:
        for entry in transact_items:
            op_type, op = next(iter(entry.items()))
            table = backend.tables.get(op.get("TableName"))
            if table is None:
                continue
            raw = op["Item"] if op_type == "Put" else op["Key"]
            range_value = DynamoType(raw[table.range_key_attr]) if table.range_key_attr else None
            keys.setdefault(table.name, []).append((DynamoType(raw[table.hash_key_attr]), range_value))
    except Exception:
        return None
    return keys


def _copy_table(table: Any, memo: dict[int, Any]) -> Any:
    """`copy.deepcopy` of moto's dynamodb Table: whole, but inside a TransactWriteItems' backup,
    where only the items the transaction names are copied (see the module's docstring)."""
    cls: Any = type(table)
    clone = cls.__new__(cls)
    memo[id(table)] = clone
    keys = getattr(_TRANSACTION, "keys", None)
    named = None if keys is None else keys.get(table.name)
    if named is None:
        for attribute, value in table.__dict__.items():
            setattr(clone, attribute, copy.deepcopy(value, memo))
        return clone
    clone.__dict__.update(table.__dict__)
    items: defaultdict[Any, Any] = defaultdict(dict)
    for hash_value, bucket in table.items.items():
        items[hash_value] = dict(bucket) if isinstance(bucket, dict) else bucket
    for hash_value, range_value in named:
        bucket = items.get(hash_value)
        if range_value is None:
            if bucket is not None and not isinstance(bucket, dict):
                items[hash_value] = copy.deepcopy(bucket, memo)
        elif isinstance(bucket, dict) and range_value in bucket:
            bucket[range_value] = copy.deepcopy(bucket[range_value], memo)
    clone.items = items
    if table.stream_shard is not None:
        clone.stream_shard = copy.deepcopy(table.stream_shard, memo)
    return clone


def lean_transaction_backups() -> None:
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.table import Table

    Table.__deepcopy__ = _copy_table  # type: ignore[attr-defined]
    original = DynamoDBBackend.transact_write_items
    if getattr(original, "lean_backup", False):
        return

    def transact_write_items(self: Any, transact_items: Any) -> None:
        _TRANSACTION.keys = _transaction_keys(self, transact_items)
        try:
            original(self, transact_items)
        finally:
            _TRANSACTION.keys = None

    transact_write_items.lean_backup = True  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


# -- shard iterators -------------------------------------------------------------------------------------


class RecentIterators(OrderedDict[str, Any]):
    """moto's `shard_iterators` (ARN -> ShardIterator), keeping only the newest, for a while."""

    def __init__(self, lifetime: float = ITERATOR_LIFETIME_SECONDS, limit: int = MAX_SHARD_ITERATORS) -> None:
        super().__init__()
        self.lifetime = lifetime
        self.limit = limit
        self._handed_out: dict[str, float] = {}

    def __setitem__(self, arn: str, iterator: Any) -> None:
        super().__setitem__(arn, iterator)
        self._handed_out[arn] = time.monotonic()
        self._forget_old()

    def __getitem__(self, arn: str) -> Any:
        self._forget_old()
        if not super().__contains__(arn):
            from moto.core.exceptions import JsonRESTError

            raise JsonRESTError("ExpiredIteratorException", "Iterator expired or unknown")
        return super().__getitem__(arn)

    def _forget_old(self) -> None:
        horizon = time.monotonic() - self.lifetime
        while self and (len(self) > self.limit or self._handed_out[next(iter(self))] < horizon):
            arn, _ = self.popitem(last=False)
            del self._handed_out[arn]


def _current_shard(iterator: Any) -> Any:
    table = iterator.streams_backend.dynamodb.tables.get(iterator.table_name)
    shard = getattr(table, "stream_shard", None)
    if shard is None:
        from moto.core.exceptions import JsonRESTError

        raise JsonRESTError("ResourceNotFoundException", f"table {iterator.table_name} has no stream")
    return shard


def _name_table(iterator: Any, shard: Any) -> None:
    iterator.table_name = shard.table.name


def iterators_by_table() -> None:
    from moto.dynamodbstreams.models import ShardIterator

    if isinstance(ShardIterator.__dict__.get("stream_shard"), property):
        return
    iterator_class: Any = ShardIterator
    iterator_class.stream_shard = property(_current_shard, _name_table)


def bounded_shard_iterators() -> None:
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend

    original = DynamoDBStreamsBackend.__init__
    if getattr(original, "bounded", False):
        return

    def __init__(self: Any, region_name: str, account_id: str) -> None:
        original(self, region_name, account_id)
        self.shard_iterators = RecentIterators()

    __init__.bounded = True  # type: ignore[attr-defined]
    DynamoDBStreamsBackend.__init__ = __init__  # type: ignore[method-assign]


# -- what is retained --------------------------------------------------------------------------------------


def retained() -> Retained:
    import gc

    from moto.dynamodb.models.table import Table
    from moto.dynamodbstreams.models import dynamodbstreams_backends

    with DYNAMODB_LOCK:
        gc.collect()  # a table and its stream shard refer to each other: only the collector frees them
        tables = sum(1 for o in gc.get_objects() if type(o) is Table)
        records = sum(
            len(t.stream_shard.items)
            for backend in _dynamodb_backends()
            for t in backend.tables.values()
            if t.stream_shard is not None
        )
        iterators = sum(
            len(backend.shard_iterators)
            for account in list(dynamodbstreams_backends.values())
            for backend in list(account.values())
        )
    return Retained(tables=tables, tracked_models=tracked_models(), stream_records=records, shard_iterators=iterators)
