"""The scheduled run's fan-out, as data: shards, the messages that carry them, and their order.

Once a period the schedule invokes the dispatcher (fleetkeeper.reconciler.dispatcher). It lists the
services from the index, cuts the names into shards of at most `shard_size`, and sends each shard
as one message to the reconcile queue; the reconciler function takes one message per invocation
(an SQS event source with a maximum concurrency) and reconciles that shard's services in the time
its invocation and the period leave it. Pure: no AWS, no clock (the caller passes `run` and
`not_after`), so the sharding is tested exhaustively without a queue.

Why a shard is 100 services by default (settings.DEFAULT_SHARD_SIZE):
- the worker describes its shard's instances in ONE DescribeInstances call, filtered on the uids
  it loaded: EC2 accepts at most 200 filter values per call (FilterLimitExceeded), one of which is
  the managed tag's value (the listing by uid carries no stack-id filter: the uids are the stack's
  own, and its replicas from before stack ids must be seen to be adopted; the ownership check
  drops anything else, fleetkeeper.reconciler.ownership);
- at ~10 ms of DynamoDB and 2 ms of CPU per service, read 8 at a time, a shard takes about a second:
  far inside a period, so a slow replica or a throttled call has room;
- its message stays small (names only, <= 63 characters each: about 7 KB), far below SQS's limits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetkeeper.settings import MAX_SHARD_SIZE

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

# SQS: at most 10 messages per SendMessageBatch, and the batch's bodies together (each message's
# too) at most 256 KiB, the limit every queue has had (the queue in template.yaml sets it).
SQS_BATCH_ENTRIES = 10
SQS_MAX_PAYLOAD_BYTES = 256 * 1024
# The message format; a worker refuses a shard of another (a dispatcher of a newer deployment).
SHARD_FORMAT = 1
# The golden ratio's fractional part: successive runs' rotation offsets spread evenly over a shard
# (the three-gap theorem), so a service a cut-short run left out comes early in one of the next few.
_GOLDEN = 0.6180339887498949


class ShardError(ValueError):
    """A message that is not a shard this worker understands."""


@dataclass(frozen=True)
class Shard:
    """Services one worker invocation reconciles in one period.

    run        the period's index (epoch seconds // period): rotates the order the worker takes
               the services in, so none is always last
    index      the shard's position among the run's shards (for logs and reports)
    services   the names, sorted
    not_after  epoch seconds after which the worker starts no service: by then the next period's
               dispatcher has handed the same services out again
    """

    run: int
    index: int
    services: tuple[str, ...]
    not_after: float

    def body(self) -> str:
        return json.dumps(
            {
                "format": SHARD_FORMAT,
                "run": self.run,
                "index": self.index,
                "not_after": self.not_after,
                "services": list(self.services),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_body(cls, body: str) -> Shard:
        try:
            raw: Any = json.loads(body)
        except ValueError as exc:
            raise ShardError(f"a shard message is JSON: {exc}") from None
        if not isinstance(raw, dict) or raw.get("format") != SHARD_FORMAT:
            raise ShardError(f"not a shard message of format {SHARD_FORMAT}: {body[:200]!r}")
        run, index, not_after, services = (raw.get(key) for key in ("run", "index", "not_after", "services"))
        if not (isinstance(run, int) and isinstance(index, int) and isinstance(not_after, int | float)):
            raise ShardError(f"a shard has integer run and index and a numeric not_after: {body[:200]!r}")
        if not isinstance(services, list) or not all(isinstance(name, str) and name for name in services):
            raise ShardError(f"a shard's services are a list of names: {body[:200]!r}")
        return cls(run=run, index=index, services=tuple(services), not_after=float(not_after))

    def ordered(self) -> list[str]:
        """The services in the order this run takes them: rotated by the run (see `rotated`)."""
        return rotated(self.services, self.run)


def run_index(now: datetime, period_seconds: int) -> int:
    """The period `now` falls in: the same for every dispatch of one period."""
    return int(now.timestamp()) // period_seconds


def make_shards(names: Iterable[str], *, size: int, run: int, not_after: float) -> list[Shard]:
    """Every name in exactly one shard of at most `size`, in name order."""
    if not 1 <= size <= MAX_SHARD_SIZE:
        raise ValueError(f"a shard holds 1 to {MAX_SHARD_SIZE} services, not {size}")
    ordered = sorted(set(names))
    return [
        Shard(run=run, index=number, services=tuple(ordered[start : start + size]), not_after=not_after)
        for number, start in enumerate(range(0, len(ordered), size))
    ]


def batches(shards: Sequence[Shard]) -> list[list[Shard]]:
    """The shards grouped for SendMessageBatch: <= 10 a batch, the bodies together <= 256 KiB."""
    grouped: list[list[Shard]] = []
    current: list[Shard] = []
    current_bytes = 0
    for shard in shards:
        size = len(shard.body().encode())
        if size > SQS_MAX_PAYLOAD_BYTES:
            raise ValueError(f"shard {shard.index} is {size} bytes, over SQS's {SQS_MAX_PAYLOAD_BYTES}")
        if current and (len(current) == SQS_BATCH_ENTRIES or current_bytes + size > SQS_MAX_PAYLOAD_BYTES):
            grouped.append(current)
            current, current_bytes = [], 0
        current.append(shard)
        current_bytes += size
    if current:
        grouped.append(current)
    return grouped


def rotated(items: Sequence[str], run: int) -> list[str]:
    """`items` rotated by an offset that moves by the golden ratio of their number each run.

    A worker that runs out of time leaves the end of its order for the next run; with this offset
    the end moves around the shard so that every service is among the first k of some run within
    about len/k runs, with no state kept between runs.
    """
    if not items:
        return []
    start = int((run * _GOLDEN) % 1.0 * len(items))
    return [*items[start:], *items[:start]]
