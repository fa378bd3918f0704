"""The endpoint through the reconciler's shell, on moto's elbv2 behind the strict-AWS layer (which
keeps a deregistered target `draining` for its deregistration delay, as AWS does).

One ALB per stack (made as template.yaml makes it); the reconciler creates a target group and a
route per service, registers READY replicas, drains a leaving replica before terminating it, and
deletes everything on delete. A steady service costs no load balancer call and no write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.model import BalancerState, ReplicaStatus
from fleetkeeper.reconciler.balancer import target_group_name
from fleetkeeper.reconciler.driver import UID_TAG
from fleetkeeper.settings import DEFAULT_STACK_ID
from tests.support.reconciler_world import (
    World,
    alb_resources,
    assert_converged,
    assert_deleted,
    make_alb,
    raw_client,
    tags,
    target_health,
)

if TYPE_CHECKING:
    from fleetkeeper.reconciler.balancers.alb import AlbBalancer
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer


def elbv2() -> Any:
    return raw_client("elbv2")


def alb_world(server: ProbeServer, monkeypatch: pytest.MonkeyPatch, **alb: Any) -> tuple[World, AlbBalancer]:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    server.requests.clear()
    balancer = make_alb(**alb)
    return World(server, balancer=balancer), balancer


def attributes(group: str) -> dict[str, str]:
    raw = elbv2().describe_target_group_attributes(TargetGroupArn=group)["Attributes"]
    return {a["Key"]: a["Value"] for a in raw}


def live_ids(world: World, uid: str) -> set[str]:
    return {i["InstanceId"] for i in world.instances() if tags(i).get(UID_TAG) == uid}


def elbv2_calls(world: World, mark: int) -> list[str]:
    return [operation for service, operation in world.log.since(mark) if service == "elbv2"]


def test_create_makes_the_endpoint_registers_every_ready_replica_and_then_costs_nothing(
    aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, balancer = alb_world(server, monkeypatch)
    uid = world.create().service.uid
    world.converge()
    assert_converged(world)  # its last run: reads only, no load balancer call either

    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    endpoint = state.service.endpoint
    assert endpoint.url == f"http://{balancer.settings.dns_name}:10000"
    assert endpoint.config.policy == "least_load" and endpoint.config.drain_seconds == 120  # SkyPilot's
    group = elbv2().describe_target_groups(Names=[target_group_name(uid, DEFAULT_STACK_ID)])["TargetGroups"][0]
    assert endpoint.target_group == group["TargetGroupArn"]
    assert group["HealthCheckPath"] == "/health" and group["Port"] == server.port
    assert attributes(endpoint.target_group)["load_balancing.algorithm.type"] == "least_outstanding_requests"
    assert attributes(endpoint.target_group)["deregistration_delay.timeout_seconds"] == "120"
    listeners = elbv2().describe_listeners(LoadBalancerArn=balancer.settings.arn)["Listeners"]
    assert [(listener["Port"], listener["Protocol"]) for listener in listeners] == [(10000, "HTTP")]
    assert listeners[0]["DefaultActions"][0]["TargetGroupArn"] == endpoint.target_group
    assert dict(endpoint.dimensions) == {
        "LoadBalancer": balancer.settings.arn.split(":loadbalancer/")[1],
        "TargetGroup": endpoint.target_group.rsplit(":", 1)[1],
    }
    # Every READY replica is in the target group, on its port, and recorded so.
    assert target_health(endpoint.target_group) == dict.fromkeys(live_ids(world, uid), "healthy")
    assert {r.balancer for r in state.replicas.values()} == {BalancerState.REGISTERED}

    mark = world.log.mark()
    world.run()
    world.run("svc")
    assert elbv2_calls(world, mark) == [] and world.log.mutations(mark) == []

    # A policy change reconfigures the target group, once, and keeps the listener.
    world.update(
        service={
            "readiness_probe": "/health",
            "replicas": 2,
            "ports": server.port,
            "load_balancing_policy": "round_robin",
        }
    )
    world.converge()
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    assert state.service.endpoint.config.policy == "round_robin"
    assert attributes(state.service.endpoint.target_group)["load_balancing.algorithm.type"] == "round_robin"
    assert state.service.endpoint.url == endpoint.url
    assert len(elbv2().describe_listeners(LoadBalancerArn=balancer.settings.arn)["Listeners"]) == 1
    mark = world.log.mark()
    world.run()
    assert elbv2_calls(world, mark) == []


def test_a_rolling_update_drains_each_old_replica_before_terminating_it(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, _ = alb_world(server, monkeypatch)
    uid = world.create(service={"readiness_probe": "/health", "replicas": 2, "ports": server.port}).service.uid
    world.converge()
    old = live_ids(world, uid)
    world.update(
        envs={"RELEASE": "2"},
        service={"readiness_probe": "/health", "replicas": 2, "ports": server.port, "drain_seconds": 600},
    )
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    group = state.service.endpoint.target_group

    drained_at_some_point = False
    finished: set[str] = set()
    for _ in range(12):
        world.run()
        state = world.store.load("svc")
        assert state is not None
        draining = [
            r for r in state.replicas.values() if r.balancer is BalancerState.DRAINING and r.instance_id not in finished
        ]
        health = target_health(group)
        for record in draining:
            # Out of the target group, its instance still running while the ALB drains it...
            assert record.instance_id not in health
            assert record.instance_id in live_ids(world, uid)
            drained_at_some_point = True
        if draining:
            # ...and the next run leaves it alone while the ALB still reports it draining...
            before = live_ids(world, uid)
            world.run()
            assert before <= live_ids(world, uid)
            strict_aws.elbv2.finish_all()  # ...until its requests are done (and those of any begun since)
            now = world.store.load("svc")
            assert now is not None
            finished |= {str(r.instance_id) for r in now.replicas.values() if r.balancer is BalancerState.DRAINING}
    assert drained_at_some_point
    world.converge()
    assert_converged(world, version=2)
    assert not (old & live_ids(world, uid))
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    assert state.service.endpoint.config.drain_seconds == 600
    assert attributes(group)["deregistration_delay.timeout_seconds"] == "600"
    assert set(target_health(group)) == live_ids(world, uid)


def test_a_drain_ends_at_its_deadline_even_if_the_alb_still_drains(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drain_seconds bounds the wait: the reconciler's clock passing it terminates the replica,
    whatever the ALB says (the layer's drain is on its own clock, which does not move here)."""
    world, _ = alb_world(server, monkeypatch)
    uid = world.create(service={"readiness_probe": "/health", "replicas": 1, "ports": server.port}).service.uid
    world.converge()
    world.update(
        envs={"RELEASE": "2"},
        service={"readiness_probe": "/health", "replicas": 1, "ports": server.port, "drain_seconds": 90},
    )
    held = 0
    for _ in range(8):  # each run moves the reconciler's clock 61 s
        world.run()
        state = world.store.load("svc")
        assert state is not None
        draining = [r for r in state.replicas.values() if r.balancer is BalancerState.DRAINING]
        if draining and draining[0].instance_id in live_ids(world, uid):
            held += 1
    assert held == 2  # deregistered at t, still draining at t+61 s, terminated at t+122 s > t+90 s
    assert_converged(world, replicas=1, version=2)


