"""The wake target's work for one request, shared by the ALB's Lambda target (fleetkeeper.wake.handler)
and the embedded mode's balancer: record the demand (fleetkeeper.store.wake), kick the reconciler
when the write landed, and the 503 the client gets (fleetkeeper.wake.demand explains the whole mechanism).

A per-process memo skips the table for a service whose demand this process recorded (or saw
coalesced) less than WAKE_COALESCE_SECONDS ago: a client retrying, or a burst, costs one write per
window and process rather than one failed conditional write per request.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetkeeper.model import utcnow
from fleetkeeper.store.wake import record_demand
from fleetkeeper.wake.demand import RETRY_AFTER_SECONDS, WAKE_COALESCE_SECONDS, WAKE_ERROR_CODE, wake_message

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from fleetkeeper.store.table import Table

logger = logging.getLogger(__name__)


@dataclass
class DemandRecorder:
    """Records demand for services with no replica serving, and kicks the reconciler for them."""

    table: Table
    kick: Callable[[str], None]
    now: Callable[[], datetime] = utcnow
    monotonic: Callable[[], float] = time.monotonic
    _recent: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, service: str) -> bool:
        """Demand for `service`: True when this call recorded it (and kicked the reconciler)."""
        moment = self.monotonic()
        with self._lock:
            last = self._recent.get(service)
            if last is not None and moment - last < WAKE_COALESCE_SECONDS:
                return False
            self._recent[service] = moment
            if len(self._recent) > 10_000:  # a long-lived process: forget the oldest half
                for name, _ in sorted(self._recent.items(), key=lambda pair: pair[1])[:5_000]:
                    del self._recent[name]
        written = record_demand(self.table, service, self.now())
        if written:
            logger.info("service %s: a request with no replica serving; demand recorded, reconciler kicked", service)
            self.kick(service)
        return written


def waking_body(service: str) -> str:
    """The 503's body, in fleetkeeper's error shape."""
    return json.dumps({"error": {"code": WAKE_ERROR_CODE, "message": wake_message(service), "details": []}})


def waking_headers() -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Retry-After": str(RETRY_AFTER_SECONDS),
        # A 503 of a waking service must not be cached by anything in between.
        "Cache-Control": "no-store",
    }
