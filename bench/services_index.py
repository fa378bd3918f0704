"""What the sparse `services` index costs in writes: each write of a service item (the only items
carrying its keys) is a write to the index's one partition key (`list_pk = SERVICE`), since the
index projects ALL attributes. Measured over a rolling update with follow-ups, the busiest a service
gets, in schedule time on the strict-AWS layer over moto (tests/simulation/reactions.py).

    .venv/bin/python bench/services_index.py

Prints the service item's size (DynamoDB's item size rules: attribute names plus values), the
service-item writes an update of 10 replicas makes and over how long, and how many services in
motion at once the index's partition takes before it reaches DynamoDB's per-partition write limit
(1,000 write units a second; one unit per KB of the item, rounded up, per index write).
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import offline_aws  # noqa: F401  (first: the path, fake credentials, probes on 127.0.0.1)

from fleetkeeper import aws
from fleetkeeper.store.keys import SERVICE_SK
from tests.simulation import reactions as r
from tests.strict_aws import FaultRates, StrictAws
from tests.support.reconciler_world import ProbeServer

PARTITION_WRITE_UNITS = 1000  # a second, per partition (DynamoDB's documented limit)


def item_size(item: dict[str, Any]) -> int:
    """Bytes of a raw (typed) DynamoDB item: names plus values, as DynamoDB counts them (numbers
    approximated by their digits; maps and lists 3 bytes each plus their contents)."""

    def value_size(value: dict[str, Any]) -> int:
        ((kind, inner),) = value.items()
        if kind in ("S", "N", "B"):
            return len(str(inner).encode())
        if kind == "BOOL" or kind == "NULL":
            return 1
        if kind == "M":
            return 3 + sum(len(k.encode()) + value_size(v) for k, v in inner.items())
        if kind == "L":
            return 3 + sum(1 + value_size(v) for v in inner)
        if kind in ("SS", "NS"):
            return sum(len(str(v).encode()) for v in inner)
        raise ValueError(kind)

    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


class MetaWrites:
    """Counts the writes that touch a service item (SK = META), on the reconciler's DynamoDB client."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        name = model.name
        if name in ("PutItem", "UpdateItem", "DeleteItem"):
            key = params.get("Key") or params.get("Item") or {}
            self.count += key.get("SK", {}).get("S") == SERVICE_SK
        elif name == "TransactWriteItems":
            for entry in params.get("TransactItems", []):
                for op in ("Put", "Update", "Delete"):
                    body = entry.get(op)
                    if body:
                        key = body.get("Key") or body.get("Item") or {}
                        self.count += key.get("SK", {}).get("S") == SERVICE_SK


def main() -> int:
    from moto import mock_aws

    logging.disable(logging.WARNING)
    server = ProbeServer()
    try:
        aws.reset_clients()
        strict = StrictAws(seed=7, faults=FaultRates.parse(""))
        with mock_aws(), strict.active():
            counter = MetaWrites()
            aws.dynamodb().meta.events.register("provide-client-params.dynamodb.*", counter)
            world = r.new_world(server, balanced=True)
            timeline = r.Timeline(world, True)
            timeline.schedule(30)
            r._create(timeline, "web", 10)
            r._converged(timeline, "web", 10)
            raw = aws.dynamodb().get_item(
                TableName=world.store.table.name, Key={"PK": {"S": "SVC#web"}, "SK": {"S": SERVICE_SK}}
            )["Item"]
            size = item_size(raw)
            before, start = counter.count, timeline.now
            world.update("web", replicas=10, envs={"RELEASE": "2"})
            timeline.api_kick("web")
            done = timeline.run_until(lambda: r._serving(world, "web", 2, 10), start + 6 * 3600)
            assert done is not None
            writes, seconds = counter.count - before, done - start
    finally:
        server.close()
    units = math.ceil(size / 1024)
    rate = writes / seconds
    per_service = rate * units
    print(f"service item: {size} bytes ({units} write unit(s) per index write)")
    print(f"rolling update of 10 replicas with follow-ups: {writes} service-item writes in {seconds:.0f} s")
    print(f"  = {rate:.3f} writes/s, {per_service:.3f} index write units/s per service in motion")
    print(
        f"one index partition ({PARTITION_WRITE_UNITS} units/s) takes {PARTITION_WRITE_UNITS / per_service:,.0f} "
        "services in motion at once"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
