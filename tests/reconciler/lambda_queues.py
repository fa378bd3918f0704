"""The reconciler's queues as Lambda runs them, on the in-memory AWS: for tests of the whole path.

`LambdaQueues` creates the reconcile and kick queues as template.yaml declares them, points the
functions at them (the variables template.yaml sets), and plays the triggers: `tick()` is the
schedule (the dispatcher handler), then each queue's event source (one message per worker
invocation, deleted once the worker returns), kicks first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetkeeper import aws
from fleetkeeper.local.reconcile_loop import scheduled_event, sqs_event
from fleetkeeper.local.template import create_queue
from tests.support.handler_client import FakeContext

if TYPE_CHECKING:
    import pytest


class LambdaQueues:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, context: Any = None) -> None:
        self.reconcile = create_queue(aws.sqs(), "fleetkeeper-reconcile", "ReconcileQueue")
        self.kicks = create_queue(aws.sqs(), "fleetkeeper-kicks", "KickQueue")
        monkeypatch.setenv("FLEETKEEPER_RECONCILE_QUEUE_URL", self.reconcile)
        monkeypatch.setenv("FLEETKEEPER_KICK_QUEUE_URL", self.kicks)
        self.context = context or FakeContext()
        self.dispatches: list[dict[str, Any]] = []
        self.runs: list[dict[str, Any]] = []

    def tick(self) -> None:
        """Kicks waiting, then the schedule: the dispatcher, and every shard it queued."""
        from fleetkeeper.reconciler.handler import dispatch_handler

        self.drain(self.kicks)
        self.dispatches.append(dispatch_handler(scheduled_event(), self.context))
        self.drain(self.reconcile)

    def drain(self, url: str) -> int:
        """The event source of queue `url`: each message to the worker, one per invocation."""
        from fleetkeeper.reconciler.handler import lambda_handler

        sqs = aws.sqs()
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        taken = 0
        while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, AttributeNames=["All"]).get(
            "Messages", []
        ):
            for message in messages:
                self.runs.append(lambda_handler(sqs_event(dict(message), arn), self.context))
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
                taken += 1
        return taken
