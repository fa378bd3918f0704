"""DynamoDB as AWS runs it, over moto's DynamoDB.

Always on (AWS's validation rules; moto forgives them):

- every number in a request (items, keys, expression values, start keys) has at most 38
  significant digits and a magnitude within 1E-130 .. 9.99E+125, else `ValidationException`;
- `ExclusiveStartKey` is a real key of the table or index being read: exactly its key attributes
  (the table's, plus the index's), each of its declared type, and for a Query inside the key
  condition (same partition value, sort key satisfying the sort key condition), else
  `ValidationException` ("The provided starting key ...");
- every request is applied atomically (moto is serialised, as `atomic_dynamodb` does), so a
  transaction's conditions and writes are one step, as on DynamoDB.

Scheduled by the test (or drawn from the seeded RNG, see `FaultRates`):

- torn reads: a Query, Scan or BatchGetItem sees only some items of a committed
  TransactWriteItems: the layer remembers every successful transaction's before and after images
  and, for a torn read, puts the chosen items back to their before-image (absent if they did not
  exist) for the duration of that one read, under the lock, then restores them. moto evaluates the
  read itself (key conditions, filters, projections, indexes, Limit, pagination), so the torn read
  is exactly the read DynamoDB would have served from that mixed state;
- `TransactionConflict`: TransactWriteItems cancelled with `CancellationReasons` code
  `TransactionConflict` on the conflicting item(s) (nothing written), and
  `TransactionConflictException` on a PutItem/UpdateItem/DeleteItem;
- throttling bursts (through `StrictAws.throttle`).
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from tests.strict_aws.wire import DYNAMODB_TYPE_PREFIX, Call, Response, json_error

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from tests.strict_aws.core import StrictAws

READS = frozenset({"Query", "Scan", "BatchGetItem"})
SINGLE_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
# How many committed transactions the layer remembers (a torn read tears one of the latest).
TRANSACTION_MEMORY = 1000

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
INVALID_START_KEY = "The provided starting key is invalid"
START_KEY_SCHEMA = "The provided starting key is invalid: The provided key element does not match the schema"
START_KEY_OUTSIDE = "The provided starting key is outside query boundaries based on provided conditions"
START_KEY_RANGE = "The provided starting key does not match the range key predicate"
ONGOING = "Transaction is ongoing for the item."


def number_problem(text: Any) -> str | None:
    """Why DynamoDB refuses this number (the message it gives), or None."""
    if not isinstance(text, str) or not _NUMBER.fullmatch(text):
        return f"The parameter cannot be converted to a numeric value: {text}"
    try:
        number = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimal literals
        return f"The parameter cannot be converted to a numeric value: {text}"
    if number == 0:
        return None
    # "Numbers can have up to 38 digits of precision ... Leading and trailing zeroes are trimmed."
    digits = "".join(map(str, number.as_tuple().digits)).strip("0")
    if len(digits) > 38:
        return "Attempting to store more than 38 significant digits in a Number"
    if number.adjusted() > 125:
        return "Number overflow. Attempting to store a number with magnitude larger than supported range"
    if number.adjusted() < -130:
        return "Number underflow. Attempting to store a number with magnitude smaller than supported range"
    return None


def numbers_in(value: Any) -> Iterator[Any]:
    """Every N and NS member anywhere in a request body (attribute values nest in M and L)."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((kind, data),) = value.items()
            if kind == "N" and not isinstance(data, dict | list):
                yield data
                return
            if kind == "NS" and isinstance(data, list):
                yield from data
                return
        for member in value.values():
            yield from numbers_in(member)
    elif isinstance(value, list):
        for member in value:
            yield from numbers_in(member)


def _plain(value: dict[str, Any]) -> Any:
    ((_, data),) = value.items()
    return data


def _ordered(value: dict[str, Any]) -> tuple[str, Any]:
    """A key attribute value as DynamoDB orders it: strings and binaries by bytes, numbers by value."""
    ((kind, data),) = value.items()
    if kind == "N":
        return kind, Decimal(data)
    if kind == "S":
        return kind, str(data).encode()
    return kind, data


