"""Spot replicas against the strict-AWS layer: capacity pools walked on refusals, SkyPilot's on-demand
fallback carrying a service while spot is refused everywhere, and EC2's interruption warnings taken
from the kick queue (as the stack's InterruptionRule delivers them) to a drained, replaced replica."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws
from fleetkeeper.local.template import load_template
from fleetkeeper.model import Interruption, InterruptionKind, Market, ReplicaStatus, to_iso
from tests.support.reconciler_world import World, ec2_driver, raw_client, spec_dict, tags

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.handler_client import HandlerClient
    from tests.support.reconciler_world import ProbeServer

S = ReplicaStatus
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"


def _subnets(world: World, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two of the default VPC's subnets (two zones), given to the reconciler's driver."""
    subnets = sorted(raw_client("ec2").describe_subnets()["Subnets"], key=lambda s: s["AvailabilityZone"])[:2]
    ids = [s["SubnetId"] for s in subnets]
    monkeypatch.setenv("FLEETKEEPER_SUBNET_IDS", ",".join(ids))
    world.reconciler.driver = ec2_driver()
    return ids


def _spot_service(world: World, replicas: int = 2, **policy: Any) -> None:
    spec = spec_dict(world.server.port)
    spec["service"] = {
        "readiness_probe": "/health",
        "ports": world.server.port,
        "replica_policy": {"min_replicas": replicas, **policy},
    }
    spec["resources"] = {"use_spot": True, "instance_type": "t3.micro"}
    from fleetkeeper.spec.service import ServiceSpec

    world.commands.create("svc", ServiceSpec.model_validate(spec))


def _live_by_market(world: World) -> dict[str, int]:
    counts = {"spot": 0, "on-demand": 0}
    for instance in world.instances():
        counts["spot" if instance.get("InstanceLifecycle") == "spot" else "on-demand"] += 1
    return counts


