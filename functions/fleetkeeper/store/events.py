"""Service events in the table: written inside the writer's own call, read newest first.

    event  PK=SVC#<name>  SK=E#<uid>#<day>#<fold key>  type, reason, message, replica_id?, version?,
                                                       code?, first_seen, last_seen, count, expiration (TTL)

An event is never a call of its own: `event_update` is one more item of the TransactWriteItems
that makes the state change it reports (a replica's transition, a claim, the breaker, a create...),
so it is written exactly when the change is, and a steady state (no change) writes none. Repeats
fold into one item: the key is the UTC day and the event's fold key, and the update raises
`count`, moves `last_seen` and the expiry, and keeps `first_seen` (`if_not_exists`). A repeat on
another day is a new item (Kubernetes, too, folds within a window).

Order: a read lists events newest first by `last_seen`, then by `seq`, the moment the write was
built (nanoseconds, increasing within the store that writes it: `EventSequence`). A reconciler run stamps all its
writes with its one `now`, so without `seq` the events of one run would come out in the arbitrary
order of their fold keys; with it they read in the order they happened, across the run's writes and
within one.

Retention: each item expires EVENT_TTL_SECONDS after it was last seen, through the table's TTL
attribute. TTL deletes late (typically within days), so a read filters out what has expired, and
answers the newest EVENTS_KEPT only. The day in the key bounds what a read costs: a Query of the
incarnation's events newest-first stops at the first day boundary once it holds EVENTS_KEPT
events, so a service that has logged thousands of events in a week still costs a read of about
its last day's.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from fleetkeeper.model import from_iso
from fleetkeeper.service_events import EVENT_TTL_SECONDS, EVENTS_KEPT, Event, EventRecord, EventType
from fleetkeeper.store.codec import expression_values, from_raw, to_raw
from fleetkeeper.store.errors import CorruptItem, MalformedPageToken
from fleetkeeper.store.keys import TTL_ATTR, event_key, event_prefix, service_pk

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

    from fleetkeeper.model import ServiceRecord
    from fleetkeeper.store.table import Table

_FOLD_KEY = re.compile(r"^[0-9a-f]{16}$")


class EventSequence:
    """The `seq` of one store's event writes: wall-clock nanoseconds, strictly increasing within the
    store (a frozen or coarse clock still orders its writes). Per store, not per process, so a
    simulation's replay, with a fresh store on the same virtual clock, writes the same numbers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, time.time_ns())
            return self._last


def expires_at(last_seen: str) -> int:
    """The TTL attribute's value (epoch seconds) of an event last seen at `last_seen`."""
    return int(from_iso(last_seen).timestamp()) + EVENT_TTL_SECONDS


def event_update(table: str, name: str, uid: str, event: Event, now: str, seq: int) -> TransactWriteItemTypeDef:
    """One event as a TransactWriteItems item: created, or folded into its earlier repeat; `seq`
    its place among the events last seen at `now` (EventSequence.next)."""
    sets = [
        "#type = :type",
        "#reason = :reason",
        "#message = :message",
        "#last = :now",
        "#first = if_not_exists(#first, :now)",
        "#ttl = :ttl",
        "#seq = :seq",
    ]
    names = {
        "#type": "type",
        "#reason": "reason",
        "#message": "message",
        "#last": "last_seen",
        "#first": "first_seen",
        "#ttl": TTL_ATTR,
        "#count": "count",
        "#seq": "seq",
    }
    values: dict[str, Any] = {
        "type": event.type.value,
        "reason": event.reason,
        "message": event.message,
        "now": now,
        "ttl": expires_at(now),
        "seq": seq,
        "one": 1,
    }
    for attribute, value in (("replica_id", event.replica_id), ("version", event.version), ("code", event.code)):
        if value is not None:
            sets.append(f"#{attribute} = :{attribute}")
            names[f"#{attribute}"] = attribute
            values[attribute] = value
    return {
        "Update": {
            "TableName": table,
            "Key": to_raw(event_key(name, uid, now[:10], event.fold_key)),
            "UpdateExpression": "SET " + ", ".join(sets) + " ADD #count :one",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": expression_values(**values),
        }
    }


