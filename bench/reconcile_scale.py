"""The scheduled run at scale: one period of the dispatcher and its shard workers, at S services.

For S = 1,000 and 10,000 services of 2 replicas each, in a steady state seeded straight into the
table and EC2 (bench/reconcile_cost.py's seed: moto's transactions are too slow to create 10,000
services through the api). AWS is moto in-process, the reconcile queue included; every readiness
probe goes to one `python -m http.server` on 127.0.0.1 (its own process). One period is measured,
the first that changes nothing (the seed is the steady state, so usually the first):

- the dispatcher: its AWS calls (the index Query pages, SendMessageBatch, the sweep's
  DescribeInstances pages), the shards it queued, its CPU;
- each shard worker, run as the queue's event source runs it (one message per invocation,
  through `Reconciler.run_shard` with the handler's read concurrency and budget): AWS calls, CPU
  (the process's, less the CPU moto spends answering: moto is timed separately), moto's wall time;
- EC2 calls of the period against the account's rate limits, DynamoDB read units, and the
  monthly cost, with the latency model and prices printed alongside.

Run: .venv/bin/python bench/reconcile_scale.py [S ...]
"""

from __future__ import annotations

import math
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moto import mock_aws
from reconcile_cost import (
    PRICE_GB_S,
    PRICE_REQUEST,
    PRICE_RRU,
    REPLICAS,
    TABLE,
    Meter,
    ProbeServer,
    _driver,
    _read_units,
    _seed,
    _spec,
)

from fleetkeeper import aws
from fleetkeeper.local.template import create_queue, create_table
from fleetkeeper.model import to_iso
from fleetkeeper.reconciler.budget import ShardBudget
from fleetkeeper.reconciler.dispatcher import Dispatcher
from fleetkeeper.reconciler.driver import UID_TAG
from fleetkeeper.reconciler.fanout import Shard
from fleetkeeper.reconciler.queue import ShardQueue
from fleetkeeper.reconciler.run import Reconciler
from fleetkeeper.settings import DEFAULT_READ_CONCURRENCY, DEFAULT_SHARD_SIZE
from fleetkeeper.store.runs import ReconcilerStore
from fleetkeeper.store.table import Table


def _index_moto_tags() -> None:
    """moto finds a resource's tags by scanning every tag of the account (TagBackend.describe_tags
    with a resource-id filter), so a tag-filtered DescribeInstances over N instances costs O(N^2):
    hours at 20,000 instances. Look them up by id instead. The answers are the same; only moto's
    speed changes, and moto's CPU is not counted (Meter times it separately)."""
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    def get_tags(resource: Any) -> list[dict[str, str]]:
        if not resource.id:
            return []
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource.id), "")
        tags = resource.ec2_backend.tags.get(resource.id, {})
        return [{"resource_id": resource.id, "key": k, "value": v, "resource_type": kind} for k, v in tags.items()]

    TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]


