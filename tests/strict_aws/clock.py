"""The layer's clock: virtual seconds, moved by the test, by AWS calls and by botocore's retry pauses."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


class VirtualClock:
    """Seconds since the start of a test, moved only on purpose: nothing here ever sleeps.

    The strict layer reads it for everything time-dependent it models (how long a launched instance
    stays invisible to DescribeInstances, how much time a Lambda invocation has left) and moves it
    when `StrictAws.call_latency` is set (every AWS attempt costs that much) and when botocore pauses
    before a retry (the pause is taken on this clock instead of the wall clock).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        # Called with the new time after each move (a simulation moves the process's wall clock
        # with it, so code that reads `datetime.now()` or `time.time()` reads this clock too).
        self.listeners: list[Callable[[float], None]] = []

    def time(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock forward; returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        with self._lock:
            self._now += seconds
            now = self._now
        for listener in self.listeners:
            listener(now)
        return now

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
