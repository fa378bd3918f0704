"""Deleting one removed incarnation's children, within a time budget, retrying what DynamoDB defers.

Two layers of retries, never stacked: botocore (fleetkeeper.aws, standard mode) retries a throttled
or failed call itself, and a ClientError (or the store's Contention, for throttling) that still
comes out of it fails the record here at once (the stream delivers it again). What botocore does
not retry is a BatchWriteItem's partial success, `UnprocessedItems`: that is retried here, with
backoff. The time budget has two holders: a call (or a pause of ours) starts only while one attempt's
worst case and the reserve still fit after it (`Budget`), and botocore's own retries of a call are
held to the same end by the invocation's deadline (fleetkeeper.aws.deadline, set by the handler),
which stops a retry whose pause and attempt would not fit. Either way the record runs out of time
(`OutOfTime`) with its reserve still in hand.

The function's collaborators come in as parameters (the keys of the incarnation, the remaining time,
sleep, jitter), so tests can inject errors, unprocessed items and a clock that runs out.

Resumable by construction: nothing is remembered between attempts. A record that runs out of time
fails; the stream delivers it again and the next attempt re-queries what is left, so it continues
where the last one stopped. A record whose items are already gone queries nothing and succeeds.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fleetkeeper.aws import CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS, DeadlineReached
from fleetkeeper.store.table import BATCH_WRITE_LIMIT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from fleetkeeper.store.codec import RawItem


class ChildKeysPort(Protocol):
    """What the cleanup needs from the table (fleetkeeper.store.cleanup.ChildKeys in production)."""

    def keys(self, before_each_query: Callable[[], None] | None = None) -> Iterable[RawItem]: ...

    def delete(self, keys: list[RawItem]) -> list[RawItem]: ...


class IncarnationStore(Protocol):
    """What an incarnation keeps outside the table (its secrets, its workdir copies): deleted with it."""

    def delete_incarnation(self, service: str, uid: str, owner: str = "") -> int: ...


@dataclass(frozen=True)
class Incarnation:
    """The removed service item's identity: its name and the uid its children's keys carry."""

    name: str
    uid: str
    # Its owner (""; before ownership existed): its secrets and workdir copies are under the owner's
    # scope (fleetkeeper.replicas.identity).
    owner: str = ""

    @classmethod
    def from_old_image(cls, image: Mapping[str, Any]) -> Incarnation:
        name, uid = image.get("name"), image.get("uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            # Without the uid we cannot tell this incarnation's children from a newer one's: never guess.
            raise MalformedRecord(f"the removed service item has no name and uid: {sorted(image)}")
        owner = image.get("owner")
        return cls(name=name, uid=uid, owner=owner if isinstance(owner, str) else "")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter for UnprocessedItems, bounded."""

    attempts: int = 8  # BatchWriteItem calls per chunk, the first included
    base_seconds: float = 0.05
    cap_seconds: float = 2.0

    def delay(self, retry: int, jitter: Callable[[float], float]) -> float:
        """The pause before retry number `retry` (1, 2, ...): uniform in [0, min(cap, base * 2^retry)]."""
        return jitter(min(self.cap_seconds, self.base_seconds * 2**retry))


@dataclass(frozen=True)
class Budget:
    """The time left in this invocation.

    A DynamoDB call starts only while, after `pause_seconds` of our own, the call's first attempt
    (`attempt_ms`: the client's connect and read timeouts) and `reserve_ms` to report the failure
    would still fit. Its retries are the deadline's to hold (the handler's `aws.within`, ending
    `reserve_ms` before the invocation): each is taken only while its pause and attempt fit, so the
    call never needs its worst-case retry waits (aws.WORST_CASE_RETRY_WAIT_SECONDS, 56 s) in hand.
    """

    remaining_ms: Callable[[], int]
    reserve_ms: int = 5_000
    attempt_ms: int = (CONNECT_TIMEOUT_SECONDS + READ_TIMEOUT_SECONDS) * 1000

    def allows_call(self, pause_seconds: float = 0.0) -> bool:
        return self.remaining_ms() - pause_seconds * 1000 - self.attempt_ms > self.reserve_ms

    def deadline_seconds(self) -> float:
        """What the invocation's AWS calls may use: all but the reserve (`aws.within`'s argument)."""
        return (self.remaining_ms() - self.reserve_ms) / 1000


