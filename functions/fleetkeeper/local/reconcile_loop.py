"""The embedded mode's stand-in for the reconciler's two triggers: the schedule and the kick.

Runs the reconciler handler every `tick` seconds with a scheduled event (reconcile every service),
and as soon as possible after a kick with `{"service": name}` (reconcile that one), like the async
invoke the api makes in AWS. Runs happen one at a time on one thread, as a reserved concurrency of 1
would make them; a failed run is logged and the next one tries again (the schedule is the backstop).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fleetkeeper.local.context import LocalContext

# Outside the `fleetkeeper` logger tree: Powertools' logger there would stamp these with a handler's context.
logger = logging.getLogger("local.reconcile_loop")

Handler = Callable[[dict[str, Any], Any], Any]
RECONCILER_FUNCTION = "ReconcilerFunction"


def scheduled_event() -> dict[str, Any]:
    """The event EventBridge's schedule sends (the reconciler treats it as "reconcile everything")."""
    return {
        "version": "0",
        "id": "local",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/fleetkeeper-local-schedule"],
        "detail": {},
    }


class ReconcileLoop:
    def __init__(self, handler: Handler, *, tick: float, timeout_seconds: int = 60) -> None:
        self.handler = handler
        self.tick = tick
        self.timeout_seconds = timeout_seconds
        self.runs = 0
        self._kicked: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def kick(self, service: str) -> None:
        """Reconcile this service soon (the api calls this after every write, through the kick URL)."""
        with self._lock:
            self._kicked.add(service)
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=RECONCILER_FUNCTION, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self, event: dict[str, Any]) -> None:
        try:
            self.handler(event, LocalContext(RECONCILER_FUNCTION, self.timeout_seconds))
        except Exception:
            logger.exception("reconciler run failed (event %s); the next tick retries", event)
        finally:
            self.runs += 1

    def _loop(self) -> None:
        # Kicks are served as they come; the scheduled run still happens every `tick` seconds even
        # when kicks keep arriving, so no service waits on another's traffic.
        next_scheduled = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_scheduled - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            with self._lock:
                services, self._kicked = sorted(self._kicked), set()
            for service in services:
                self.run_once({"service": service})
            if time.monotonic() >= next_scheduled:
                self.run_once(scheduled_event())
                next_scheduled = time.monotonic() + self.tick