def _satisfies(value: dict[str, Any], comparison: str, operands: list[dict[str, Any]]) -> bool:
    kind, subject = _ordered(value)
    bounds = [_ordered(o) for o in operands]
    if any(k != kind for k, _ in bounds):
        return False
    values = [v for _, v in bounds]
    op = comparison.upper()
    if op == "=":
        return bool(subject == values[0])
    if op == "<":
        return bool(subject < values[0])
    if op == "<=":
        return bool(subject <= values[0])
    if op == ">":
        return bool(subject > values[0])
    if op == ">=":
        return bool(subject >= values[0])
    if op == "BETWEEN":
        return bool(values[0] <= subject <= values[1])
    if op == "BEGINS_WITH":
        return bool(subject[: len(values[0])] == values[0])
    return True  # an operator we do not know: leave the judgement to moto


@dataclass(frozen=True)
class ItemRef:
    """One item of a TransactWriteItems request: its position, action, table and key."""

    index: int
    action: str  # Put | Update | Delete | ConditionCheck
    table: str
    key: dict[str, Any]  # attribute values, e.g. {"PK": {"S": "SVC#web"}, "SK": {"S": "META"}}

    def key_value(self, attribute: str) -> Any:
        return _plain(self.key[attribute])


@dataclass(frozen=True)
class TxItem(ItemRef):
    """An item of a committed transaction, as it was before and after it (None: absent)."""

    before: dict[str, Any] | None
    after: dict[str, Any] | None
    _before_item: Any = field(default=None, repr=False, compare=False)  # moto's Item, for torn reads

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class Transaction:
    """A committed TransactWriteItems, in commit order (seq)."""

    seq: int
    items: tuple[TxItem, ...]
    actor: str | None = None  # who committed it (StrictAws.acting_as), when the test says

    @property
    def tables(self) -> frozenset[str]:
        return frozenset(item.table for item in self.items)

    def indices(self, where: Callable[[TxItem], bool]) -> tuple[int, ...]:
        return tuple(item.index for item in self.items if where(item))


@dataclass(frozen=True)
class TornRead:
    """A read the layer tore: these items of that transaction were shown in their before-image."""

    operation: str
    transaction: int  # seq
    stale: tuple[int, ...]


@dataclass
class _Tear:
    transaction: Transaction
    stale: Callable[[TxItem], bool] | None  # None: the RNG picks a non-empty proper subset
    operations: frozenset[str]
    remaining: int


@dataclass
class _TransactionConflict:
    conflicting: Callable[[ItemRef], bool] | None  # None: the RNG picks one item
    remaining: int


@dataclass
class _WriteConflict:
    operations: frozenset[str]
    key: dict[str, Any] | None
    remaining: int


def _predicate(selection: Iterable[int] | Callable[[Any], bool] | None) -> Callable[[Any], bool] | None:
    if selection is None or callable(selection):
        return selection
    chosen = frozenset(selection)
    return lambda item: item.index in chosen


