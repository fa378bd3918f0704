"""AWS calls the cleanup function makes per removed incarnation, measured against moto.

Prints a table: children deleted, Query calls, BatchWriteItem calls (= ceil(n / 25) with nothing
throttled), and the wall time here (moto in-process: an indication, not a DynamoDB latency).
Query calls: one per key prefix (versions, replicas) plus one per further 1 MB page DynamoDB reads;
the keys-only projection does not shrink pages, since DynamoDB sizes them by the items it reads.
Children are full version items (~0.5 KB: a spec) plus 2 replicas, as the api and reconciler write them.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
)

from moto import mock_aws  # noqa: E402

from fleetkeeper import aws  # noqa: E402
from fleetkeeper.cleanup.logic import Budget, Cleaner  # noqa: E402
from fleetkeeper.local.template import create_table  # noqa: E402
from fleetkeeper.store.cleanup import ChildKeys  # noqa: E402
from fleetkeeper.store.table import Table  # noqa: E402
from tests.support.cleanup_support import count_calls, partition_keys, seed_children  # noqa: E402

TABLE = "fleetkeeper-bench"
REPLICAS = 2


def measure(versions: int) -> tuple[int, int, int, float]:
    aws.reset_clients()
    with mock_aws():
        create_table(aws.dynamodb(), TABLE)
        seed_children(TABLE, "web", "0123456789abcdef", versions=versions, replicas=REPLICAS)
        queries, batches = count_calls("Query"), count_calls("BatchWriteItem")
        started = time.perf_counter()
        progress = Cleaner(
            children=ChildKeys(Table(TABLE), "web", "0123456789abcdef"),
            budget=Budget(remaining_ms=lambda: 300_000),
        ).run()
        elapsed = time.perf_counter() - started
        query_calls = len(queries)
        assert partition_keys(TABLE, "web") == set()
        assert len(batches) == math.ceil((versions + REPLICAS) / 25)
        return progress.deleted, query_calls, len(batches), elapsed


def main() -> None:
    print(f"{'children':>9} {'Query':>6} {'BatchWriteItem':>15} {'ceil(n/25)':>11} {'moto s':>7}")
    for versions in (1, 23, 24, 998, 9_998):
        deleted, queries, batches, elapsed = measure(versions)
        print(f"{deleted:>9} {queries:>6} {batches:>15} {math.ceil(deleted / 25):>11} {elapsed:>7.2f}")


if __name__ == "__main__":
    main()