def test_spot_refused_everywhere_then_back(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: spot refused in every pool -> the on-demand fallback carries the service, the
    spot replicas wait in place (no items pile up, nothing counts toward the breaker); spot back -> the
    spot replicas are READY and the extra on-demand ones are drained and terminated."""
    _subnets(world, monkeypatch)
    refusal = strict_aws.ec2.spot_refused("MaxSpotInstanceCountExceeded")
    _spot_service(world, 2, dynamic_ondemand_fallback=True)

    for _ in range(4):
        world.run()
    state = world.store.require("svc")
    by_id = state.replicas
    assert sorted((r.market, r.status) for r in by_id.values()) == [
        (Market.ON_DEMAND, S.READY),
        (Market.ON_DEMAND, S.READY),
        (Market.SPOT, S.FAILED_PROVISION),
        (Market.SPOT, S.FAILED_PROVISION),
    ]
    assert len(by_id) == 4  # retried in place: no new items per refusal
    assert state.service.status.value == "READY"
    assert state.versions[1].state.value == "READY"  # never counted toward the breaker
    spot = [r for r in by_id.values() if r.market is Market.SPOT]
    # Each refused run tried both pools (two subnets) before backing off.
    assert all(
        r.launch_attempts == 2 * r.refused_runs and r.failure_code == "MaxSpotInstanceCountExceeded" for r in spot
    )
    assert _live_by_market(world) == {"spot": 0, "on-demand": 2}

    refusal.clear()
    world.clock.advance(30 * 60)  # past the longest backoff
    world.converge()
    state = world.store.require("svc")
    assert sorted((r.market, r.status) for r in state.replicas.values()) == [
        (Market.SPOT, S.READY),
        (Market.SPOT, S.READY),
    ]
    assert _live_by_market(world) == {"spot": 2, "on-demand": 0}
    service = world.store.require("svc").service
    page, _ = world.store.events_page(service, limit=100, next_token=None, now_epoch=int(world.clock().timestamp()))
    events = [e.event.message for e in page]
    assert any("on-demand fallback retired: 2 spot replica(s) READY" in m for m in events)


def test_a_fresh_account_without_the_spot_role_never_fails_a_good_version(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An account whose spot service-linked role cannot be created (an SCP, or a stack role without
    the grant) refuses every spot launch with AuthFailure.ServiceLinkedRoleCreationNotPermitted: that
    is the account's doing, so the replicas back off in place and the breaker never trips; once the
    role exists (an administrator made it) the same version's spot replicas come up."""
    _subnets(world, monkeypatch)
    refusal = strict_aws.ec2.spot_refused("AuthFailure.ServiceLinkedRoleCreationNotPermitted")
    _spot_service(world, 2)
    for _ in range(6):
        world.run()
        world.clock.advance(5 * 60)
    state = world.store.require("svc")
    assert state.versions[1].state.value == "NEW"  # not FAILED: nothing counted toward the breaker
    assert {(r.status, r.failure_code) for r in state.replicas.values()} == {
        (S.FAILED_PROVISION, "AuthFailure.ServiceLinkedRoleCreationNotPermitted")
    }
    refusal.clear()
    world.clock.advance(30 * 60)
    world.converge()
    assert sorted(r.status for r in world.store.require("svc").replicas.values()) == [S.READY, S.READY]


def test_a_refused_pool_is_followed_by_the_next_in_the_same_run(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cpus: 2+` has several candidate types: the first refused in both zones, the second launches
    in the same run, and the replica records the type it got."""
    first, second = _subnets(world, monkeypatch)
    world.create(replicas=1, resources={"cpus": "2+"})
    candidates = world.store.require("svc").target.spec.resources.placement.instance_types  # type: ignore[union-attr]
    strict_aws.ec2.insufficient_capacity(instance_type=candidates[0])

    world.run()

    [record] = world.store.require("svc").replicas.values()
    assert record.status is S.PROVISIONING
    assert record.instance_type == candidates[1]
    assert record.launch_attempts == 2  # the refused type in both subnets, then the next type
    [instance] = world.instances()
    assert instance["InstanceType"] == candidates[1]
    assert instance["SubnetId"] in (first, second)
    faults = [f.kind for f in strict_aws.faults_injected if (f.service, f.operation) == ("ec2", "RunInstances")]
    assert faults.count("InsufficientInstanceCapacity") >= 2


def test_pools_tried_in_a_run_are_bounded(world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch) -> None:
    _subnets(world, monkeypatch)
    strict_aws.ec2.unsupported()  # every type, every zone
    world.create(replicas=1, resources={"cpus": "2+"})
    before = strict_aws.attempts_of("ec2", "RunInstances")

    world.run()

    [record] = world.store.require("svc").replicas.values()
    assert (record.status, record.launch_attempts, record.refused_runs) == (S.FAILED_PROVISION, 4, 1)
    # Unsupported is HTTP 400, not retried by botocore: one call per pool, four pools.
    assert strict_aws.attempts_of("ec2", "RunInstances") - before == 4


def _rendered_warning(detail_type: str, instance_id: str, time: str) -> str:
    """The kick queue's message as the stack's InterruptionRule makes it: its input transformer's
    template, filled as EventBridge fills it (a string value goes in as a JSON string)."""
    rule = load_template()["Resources"]["InterruptionRule"]["Properties"]
    transformer = rule["Targets"][0]["InputTransformer"]
    values = {"type": detail_type, "instance": instance_id, "time": time}
    assert set(transformer["InputPathsMap"]) == set(values)
    body = transformer["InputTemplate"]
    for name, value in values.items():
        body = body.replace(f"<{name}>", json.dumps(value))
    assert len(body.encode()) <= 1024  # the kick queue's MaximumMessageSize
    return str(body)


def test_an_interruption_warning_from_the_kick_queue_drains_and_replaces_the_replica(
    api: HandlerClient, server: ProbeServer, monkeypatch: pytest.MonkeyPatch, strict_aws: StrictAws
) -> None:
    from tests.reconciler.lambda_queues import LambdaQueues

    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    queues = LambdaQueues(monkeypatch)
    spec = spec_dict(server.port)
    spec["resources"] = {"use_spot": True, "instance_type": "t3.micro"}
    assert api.post("/v1/services", {"name": "web", "spec": spec}).status == 201
    for _ in range(3):
        queues.tick()
    view = api.get("/v1/services/web").body
    assert [(r["status"], r["market"]) for r in view["replicas"]] == [("READY", "spot"), ("READY", "spot")]
    warned = view["replicas"][0]
    assert warned["instance_type"] == "t3.micro"

    sqs = aws.sqs()
    # Sent 90 s ago (delivered late): past the moment its drain had to start, so it is drained now.
    sent = to_iso(datetime.now(UTC) - timedelta(seconds=90))
    # Another account's instance: ignored. Then the replica's.
    for instance_id in ("i-0123456789abcdef0", warned["instance_id"]):
        sqs.send_message(
            QueueUrl=queues.kicks,
            MessageBody=_rendered_warning(SPOT_WARNING, instance_id, sent),
        )
    assert queues.drain(queues.kicks) == 2

    replicas = {r["replica_id"]: r for r in api.get("/v1/services/web").body["replicas"]}
    assert replicas[warned["replica_id"]]["status"] == "SHUTTING_DOWN", replicas
    assert "spot interruption warning" in replicas[warned["replica_id"]]["status_message"]
    assert replicas[warned["replica_id"]]["interruption"]["kind"] == "spot-interruption"
    assert sorted(r["status"] for r in replicas.values()) == ["PROVISIONING", "READY", "SHUTTING_DOWN"]
    live = {i["InstanceId"]: i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]}
    assert live[warned["instance_id"]]["State"]["Name"] in ("shutting-down", "terminated")

    # AWS takes it back two minutes later (it is gone already); the service converges on two again.
    for _ in range(3):
        queues.tick()
    replicas = api.get("/v1/services/web").body["replicas"]
    assert [(r["status"], r["market"]) for r in replicas] == [("READY", "spot"), ("READY", "spot")]
    events = [e["message"] for e in api.get("/v1/services/web/events").body["events"]]
    assert any("AWS sent a spot interruption warning" in m for m in events)


def test_a_warning_recorded_by_a_run_that_then_died_is_still_acted_on(world: World) -> None:
    """The warning is on the replica item before the run acts on it: a crash in between loses nothing."""
    world.create(replicas=1, resources={"use_spot": True, "instance_type": "t3.micro"})
    world.converge()
    [record] = world.store.require("svc").replicas.values()
    assert record.status is S.READY and record.instance_id is not None
    warning = Interruption(InterruptionKind.REBALANCE, record.instance_id, to_iso(world.clock()))

    def die(name: str) -> Any:
        raise KeyboardInterrupt("the run died after the warning was written")

    world.reconciler.run_one = die  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        world.reconciler.interrupt(warning)
    world.restart()
    assert world.store.require("svc").replicas[record.replica_id].interruption == warning

    world.converge()
    [replacement] = world.store.require("svc").replicas.values()
    assert replacement.replica_id != record.replica_id and replacement.status is S.READY
    assert [i["InstanceId"] for i in world.instances()] == [replacement.instance_id]
    assert os.environ.get("FLEETKEEPER_REPLICA_HOST") == "127.0.0.1"
    assert tags(world.instances()[0])["fleetkeeper:replica-id"] == str(replacement.replica_id)


def test_a_spot_interruption_wakes_the_reconciler_when_the_drain_must_start(world: World) -> None:
    """The warned replica serves on; a kick is asked for the moment its drain must start (notice 120 s
    - drain 30 s - margin 15 s after the warning), as a delayed message on the kick queue."""
    service = {"readiness_probe": "/health", "replicas": 1, "ports": world.server.port, "drain_seconds": 30}
    world.create(service=service, resources={"use_spot": True, "instance_type": "t3.micro"})
    world.converge()
    [record] = world.store.require("svc").replicas.values()
    assert record.instance_id is not None
    kicks: list[tuple[str, int]] = []
    world.reconciler.kick = lambda name, delay: kicks.append((name, delay))
    sent = world.clock() - timedelta(seconds=5)
    world.reconciler.interrupt(Interruption(InterruptionKind.SPOT_INTERRUPTION, record.instance_id, to_iso(sent)))
    assert kicks == [("svc", 120 - 30 - 15 - 5)]
    assert world.store.require("svc").replicas[record.replica_id].status is S.READY  # serving until then


@pytest.mark.parametrize("detail_type", [SPOT_WARNING, "EC2 Instance Rebalance Recommendation"])
def test_a_warning_about_an_on_demand_replica_is_ignored_with_a_log_line(
    api: HandlerClient,
    server: ProbeServer,
    monkeypatch: pytest.MonkeyPatch,
    strict_aws: StrictAws,
    caplog: pytest.LogCaptureFixture,
    detail_type: str,
) -> None:
    """EC2 warns about spot instances only: a warning naming an on-demand replica (forged on the kick
    queue, or misrouted) is logged and ignored by the worker; the replica serves on, untouched."""
    import logging

    from tests.reconciler.lambda_queues import LambdaQueues

    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    queues = LambdaQueues(monkeypatch)
    spec = spec_dict(server.port)
    spec["resources"] = {"instance_type": "t3.micro"}
    assert api.post("/v1/services", {"name": "web", "spec": spec}).status == 201
    for _ in range(3):
        queues.tick()
    before = api.get("/v1/services/web").body["replicas"]
    assert [(r["status"], r["market"]) for r in before] == [("READY", "on-demand"), ("READY", "on-demand")]

    sent = to_iso(datetime.now(UTC) - timedelta(seconds=90))
    for replica in before:
        aws.sqs().send_message(
            QueueUrl=queues.kicks, MessageBody=_rendered_warning(detail_type, replica["instance_id"], sent)
        )
    with caplog.at_level(logging.WARNING):
        assert queues.drain(queues.kicks) == 2

    after = api.get("/v1/services/web").body["replicas"]
    assert [(r["replica_id"], r["status"], r.get("interruption")) for r in after] == [
        (r["replica_id"], "READY", None) for r in before
    ]
    live = {
        i["InstanceId"]: i["State"]["Name"]
        for r in aws.ec2().describe_instances()["Reservations"]
        for i in r["Instances"]
    }
    assert all(live[r["instance_id"]] == "running" for r in before)
    ignored = [m for m in caplog.messages if "is not a spot instance, warning ignored" in m]
    assert len(ignored) == 2, caplog.messages
