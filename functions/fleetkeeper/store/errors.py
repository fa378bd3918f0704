"""What the store raises instead of doing what it was asked: facts, typed, with no words for people.

The store knows nothing of HTTP or of how to phrase a refusal. Its callers decide what a fact
means to their own audience: `fleetkeeper.api.services` maps the api's to HTTP errors and messages in
one place; the reconciler stops for a service on Superseded. The `str()` of each is for logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetkeeper.model import ServiceRecord


class StoreError(Exception):
    """Base of every refusal the store reports as a fact."""


@dataclass(eq=False)
class ServiceMissing(StoreError):
    """No service item of that name (it never existed, or it is gone)."""

    name: str

    def __post_init__(self) -> None:
        super().__init__(f"no service {self.name!r}")


@dataclass(eq=False)
class ServiceExists(StoreError):
    """A create found a service item of that name; `deleting` when it is on its way out."""

    name: str
    deleting: bool
    # The service item found, when it decodes: whose it is decides what the creator may be told.
    existing: ServiceRecord | None = None

    def __post_init__(self) -> None:
        super().__init__(f"service {self.name!r} exists{' (DELETING)' if self.deleting else ''}")


@dataclass(eq=False)
class UidCollision(StoreError):
    """A create's version item already existed under its fresh random uid; nothing was written."""

    name: str

    def __post_init__(self) -> None:
        super().__init__(f"version 1 of {self.name!r} already existed under a fresh uid")


@dataclass(eq=False)
class Recreated(StoreError):
    """The service item now belongs to another incarnation (another uid) than the one read."""

    name: str

    def __post_init__(self) -> None:
        super().__init__(f"service {self.name!r} has another uid than the one read")


@dataclass(eq=False)
class Deleting(StoreError):
    """A write that needs an ACTIVE service found it DELETING."""

    name: str

    def __post_init__(self) -> None:
        super().__init__(f"service {self.name!r} is DELETING")


@dataclass(eq=False)
class GenerationMismatch(StoreError):
    """The service is at generation `current`, not the `expected` one the caller named (If-Match)."""

    name: str
    current: int
    expected: int

    def __post_init__(self) -> None:
        super().__init__(f"service {self.name!r} is at generation {self.current}, not {self.expected}")


@dataclass(eq=False)
class Raced(StoreError):
    """Another writer moved the service between this caller's read and its write; a retry may pass."""

    name: str

    def __post_init__(self) -> None:
        super().__init__(f"service {self.name!r} changed between read and write")


@dataclass(eq=False)
class VersionMissing(StoreError):
    """The service has no item for `version` (never written, or pruned); `latest` is its newest."""

    name: str
    version: int
    latest: int

    def __post_init__(self) -> None:
        super().__init__(f"service {self.name!r} has no version {self.version} (latest {self.latest})")


@dataclass(eq=False)
class MalformedPageToken(StoreError):
    """A page token this store did not issue; `problem` says how it failed ("malformed", "unknown token")."""

    problem: str

    def __post_init__(self) -> None:
        super().__init__(f"page token: {self.problem}")


class Superseded(StoreError):
    """A reconciler write found its item changed since the run observed it: another writer won."""


@dataclass(eq=False)
class CorruptItem(StoreError):
    """An item of service `name` (sort key `sk`) does not decode: corrupt, or of another schema."""

    name: str
    sk: str
    problem: str

    def __post_init__(self) -> None:
        super().__init__(f"service {self.name!r}: item {self.sk} does not decode: {self.problem}")


@dataclass(eq=False)
class Contention(StoreError):
    """DynamoDB did not do what was asked, and nothing was written: another transaction held an item
    (`TransactionConflict`), throttling outlasted botocore's retries, or reads kept landing in the
    middle of a transaction (`torn read`). Asking again later is safe; `reason` is DynamoDB's code."""

    reason: str
    throttled: bool = False  # botocore already retried it: the caller should not multiply attempts

    def __post_init__(self) -> None:
        super().__init__(f"contention: {self.reason}")
