"""The immediate reconciler kick after an api write. Best-effort: the schedule is the backstop.

In AWS the reconciler function is invoked asynchronously for the one service; in embedded mode a
loopback URL wakes the local reconciler loop. Neither may fail or slow an api request noticeably.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetkeeper.settings import Settings

logger = logging.getLogger(__name__)
# The embedded kick URL: loopback, answered at once by the local reconcile loop; one attempt.
KICK_URL_TIMEOUT_SECONDS = 1


@dataclass(frozen=True)
class ReconcilerKick:
    """Kicks the reconciler for one service: invoke `function_name`, else POST to `url`, else nothing."""

    function_name: str | None = None
    url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ReconcilerKick:
        return cls(function_name=settings.reconciler_function_name, url=settings.kick_url)

    def __call__(self, name: str) -> None:
        payload = json.dumps({"service": name}).encode()
        try:
            if self.function_name:
                from fleetkeeper import aws

                aws.lambda_for_kick().invoke(FunctionName=self.function_name, InvocationType="Event", Payload=payload)
            elif self.url:
                request = urllib.request.Request(
                    self.url, data=payload, method="POST", headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=KICK_URL_TIMEOUT_SECONDS):
                    pass
        except Exception:  # a kick must never fail the write it follows
            logger.warning("could not kick the reconciler for %s; the schedule will pick it up", name, exc_info=True)
