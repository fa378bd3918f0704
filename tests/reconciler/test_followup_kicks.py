"""Follow-ups and EC2's state-change notifications as kicks, through the shell, the store and the
worker (when a follow-up is due, the pure part: test_followup.py): a service in motion asks for its
next run as ONE delayed kick on the kick queue; a steady one asks for nothing and writes nothing;
duplicates and replaced follow-ups coalesce; an instance AWS ends gets its service reconciled at
once, and any other instance costs one describe."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.kick import ReconcilerKick
from fleetkeeper.reconciler.state_changes import StateChange, state_change_event
from fleetkeeper.store.errors import Superseded
from tests.support.aws_calls import AwsCalls
from tests.support.reconciler_world import World, raw_client

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws

FOLLOWUP = "SET followup_at = :due"


@pytest.fixture
def kicks(world: World, monkeypatch: pytest.MonkeyPatch) -> str:
    """The reconciler sends its kicks and follow-ups to a kick queue on the in-memory AWS."""
    from tests.reconciler.lambda_queues import LambdaQueues

    queue = LambdaQueues(monkeypatch).kicks
    kick = ReconcilerKick(queue_url=queue)
    world.reconciler.kick = kick
    world.reconciler.follow_up = kick.follow_up
    return queue


def sends(calls: AwsCalls) -> list[dict[str, Any]]:
    return [params for service, op, params in calls.brief() if op == "SendMessage"]


def followup_writes(calls: AwsCalls) -> list[dict[str, Any]]:
    return [p for _, op, p in calls.brief() if op == "UpdateItem" and p.get("UpdateExpression") == FOLLOWUP]


def epoch(world: World) -> int:
    return int(world.clock().timestamp())


def test_a_probing_replica_asks_for_exactly_one_delayed_kick(world: World, kicks: str) -> None:
    world.create(replicas=1)
    world.server.status = 503  # the app does not answer yet
    with AwsCalls(kicks=True) as first:
        world.reconciler.run_one("svc")  # claims and launches: PROVISIONING
    due = epoch(world) + 10
    [sent] = sends(first)
    assert sent["DelaySeconds"] == 10
    assert sent["body"] == {"service": "svc", "due": sent["body"]["due"], "delay_seconds": 10, "followup": due}
    assert followup_writes(first) == [
        {
            "SK": "META",
            "UpdateExpression": FOLLOWUP,
            "ConditionExpression": "uid = :uid AND attribute_not_exists(followup_at)",
            "values": {":uid": world.store.require("svc").service.uid, ":due": due},
        }
    ]
    assert world.store.require("svc").service.followup_at == due

    # Another run before it is due (a scheduled one, an api kick): the pending one stands.
    world.clock.advance(3)
    with AwsCalls(kicks=True) as again:
        world.reconciler.run_one("svc")
    assert sends(again) == [] and followup_writes(again) == []

    # The follow-up itself: the replica is probed (still not answering) and the next one asked for.
    world.clock.advance(7)
    with AwsCalls(kicks=True) as followed:
        report = world.reconciler.run_one("svc", followup=due)
    assert not report.void_followup
    [sent] = sends(followed)
    assert sent["DelaySeconds"] == 10 and sent["body"]["followup"] == due + 10
    assert followup_writes(followed)[0]["values"][":seen"] == due


def test_a_steady_service_asks_for_nothing_and_writes_nothing(world: World, kicks: str) -> None:
    world.create(replicas=2)
    world.converge()
    pending = world.store.require("svc").service.followup_at  # from the runs that got it there
    for kicked in ("svc", None):
        with AwsCalls(kicks=True) as calls:
            world.run(kicked)
        assert sends(calls) == []
        assert [op for _, op, _ in calls.brief() if op not in ("Query", "DescribeInstances")] == []
    assert world.store.require("svc").service.followup_at == pending


def test_the_app_answering_makes_the_replica_ready_at_the_follow_up_and_then_nothing(world: World, kicks: str) -> None:
    world.create(replicas=1)
    world.server.status = 503
    world.reconciler.run_one("svc")
    due = world.store.require("svc").service.followup_at
    assert due is not None
    world.server.status = 200
    world.clock.advance(10)
    with AwsCalls(kicks=True) as calls:
        world.reconciler.run_one("svc", followup=due)
    [record] = world.store.require("svc").replicas.values()
    assert record.status.value == "READY"
    assert sends(calls) == [] and followup_writes(calls) == []  # READY: steady, nothing more


def test_a_duplicate_or_replaced_follow_up_costs_one_read(world: World, kicks: str) -> None:
    world.create(replicas=1)
    world.server.status = 503
    world.reconciler.run_one("svc")
    due = world.store.require("svc").service.followup_at
    assert due is not None
    world.clock.advance(10)
    world.reconciler.run_one("svc", followup=due)  # the first delivery: asks for the next one
    assert world.store.require("svc").service.followup_at == due + 10
    with AwsCalls(kicks=True) as duplicate:
        report = world.reconciler.run_one("svc", followup=due)  # SQS delivers it again
    assert report.void_followup
    assert [op for _, op, _ in duplicate.brief()] == ["Query"]


def test_of_two_runs_asking_at_once_only_one_write_lands(world: World) -> None:
    world.create(replicas=1)
    service = world.store.require("svc").service
    store = world.reconciler.store
    store.record_followup(service, None, 100)
    with pytest.raises(Superseded):
        store.record_followup(service, None, 105)  # read the same (no follow-up): lost
    store.record_followup(service, 100, 110)
    with pytest.raises(Superseded):
        store.record_followup(service, 100, 120)
    assert world.store.require("svc").service.followup_at == 110


def test_without_a_queue_no_follow_up_is_asked_for(world: World) -> None:
    world.create(replicas=1)
    world.server.status = 503
    with AwsCalls(kicks=True) as calls:
        world.reconciler.run_one("svc")
    assert sends(calls) == [] and followup_writes(calls) == []


def test_an_instance_aws_terminates_is_replaced_at_its_state_change(world: World, strict_aws: StrictAws) -> None:
    world.create(replicas=2)
    world.converge()
    state = world.store.require("svc")
    gone = state.replicas[0].instance_id
    assert gone is not None
    strict_aws.ec2.terminate_by_aws(gone, "Server.InternalError")
    with AwsCalls() as calls:
        report = world.reconciler.instance_changed(StateChange(gone, "shutting-down"))
    assert report.actions["Launch"] == 1
    assert [op for _, op, _ in calls.brief()][:3] == ["DescribeInstances", "Query", "DescribeInstances"]
    assert "RunInstances" in [op for _, op, _ in calls.brief()]
    replicas = world.store.require("svc").replicas
    assert replicas[0].status.value == "PREEMPTED" and len([r for r in replicas.values() if r.replica_id >= 2]) == 1


def test_any_other_instance_costs_one_describe(world: World) -> None:
    raw_client("ec2").stop_instances(InstanceIds=[world.unmanaged])
    with AwsCalls() as calls:
        report = world.reconciler.instance_changed(StateChange(world.unmanaged, "stopping"))
    assert [op for _, op, _ in calls.brief()] == ["DescribeInstances"]
    assert report.services == 0


def test_the_worker_takes_state_changes_and_follow_ups_from_the_kick_queue(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the InstanceStateRule's transformer and fleetkeeper.kick put them on the kick queue."""
    from tests.reconciler.lambda_queues import LambdaQueues
    from tests.support import TABLE

    monkeypatch.setenv("TABLE_NAME", TABLE)
    queues = LambdaQueues(monkeypatch)
    world.create(replicas=1)
    world.converge()
    [record] = world.store.require("svc").replicas.values()
    assert record.instance_id is not None
    raw_client("ec2").terminate_instances(InstanceIds=[record.instance_id])
    sqs = raw_client("sqs")
    body = json.dumps(state_change_event(StateChange(record.instance_id, "terminated")))
    assert len(body.encode()) <= 1024  # the kick queue's MaximumMessageSize
    sqs.send_message(QueueUrl=queues.kicks, MessageBody=body)
    sqs.send_message(QueueUrl=queues.kicks, MessageBody=json.dumps({"service": "svc", "followup": 12345}))
    assert queues.drain(queues.kicks) == 2
    [changed], [stale] = (run["runs"] for run in queues.runs)
    assert changed["instance"] == record.instance_id and changed["state"] == "terminated"
    assert changed["actions"]["Launch"] == 1 and changed["actions"]["FollowUp"] == 1  # the replacement boots
    assert stale == {"kick": "svc", "followup": 12345, "void": True}