@dataclass
class CleanupCounts:
    """What one cleanup of an incarnation has done so far (the handler's log and metric read it)."""

    deleted: int = 0  # keys DynamoDB confirmed deleted (gone afterwards, whether or not they existed)
    batch_calls: int = 0
    retries: int = 0  # BatchWriteItem calls again for UnprocessedItems


class CleanupError(Exception):
    """This record could not be completed now; the stream will deliver it again."""

    def __init__(self, message: str, progress: CleanupCounts | None = None) -> None:
        super().__init__(message)
        self.progress = progress or CleanupCounts()


class MalformedRecord(CleanupError):
    pass


class OutOfTime(CleanupError):
    pass


class GaveUp(CleanupError):
    pass


def full_jitter(cap: float) -> float:
    """Full jitter: retries of many deferred chunks spread out instead of arriving together."""
    return random.uniform(0.0, cap)


@dataclass
class Cleaner:
    """Deletes every child of one incarnation, chunk by chunk, within the budget."""

    children: ChildKeysPort
    budget: Budget
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[float], float] = full_jitter

    progress: CleanupCounts = field(default_factory=CleanupCounts)  # also readable when run() raised

    def run(self) -> CleanupCounts:
        progress = self.progress = CleanupCounts()
        # Reading the keys is calls too (a Query per page): each is held to the budget like a delete.
        keys = self.children.keys(before_each_query=lambda: self._require_time_for_a_call(progress))
        try:
            for chunk in _chunks(keys, BATCH_WRITE_LIMIT):
                self._delete_chunk(chunk, progress)
        except DeadlineReached as reached:
            # botocore's retries of a call ran into the invocation's end: the same as our own budget's.
            raise OutOfTime(
                f"time budget spent after deleting {progress.deleted} item(s) ({reached}); the retry continues",
                progress,
            ) from reached
        return progress

    def _require_time_for_a_call(self, progress: CleanupCounts, *, pending: int = 0, pause: float = 0.0) -> None:
        if self.budget.allows_call(pause):
            return
        if pending:
            raise OutOfTime(f"time budget spent retrying {pending} deferred delete(s); the retry continues", progress)
        raise OutOfTime(f"time budget spent after deleting {progress.deleted} item(s); the retry continues", progress)

    def _delete_chunk(self, chunk: list[RawItem], progress: CleanupCounts) -> None:
        pending = chunk
        for attempt in range(1, self.policy.attempts + 1):
            if attempt == 1:
                self._require_time_for_a_call(progress)
            else:
                pause = self.policy.delay(attempt - 1, self.jitter)
                self._require_time_for_a_call(progress, pending=len(pending), pause=pause)
                self.sleep(pause)
                progress.retries += 1
            progress.batch_calls += 1
            # A ClientError (Contention, for throttling) propagates: botocore has already retried it, and
            # retrying again here would multiply its attempts. The record fails; the stream retries.
            unprocessed = self.children.delete(pending)
            progress.deleted += len(pending) - len(unprocessed)
            if not unprocessed:
                return
            pending = unprocessed
        raise GaveUp(
            f"{len(pending)} delete(s) still deferred after {self.policy.attempts} attempts; "
            "the stream will retry this record",
            progress,
        )


def _chunks(keys: Iterable[RawItem], size: int) -> Iterator[list[RawItem]]:
    """Fixed-size chunks across query pages and prefixes, so n keys take ceil(n / size) calls."""
    iterator = iter(keys)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
