"""The reconciler shell against moto: lifecycle, breaker, probes, steady state, concurrency, orphans.

Probes are served by a real HTTP server on 127.0.0.1; replica addresses resolve to it through the
driver (FLEETKEEPER_REPLICA_HOST). No test sends traffic anywhere else.
"""

from __future__ import annotations

import base64
import json
import threading
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper import aws as aws_clients
from fleetkeeper.model import FailureCause, ReplicaStatus, ServiceStatus, VersionState
from fleetkeeper.reconciler.driver import MANAGED_TAG, REPLICA_TAG, SERVICE_TAG, STACK_TAG, UID_TAG, VERSION_TAG
from fleetkeeper.reconciler.plan import Policy
from fleetkeeper.settings import DEFAULT_STACK_ID
from tests.support.handler_client import HandlerClient
from tests.support.reconciler_world import World, instance_state, run_tagged, spec_dict, tags

if TYPE_CHECKING:
    pass

from tests.support.reconciler_world import ProbeServer, assert_converged, assert_deleted


def test_whole_lifecycle_through_the_api_and_the_handler(
    api: HandlerClient, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create -> READY -> update -> rolled -> delete -> service item gone, as Lambda would run it: the
    api's kicks through the kick queue, the schedule through the dispatcher and the reconcile queue."""
    from tests.reconciler.lambda_queues import LambdaQueues

    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    queues = LambdaQueues(monkeypatch)

    def tick() -> None:
        queues.tick()

    def view() -> dict[str, Any]:
        body: dict[str, Any] = api.get("/v1/services/web").body
        return body

    assert api.post("/v1/services", {"name": "web", "spec": spec_dict(server.port)}).status == 201
    assert queues.drain(queues.kicks) == 1  # the kick: launches at once
    assert {r["status"] for r in view()["replicas"]} == {"PROVISIONING"}
    for _ in range(2):
        tick()
    assert view()["status"] == "READY" and view()["status_message"] == "2/2 ready"
    assert {r["status"] for r in view()["replicas"]} == {"READY"}

    updated = spec_dict(server.port, envs={"RELEASE": "2"})
    assert api.put("/v1/services/web", {"spec": updated}).status == 200
    statuses = []
    for _ in range(10):
        tick()
        statuses.append(view()["status"])
        if statuses[-1] == "READY":
            break
    assert "UPDATING" in statuses and statuses[-1] == "READY"
    replicas = view()["replicas"]
    assert [r["version"] for r in replicas] == [2, 2] and {r["status"] for r in replicas} == {"READY"}

    uid = view()["uid"]
    assert api.delete("/v1/services/web").status == 202
    for _ in range(3):
        tick()
    assert api.get("/v1/services/web").status == 404
    live = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert not [i for i in live if tags(i).get(UID_TAG) == uid and i["State"]["Name"] != "terminated"]


def test_launch_carries_tags_imdsv2_user_data_spot_and_disk(world: World) -> None:
    world.create(replicas=1, resources={"instance_type": "t3.micro", "use_spot": True, "disk_size": 40})
    world.run()
    [instance] = world.instances()
    uid = world.store.require("svc").service.uid
    assert {k: v for k, v in tags(instance).items() if k.startswith("fleetkeeper:")} == {
        MANAGED_TAG: "true",
        STACK_TAG: DEFAULT_STACK_ID,
        SERVICE_TAG: "svc",
        UID_TAG: uid,
        VERSION_TAG: "1",
        REPLICA_TAG: "0",
    }
    assert instance["MetadataOptions"]["HttpTokens"] == "required"
    assert instance["InstanceType"] == "t3.micro"
    assert instance.get("InstanceLifecycle") == "spot"
    volumes = aws.ec2().describe_volumes()["Volumes"]
    assert any(v["Size"] == 40 and {"Key": MANAGED_TAG, "Value": "true"} in v.get("Tags", []) for v in volumes)
    raw = aws.ec2().describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
    script = base64.b64decode(raw["UserData"]["Value"]).decode()
    assert "systemctl enable --now fleetkeeper-replica.service" in script


def test_launch_requires_imdsv2_with_a_hop_limit_of_one(world: World) -> None:
    """The launch request itself sets the hop limit (an AMI with ImdsSupport v2.0 would default it to
    2, letting a container on the replica fetch the instance role's credentials)."""
    from tests.support.aws_calls import AwsCalls

    world.create(replicas=1)
    with AwsCalls() as calls:
        world.run()
    [launch] = [c.params for c in calls.calls if c.operation == "RunInstances"]
    assert launch["MetadataOptions"] == {
        "HttpTokens": "required",
        "HttpEndpoint": "enabled",
        "HttpPutResponseHopLimit": 1,
    }


def test_kick_reconciles_one_service_and_filters_ec2_by_its_uid(world: World) -> None:
    world.create("a")
    world.create("b")
    mark = world.log.mark()
    world.run("a")
    assert world.log.by_api(mark)["ec2:RunInstances"] == 2
    assert world.log.by_api(mark)["dynamodb:Query"] == 1  # no listing of services for a kick
    assert {tags(i)[SERVICE_TAG] for i in world.instances()} == {"a"}


def test_probes_use_the_spec_method_headers_and_body(world: World) -> None:
    probe = {"path": "/ready", "headers": {"X-Probe": "fk"}, "post_data": {"q": 1}}
    world.create(service={"readiness_probe": probe, "replicas": 1, "ports": world.server.port})
    world.run()
    world.run()
    method, path, body, headers = world.server.requests[-1]
    assert (method, path, json.loads(body)) == ("POST", "/ready", {"q": 1})
    assert headers["X-Probe"] == "fk" and headers["Content-Type"] == "application/json"
    assert world.store.require("svc").replicas[0].status is ReplicaStatus.READY


def test_only_http_200_is_ready_and_a_failing_replica_is_replaced(world: World) -> None:
    world.create(replicas=1)
    world.converge()
    world.server.status = 204
    world.run()
    replica = world.store.require("svc").replicas[0]
    assert replica.status is ReplicaStatus.NOT_READY and replica.status_message.endswith("HTTP 204")
    world.run()  # 61 s of failures
    world.run()  # 122 s: still within SkyPilot's 180 s window, the instance kept
    assert world.store.require("svc").replicas[0].status is ReplicaStatus.NOT_READY
    world.run()  # 183 s of consecutive failures: FAILED_PROBING, terminated, replaced by replica 1
    state = world.store.require("svc")
    assert state.replicas[0].status is ReplicaStatus.FAILED_PROBING
    assert 1 in state.replicas
    world.server.status = 200
    world.converge()
    assert_converged(world, replicas=1)
    assert sorted(world.store.require("svc").replicas) == [1]


def test_steady_state_costs_reads_only(world: World) -> None:
    world.create()
    world.converge()
    mark = world.log.mark()
    world.run()
    assert world.log.mutations(mark) == []
    assert world.log.by_api(mark) == {
        "dynamodb:Query": 2,  # the services index, then the service's partition
        "ec2:DescribeInstances": 1,
    }


def test_refused_launches_trip_the_breaker_and_roll_back(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    world.create()
    world.converge()
    _validate_amis(monkeypatch)
    world.update(resources={"image_id": "ami-0000000000000dead"})
    world.run()
    state = world.store.require("svc")
    [refused] = [r for r in state.replicas.values() if r.version == 2]
    assert refused.status is ReplicaStatus.FAILED_PROVISION
    assert (refused.failure_code, refused.cause) == ("InvalidAMIID.NotFound", FailureCause.VERSION)
    assert refused.status_message.startswith("InvalidAMIID.NotFound: ")
    assert state.service.status is ServiceStatus.UPDATING
    assert state.service.status_message == (
        f"updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; "
        f"replica {refused.replica_id} FAILED_PROVISION: {refused.status_message}"
    )
    for _ in range(10):
        world.clock.advance(600)  # past the backoff
        world.run()
        if world.store.require("svc").service.target_version == 1:
            break
    state = world.store.require("svc")
    assert state.service.target_version == 1
    assert state.versions[2].state is VersionState.FAILED
    assert "InvalidAMIID.NotFound" in state.versions[2].state_message
    world.converge()
    assert_converged(world, version=1)
    message = world.store.require("svc").service.status_message
    assert message.startswith("2/2 ready; rolled back to version 1: version 2 failed: 3 replica failures")


def test_a_version_that_never_works_fails_the_service_without_a_crash_loop(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    _validate_amis(monkeypatch)
    world.create(resources={"image_id": "ami-0000000000000dead"})
    for _ in range(6):
        world.clock.advance(600)
        world.run()
    state = world.store.require("svc")
    assert state.service.status is ServiceStatus.FAILED
    assert state.versions[1].state is VersionState.FAILED
    mark = world.log.mark()
    world.clock.advance(3600)
    world.run()
    assert world.log.by_api(mark)["ec2:RunInstances"] == 0
    assert world.log.mutations(mark) == []


def test_spot_preemption_is_replaced_with_a_new_replica_id(world: World) -> None:
    world.create(resources={"use_spot": True})
    world.converge()
    victim = world.store.require("svc").replicas[0]
    assert victim.instance_id is not None
    _reclaim_spot_instance(victim.instance_id)
    world.run()
    state = world.store.require("svc")
    preempted = state.replicas[0]
    assert preempted.status is ReplicaStatus.PREEMPTED
    assert (preempted.failure_code, preempted.cause) == ("Server.SpotInstanceTermination", FailureCause.SPOT_RECLAIM)
    assert max(state.replicas) == 2
    world.converge()
    assert_converged(world)
    assert sorted(world.store.require("svc").replicas) == [1, 2]


def test_an_instance_terminated_through_the_api_is_the_versions_fault_even_on_spot(world: World) -> None:
    world.create(resources={"use_spot": True})
    world.converge()
    victim = world.store.require("svc").replicas[0]
    World._raw_ec2().terminate_instances(InstanceIds=[victim.instance_id])  # Client.UserInitiatedShutdown
    world.run()
    preempted = world.store.require("svc").replicas[0]
    assert preempted.status is ReplicaStatus.PREEMPTED
    assert (preempted.failure_code, preempted.cause) == ("Client.UserInitiatedShutdown", FailureCause.VERSION)
    assert preempted.status_message == (
        f"instance {victim.instance_id} is terminated (Client.UserInitiatedShutdown: User initiated shutdown): "
        "terminated outside fleetkeeper"
    )


def test_orphans_are_terminated_after_the_grace_period_and_unmanaged_survive(world: World) -> None:
    created = world.create()
    world.converge()
    # The service item vanishes without the reconciler's delete (e.g. deleted by hand).
    aws.dynamodb().delete_item(TableName=world.store.table.name, Key={"PK": {"S": "SVC#svc"}, "SK": {"S": "META"}})
    world.run()
    assert len(world.instances()) == 2  # still within the grace period
    world.clock.advance(Policy().orphan_grace.total_seconds())
    world.run()
    assert_deleted(world, created.service.uid)


def test_delete_terminates_everything_then_removes_the_item(world: World) -> None:
    created = world.create()
    world.converge()
    world.delete()
    world.run()
    state = world.store.require("svc")
    assert {r.status for r in state.replicas.values()} == {ReplicaStatus.SHUTTING_DOWN}
    world.run()
    assert_deleted(world, created.service.uid)


def test_two_runs_at_once_never_double_launch_or_lose_status(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two reconcilers race on every step of create, rolling update and delete."""
    _serialize_moto_requests(monkeypatch)
    _idempotent_client_tokens(monkeypatch)
    created = world.create()

    def race(rounds: int) -> None:
        for _ in range(rounds):
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def one(barrier: threading.Barrier = barrier, errors: list[BaseException] = errors) -> None:
                try:
                    barrier.wait()
                    world.reconciler.run_all()
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            threads = [threading.Thread(target=one) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            world.clock.advance()

    race(4)
    world.converge()
    assert_converged(world)
    world.update(envs={"RELEASE": "2"})
    race(8)
    world.converge()
    assert_converged(world, version=2)
    world.delete()
    race(3)
    world.converge()
    assert_deleted(world, created.service.uid)


def _reclaim_spot_instance(instance_id: str) -> None:
    """AWS takes a spot instance back: terminated, with EC2's StateReason for it (moto's terminate
    always says Client.UserInitiatedShutdown)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    World._raw_ec2().terminate_instances(InstanceIds=[instance_id])
    moto_instance = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_instance(instance_id)
    moto_instance.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
    )


def _validate_amis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make moto refuse unknown AMIs as EC2 does (moto reads MOTO_ENABLE_AMI_VALIDATION at import)."""
    from moto import settings

    monkeypatch.setattr(settings, "ENABLE_AMI_VALIDATION", True)


def _serialize_moto_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """DynamoDB applies each request atomically; in-process moto does not across threads, so lock it."""
    from moto.core.botocore_stubber import BotocoreStubber

    lock = threading.RLock()
    original = BotocoreStubber.process_request

    def locked(self: Any, request: Any) -> Any:
        with lock:
            return original(self, request)

    monkeypatch.setattr(BotocoreStubber, "process_request", locked)


def _idempotent_client_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """EC2 returns the earlier launch for a repeated ClientToken; moto launches again. Model EC2."""
    from moto.ec2.models.instances import InstanceBackend

    original = InstanceBackend.run_instances

    def run_instances(self: Any, image_id: str, count: int, user_data: Any, groups: Any, **kwargs: Any) -> Any:
        token = kwargs.get("client_token")
        for reservation in self.reservations.values():
            if token and any(i.client_token == token for i in reservation.instances):
                return reservation
        return original(self, image_id, count, user_data, groups, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)


# Guards a regression found by review (commit 5faa8d0): instances were not listed by managed=true, the
# test IAM applies, and a refused orphan terminate failed the run.
def test_the_orphan_sweep_only_sees_what_the_iam_policy_lets_it_terminate(world: World) -> None:
    opted_out = run_tagged({"fleetkeeper:managed": "false", "Name": "not-ours"})
    orphan = run_tagged(
        {
            "fleetkeeper:managed": "true",
            "fleetkeeper:stack": "fleetkeeper",
            "fleetkeeper:uid": "deadbeef",
            "fleetkeeper:replica-id": "0",
        },
        client_token="fk-fleetkeeper-deadbeef-0",
    )
    # Another stack's orphan: its own sweep's, never this one's.
    neighbours = run_tagged(
        {
            "fleetkeeper:managed": "true",
            "fleetkeeper:stack": "neighbour",
            "fleetkeeper:uid": "feedbeef",
            "fleetkeeper:replica-id": "0",
        },
        client_token="fk-neighbour-feedbeef-0",
    )

    def iam(params: dict[str, Any], **_: Any) -> None:
        """template.yaml's TerminateOnlyManaged: aws:ResourceTag/fleetkeeper:managed == "true" and
        aws:ResourceTag/fleetkeeper:stack == the stack's id."""
        raw = World._raw_ec2().describe_instances(InstanceIds=params["InstanceIds"])
        for reservation in raw["Reservations"]:
            for found in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in found.get("Tags", [])}
                if tags.get("fleetkeeper:managed") != "true" or tags.get("fleetkeeper:stack") != "fleetkeeper":
                    error = {"Code": "UnauthorizedOperation", "Message": "not authorized"}
                    raise ClientError({"Error": error}, "TerminateInstances")

    aws_clients.ec2().meta.events.register("before-parameter-build.ec2.TerminateInstances", iam)
    try:
        world.clock.advance(3600)  # past the orphan grace period
        world.run()
    finally:
        aws_clients.ec2().meta.events.unregister("before-parameter-build.ec2.TerminateInstances", iam)
    assert instance_state(orphan) != "running"
    assert instance_state(opted_out) == "running"
    assert instance_state(neighbours) == "running"
