"""Reading services: one whole service (one Query on its partition), and the services index.

Shared by the api's store and the reconciler's, which each expose the reads they need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetkeeper.store.codec import (
    Item,
    RawItem,
    decode_token,
    decode_version_token,
    encode_token,
    expression_values,
    from_raw,
    service_from_item,
    state_from_items,
    to_raw,
    version_from_item,
)
from fleetkeeper.store.keys import (
    LIST_PK_ATTR,
    LIST_PK_VALUE,
    LIST_SK_ATTR,
    SERVICES_INDEX,
    WHOLE_SERVICE_FROM,
    service_key,
    service_pk,
    version_prefix,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from fleetkeeper.model import ServiceRecord, ServiceState, VersionRecord
    from fleetkeeper.store.table import Table

# A filtered list page reads the index this many items a Query, and at most LIST_EXAMINED_PER_PAGE
# items a page (a caller who sees a few of 10,000 services pages through the index in 4 requests;
# 2,500 items of ~1.5 KB are ~470 read units, eventually consistent at 8 KB a unit, and about a second).
_FILTERED_QUERY_LIMIT = 250
LIST_EXAMINED_PER_PAGE = 2500

# The sparse index's one partition: every service item, and nothing else.
_SERVICES_QUERY: dict[str, Any] = {
    "IndexName": SERVICES_INDEX,
    "KeyConditionExpression": f"{LIST_PK_ATTR} = :lpk",
    "ExpressionAttributeValues": expression_values(lpk=LIST_PK_VALUE),
}


def _index_key(raw: RawItem) -> RawItem:
    """The key of a services-index item (table and index keys): the ExclusiveStartKey after it."""
    return {name: raw[name] for name in ("PK", "SK", LIST_PK_ATTR, LIST_SK_ATTR)}


class ServiceReads:
    def __init__(self, table: Table) -> None:
        self.table = table

    def load(self, name: str) -> ServiceState | None:
        """The service with its versions and replicas: one consistent Query (paginated past 1 MB).

        From the service item on (`SK >= META`): its events sort before it and are not read."""
        items: list[Item] = []
        for page in self.table.query_pages(
            KeyConditionExpression="PK = :pk AND SK >= :meta",
            ExpressionAttributeValues=expression_values(pk=service_pk(name), meta=WHOLE_SERVICE_FROM),
            ConsistentRead=True,
        ):
            items.extend(from_raw(raw) for raw in page["Items"])
        return state_from_items(items)

    def service(self, name: str) -> ServiceRecord | None:
        """The service item alone: one consistent GetItem (serializable against transactions)."""
        raw = self.table.client.get_item(
            TableName=self.table.name, Key=to_raw(service_key(name)), ConsistentRead=True
        ).get("Item")
        return service_from_item(from_raw(raw)) if raw else None

    def versions_page(
        self, service: ServiceRecord, *, limit: int, next_token: str | None = None
    ) -> tuple[list[VersionRecord], str | None]:
        """A page of the incarnation's versions, oldest first: one consistent Query of `limit` items.

        Raises MalformedPageToken for a token that is not one of this incarnation's versions.
        """
        query: dict[str, Any] = {
            "KeyConditionExpression": "PK = :pk AND begins_with(SK, :prefix)",
            "ExpressionAttributeValues": expression_values(
                pk=service_pk(service.name), prefix=version_prefix(service.uid)
            ),
            "ConsistentRead": True,
            "Limit": limit,
        }
        if next_token:
            query["ExclusiveStartKey"] = decode_version_token(next_token, service.name, service.uid)
        page = self.table.client.query(TableName=self.table.name, **query)
        versions = [version_from_item(from_raw(raw)) for raw in page["Items"]]
        return versions, encode_token(page.get("LastEvaluatedKey"))

    def list_page(
        self,
        *,
        limit: int,
        next_token: str | None = None,
        visible: Callable[[ServiceRecord], bool] | None = None,
        examine_at_most: int | None = None,
    ) -> tuple[list[ServiceRecord], str | None]:
        """A page of service items from the sparse index (never version or replica items).

        `visible`: only the services it accepts are answered (a caller's own, fleetkeeper.owners.access).
        The index is read in order until `limit` of them are found, the index ends, or
        `examine_at_most` (default LIST_EXAMINED_PER_PAGE) items were read; the token continues
        right after the last item read. So a page may hold fewer than `limit` services (even none)
        while more may follow, but every page moves on by at least that many items or reaches the
        end: following the tokens always ends. Without `visible`, one Query of `limit` items, as DynamoDB pages it.

        Why read and filter here rather than with a FilterExpression: a filter expression is
        applied after the items are read and costs the same read capacity, and grants are principal
        patterns (`*`) no expression can match.

        Raises MalformedPageToken for a token this store did not issue.
        """
        start = decode_token(next_token) if next_token else None
        if visible is None:
            query: dict[str, Any] = {**_SERVICES_QUERY, "Limit": limit}
            if start is not None:
                query["ExclusiveStartKey"] = start
            page = self.table.client.query(TableName=self.table.name, **query)
            services = [service_from_item(from_raw(raw)) for raw in page["Items"]]
            return services, encode_token(page.get("LastEvaluatedKey"))
        budget = examine_at_most or LIST_EXAMINED_PER_PAGE
        found: list[ServiceRecord] = []
        examined = 0
        while True:
            query = {**_SERVICES_QUERY, "Limit": _FILTERED_QUERY_LIMIT}
            if start is not None:
                query["ExclusiveStartKey"] = start
            page = self.table.client.query(TableName=self.table.name, **query)
            items = page["Items"]
            following = page.get("LastEvaluatedKey")
            for index, raw in enumerate(items):
                examined += 1
                service = service_from_item(from_raw(raw))
                if visible(service):
                    found.append(service)
                    if len(found) == limit:
                        more = index < len(items) - 1 or following is not None
                        return found, encode_token(_index_key(raw)) if more else None
            if following is None:
                return found, None
            start = dict(following)
            if examined >= budget:
                return found, encode_token(following)

    def iter_services(self) -> Iterator[ServiceRecord]:
        """Every service item, page by page through the sparse index."""
        for page in self.table.query_pages(**_SERVICES_QUERY):
            for raw in page["Items"]:
                yield service_from_item(from_raw(raw))