def _index_moto_instances() -> None:
    """moto finds an instance by id by copying and scanning every reservation, and each launch
    looks its new instance and its root volume up that way: seeding 20,000 instances is O(N^2),
    hours. Keep an index by id (a new instance is found in the newest reservation), and find
    volumes by id in moto's own dict."""
    from moto.ec2.exceptions import InvalidInstanceIdError
    from moto.ec2.models.instances import InstanceBackend

    def lookup(backend: Any, instance_id: str) -> Any:
        index: dict[str, Any] = backend.__dict__.setdefault("_bench_instances", {})
        found = index.get(instance_id)
        if found is None and backend.reservations:
            for instance in next(reversed(backend.reservations.values())).instances:
                index[instance.id] = instance
            found = index.get(instance_id)
        if found is None:  # not launched through the newest reservation: index everything once more
            index.update({i.id: i for r in backend.reservations.values() for i in r.instances})
            found = index.get(instance_id)
        return found

    def get_instance(backend: Any, instance_id: str) -> Any:
        found = lookup(backend, instance_id)
        if found is None:
            raise InvalidInstanceIdError(instance_id)
        return found

    InstanceBackend.get_instance = get_instance  # type: ignore[method-assign]
    InstanceBackend.get_instance_by_id = lookup  # type: ignore[method-assign]

    # Each launch also tags its root volume, found by a scan of every volume.
    from moto.ec2.models.elastic_block_store import EBSBackend

    scan = EBSBackend.describe_volumes

    def describe_volumes(backend: Any, volume_ids: list[str] | None = None, filters: Any = None) -> list[Any]:
        if volume_ids and not filters and all(v in backend.volumes for v in volume_ids):
            return [backend.volumes[v] for v in volume_ids]
        return scan(backend, volume_ids=volume_ids, filters=filters)

    EBSBackend.describe_volumes = describe_volumes  # type: ignore[method-assign]

    # A shard worker's DescribeInstances filters on 100 uids: look at those uids' instances only,
    # not at a copy of every reservation (moto's filter then decides, as it would have).
    import copy

    from moto.ec2.utils import filter_reservations

    every = InstanceBackend.all_reservations

    def all_reservations(backend: Any, filters: Any = None) -> list[Any]:
        uids = set((filters or {}).get(f"tag:{UID_TAG}", []))
        if not uids:
            return every(backend, filters)
        wanted = {rid for rid, tags in backend.tags.items() if tags.get(UID_TAG) in uids}
        candidates = [copy.copy(r) for r in backend.reservations.values() if any(i.id in wanted for i in r.instances)]
        return filter_reservations(candidates, filters)

    InstanceBackend.all_reservations = all_reservations  # type: ignore[method-assign]


