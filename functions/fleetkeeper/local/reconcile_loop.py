"""The embedded mode's stand-in for the reconciler's triggers: the schedule, the queue, the kick.

Every `tick` seconds it invokes the dispatcher handler with a scheduled event, as EventBridge does;
the dispatcher queues the services in shards on the in-memory AWS's reconcile queue, and the loop
then takes the shards off that queue one message at a time and invokes the worker handler with the
SQS event the queue's event source would send (deleting each message once the worker returns, as
the event source does): the same code path as on AWS. A kick (`{"service": name}`, posted by the
api to the kick URL) invokes the worker for that one service as soon as possible, as a message on
the kick queue would. A delayed kick (a warned replica's drain, the reconciler's follow-up of a
service in motion: `{"service": name, "followup": due}`) is kept in this process until its delay is
over, as SQS's DelaySeconds keeps it on AWS, then run like any kick; the same follow-up asked for
twice is kept once. The tick stays the backstop. Runs happen one at a time on one thread, as an
event source with a maximum concurrency of 1 would make them; a failed run is logged and the next
tick tries again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fleetkeeper import aws
from fleetkeeper.local.context import LocalContext

# Outside the `fleetkeeper` logger tree: Powertools' logger there would stamp these with a handler's context.
logger = logging.getLogger("local.reconcile_loop")

Handler = Callable[[dict[str, Any], Any], Any]
RECONCILER_FUNCTION = "ReconcilerFunction"
DISPATCHER_FUNCTION = "DispatcherFunction"


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


def sqs_event(message: dict[str, Any], queue_arn: str) -> dict[str, Any]:
    """The event an SQS event source sends the function for one message (BatchSize 1)."""
    return {
        "Records": [
            {
                "messageId": message["MessageId"],
                "receiptHandle": message["ReceiptHandle"],
                "body": message["Body"],
                "attributes": message.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": message.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1",
            }
        ]
    }


class ReconcileLoop:
    def __init__(
        self,
        handler: Handler,
        *,
        tick: float,
        dispatcher: Handler | None = None,
        queue_url: str | None = None,
        # template.yaml's ReconcilerFunction Timeout: a long readiness probe's own run (a kick) has the
        # whole invocation for it here as on AWS (settings.MAX_READINESS_TIMEOUT_SECONDS).
        timeout_seconds: int = 120,
    ) -> None:
        # handler: the worker (ReconcilerFunction); dispatcher: DispatcherFunction, whose shards
        # arrive on queue_url. Without them (the loop's own tests), a tick invokes `handler` with
        # the scheduled event itself.
        self.handler = handler
        self.dispatcher = dispatcher
        self.queue_url = queue_url
        self.tick = tick
        self.timeout_seconds = timeout_seconds
        self.runs = 0
        self._kicked: set[str] = set()
        # Delayed kicks: (when, order, service, follow-up due time or None), soonest first.
        self._later: list[tuple[float, int, str, int | None]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def kick(self, service: str, delay: float = 0, followup: int | None = None) -> None:
        """Reconcile this service soon (the api calls this after every write, through the kick URL), or
        `delay` seconds from now; `followup`: the follow-up due time the kick names (the worker runs
        it only while it is the service's pending one)."""
        with self._lock:
            if delay <= 0 and followup is None:
                self._kicked.add(service)
            elif not any((s, f) == (service, followup) for _, _, s, f in self._later if followup is not None):
                heapq.heappush(self._later, (time.monotonic() + max(delay, 0), next(self._order), service, followup))
        self._wake.set()

    def pending(self) -> list[tuple[str, int | None]]:
        """The delayed kicks not yet due, soonest first (for tests and `fleetkeeper local`'s info)."""
        with self._lock:
            return [(service, followup) for _, _, service, followup in sorted(self._later)]

    def _due(self) -> list[dict[str, Any]]:
        """The delayed kicks whose time has come, as the worker's events, taken off the heap."""
        events: list[dict[str, Any]] = []
        with self._lock:
            while self._later and self._later[0][0] <= time.monotonic():
                _, _, service, followup = heapq.heappop(self._later)
                events.append({"service": service} if followup is None else {"service": service, "followup": followup})
        return events

    def _next_wake(self, next_scheduled: float) -> float:
        with self._lock:
            soonest = self._later[0][0] if self._later else next_scheduled
        return min(next_scheduled, soonest)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=RECONCILER_FUNCTION, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self, event: dict[str, Any]) -> bool:
        """One worker invocation; True when it returned (the event source then deletes the message)."""
        try:
            self.handler(event, LocalContext(RECONCILER_FUNCTION, self.timeout_seconds))
        except Exception:
            logger.exception("reconciler run failed (event %s); the next tick retries", event)
            return False
        finally:
            self.runs += 1
        return True

    def scheduled_run(self) -> None:
        """What the schedule sets off: the dispatcher, then every shard it queued, one at a time."""
        if self.dispatcher is None or self.queue_url is None:
            self.run_once(scheduled_event())
            return
        try:
            self.dispatcher(scheduled_event(), LocalContext(DISPATCHER_FUNCTION, self.timeout_seconds))
        except Exception:
            logger.exception("dispatcher run failed; the next tick retries")
            return
        sqs = aws.sqs()
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        while not self._stop.is_set():
            messages = sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=1, AttributeNames=["All"], WaitTimeSeconds=0
            ).get("Messages", [])
            if not messages:
                return
            (message,) = messages
            if self.run_once(sqs_event(dict(message), queue_arn)):
                sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])

    def _loop(self) -> None:
        # Kicks are served as they come, delayed ones when due; the scheduled run still happens every
        # `tick` seconds even when kicks keep arriving, so no service waits on another's traffic.
        next_scheduled = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(max(0.0, self._next_wake(next_scheduled) - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            with self._lock:
                services, self._kicked = sorted(self._kicked), set()
            for service in services:
                self.run_once({"service": service})
            for event in self._due():
                self.run_once(event)
            if time.monotonic() >= next_scheduled:
                self.scheduled_run()
                next_scheduled = time.monotonic() + self.tick
