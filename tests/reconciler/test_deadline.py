"""A worker's run keeps its invocation's time whatever its AWS calls cost (fleetkeeper.aws.deadline).

On the strict layer's virtual clock: an EC2 call that hangs (connect or read timeouts) or is
throttled near the end of the invocation is not attempted, nor retried, past what the invocation
has left. The run stops there as a run killed at that call would (the crash sweep, test_crash.py,
proves the next runs complete any such state), reports it `cut_short`, and the handler returns
before Lambda's timeout.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.reconciler.fanout import Shard
from tests.reconciler.test_fanout import shard_event
from tests.support.reconciler_world import assert_converged

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import World

NAMES = ("a", "b", "c")
TIMEOUT = 20.0
RESERVE = 1.0  # what the handler keeps to return (handler._RETURN_RESERVE_SECONDS)


def _shard_run(world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], float]:
    """One shard of NAMES through the worker's handler, given TIMEOUT seconds: its report, and the
    virtual seconds it took."""
    from fleetkeeper.reconciler.handler import lambda_handler

    monkeypatch.setenv("TABLE_NAME", world.store.table.name)
    shard = Shard(run=1, index=0, services=NAMES, not_after=time.time() + 55)
    with strict_aws.lambda_context(timeout_seconds=TIMEOUT, function_name="fleetkeeper-reconciler") as context:
        (run,) = lambda_handler(shard_event(shard), context)["runs"]
        took = strict_aws.clock.time() - context.started_at
    assert not context.killed
    return run, took


def _next_runs_complete(world: World, strict_aws: StrictAws) -> None:
    strict_aws.clear_hangs()
    world.clock.advance()
    world.converge()
    for name in NAMES:
        assert_converged(world, name, replicas=1)


@pytest.mark.parametrize(
    ("operation", "kind"),
    [
        ("RunInstances", "read"),  # launched, its answer lost: the next run finds it by its tags
        ("RunInstances", "connect"),  # never sent: the next run launches it, with the same ClientToken
        (None, "connect"),  # EC2 unreachable: DescribeInstances hangs before any service starts
    ],
)
def test_a_shard_whose_ec2_calls_hang_returns_in_time_cut_short_and_the_next_run_completes_it(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch, operation: str | None, kind: str
) -> None:
    for name in NAMES:
        world.create(name, replicas=1)
    strict_aws.hang("ec2", operation, times=100, kind=kind)

    run, took = _shard_run(world, strict_aws, monkeypatch)

    assert took <= TIMEOUT - RESERVE
    assert run["errors"] == [] and run["unloadable"] == {}
    if operation is None:
        # The instance listing is every service's first EC2 call: none started.
        assert run["cut_short"] == [] and sorted(run["skipped"]) == list(NAMES)
    else:
        # The first service claimed its replica and stopped at the launch; the others never started.
        (first,) = run["cut_short"]
        assert sorted([first, *run["skipped"]]) == list(NAMES)
        assert run["actions"] == {"Claim": 1, "Launch": 1}
    _next_runs_complete(world, strict_aws)


def test_a_kick_whose_launch_hangs_returns_in_time_cut_short(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper.reconciler.handler import lambda_handler

    monkeypatch.setenv("TABLE_NAME", world.store.table.name)
    world.create("a", replicas=1)
    strict_aws.hang("ec2", "RunInstances", times=100, kind="read")

    with strict_aws.lambda_context(timeout_seconds=TIMEOUT, function_name="fleetkeeper-reconciler") as context:
        summary = lambda_handler({"service": "a"}, context)
        left = context.get_remaining_time_in_millis() / 1000

    assert not context.killed and left >= RESERVE
    assert summary["kick"] == "a" and summary["cut_short"] == ["a"]
    strict_aws.clear_hangs()
    world.clock.advance()
    world.converge()
    assert_converged(world, "a", replicas=1)


def test_a_throttle_burst_near_the_deadline_is_not_retried_past_it(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NAMES:
        world.create(name, replicas=1)
    strict_aws.throttle("ec2", "RunInstances", times=6)  # as many as botocore's attempts

    run, took = _shard_run(world, strict_aws, monkeypatch)

    assert took <= TIMEOUT - RESERVE
    # Retried while the next pause (1, 2, 4 s at most) and attempt (15 s for EC2's client) fit in 19 s.
    assert 1 < strict_aws.attempts_of("ec2", "RunInstances") < 6
    (first,) = run["cut_short"]
    assert sorted([first, *run["skipped"]]) == list(NAMES)
    strict_aws.throttle("ec2", "RunInstances", times=0)
    world.clock.advance()
    world.converge()
    for name in NAMES:
        assert_converged(world, name, replicas=1)


def test_far_from_the_deadline_a_hang_is_retried_as_before(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the invocation's time to spare, the deadline changes nothing: botocore retries the hung
    launch and the run completes every service."""
    from fleetkeeper.reconciler.handler import lambda_handler

    monkeypatch.setenv("TABLE_NAME", world.store.table.name)
    for name in NAMES:
        world.create(name, replicas=1)
    strict_aws.hang("ec2", "RunInstances", times=2, kind="connect")
    shard = Shard(run=1, index=0, services=NAMES, not_after=time.time() + 55)

    with strict_aws.lambda_context(timeout_seconds=120, function_name="fleetkeeper-reconciler") as context:
        (run,) = lambda_handler(shard_event(shard), context)["runs"]

    assert run["cut_short"] == [] and run["skipped"] == [] and run["actions"]["Launch"] == 3
    assert [f.kind for f in strict_aws.faults_injected] == ["hang:connect"] * 2
    assert len(world.instances()) == 3


