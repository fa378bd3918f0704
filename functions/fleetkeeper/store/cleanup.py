"""The cleanup's reads and deletes: the children of one removed incarnation, and nothing else.

The cleanup function (fleetkeeper/cleanup) deletes the version, replica and event items of an
incarnation whose service item was removed. Both operations address children ONLY through the uid's
sort-key prefixes (`V#<uid>#`, `R#<uid>#`, `E#<uid>#`), so a newer incarnation of the same name
(another uid) is out of reach by construction. Retries of deferred items and the time budget are the caller's
(cleanup/logic.py); throttling is botocore's (fleetkeeper.aws).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetkeeper.store.codec import RawItem, expression_values, from_raw, to_raw
from fleetkeeper.store.keys import SERVICE_SK, child_prefixes, service_key, service_pk
from fleetkeeper.store.table import BATCH_WRITE_LIMIT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from fleetkeeper.store.table import Table


class ChildKeys:
    """Reads and deletes the child items of one incarnation: (name, uid)."""

    def __init__(self, table: Table, name: str, uid: str) -> None:
        if not name or not uid:
            raise ValueError("cleanup needs both the service name and the incarnation uid")
        self.table = table
        self.pk = service_pk(name)
        self.prefixes = child_prefixes(uid)

    def keys(self, before_each_query: Callable[[], None] | None = None) -> Iterator[RawItem]:
        """Every remaining child key (versions, then replicas), page by page, keys only.

        Lazy: a caller that deletes while iterating only asks for the next page when it needs it,
        and items it already deleted lie behind the page cursor. `before_each_query` runs before
        each Query call.
        """
        for prefix in self.prefixes:
            for page in self.table.query_pages(
                before_each_query,
                KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
                ExpressionAttributeValues=expression_values(pk=self.pk, prefix=prefix),
                ProjectionExpression="PK, SK",
                ConsistentRead=True,
            ):
                yield from page["Items"]

    def owns(self, key: Mapping[str, Any]) -> bool:
        """True for a key of this incarnation: a last guard before anything is deleted."""
        sk = key.get("SK", {}).get("S", "")
        return key.get("PK", {}).get("S") == self.pk and any(sk.startswith(p) for p in self.prefixes)

    def delete(self, keys: list[RawItem]) -> list[RawItem]:
        """ONE BatchWriteItem of up to 25 deletes; returns the keys DynamoDB left unprocessed.

        Deleting an item that is already gone succeeds, so a repeated chunk is harmless.
        """
        if not 0 < len(keys) <= BATCH_WRITE_LIMIT:
            raise ValueError(f"a delete batch holds 1..{BATCH_WRITE_LIMIT} keys, got {len(keys)}")
        foreign = [k for k in keys if not self.owns(k)]
        if foreign:
            raise ValueError(f"refusing to delete keys of another incarnation: {foreign[:3]}")
        response = self.table.client.batch_write_item(
            RequestItems={self.table.name: [{"DeleteRequest": {"Key": key}} for key in keys]}
        )
        unprocessed = response.get("UnprocessedItems", {}).get(self.table.name, [])
        return [dict(request["DeleteRequest"]["Key"]) for request in unprocessed if "DeleteRequest" in request]


def live_uid(table: Table, name: str) -> str | None:
    """The uid of service `name`'s item as it is now (None when there is none): one consistent
    GetItem, which is serializable against the transactions that create and delete services.

    The cleanup asks it before deleting anything: a REMOVE record whose uid is still the live one is
    not a removal (a forged event handed to the function, or a record replayed onto a name whose item
    was never deleted), and deletes nothing.
    """
    response = table.client.get_item(
        TableName=table.name,
        Key=to_raw(service_key(name)),
        ProjectionExpression="uid",
        ConsistentRead=True,
    )
    uid = from_raw(response["Item"]).get("uid") if "Item" in response else None
    return str(uid) if uid else None


def partition_uids(table: Table, name: str) -> tuple[str | None, dict[str, int]]:
    """The live incarnation's uid (None when its service item is gone) and child counts per uid.

    Read-only, for an operator (cleanup/manual.py): a Query is not isolated from a concurrent
    create's transaction, so what it shows is a hint for a person, never a reason for code to delete.
    """
    live: str | None = None
    counts: dict[str, int] = {}
    for page in table.query_pages(
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues=expression_values(pk=service_pk(name)),
        ProjectionExpression="SK, uid",
        ConsistentRead=True,
    ):
        for item in map(from_raw, page["Items"]):
            if item["SK"] == SERVICE_SK:
                live = str(item["uid"])
            elif "uid" in item:
                counts[str(item["uid"])] = counts.get(str(item["uid"]), 0) + 1
    return live, counts