def _index_moto_queries() -> None:
    """moto answers a table Query by sorting and scanning every item of the table (Table.all_items)
    for the partition key: 10,000 Queries over 30,000 items took minutes per shard. A Query on the
    table (not an index) looks at its partition's items only; moto's own code still decides the
    answer from them. Per thread: a worker has 8 Queries in flight."""
    import threading

    from moto.dynamodb.models.table import Table as MotoTable

    current = threading.local()
    every_item = MotoTable.all_items
    query = MotoTable.query

    def all_items(table: Any) -> list[Any]:
        partition = getattr(current, "partition", None)
        if partition is None:
            return every_item(table)
        return sorted(partition.values(), key=lambda item: item.range_key)

    def partition_query(table: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index_name or hash_key is None or not table.range_key_attr:
            return query(table, hash_key, *args, **kwargs)
        current.partition = table.items.get(hash_key, {})
        try:
            return query(table, hash_key, *args, **kwargs)
        finally:
            current.partition = None

    MotoTable.all_items = all_items  # type: ignore[method-assign]
    MotoTable.query = partition_query  # type: ignore[method-assign]


PERIOD_SECONDS = 60
PERIODS_PER_MONTH = 730 * 60
SHARD_CONCURRENCY = 10  # template.yaml: ReconcilerShardConcurrency's default
DISPATCHER_MEMORY_GB = 0.5
WORKER_MEMORY_GB = 0.5
PRICE_SQS_REQUEST = 0.40 / 1e6  # standard queue, per 64 KB chunk of a request
# The latency model for AWS (in-region): moto's wall times say nothing about AWS's.
QUERY_MS = 6.0
INDEX_PAGE_MS = 30.0
SEND_BATCH_MS = 15.0
DESCRIBE_PAGE_MS = 400.0  # a page of up to 1,000 instances
PROBE_MS = 20.0
PROBE_WORKERS = 32
# The account's EC2 request limits (token buckets: burst, then refill per second).
EC2_LIMITS = {"DescribeInstances": (100, 20), "RunInstances": (5, 2), "mutating": (50, 5)}
# Lambda's SQS event source polls an idle queue too: ~5 long polls of 20 s at a time per queue.
IDLE_POLLS_PER_MINUTE = 5 * 3 * 2  # two queues (reconcile, kick)


def _period(reconciler: Reconciler, queue: ShardQueue, meter: Meter) -> dict[str, Any]:
    """One period: the dispatcher, then every shard it queued, as the event source would run them."""
    meter.reset()
    reconciler.driver = _driver()
    cpu, moto = time.process_time(), meter.moto_cpu
    dispatch = Dispatcher(reconciler, queue, shard_size=DEFAULT_SHARD_SIZE, period_seconds=PERIOD_SECONDS).run()
    dispatcher = {
        "calls": dict(meter.calls),
        "cpu_s": time.process_time() - cpu - (meter.moto_cpu - moto),
        "report": dispatch,
    }
    workers: list[dict[str, Any]] = []
    sqs = aws.sqs()
    while messages := sqs.receive_message(QueueUrl=queue.url, MaxNumberOfMessages=1).get("Messages", []):
        (message,) = messages
        shard = Shard.from_body(message["Body"])
        before = dict(meter.calls)
        cpu, moto, wall = time.process_time(), meter.moto_cpu, time.perf_counter()
        # moto's wall time is not AWS's (a shard that takes a second on AWS can take a minute
        # here): the budget never bites in this benchmark, which counts calls and CPU.
        budget = ShardBudget(lambda: 3600.0)
        reconciler.driver = _driver()
        report = reconciler.run_shard(shard.ordered(), budget)
        calls = {api: n - before.get(api, 0) for api, n in meter.calls.items() if n - before.get(api, 0)}
        workers.append(
            {
                "services": len(shard.services),
                "calls": calls,
                "cpu_s": time.process_time() - cpu - (meter.moto_cpu - moto),
                "wall_s": time.perf_counter() - wall,
                "report": report,
            }
        )
        sqs.delete_message(QueueUrl=queue.url, ReceiptHandle=message["ReceiptHandle"])
    for worker in workers:
        report = worker["report"]
        assert not (report.errors or report.skipped or report.cut_short), report.as_dict()
    # Every service listed was in one shard, and every shard was run: the figures are the period's.
    reconciled = sum(worker["services"] for worker in workers)
    assert reconciled == dispatch.services, f"{reconciled} services reconciled of {dispatch.services} listed"
    # The queue's own traffic is the fan-out working, not a change to the fleet.
    queue_calls = sum(n for api, n in meter.calls.items() if api.startswith("sqs:"))
    return {"dispatcher": dispatcher, "workers": workers, "mutations": meter.mutations() - queue_calls}


def measure(services: int, port: int, meter: Meter) -> dict[str, Any]:
    with mock_aws():
        aws.reset_clients()
        create_table(aws.dynamodb(), TABLE)
        meter.hook()
        aws.sqs().meta.events.register("before-call", meter._count)
        queue = ShardQueue(create_queue(aws.sqs(), "fleetkeeper-reconcile", "ReconcileQueue"))
        # The template keeps a shard 15 minutes (a period's shards are stale long before). On moto a
        # shard takes minutes, not a second, so at 10,000 services the last shards of a period
        # would expire before their turn: keep them as long as SQS allows.
        aws.sqs().set_queue_attributes(QueueUrl=queue.url, Attributes={"MessageRetentionPeriod": "1209600"})
        store = ReconcilerStore(Table(TABLE))
        clock = [datetime.now(UTC)]
        started = time.perf_counter()
        _seed(store, services, _spec(port), to_iso(clock[0]))
        seeded_s = time.perf_counter() - started
        reconciler = Reconciler(
            store=store,
            driver=_driver(),
            now=lambda: clock[0],
            probe_budget_seconds=20,
            read_concurrency=DEFAULT_READ_CONCURRENCY,
        )
        periods = 0
        while True:  # reconcile the seed until a period changes nothing: that period is measured
            periods += 1
            if periods > 10:
                raise RuntimeError(f"S={services}: no steady state in 10 periods")
            period = _period(reconciler, queue, meter)
            clock[0] += timedelta(seconds=PERIOD_SECONDS)
            if period["mutations"] == 0:
                break
        rru = _read_units(TABLE)
    aws.reset_clients()
    return {"services": services, "seeded_s": seeded_s, "periods_to_converge": periods, "rru": rru, **period}


def _sum(calls: dict[str, int], api: str) -> int:
    return sum(n for name, n in calls.items() if name == api or (api.endswith(":") and name.startswith(api)))


def _worker_estimate_s(worker: dict[str, Any]) -> float:
    """A worker's duration on AWS: its CPU, its Queries 8 at a time, its describe pages, its probes."""
    calls = worker["calls"]
    queries = _sum(calls, "dynamodb:Query")
    probes = worker["services"] * REPLICAS
    return (
        worker["cpu_s"]
        + math.ceil(queries / DEFAULT_READ_CONCURRENCY) * QUERY_MS / 1000
        + _sum(calls, "ec2:DescribeInstances") * DESCRIBE_PAGE_MS / 1000
        + math.ceil(probes / PROBE_WORKERS) * PROBE_MS / 1000
    )


def _dispatcher_estimate_s(dispatcher: dict[str, Any]) -> float:
    calls = dispatcher["calls"]
    return (
        dispatcher["cpu_s"]
        + _sum(calls, "dynamodb:Query") * INDEX_PAGE_MS / 1000
        + _sum(calls, "sqs:SendMessageBatch") * SEND_BATCH_MS / 1000
        + _sum(calls, "ec2:DescribeInstances") * DESCRIBE_PAGE_MS / 1000
    )


def report(row: dict[str, Any]) -> None:
    services, workers, dispatcher = row["services"], row["workers"], row["dispatcher"]
    worker_cpu = sum(w["cpu_s"] for w in workers)
    estimates = [_worker_estimate_s(w) for w in workers]
    dispatch_s = _dispatcher_estimate_s(dispatcher)
    # Workers start together, SHARD_CONCURRENCY at a time: the period's reconcile wall time on AWS.
    waves = math.ceil(len(workers) / SHARD_CONCURRENCY)
    period_s = dispatch_s + waves * max(estimates, default=0.0)
    ec2_worker = sum(_sum(w["calls"], "ec2:DescribeInstances") for w in workers)
    ec2_dispatch = _sum(dispatcher["calls"], "ec2:DescribeInstances")
    queries = sum(_sum(w["calls"], "dynamodb:Query") for w in workers) + _sum(dispatcher["calls"], "dynamodb:Query")
    writes = row["mutations"]
    sqs_requests = _sum(dispatcher["calls"], "sqs:SendMessageBatch") + 2 * len(workers) + IDLE_POLLS_PER_MINUTE
    invocations = 1 + len(workers)
    gb_s = dispatch_s * DISPATCHER_MEMORY_GB + sum(estimates) * WORKER_MEMORY_GB
    lambda_month = PERIODS_PER_MONTH * (gb_s * PRICE_GB_S + invocations * PRICE_REQUEST)
    dynamodb_month = PERIODS_PER_MONTH * row["rru"] * PRICE_RRU
    sqs_month = PERIODS_PER_MONTH * sqs_requests * PRICE_SQS_REQUEST
    burst, rate = EC2_LIMITS["DescribeInstances"]

    print(f"## S = {services:,} services, {services * REPLICAS:,} instances (seeded in {row['seeded_s']:.0f} s)\n")
    print("| figure | value |")
    print("|---|---:|")
    print(f"| periods until one changed nothing (the one measured) | {row['periods_to_converge']} |")
    print(
        f"| dispatcher calls | {_sum(dispatcher['calls'], 'dynamodb:Query')} index Query page(s), "
        f"{_sum(dispatcher['calls'], 'sqs:SendMessageBatch')} SendMessageBatch, {ec2_dispatch} DescribeInstances "
        "page(s) (the sweep) |"
    )
    print(f"| shards (messages) | {len(workers)} of <= {DEFAULT_SHARD_SIZE} services |")
    print(f"| dispatcher CPU | {1000 * dispatcher['cpu_s']:.0f} ms |")
    print(
        f"| worker CPU per service (reconciler only; incl. dispatcher) | {1000 * worker_cpu / services:.2f} ms "
        f"({1000 * (worker_cpu + dispatcher['cpu_s']) / services:.2f} ms) |"
    )
    print(
        f"| worker duration on AWS, estimated (min / max) | {min(estimates):.2f} s / {max(estimates):.2f} s |"
        if estimates
        else "| worker duration | no shard |"
    )
    print(f"| worker wall time on moto (max) | {max((w['wall_s'] for w in workers), default=0):.2f} s |")
    print(f"| the period's work on AWS, estimated ({SHARD_CONCURRENCY} workers at once) | {period_s:.1f} s |")
    print(f"| DynamoDB calls: Query (reads) / writes | {queries} / {writes} |")
    print(f"| DynamoDB read units per period | {row['rru']:.0f} |")
    print(
        f"| EC2 DescribeInstances per minute (workers + sweep) | {ec2_worker} + {ec2_dispatch} = "
        f"{ec2_worker + ec2_dispatch} of {rate * 60:,} allowed ({rate}/s; burst {burst}); at most "
        f"{SHARD_CONCURRENCY + min(ec2_dispatch, 1)} at once (the sweep's pages one after another) |"
    )
    print(f"| EC2 mutating calls in the steady state | {_sum(dispatcher['calls'], 'ec2:') - ec2_dispatch} |")
    print(f"| Lambda per month (invocations, GB-s) | ${lambda_month:.2f} ({invocations} invocations a period) |")
    print(f"| DynamoDB reads per month | ${dynamodb_month:.2f} |")
    print(f"| SQS per month | ${sqs_month:.2f} ({sqs_requests} requests a period) |")
    print(f"| **total per month** | **${lambda_month + dynamodb_month + sqs_month:.2f}** |\n")


def main(sizes: list[int]) -> None:
    _index_moto_tags()
    _index_moto_instances()
    _index_moto_queries()
    server = ProbeServer()
    meter = Meter()
    print("One steady-state period of the scheduled run: dispatcher + shard workers, 2 replicas per service\n")
    try:
        for services in sizes:  # each printed as soon as it is measured (10,000 takes long on moto)
            started = time.perf_counter()
            report(measure(services, server.port, meter))
            print(f"  S={services}: measured in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            sys.stdout.flush()
    finally:
        server.close()
    print(
        f"Assumptions: rate(1 minute) = {PERIODS_PER_MONTH:,} periods a month; shards of {DEFAULT_SHARD_SIZE}, "
        f"{SHARD_CONCURRENCY} workers at once (template defaults), {DEFAULT_READ_CONCURRENCY} Queries in flight "
        f"per worker. Durations on AWS are estimated: measured CPU + {QUERY_MS:.0f} ms per Query, "
        f"{INDEX_PAGE_MS:.0f} ms per index page, {SEND_BATCH_MS:.0f} ms per SendMessageBatch, "
        f"{DESCRIBE_PAGE_MS:.0f} ms per DescribeInstances page, probes at {PROBE_MS:.0f} ms, {PROBE_WORKERS} at "
        "once. Prices (us-east-1): Lambda arm64 $0.0000133334 per GB-s + $0.20 per million requests (512 MB "
        "each), DynamoDB $0.125 per million read units, SQS $0.40 per million requests (SendMessageBatch; "
        f"the event source's receive + delete per message; ~{IDLE_POLLS_PER_MINUTE} idle long polls a minute "
        "for the two queues). EC2 Describe calls and EventBridge schedules cost nothing."
    )


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [1_000, 10_000])