def test_the_dispatchers_identities_stop_when_their_time_is_spent_and_the_shards_still_go_out(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper import aws
    from fleetkeeper.local.reconcile_loop import scheduled_event
    from fleetkeeper.reconciler.dispatcher import IDENTITIES_LEAVE_SECONDS
    from fleetkeeper.reconciler.handler import dispatch_handler
    from fleetkeeper.replicas.identity import owner_scope
    from fleetkeeper.spec.service import ServiceSpec
    from fleetkeeper.store.identities import IdentityRecords
    from fleetkeeper.store.table import Table
    from tests.replicas.test_identity import STACK, owner_policy
    from tests.support.reconciler_world import spec_dict

    queue = aws.sqs().create_queue(QueueName="reconcile")["QueueUrl"]
    for name, value in {
        "TABLE_NAME": world.store.table.name,
        "FLEETKEEPER_RECONCILE_QUEUE_URL": queue,
        "FLEETKEEPER_REPLICA_IDENTITY": "owner",
        "FLEETKEEPER_REPLICA_POLICY_ARN": owner_policy(),
        "FLEETKEEPER_STACK_ID": STACK,
    }.items():
        monkeypatch.setenv(name, value)
    owners = [f"arn:aws:iam::123456789012:role/team-{n}" for n in range(8)]
    spec = ServiceSpec.model_validate(spec_dict(world.server.port, replicas=0))
    for n, owner in enumerate(owners):
        world.commands.create(f"svc-{n}", spec, owner=owner)
    records = IdentityRecords(Table(world.store.table.name))
    # Every attempt costs 1 s; a new owner's identity is 4 IAM writes and its record's PutItem: 5 s.
    strict_aws.call_latency = 1.0

    with strict_aws.lambda_context(timeout_seconds=60, function_name="fleetkeeper-dispatcher") as context:
        first = dispatch_handler(scheduled_event(), context)
        left = context.get_remaining_time_in_millis() / 1000

    assert not context.killed and first["out_of_time"] is None
    # IAM's calls stopped while the rest of the dispatch still had IDENTITIES_LEAVE_SECONDS: some
    # identities made, the others left for the next period; the shards went out all the same.
    assert 0 < len(first["identities_made"]) < len(owners)
    assert first["shards"] == 1 and first["unsent_shards"] == [] and first["send_calls"] == 1
    assert left > IDENTITIES_LEAVE_SECONDS - 13  # the send, the sweep and the identities' sweep came after
    messages = aws.sqs().get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])
    assert messages["Attributes"]["ApproximateNumberOfMessages"] == "1"

    with strict_aws.lambda_context(timeout_seconds=60, function_name="fleetkeeper-dispatcher") as context:
        second = dispatch_handler(scheduled_event(), context)
    assert not context.killed
    assert len(first["identities_made"]) + len(second["identities_made"]) == len(owners)
    assert all(records.get(str(owner_scope(owner))) is not None for owner in owners)


def test_an_ec2_warning_the_deadline_stops_before_it_is_recorded_fails_for_redelivery(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Returning would delete the message and lose the warning: the invocation fails instead (SQS
    delivers it again), with the deadline's error, before Lambda's timeout."""
    import json

    from fleetkeeper import aws
    from fleetkeeper.reconciler.handler import lambda_handler
    from tests.reconciler.test_spot import SPOT_WARNING, _rendered_warning

    monkeypatch.setenv("TABLE_NAME", world.store.table.name)
    warning = json.loads(_rendered_warning(SPOT_WARNING, "i-0123456789abcdef0", "2026-01-01T00:00:00Z"))
    strict_aws.hang("ec2", "DescribeInstances", times=100)

    with strict_aws.lambda_context(timeout_seconds=TIMEOUT, function_name="fleetkeeper-reconciler") as context:
        with pytest.raises(aws.DeadlineReached):
            lambda_handler(warning, context)
        left = context.get_remaining_time_in_millis() / 1000
    assert not context.killed and left >= RESERVE