class DynamoDBLayer:
    """The DynamoDB half of `StrictAws` (reach it as `strict_aws.dynamodb`)."""

    def __init__(self, strict: StrictAws) -> None:
        self._strict = strict
        # Serialises every request moto handles: DynamoDB applies each request atomically, and a
        # torn read swaps items in and out of moto's table, which no other request may see.
        self.lock = threading.RLock()
        self.transactions: deque[Transaction] = deque(maxlen=TRANSACTION_MEMORY)
        self.torn_reads: list[TornRead] = []
        self._seq = 0
        # The last successful write request to each table: ("tx", seq) for a transaction. Only a
        # transaction that is still the last write to a table can be in flight for a read drawn by
        # the RNG: a read that overlapped it cannot have started after a later write.
        self._last_write: dict[str, tuple[str, int]] = {}
        self._writes = 0
        self._tears: list[_Tear] = []
        self._transaction_conflicts: list[_TransactionConflict] = []
        self._write_conflicts: list[_WriteConflict] = []

    # -- what the test schedules --

    def last_transaction(self) -> Transaction:
        with self.lock:
            if not self.transactions:
                raise LookupError("no TransactWriteItems has committed yet")
            return self.transactions[-1]

    def tear_next_read(
        self,
        stale: Iterable[int] | Callable[[TxItem], bool] | None = None,
        *,
        transaction: Transaction | None = None,
        operations: Iterable[str] = READS,
        times: int = 1,
    ) -> None:
        """The next `times` reads (Query/Scan/BatchGetItem) of the transaction's tables are torn.

        `stale` chooses the items shown in their before-image: indices into the transaction's
        TransactItems, or a predicate on `TxItem`; None lets the seeded RNG pick a non-empty proper
        subset. The transaction defaults to the last one committed. An item that changed again
        since the transaction is no longer in flight and is never torn.
        """
        chosen = transaction or self.last_transaction()
        with self.lock:
            self._tears.append(_Tear(chosen, _predicate(stale), frozenset(operations), times))

    def conflict_next_transaction(
        self, items: Iterable[int] | Callable[[ItemRef], bool] | None = None, *, times: int = 1
    ) -> None:
        """The next `times` TransactWriteItems are cancelled: `TransactionConflict` on `items`
        (indices, or a predicate on `ItemRef`; None: one item picked by the RNG), `None` on the
        others. Nothing is written; botocore does not retry TransactionCanceledException."""
        with self.lock:
            self._transaction_conflicts.append(_TransactionConflict(_predicate(items), times))

    def conflict_next_write(
        self, *, operations: Iterable[str] = SINGLE_WRITES, key: dict[str, Any] | None = None, times: int = 1
    ) -> None:
        """The next `times` single-item writes (of `key`, when given) overlap a transaction in
        flight: `TransactionConflictException`, nothing written."""
        with self.lock:
            self._write_conflicts.append(_WriteConflict(frozenset(operations), key, times))

    def throttle(self, operation: str | None = None, *, times: int, code: str = "") -> None:
        """The next `times` attempts of `operation` (any, when None) are throttled; see StrictAws.throttle."""
        self._strict.throttle("dynamodb", operation, times=times, code=code or None)

    # -- the request path --

    def _backend(self, call: Call) -> Any:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends

        return dynamodb_backends[DEFAULT_ACCOUNT_ID][call.region]

    def send(self, call: Call) -> Response:
        body = call.json()
        for number in numbers_in(body):
            problem = number_problem(number)
            if problem:
                return json_error("ValidationException", problem)
        with self.lock:
            backend = self._backend(call)
            if call.operation in {"Query", "Scan"} and body.get("ExclusiveStartKey"):
                problem = self._start_key_problem(backend, call.operation, body)
                if problem:
                    return json_error("ValidationException", problem)
            if call.operation == "TransactWriteItems":
                return self._transact_write(call, backend, body)
            if call.operation in SINGLE_WRITES:
                conflict = self._write_conflict(call.operation, backend, body)
                if conflict is not None:
                    return conflict
            if call.operation in SINGLE_WRITES or call.operation == "BatchWriteItem":
                response = call.send()
                if response[0] == 200:
                    self._writes += 1
                    for name in self._tables(backend, call.operation, body):
                        self._last_write[name] = ("write", self._writes)
                return response
            if call.operation in READS:
                return self._read(call, backend, body)
            return call.send()

    # -- ExclusiveStartKey --

    def _start_key_problem(self, backend: Any, operation: str, body: dict[str, Any]) -> str | None:
        start = body["ExclusiveStartKey"]
        try:
            table = backend.get_table(body.get("TableName", ""))
        except Exception:
            return None  # no such table: moto says so
        types = {a["AttributeName"]: a["AttributeType"] for a in table.attr}
        schema: list[dict[str, str]] = list(table.schema)
        key_attrs = set(table.table_key_attrs)
        index_name = body.get("IndexName")
        if index_name:
            index = next((i for i in [*table.global_indexes, *table.indexes] if i.name == index_name), None)
            if index is None:
                return None
            schema = list(index.schema)
            key_attrs |= {k["AttributeName"] for k in schema}
        if not isinstance(start, dict) or set(start) != key_attrs:
            return INVALID_START_KEY if operation == "Query" else START_KEY_SCHEMA
        for name, value in start.items():
            if not isinstance(value, dict) or list(value) != [types.get(name)]:
                return START_KEY_SCHEMA
        condition = body.get("KeyConditionExpression")
        if operation != "Query" or not condition:
            return None
        from moto.dynamodb.parsing.key_condition_expression import parse_expression

        try:
            hash_conditions, range_conditions, _ = parse_expression(
                key_condition_expression=condition,
                expression_attribute_values=body.get("ExpressionAttributeValues", {}),
                expression_attribute_names=body.get("ExpressionAttributeNames", {}),
                schema=schema,
            )
        except Exception:
            return None  # a key condition moto cannot read: its own error follows
        for name, value in hash_conditions:
            if start.get(name) != value:
                return START_KEY_OUTSIDE
        for name, comparison, operands in range_conditions:
            if name in start and not _satisfies(start[name], comparison, operands):
                return START_KEY_RANGE
        return None

    # -- transactions --

    def _refs(self, backend: Any, body: dict[str, Any]) -> list[tuple[ItemRef, Any]] | None:
        refs: list[tuple[ItemRef, Any]] = []
        for index, entry in enumerate(body.get("TransactItems", [])):
            if not isinstance(entry, dict) or len(entry) != 1:
                return None
            ((action, op),) = entry.items()
            try:
                table = backend.get_table(op["TableName"])
                key = {a: op["Item"][a] for a in table.table_key_attrs} if action == "Put" else dict(op["Key"])
            except Exception:
                return None  # malformed: moto refuses it, nothing is recorded
            refs.append((ItemRef(index, action, table.name, key), table))
        return refs

    @staticmethod
    def _item(table: Any, key: dict[str, Any]) -> Any:
        from moto.dynamodb.models.dynamo_type import DynamoType

        try:
            hash_key = DynamoType(key[table.hash_key_attr])
            range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
            return table.get_item(hash_key, range_key)
        except Exception:
            return None

    @staticmethod
    def _raw(item: Any) -> dict[str, Any] | None:
        if item is None:
            return None
        raw: dict[str, Any] = json.loads(json.dumps(item.to_json()["Attributes"]))
        return raw

    def _transact_write(self, call: Call, backend: Any, body: dict[str, Any]) -> Response:
        refs = self._refs(backend, body)
        cancelled = self._transaction_conflict(refs)
        if cancelled is not None:
            return cancelled
        before = [copy.deepcopy(self._item(table, ref.key)) for ref, table in refs or []]
        response = call.send()
        if response[0] == 200 and refs:
            self._seq += 1
            items = tuple(
                TxItem(
                    ref.index,
                    ref.action,
                    ref.table,
                    ref.key,
                    before=self._raw(old),
                    after=self._raw(self._item(backend.get_table(ref.table), ref.key)),
                    _before_item=old,
                )
                for (ref, _), old in zip(refs, before, strict=True)
            )
            self.transactions.append(Transaction(self._seq, items, self._strict.actor()))
            for name in self.transactions[-1].tables:
                self._last_write[name] = ("tx", self._seq)
        return response

    def _transaction_conflict(self, refs: list[tuple[ItemRef, Any]] | None) -> Response | None:
        if not refs:
            return None
        scheduled = next((c for c in self._transaction_conflicts if c.remaining > 0), None)
        rng = self._strict.rng
        if scheduled is not None:
            scheduled.remaining -= 1
            pick = scheduled.conflicting
        elif self._strict.faults.transaction_conflict and rng.random() < self._strict.faults.transaction_conflict:
            pick = None
        else:
            return None
        if pick is None:
            lucky = rng.randrange(len(refs))
            conflicting = {lucky}
        else:
            conflicting = {ref.index for ref, _ in refs if pick(ref)}
        if not conflicting:
            return None
        reasons: list[dict[str, str]] = [
            {"Code": "TransactionConflict", "Message": ONGOING} if ref.index in conflicting else {"Code": "None"}
            for ref, _ in refs
        ]
        codes = ", ".join(r["Code"] for r in reasons)
        self._strict.record_fault("dynamodb", "TransactWriteItems", "TransactionConflict")
        return json_error(
            "TransactionCanceledException",
            f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
            prefix=DYNAMODB_TYPE_PREFIX,
            CancellationReasons=reasons,
        )

    def _write_conflict(self, operation: str, backend: Any, body: dict[str, Any]) -> Response | None:
        key: dict[str, Any] | None = body.get("Key")
        if operation == "PutItem":
            try:
                table = backend.get_table(body.get("TableName", ""))
                key = {a: body["Item"][a] for a in table.table_key_attrs}
            except Exception:
                key = None
        hit = False
        for conflict in self._write_conflicts:
            if conflict.remaining > 0 and operation in conflict.operations and conflict.key in (None, key):
                conflict.remaining -= 1
                hit = True
                break
        rate = self._strict.faults.write_conflict
        if not hit and not (rate and self._strict.rng.random() < rate):
            return None
        self._strict.record_fault("dynamodb", operation, "TransactionConflictException")
        return json_error("TransactionConflictException", ONGOING.rstrip("."))

    # -- reads --

    @staticmethod
    def _tables(backend: Any, operation: str, body: dict[str, Any]) -> set[str]:
        batch = operation in {"BatchGetItem", "BatchWriteItem"}
        names = list(body.get("RequestItems", {})) if batch else [body.get("TableName", "")]
        tables: set[str] = set()
        for name in names:
            try:
                tables.add(backend.get_table(name).name)
            except Exception:
                continue
        return tables

    def _in_flight(self, backend: Any, transaction: Transaction) -> list[TxItem]:
        """The transaction's items that it changed and that nothing has changed since."""
        return [
            item
            for item in transaction.items
            if item.changed and self._raw(self._item(backend.get_table(item.table), item.key)) == item.after
        ]

    def _choose_tear(self, backend: Any, operation: str, tables: set[str]) -> tuple[Transaction, list[TxItem]] | None:
        for tear in self._tears:
            if tear.remaining > 0 and operation in tear.operations and tear.transaction.tables & tables:
                tear.remaining -= 1
                candidates = self._in_flight(backend, tear.transaction)
                if tear.stale is not None:
                    return tear.transaction, [item for item in candidates if tear.stale(item)]
                return tear.transaction, self._random_subset(candidates)
        rate = self._strict.faults.torn_read
        if rate and self._strict.rng.random() < rate:
            last = {self._last_write.get(name) for name in tables}
            reader = self._strict.actor()
            for transaction in reversed(self.transactions):
                if ("tx", transaction.seq) not in last:
                    continue
                # A read that starts after the transaction returned is not torn: the transaction's
                # own actor has seen it return. Unnamed actors are assumed to be others.
                if reader is not None and reader == transaction.actor:
                    return None
                return transaction, self._random_subset(self._in_flight(backend, transaction))
        return None

    def _random_subset(self, candidates: list[TxItem]) -> list[TxItem]:
        if len(candidates) < 2:
            return []
        rng = self._strict.rng
        return sorted(rng.sample(candidates, rng.randint(1, len(candidates) - 1)), key=lambda i: i.index)

    def _read(self, call: Call, backend: Any, body: dict[str, Any]) -> Response:
        choice = self._choose_tear(backend, call.operation, self._tables(backend, call.operation, body))
        if choice is None or not choice[1]:
            return call.send()
        transaction, stale = choice
        restores = [self._show_before(backend, item) for item in stale]
        try:
            response = call.send()
        finally:
            for restore in reversed(restores):
                restore()
        self.torn_reads.append(TornRead(call.operation, transaction.seq, tuple(i.index for i in stale)))
        self._strict.record_fault("dynamodb", call.operation, "TornRead")
        return response

    @staticmethod
    def _show_before(backend: Any, item: TxItem) -> Callable[[], None]:
        """Put the item's before-image in moto's table; returns what puts the current one back.

        Replaces the partition's bucket with a modified copy instead of editing it, so restoring
        is putting the very same bucket object back.
        """
        from moto.dynamodb.models.dynamo_type import DynamoType

        table = backend.get_table(item.table)
        hash_key = DynamoType(item.key[table.hash_key_attr])
        present = hash_key in table.items
        original = table.items[hash_key] if present else None
        before = copy.deepcopy(item._before_item)
        if table.range_key_attr:
            range_key = DynamoType(item.key[table.range_key_attr])
            bucket = dict(original) if original is not None else {}
            if before is None:
                bucket.pop(range_key, None)
            else:
                bucket[range_key] = before
            replacement: Any = bucket or None
        else:
            replacement = before
        if replacement is None:
            table.items.pop(hash_key, None)
        else:
            table.items[hash_key] = replacement

        def restore() -> None:
            if present:
                table.items[hash_key] = original
            else:
                table.items.pop(hash_key, None)

        return restore
