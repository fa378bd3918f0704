"""The reconcile queue as the dispatcher writes to it: shards in SendMessageBatch calls.

A batch can partly fail (SQS answers 200 with some entries under `Failed`): the entries SQS did not
blame on the request (SenderFault false: a throttle, an internal error) are sent once more; what
still fails is returned, reported and logged by the dispatcher, and those services wait for the
next period's dispatch (their last run's state stands; nothing is lost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetkeeper import aws
from fleetkeeper.reconciler.fanout import Shard, batches

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mypy_boto3_sqs import SQSClient


@dataclass
class ShardQueue:
    url: str
    calls: int = 0  # SendMessageBatch calls made (the dispatcher reports them)

    @property
    def sqs(self) -> SQSClient:
        return aws.sqs()

    def send(self, shards: Sequence[Shard]) -> list[Shard]:
        """Send every shard; returns those SQS would not take (after one more try of retryable ones)."""
        unsent: list[Shard] = []
        for batch in batches(shards):
            retryable, refused = self._send_batch(batch)
            if retryable:
                still_retryable, refused_again = self._send_batch(retryable)
                refused += still_retryable + refused_again
            unsent += refused
        return sorted(unsent, key=lambda shard: shard.index)

    def _send_batch(self, batch: Sequence[Shard]) -> tuple[list[Shard], list[Shard]]:
        """One SendMessageBatch: the shards worth another try, and those SQS refused for good."""
        by_id = {f"shard-{shard.index}": shard for shard in batch}
        self.calls += 1
        response = self.sqs.send_message_batch(
            QueueUrl=self.url,
            Entries=[{"Id": entry_id, "MessageBody": shard.body()} for entry_id, shard in by_id.items()],
        )
        retryable: list[Shard] = []
        refused: list[Shard] = []
        for failure in response.get("Failed", []):
            (refused if failure.get("SenderFault") else retryable).append(by_id[failure["Id"]])
        return retryable, refused