def event_updates(
    table: str, name: str, uid: str, events: Iterable[Event], now: str, sequence: EventSequence
) -> list[TransactWriteItemTypeDef]:
    """Several events of one write; the same event twice is one item (a transaction may not touch an
    item twice)."""
    unique = {event.fold_key: event for event in events}
    return [event_update(table, name, uid, event, now, sequence.next()) for event in unique.values()]


def event_from_item(item: Mapping[str, Any]) -> EventRecord:
    def optional_int(key: str) -> int | None:
        value = item.get(key)
        return None if value is None else int(value)

    event = Event(
        reason=str(item["reason"]),
        message=str(item["message"]),
        type=EventType(item["type"]),
        replica_id=optional_int("replica_id"),
        version=optional_int("version"),
        code=None if item.get("code") is None else str(item["code"]),
    )
    return EventRecord(
        event=event,
        first_seen=str(item["first_seen"]),
        last_seen=str(item["last_seen"]),
        count=int(item["count"]),
        expires_at=int(item[TTL_ATTR]),
        sequence=int(item.get("seq", 0)),
    )


def _order(record: EventRecord) -> tuple[str, int, str]:
    return (record.last_seen, record.sequence, record.event.fold_key)


def _newest(records: list[EventRecord]) -> list[EventRecord]:
    return sorted(records, key=_order, reverse=True)[:EVENTS_KEPT]


def encode_event_token(record: EventRecord) -> str:
    text = json.dumps({"t": record.last_seen, "s": record.sequence, "k": record.event.fold_key}, sort_keys=True)
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_event_token(token: str) -> tuple[str, int, str]:
    """(last_seen, sequence, fold key) of the last event of the previous page; MalformedPageToken otherwise."""
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
    except (ValueError, binascii.Error, UnicodeError, RecursionError) as exc:
        raise MalformedPageToken("malformed") from exc
    if not isinstance(key, dict) or set(key) != {"t", "s", "k"}:
        raise MalformedPageToken("unknown token")
    moment, sequence, fold = key["t"], key["s"], key["k"]
    if not isinstance(moment, str) or not isinstance(fold, str) or not _FOLD_KEY.fullmatch(fold):
        raise MalformedPageToken("unknown token")
    if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
        raise MalformedPageToken("unknown token")
    try:
        from_iso(moment)
    except ValueError as exc:
        raise MalformedPageToken("unknown token") from exc
    return moment, sequence, fold


class EventReads:
    """The events of a service's current incarnation, newest first."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def newest(self, service: ServiceRecord, now_epoch: int) -> list[EventRecord]:
        """The newest EVENTS_KEPT unexpired events, newest (last seen) first: one Query (paginated)."""
        records: list[EventRecord] = []
        day = None
        pages = self.table.query_pages(
            KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
            ExpressionAttributeValues=expression_values(pk=service_pk(service.name), prefix=event_prefix(service.uid)),
            ConsistentRead=True,
            ScanIndexForward=False,  # the newest days first
        )
        for page in pages:
            for raw in page["Items"]:
                item = from_raw(raw)
                item_day = str(item["SK"]).split("#")[2]
                if item_day != day:
                    if len(records) >= EVENTS_KEPT:
                        return _newest(records)  # every later item is of an older day
                    day = item_day
                try:
                    record = event_from_item(item)
                except (KeyError, ValueError, TypeError) as exc:
                    raise CorruptItem(service.name, str(item.get("SK", "")), f"{type(exc).__name__}: {exc}") from exc
                if record.expires_at > now_epoch:  # TTL deletes late: an expired item may still be read
                    records.append(record)
        return _newest(records)

    def page(
        self, service: ServiceRecord, *, limit: int, next_token: str | None, now_epoch: int
    ) -> tuple[list[EventRecord], str | None]:
        """A page of the newest events, newest first; `next_token` continues after the previous page."""
        after = decode_event_token(next_token) if next_token else None
        records: Sequence[EventRecord] = self.newest(service, now_epoch)
        if after is not None:
            records = [r for r in records if _order(r) < after]
        page = list(records[:limit])
        more = len(records) > limit
        return page, encode_event_token(page[-1]) if more and page else None