def test_delete_drains_then_removes_the_listener_and_target_group(
    aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, balancer = alb_world(server, monkeypatch)
    uid = world.create().service.uid
    world.converge()
    assert alb_resources(balancer)["target_groups"]
    world.delete()
    world.converge()
    assert_deleted(world, uid)
    assert alb_resources(balancer) == {"target_groups": [], "listeners": [], "rules": []}


def test_with_a_domain_each_service_gets_a_host_rule_on_the_shared_https_listener(
    aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, balancer = alb_world(server, monkeypatch, domain="svc.example.com", certificate=True)
    world.create("api")
    world.create("web", service={"readiness_probe": "/health", "replicas": 1, "ports": server.port})
    world.converge()
    urls = {}
    for name in ("api", "web"):
        state = world.store.load(name)
        assert state is not None and state.service.endpoint is not None
        urls[name] = state.service.endpoint.url
    assert urls == {"api": "https://api.svc.example.com", "web": "https://web.svc.example.com"}
    assert balancer.settings.listener_arn is not None
    rules = [
        r for r in elbv2().describe_rules(ListenerArn=balancer.settings.listener_arn)["Rules"] if not r["IsDefault"]
    ]
    hosts = sorted((r["Priority"], r["Conditions"][0]["HostHeaderConfig"]["Values"][0]) for r in rules)
    assert hosts == [("1", "api.svc.example.com"), ("2", "web.svc.example.com")]
    assert alb_resources(balancer)["listeners"] == []  # no per-service listener with a domain

    world.delete("api")
    world.converge()
    left = alb_resources(balancer)
    assert len(left["rules"]) == 1 and len(left["target_groups"]) == 1


def test_without_a_domain_a_certificate_makes_each_listener_https(
    aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, balancer = alb_world(server, monkeypatch, certificate=True)
    world.create()
    world.converge()
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    assert state.service.endpoint.url == f"https://{balancer.settings.dns_name}:10000"
    listener = elbv2().describe_listeners(LoadBalancerArn=balancer.settings.arn)["Listeners"][0]
    assert (
        listener["Protocol"] == "HTTPS"
        and listener["Certificates"][0]["CertificateArn"] == balancer.settings.certificate_arn
    )


def test_every_listener_port_taken_fails_that_service_only(
    aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, _ = alb_world(server, monkeypatch, ports=(10000, 10000))
    world.create("one")
    world.converge()
    world.create("two")
    report = world.run()
    assert report.errors == []  # not the operator's error: the service's status says it
    two = world.store.load("two")
    assert two is not None and two.service.endpoint is None
    assert "no endpoint: every listener port 10000-10000" in two.service.status_message
    # Its replicas still come up: only the endpoint is missing (and retried every run).
    world.run()
    world.run()
    two = world.store.load("two")
    assert two is not None
    assert any(r.status is ReplicaStatus.READY for r in two.replicas.values())


def test_the_exact_load_balancer_calls_of_a_create_and_a_delete(
    aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run by run: the endpoint first (before any launch), one RegisterTargets for both replicas
    once READY, then nothing; on delete one DeregisterTargets, one DescribeTargetHealth a run while they
    drain (120 s, a run a minute), and the listener and target group removed once the instances are gone."""
    world, _ = alb_world(server, monkeypatch)
    world.create()
    runs = []
    for _ in range(3):
        mark = world.log.mark()
        world.run()
        runs.append(elbv2_calls(world, mark))
    assert runs == [
        [
            "DescribeTargetGroups",
            "CreateTargetGroup",
            "ModifyTargetGroupAttributes",
            "DescribeListeners",
            "CreateListener",
        ],
        ["RegisterTargets", "DescribeTargetHealth"],  # ...and whether the ALB uses them (its zones)
        [],
    ]
    world.delete()
    runs = []
    for _ in range(5):
        mark = world.log.mark()
        world.run()
        runs.append(elbv2_calls(world, mark))
    assert runs == [
        ["DeregisterTargets"],
        ["DescribeTargetHealth"],
        ["DescribeTargetHealth"],
        ["DescribeTargetGroups", "DescribeListeners", "DeleteListener", "DeleteTargetGroup"],
        [],
    ]
    assert world.store.load("svc") is None
