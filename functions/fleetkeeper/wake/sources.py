"""A per-source bound on the wake target: how many requests one client may have recorded as demand.

The wake function answers anyone who reaches the load balancer. Its reserved concurrency (template.yaml,
WakeConcurrency) caps what a flood takes from the account's Lambda concurrency; the demand writes are
coalesced per service (fleetkeeper.wake.target); what is left is one client cycling through many
services at zero, each request a table write and a reconciler kick. So each process lets one source
(the client address the load balancer saw) through to the recorder at most SOURCE_REQUESTS times in
SOURCE_WINDOW_SECONDS; past that it answers 429 with Retry-After and touches nothing.

The source is the last address of X-Forwarded-For: the load balancer appends the address of the
connection it received (its default `append` mode), so the entries before it are the client's own
words and the last is not. Per process, not per account: with the reserved concurrency N, one source
gets at most N x SOURCE_REQUESTS requests through a window (a bound, not a quota).
https://docs.aws.amazon.com/elasticloadbalancing/latest/application/x-forwarded-headers.html

Pure but for the clock it is given.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# A client retrying a waking service per Retry-After (5 s) sends 12 a minute; a few services' worth.
SOURCE_REQUESTS = 60
SOURCE_WINDOW_SECONDS = 60.0
# Sources remembered per process; past it the least recently seen are forgotten.
MAX_SOURCES = 10_000
UNKNOWN_SOURCE = "unknown"


def source_of(headers: Mapping[str, str]) -> str:
    """The client address the load balancer saw: the last entry of X-Forwarded-For (lower-cased keys)."""
    forwarded = headers.get("x-forwarded-for", "")
    last = forwarded.rsplit(",", 1)[-1].strip()
    return last[:64] if last else UNKNOWN_SOURCE


@dataclass
class SourceBound:
    """At most `limit` requests per source in any `window` seconds (a sliding window), per process."""

    limit: int = SOURCE_REQUESTS
    window: float = SOURCE_WINDOW_SECONDS
    max_sources: int = MAX_SOURCES
    monotonic: Callable[[], float] = time.monotonic
    _seen: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, source: str) -> bool:
        """True when this request of `source` is within its bound (and counts against it)."""
        now = self.monotonic()
        with self._lock:
            times = self._seen.pop(source, None) or deque()
            while times and now - times[0] >= self.window:
                times.popleft()
            admitted = len(times) < self.limit
            if admitted:
                times.append(now)
            self._seen[source] = times  # re-inserted: dict order is recency
            while len(self._seen) > self.max_sources:
                del self._seen[next(iter(self._seen))]
            return admitted

    def retry_after(self, source: str) -> int:
        """Seconds until `source`'s oldest counted request leaves the window (at least 1)."""
        with self._lock:
            times = self._seen.get(source)
            if not times:
                return 1
            return max(1, int(times[0] + self.window - self.monotonic()) + 1)
