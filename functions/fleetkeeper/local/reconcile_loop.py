"""The embedded mode's stand-in for the reconciler's triggers: the schedule, the queue, the kick.

Every `tick` seconds it invokes the dispatcher handler with a scheduled event, as EventBridge does;
the dispatcher queues the services in shards on the in-memory AWS's reconcile queue, and the loop
then takes the shards off that queue one message at a time and invokes the worker handler with the
SQS event the queue's event source would send (deleting each message once the worker returns, as
the event source does): the same code path as on AWS. A kick (`{"service": name}`, posted by the
api to the kick URL) invokes the worker for that one service as soon as possible, as a message on
the kick queue would. Runs happen one at a time on one thread, as an event source with a maximum
concurrency of 1 would make them; a failed run is logged and the next tick tries again.
"""

from __future__ import annotations

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
        timeout_seconds: int = 60,
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
                self.scheduled_run()
                next_scheduled = time.monotonic() + self.tick
