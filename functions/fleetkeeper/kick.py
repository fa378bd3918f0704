"""The reconciler kick: after an api write (at once), and from the reconciler itself (delayed) when a
warned replica's drain must start between two scheduled runs, or when a service in motion is worth
a look again (a follow-up, fleetkeeper.reconciler.followup). Best-effort: the schedule is the
backstop.

In AWS the kick is a message on the kick queue, whose event source invokes the reconciler worker
for that one service with a maximum concurrency: a storm of writes queues up instead of taking
the account's Lambda concurrency (a direct asynchronous invoke could not be capped without reserved
concurrency, which a new account cannot grant). In embedded mode a loopback URL wakes the local
reconciler loop. Neither may fail or slow an api request noticeably.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetkeeper.settings import Settings

logger = logging.getLogger(__name__)
# The embedded kick URL: loopback, answered at once by the local reconcile loop; one attempt.
KICK_URL_TIMEOUT_SECONDS = 1
# SQS's longest DelaySeconds.
MAX_DELAY_SECONDS = 900


@dataclass(frozen=True)
class ReconcilerKick:
    """Kicks the reconciler for one service: send to `queue_url`, else POST to `url`, else nothing."""

    queue_url: str | None = None
    url: str | None = None
    # The embedded API's bearer token, which its kick URL requires (never part of the repr: logs).
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> ReconcilerKick:
        return cls(queue_url=settings.kick_queue_url, url=settings.kick_url, token=settings.kick_token)

    def __call__(self, name: str, delay_seconds: int = 0) -> None:
        """Kick `name` now, or `delay_seconds` from now (at most MAX_DELAY_SECONDS). A delayed kick
        says when it is due, so the worker judges its age from then, not from when it was sent."""
        self._send(name, delay_seconds, None)

    def follow_up(self, name: str, delay_seconds: int, due: int) -> None:
        """The reconciler's follow-up for `name` (fleetkeeper.reconciler.followup): a delayed kick that
        names the due time the service item records, so the worker runs it only while it is still
        the service's pending follow-up (a duplicate, or one replaced since, is dropped)."""
        self._send(name, delay_seconds, due)

    def _send(self, name: str, delay_seconds: int, followup: int | None) -> None:
        delay = max(0, min(int(delay_seconds), MAX_DELAY_SECONDS))
        message: dict[str, object] = {"service": name}
        if delay:
            message["due"] = int(time.time()) + delay
            message["delay_seconds"] = delay
        if followup is not None:
            message["followup"] = followup
        body = json.dumps(message)
        try:
            if self.queue_url:
                from fleetkeeper import aws

                aws.sqs_for_kick().send_message(QueueUrl=self.queue_url, MessageBody=body, DelaySeconds=delay)
            elif self.url:
                headers = {"Content-Type": "application/json"}
                if self.token:
                    headers["Authorization"] = f"Bearer {self.token}"
                import urllib.request  # the embedded mode's kick only: on AWS the kick is an SQS message

                request = urllib.request.Request(self.url, data=body.encode(), method="POST", headers=headers)
                with urllib.request.urlopen(request, timeout=KICK_URL_TIMEOUT_SECONDS):
                    pass
        except Exception:  # a kick must never fail the write it follows
            logger.warning("could not kick the reconciler for %s; the schedule will pick it up", name, exc_info=True)
