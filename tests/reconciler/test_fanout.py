"""The scheduled run's fan-out: shards, the dispatcher, bounded workers, parallel reads, EC2's limits."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws
from fleetkeeper.model import ServiceStatus
from fleetkeeper.reconciler.budget import ShardBudget
from fleetkeeper.reconciler.dispatcher import Dispatcher
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.reconciler.fanout import (
    SQS_BATCH_ENTRIES,
    SQS_MAX_PAYLOAD_BYTES,
    Shard,
    ShardError,
    batches,
    make_shards,
    rotated,
)
from fleetkeeper.reconciler.plan import Policy
from fleetkeeper.reconciler.queue import ShardQueue
from fleetkeeper.settings import MAX_SHARD_SIZE
from fleetkeeper.store import keys
from tests.reconciler.lambda_queues import LambdaQueues
from tests.support.handler_client import FakeContext
from tests.support.reconciler_world import assert_converged, assert_deleted

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import World

LONGEST_NAME = 63


# --- shards, as data -----------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 99, 100, 101, 1_000, 10_000])
@pytest.mark.parametrize("size", [1, 7, 100, MAX_SHARD_SIZE])
def test_every_service_is_in_exactly_one_shard_of_at_most_the_size(count: int, size: int) -> None:
    names = [f"svc-{i:05d}" for i in range(count)]
    shards = make_shards(reversed(names), size=size, run=42, not_after=1e9)
    flat = [name for shard in shards for name in shard.services]
    assert flat == names  # each exactly once, in name order
    assert all(1 <= len(shard.services) <= size for shard in shards)
    assert len(shards) == math.ceil(count / size)
    assert [shard.index for shard in shards] == list(range(len(shards)))


def test_a_name_listed_twice_is_still_in_one_shard() -> None:
    (shard,) = make_shards(["b", "a", "b"], size=10, run=0, not_after=0)
    assert shard.services == ("a", "b")


@pytest.mark.parametrize("size", [0, MAX_SHARD_SIZE + 1])
def test_a_shard_size_ec2_could_not_describe_in_one_call_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match=f"1 to {MAX_SHARD_SIZE}"):
        make_shards(["a"], size=size, run=0, not_after=0)


def test_batches_keep_within_sqs_limits_at_the_largest_shards() -> None:
    names = [f"{i:05d}".ljust(LONGEST_NAME, "x") for i in range(10_000)]
    shards = make_shards(names, size=MAX_SHARD_SIZE, run=1, not_after=1e9)
    grouped = batches(shards)
    assert [shard for batch in grouped for shard in batch] == shards
    for batch in grouped:
        assert 1 <= len(batch) <= SQS_BATCH_ENTRIES
        assert sum(len(shard.body().encode()) for shard in batch) <= SQS_MAX_PAYLOAD_BYTES
    # The largest shard's message, and the 10 in a call, are far inside the limits.
    assert max(len(shard.body().encode()) for shard in shards) < 14_000
    assert len(grouped) == math.ceil(len(shards) / SQS_BATCH_ENTRIES)


def test_batches_split_on_size_before_count() -> None:
    big = [Shard(run=0, index=i, services=("n" * 60_000,), not_after=0) for i in range(6)]
    grouped = batches(big)
    assert [len(batch) for batch in grouped] == [4, 2]  # 4 x ~60 KB fit in 256 KiB, 5 do not
    with pytest.raises(ValueError, match="over SQS's"):
        batches([Shard(run=0, index=9, services=("n" * SQS_MAX_PAYLOAD_BYTES,), not_after=0)])


def test_a_shard_round_trips_and_any_other_body_is_refused_with_its_reason() -> None:
    shard = Shard(run=29_000_000, index=3, services=("api", "web"), not_after=1_740_000_055.5)
    assert Shard.from_body(shard.body()) == shard
    for body, reason in [
        ("not json", "is JSON"),
        ('{"service": "web"}', "not a shard message"),
        ('{"format": 2, "run": 1, "index": 0, "not_after": 1, "services": []}', "not a shard message"),
        ('{"format": 1, "run": "1", "index": 0, "not_after": 1, "services": []}', "integer run"),
        ('{"format": 1, "run": 1, "index": 0, "not_after": 1, "services": [""]}', "list of names"),
    ]:
        with pytest.raises(ShardError, match=reason):
            Shard.from_body(body)


def test_rotation_is_a_permutation_and_no_service_waits_long_for_the_front() -> None:
    """A worker that gets through only the first k of n services each run: every service is among
    the first k within a few more runs than n/k, wherever the runs start."""
    n, k = 100, 30
    names = [f"s{i:03d}" for i in range(n)]
    bound = math.ceil(n / k) + 2
    for first_run in range(0, 500, 7):
        orders = [rotated(names, run) for run in range(first_run, first_run + bound)]
        assert all(sorted(order) == names for order in orders)
        reached = {name for order in orders for name in order[:k]}
        assert reached == set(names), f"starved from run {first_run}: {sorted(set(names) - reached)[:5]}"


# --- the dispatcher ------------------------------------------------------------------------------


def test_the_dispatcher_queues_every_service_once_and_sweeps_orphans(world: World) -> None:
    created = world.create("gone")
    world.converge()
    for number in range(204):  # index entries are all the dispatcher reads
        aws.dynamodb().put_item(
            TableName=world.store.table.name,
            Item={
                "PK": {"S": f"SVC#bulk-{number:03d}"},
                "SK": {"S": "META"},
                keys.LIST_PK_ATTR: {"S": keys.LIST_PK_VALUE},
                keys.LIST_SK_ATTR: {"S": f"bulk-{number:03d}"},
                "uid": {"S": f"uid-{number}"},
            },
        )
    # "gone" loses its item without the reconciler's delete: its instances are orphans.
    aws.dynamodb().delete_item(TableName=world.store.table.name, Key={"PK": {"S": "SVC#gone"}, "SK": {"S": "META"}})
    world.clock.advance(Policy().orphan_grace.total_seconds() + 60)
    url = aws.sqs().create_queue(QueueName="reconcile")["QueueUrl"]
    queue = ShardQueue(url)
    report = Dispatcher(world.reconciler, queue, shard_size=100, period_seconds=60).run()

    assert (report.services, report.shards, report.send_calls, report.unsent) == (204, 3, 1, [])
    queued: list[Shard] = []
    while messages := aws.sqs().receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for message in messages:
            queued.append(Shard.from_body(message["Body"]))
            aws.sqs().delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    names = sorted(name for shard in queued for name in shard.services)
    assert names == [f"bulk-{number:03d}" for number in range(204)]
    assert sorted(len(shard.services) for shard in queued) == [4, 100, 100]
    now = world.clock().timestamp()
    assert {shard.not_after for shard in queued} == {now + 55}
    assert len(report.sweep["orphans_terminated"]) == 2
    assert_deleted(world, created.service.uid)


class PartlyFailingSqs:
    """SendMessageBatch that fails given entries the first time they are sent."""

    def __init__(self, fail: dict[int, bool]) -> None:
        self.fail = fail  # shard index -> SenderFault
        self.sent: list[list[str]] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        self.sent.append([entry["Id"] for entry in Entries])
        failed = []
        for entry in Entries:
            index = int(entry["Id"].removeprefix("shard-"))
            if index in self.fail:
                failed.append({"Id": entry["Id"], "SenderFault": self.fail[index], "Code": "X"})
                if not self.fail[index]:
                    del self.fail[index]  # a transient failure: the next try succeeds
        return {"Successful": [], "Failed": failed}


def test_a_transient_batch_failure_is_sent_once_more_and_a_refused_shard_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = PartlyFailingSqs({1: False, 2: True})
    monkeypatch.setattr(ShardQueue, "sqs", property(lambda _self: fake))
    shards = make_shards([f"s{i}" for i in range(40)], size=10, run=0, not_after=0)
    queue = ShardQueue("https://sqs.example/queue")
    unsent = queue.send(shards)
    assert [shard.index for shard in unsent] == [2]
    assert fake.sent == [["shard-0", "shard-1", "shard-2", "shard-3"], ["shard-1"]]
    assert queue.calls == 2


# --- the worker: bounded runs --------------------------------------------------------------------


def shard_event(shard: Shard) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": "m-1",
                "receiptHandle": "r-1",
                "body": shard.body(),
                "attributes": {"SentTimestamp": str(int(time.time() * 1000))},
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:reconcile",
            }
        ]
    }


def test_a_worker_with_3_seconds_left_starts_no_service_and_returns_at_once(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper.reconciler.handler import lambda_handler

    monkeypatch.setenv("TABLE_NAME", world.store.table.name)
    for name in ("a", "b", "c"):
        world.create(name)
    shard = Shard(run=1, index=0, services=("a", "b", "c"), not_after=time.time() + 55)
    queries = strict_aws.attempts_of("dynamodb", "Query")
    with strict_aws.lambda_context(timeout_seconds=3, function_name="fleetkeeper-reconciler") as context:
        result = lambda_handler(shard_event(shard), context)
        left = context.get_remaining_time_in_millis()
    (run,) = result["runs"]
    assert sorted(run["skipped"]) == ["a", "b", "c"] and run["actions"] == {}
    # The default margin (10 s) is more than it has: it read nothing and used no time.
    assert strict_aws.attempts_of("dynamodb", "Query") == queries
    assert left == 3000


def test_short_runs_stop_in_time_and_rotation_still_brings_every_service_to_ready(
    world: World, strict_aws: StrictAws
) -> None:
    names = [f"svc-{i:02d}" for i in range(8)]
    for name in names:
        world.create(name, replicas=1)
    strict_aws.call_latency = 0.1  # every AWS attempt costs 100 ms of the invocation's time
    runs_cut = 0
    for run in range(40):
        with strict_aws.lambda_context(timeout_seconds=3.0, function_name="fleetkeeper-reconciler") as context:

            def remaining(context: Any = context) -> float:
                return context.get_remaining_time_in_millis() / 1000 - 0.2

            budget = ShardBudget(remaining, service_margin=0.8, action_margin=0.4)
            report = world.reconciler.run_shard(rotated(names, run), budget)
            left = context.get_remaining_time_in_millis()
        assert left >= 300, f"run {run} returned with {left} ms left"  # never near Lambda's kill
        runs_cut += bool(report.skipped or report.cut_short)
        world.clock.advance()
        states = [world.store.load(name) for name in names]
        if all(s is not None and s.service.status is ServiceStatus.READY for s in states):
            print(f"every service READY after {run + 1} runs of 3 s, {runs_cut} of them cut short")
            break
    else:
        pytest.fail("short runs never brought every service to READY")
    assert runs_cut >= 3, "the runs were never short: the test proves nothing about budgets"
    strict_aws.call_latency = 0.0
    world.converge()
    for name in names:
        assert_converged(world, name, replicas=1)


def test_a_service_cut_short_before_a_launch_is_launched_by_the_next_run(world: World) -> None:
    world.create(replicas=2)
    # Room to start a service, none for a launch: the run claims the replicas and stops there.
    budget = ShardBudget(lambda: 1.0, service_margin=0.5, action_margin=2.0)
    report = world.reconciler.run_shard(["svc"], budget)
    assert report.cut_short == ["svc"] and report.actions == {"Claim": 1}
    assert world.instances() == []
    world.clock.advance()
    world.converge()
    assert_converged(world, replicas=2)


def test_a_stale_shard_a_malformed_message_and_an_old_kick_are_dropped(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper.reconciler.handler import lambda_handler

    monkeypatch.setenv("TABLE_NAME", world.store.table.name)
    world.create()
    stale = Shard(run=1, index=0, services=("svc",), not_after=time.time() - 1)
    (run,) = lambda_handler(shard_event(stale), FakeContext())["runs"]
    assert run == {"shard": 0, "run": 1, "stale": True, "skipped": ["svc"]}

    malformed = shard_event(stale)
    malformed["Records"][0]["body"] = '{"format": 99}'
    (run,) = lambda_handler(malformed, FakeContext())["runs"]
    assert "not a shard message" in run["dropped"]

    old_kick = shard_event(stale)
    old_kick["Records"][0]["body"] = json.dumps({"service": "svc"})
    old_kick["Records"][0]["attributes"]["SentTimestamp"] = str(int((time.time() - 120) * 1000))
    (run,) = lambda_handler(old_kick, FakeContext())["runs"]
    assert run == {"kick": "svc", "stale": True}
    assert world.instances() == []  # none of the three did anything

    # A delayed kick (a spot-interrupted replica's drain) is as old as its due time, not its sending.
    delayed_kick = shard_event(stale)
    delayed_kick["Records"][0]["body"] = json.dumps({"service": "svc", "due": int(time.time()), "delay_seconds": 120})
    delayed_kick["Records"][0]["attributes"]["SentTimestamp"] = str(int((time.time() - 120) * 1000))
    (run,) = lambda_handler(delayed_kick, FakeContext())["runs"]
    assert run["kick"] == "svc" and run["actions"]["Launch"] == 2


def test_the_schedule_through_dispatcher_queue_and_workers_converges_many_services(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TABLE_NAME", world.store.table.name)
    monkeypatch.setenv("FLEETKEEPER_SHARD_SIZE", "4")
    names = [f"svc-{i:02d}" for i in range(10)]
    for name in names:
        world.create(name, replicas=1)
    queues = LambdaQueues(monkeypatch)
    for _ in range(3):
        queues.tick()
    assert [d["shards"] for d in queues.dispatches] == [3, 3, 3]
    for name in names:
        assert_converged(world, name, replicas=1)
    assert not any(run.get("skipped") or run.get("errors") for run in queues.runs)


# --- the worker: reads and EC2 ---------------------------------------------------------------------


def test_reads_run_in_parallel_each_acting_as_the_caller(world: World, strict_aws: StrictAws) -> None:
    names = [f"svc-{i:02d}" for i in range(16)]
    for name in names:
        world.create(name, replicas=1)
    seen: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    def on_query(**_: Any) -> None:
        with lock:
            seen.append((threading.get_ident(), strict_aws.actor()))

    client = aws.dynamodb()
    client.meta.events.register("before-call.dynamodb.Query", on_query)
    try:
        world.reconciler.read_concurrency = 8
        with strict_aws.acting_as("reconciler"):
            report = world.reconciler.run_shard(names)
    finally:
        client.meta.events.unregister("before-call.dynamodb.Query", on_query)
    assert report.services == 16 and not report.unloadable
    assert len(seen) == 16 and {actor for _, actor in seen} == {"reconciler"}
    assert len({thread for thread, _ in seen}) > 1, "the reads ran on one thread"


def test_a_worker_describes_only_its_shards_instances_in_one_call(world: World) -> None:
    for name in ("a", "b", "c"):
        world.create(name, replicas=1)
    world.converge()
    calls: list[dict[str, Any]] = []
    client = aws.ec2()

    def on_describe(params: dict[str, Any], **_: Any) -> None:
        calls.append(params)

    client.meta.events.register("provide-client-params.ec2.DescribeInstances", on_describe)
    try:
        world.reconciler.run_shard(["a", "b"])
    finally:
        client.meta.events.unregister("provide-client-params.ec2.DescribeInstances", on_describe)
    (call,) = calls
    uids = sorted(world.store.require(name).service.uid for name in ("a", "b"))
    assert call["Filters"] == [
        {"Name": "tag:fleetkeeper:managed", "Values": ["true"]},
        {"Name": "tag:fleetkeeper:uid", "Values": uids},
    ]


def test_more_uids_than_one_call_may_filter_on_take_more_calls(strict_aws: StrictAws) -> None:
    from botocore.exceptions import ClientError

    assert Ec2Driver().list_instances(uids=[f"uid-{i}" for i in range(250)]) == []
    assert strict_aws.attempts_of("ec2", "DescribeInstances") == 2
    with pytest.raises(ClientError, match="FilterLimitExceeded"):
        aws.ec2().describe_instances(Filters=[{"Name": "tag:x", "Values": [str(i) for i in range(201)]}])


def test_ec2_calls_back_off_on_the_client_after_a_throttle(strict_aws: StrictAws) -> None:
    """Adaptive retry mode: after throttles, botocore rate-limits the client itself (token waits)."""
    client = aws.ec2()
    assert client.meta.config.retries["mode"] == "adaptive"
    assert aws.dynamodb().meta.config.retries["mode"] == "standard"
    strict_aws.ec2.throttle("DescribeInstances", times=3)
    for _ in range(8):
        client.describe_instances()
    assert strict_aws.attempts_of("ec2", "DescribeInstances") == 8 + 3
    assert strict_aws.rate_limited, "no client-side rate limiting after throttles"
