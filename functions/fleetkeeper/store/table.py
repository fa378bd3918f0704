"""The shared base of every store: the table and its client, paginated queries, DynamoDB's limits,
and how to read a refused write's answer.

Condition failures are told apart by the item DynamoDB returns (`ReturnValuesOnConditionCheckFailure`)
and by each transaction item's `CancellationReasons`, never by parsing messages.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

from fleetkeeper.store.codec import Item, from_raw
from fleetkeeper.store.errors import Contention

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from botocore.exceptions import ClientError
    from mypy_boto3_dynamodb import DynamoDBClient

# Answers that mean "not now" rather than "no": nothing was written, and the same call may pass later.
# Throttling codes reach us only after botocore's own retries (fleetkeeper.aws) gave up.
THROTTLING_CODES = frozenset({"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"})
CONFLICT_CODES = frozenset({"TransactionConflictException", "TransactionInProgressException"})

# DynamoDB's ceilings on one call: the items of a TransactWriteItems, the requests of a BatchWriteItem.
TRANSACT_ITEM_LIMIT = 100
BATCH_WRITE_LIMIT = 25


class Table:
    """One table and the client that reaches it, created on first use (never at import)."""

    def __init__(self, name: str, client: DynamoDBClient | None = None) -> None:
        self.name = name
        self._client = client

    @property
    def raw_client(self) -> DynamoDBClient:
        """The botocore client itself (for Powertools, which reads its own errors)."""
        if self._client is None:
            from fleetkeeper import aws

            self._client = aws.dynamodb()  # cached per process in fleetkeeper.aws: cheap
        return self._client

    @property
    def client(self) -> DynamoDBClient:
        """The client every store calls: contention (a transaction conflict, throttling that outlasted
        botocore's retries) arrives as the typed `Contention`, never as a bare ClientError, for the
        api's store and the reconciler's alike."""
        return cast("DynamoDBClient", _ContentionAsFact(self.raw_client))

    def query_pages(self, before_each_call: Callable[[], None] | None = None, **query: Any) -> Iterator[dict[str, Any]]:
        """Every page of one Query, read lazily: the next page is asked for only when it is needed.

        `before_each_call` runs before each Query call (a caller with a deadline may refuse to start one).
        """
        while True:
            if before_each_call is not None:
                before_each_call()
            page = self.client.query(TableName=self.name, **query)
            yield dict(page)
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            query["ExclusiveStartKey"] = last


class _ContentionAsFact:
    """A DynamoDB client whose calls raise `Contention` for the answers in `contention_code`."""

    def __init__(self, client: DynamoDBClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute) or name.startswith("_") or name in {"get_paginator", "get_waiter", "can_paginate"}:
            return attribute

        @functools.wraps(attribute)
        def call(*args: Any, **kwargs: Any) -> Any:
            from botocore.exceptions import ClientError

            try:
                return attribute(*args, **kwargs)
            except ClientError as exc:
                reason = contention_code(exc)
                if reason is None:
                    raise
                raise Contention(reason, throttled=reason in THROTTLING_CODES) from exc

        return call


def contention_code(exc: ClientError) -> str | None:
    """Why a call met contention (DynamoDB's code), or None when the error is something else.

    A cancelled transaction counts when any item's reason is `TransactionConflict` (another
    transaction holds that item; nothing was written) or a throttling code.
    """
    code = error_code(exc)
    if code in THROTTLING_CODES or code in CONFLICT_CODES:
        return code
    for reason in cancellation_reasons(exc):
        if reason.get("Code") == "TransactionConflict" or reason.get("Code") in THROTTLING_CODES:
            return str(reason["Code"])
    return None


def error_code(exc: ClientError) -> str | None:
    code = exc.response.get("Error", {}).get("Code")
    return None if code is None else str(code)


def cancellation_reasons(exc: ClientError) -> list[dict[str, Any]]:
    """Per transaction item, why a TransactWriteItems was cancelled (empty for any other error)."""
    if error_code(exc) != "TransactionCanceledException":
        return []
    reasons: list[dict[str, Any]] = exc.response.get("CancellationReasons", [])  # type: ignore[assignment]
    return reasons


def condition_failed(reasons: list[dict[str, Any]], index: int) -> bool:
    """True when the `index`-th item of a cancelled transaction failed its condition."""
    return len(reasons) > index and reasons[index].get("Code") == "ConditionalCheckFailed"


def item_as_it_was(raw: Mapping[str, Any] | None) -> Item | None:
    """The item returned with a failed condition, as it was then (None: it did not exist)."""
    return from_raw(raw) if raw else None
