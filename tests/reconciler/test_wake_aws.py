"""Wake from zero on AWS's semantics: the strict layer's ALB (tests/strict_aws/elbv2.py) counts
`RequestCount` only for a request it chose a target for, and invokes a `lambda` target group's
function with the ALB's event. Requests go through the ALB, rates come from the real metric path
(RequestRates over CloudWatch), decisions from the reconciler's shell, as in production.

Before the wake target, a service at zero answered every request with the ALB's own 503, counted
nothing, and read 0 req/s forever (the first test shows that this layer reproduces it). With it, the
service's listener forwards to the wake target while it has no replica: the function records the
demand and kicks the reconciler (both coalesced), the next run scales to one, the run that
registers the replica puts the listener back on the target group, the ALB counts the requests again,
and without requests the service returns to zero and its listener to the wake target.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.kick import ReconcilerKick
from fleetkeeper.model import ReplicaStatus
from fleetkeeper.reconciler.metrics import RequestRates
from fleetkeeper.store.table import Table
from fleetkeeper.wake import demand as wake
from fleetkeeper.wake import handler as wake_handler
from fleetkeeper.wake.target import DemandRecorder
from tests.support.reconciler_world import TABLE, World, make_alb, raw_client

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fleetkeeper.reconciler.balancers.alb import AlbBalancer
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer

FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:fk-wake"


def to_zero(port: int, **policy: Any) -> dict[str, Any]:
    return {
        "readiness_probe": "/health",
        "ports": port,
        "replica_policy": {
            "min_replicas": 0,
            "max_replicas": 2,
            "target_qps_per_replica": 1,
            "upscale_delay_seconds": 60,
            "downscale_delay_seconds": 120,
            "downscale_to_zero_delay_seconds": 120,
            **policy,
        },
    }


class Stack:
    """The stack's ALB with its wake target (template.yaml's WakeTargetGroup and WakeFunction)."""

    def __init__(self, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
        server.status = 200
        elbv2 = raw_client("elbv2")
        self.strict = strict_aws
        alb = make_alb()
        group = elbv2.create_target_group(Name="fkwake-0123456789ab", TargetType="lambda")["TargetGroups"][0]
        elbv2.register_targets(TargetGroupArn=group["TargetGroupArn"], Targets=[{"Id": FUNCTION}])
        self.alb: AlbBalancer = replace(alb, settings=replace(alb.settings, wake_target_group=group["TargetGroupArn"]))
        self.rates = RequestRates(window_seconds=60, lag_seconds=0)
        self.world = World(server, balancer=self.alb, rates=self.rates)
        queue = raw_client("sqs").create_queue(QueueName="kicks")["QueueUrl"]
        self.queue = queue
        monkeypatch.setenv("TABLE_NAME", TABLE)
        monkeypatch.setenv("FLEETKEEPER_ALB_ARN", self.alb.settings.arn)
        monkeypatch.delenv("FLEETKEEPER_DOMAIN_NAME", raising=False)
        wake_handler.reset()
        # The function's process, with the world's clock (a warm instance: its memo carries over).
        wake_handler._recorder = DemandRecorder(
            Table(TABLE),
            lambda name: ReconcilerKick(queue_url=queue)(name),
            now=self.world.clock,
            monotonic=self.seconds,
        )
        strict_aws.elbv2.register_lambda(FUNCTION, wake_handler.lambda_handler)

    def seconds(self) -> float:
        return self.world.clock().timestamp()

    def get(self, port: int) -> Any:
        return self.strict.elbv2.request(self.alb.settings.arn, port, self.world.clock())

    def kicks(self) -> list[str]:
        sqs = raw_client("sqs")
        found: list[str] = []
        while True:
            messages = sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return found
            for message in messages:
                found.append(json.loads(message["Body"])["service"])
                sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=message["ReceiptHandle"])

    def state(self, name: str = "svc") -> Any:
        state = self.world.store.load(name)
        assert state is not None
        return state

    def target(self, name: str = "svc") -> int:
        autoscaler = self.state(name).service.autoscaler
        return autoscaler.target if autoscaler is not None else 0

    def serving(self, name: str = "svc") -> list[int]:
        return sorted(r.replica_id for r in self.state(name).replicas.values() if r.status is ReplicaStatus.READY)

    def port(self, name: str = "svc") -> int:
        return int(self.state(name).service.endpoint.url.rsplit(":", 1)[1])

    def default_action(self, name: str = "svc") -> str:
        """Where the listener sends requests: its forward's heaviest target group."""
        listener = raw_client("elbv2").describe_listeners(ListenerArns=[self.state(name).service.endpoint.route])
        return sends_to(listener["Listeners"][0]["DefaultActions"])


def sends_to(actions: list[dict[str, Any]]) -> str:
    """The target group a forward sends requests to (a weighted forward: its heaviest group; while a
    service wakes its own group stays in the forward at weight 0, so the ALB health checks it)."""
    weighted = (actions[0].get("ForwardConfig") or {}).get("TargetGroups") or []
    if weighted:
        return str(max(weighted, key=lambda g: int(g.get("Weight", 1)))["TargetGroupArn"])
    return str(actions[0]["TargetGroupArn"])


def kept_in_forward(actions: list[dict[str, Any]]) -> set[str]:
    weighted = (actions[0].get("ForwardConfig") or {}).get("TargetGroups") or []
    return {str(g["TargetGroupArn"]) for g in weighted} or {str(actions[0]["TargetGroupArn"])}


@pytest.fixture
def stack(aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    yield Stack(strict_aws, server, monkeypatch)
    wake_handler.reset()


def test_the_strict_alb_counts_no_request_for_a_target_group_without_targets(stack: Stack) -> None:
    """What made scale-to-zero deaf: the listener on the service's own target group (as before the
    wake target), no target: the ALB's own 503, and RequestCount reads 0 however many ask."""
    stack.world.create(service=to_zero(stack.world.server.port))
    stack.world.converge()
    state = stack.state()
    listener = state.service.endpoint.route
    raw_client("elbv2").modify_listener(
        ListenerArn=listener,
        DefaultActions=[{"Type": "forward", "TargetGroupArn": state.service.endpoint.target_group}],
    )
    answers = [stack.get(stack.port()) for _ in range(40)]
    assert {a.status for a in answers} == {503} and not any(a.counted for a in answers)
    rates = stack.rates.read({"svc": state.service.endpoint.dimensions}, stack.world.clock() + timedelta(seconds=60))
    assert rates == {"svc": 0.0}


def test_a_service_at_zero_wakes_through_the_wake_target_and_returns_to_zero(stack: Stack) -> None:
    world = stack.world
    world.create(service=to_zero(world.server.port))
    world.converge()
    # At zero: no replica, the listener on the wake target; steady (no write, no ELB call).
    assert stack.serving() == [] and stack.target() == 0
    assert stack.state().service.endpoint.waking
    assert stack.default_action() == stack.alb.settings.wake_target_group
    mark = world.log.mark()
    world.run()
    assert world.log.mutations(mark) == []

    # Requests: the wake target answers 503 + Retry-After; ONE demand write and ONE kick for a burst.
    answers = [stack.get(stack.port()) for _ in range(20)]
    assert {a.status for a in answers} == {503}
    assert answers[0].headers["Retry-After"] == str(wake.RETRY_AFTER_SECONDS)
    assert json.loads(answers[0].body)["error"]["code"] == "waking"
    assert stack.kicks() == ["svc"]
    assert stack.state().service.wake_at is not None

    # The kick's run: the metric reads 0 (the service's target group counted nothing), the demand
    # is the rate: target 1 at once, a replica launched.
    world.run("svc")
    assert stack.target() == 1
    world.converge()
    assert stack.serving() == [0]
    # The run that registered it put the listener back on the target group: the ALB serves and counts.
    assert not stack.state().service.endpoint.waking
    assert stack.default_action() == stack.state().service.endpoint.target_group
    served = stack.get(stack.port())
    assert served.status == 200 and served.counted
    assert stack.kicks() == []  # a served request kicks nothing

    # No more requests: back to zero after the delay (the old demand no longer counts), the listener
    # back on the wake target, and the next request wakes it again. The served request's data point
    # leaves a few runs without a reading (metrics.RequestRates: the newest may be late) first.
    for _ in range(stack.rates.quiet_windows + 6):
        world.run()
    assert stack.target() == 0
    world.converge()
    assert stack.serving() == [] and stack.state().service.endpoint.waking
    assert stack.default_action() == stack.alb.settings.wake_target_group
    world.clock.advance(wake.WAKE_COALESCE_SECONDS)
    assert stack.get(stack.port()).status == 503
    assert stack.kicks() == ["svc"]
    world.run("svc")
    assert stack.target() == 1


def test_delete_removes_a_listener_that_forwards_to_the_wake_target(stack: Stack) -> None:
    """The listener no longer names the service's target group while it wakes: it is found as the
    recorded route, and deleted with the target group; the wake target group stays."""
    world = stack.world
    world.create(service=to_zero(world.server.port))
    world.converge()
    assert stack.state().service.endpoint.waking
    world.delete()
    world.converge()
    assert world.store.load("svc") is None
    elbv2 = raw_client("elbv2")
    assert elbv2.describe_listeners(LoadBalancerArn=stack.alb.settings.arn)["Listeners"] == []
    groups = [g["TargetGroupArn"] for g in elbv2.describe_target_groups()["TargetGroups"]]
    assert groups == [stack.alb.settings.wake_target_group]


def test_the_wake_target_answers_404_for_a_port_no_service_has(stack: Stack) -> None:
    answer = wake_handler.lambda_handler({"headers": {"x-forwarded-port": "10999"}}, None)
    assert answer["statusCode"] == 404
    assert stack.kicks() == []


def test_the_wake_target_finds_the_service_by_host_with_a_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"FLEETKEEPER_DOMAIN_NAME": "svc.example.com"}
    assert wake_handler.service_of({"host": "api.svc.example.com:443"}, environ) == "api"
    assert wake_handler.service_of({"host": "API.SVC.EXAMPLE.COM."}, environ) == "api"
    assert wake_handler.service_of({"host": "a.b.svc.example.com"}, environ) is None
    assert wake_handler.service_of({"host": "svc.example.com"}, environ) is None
    assert wake_handler.service_of({"host": "other.example.org"}, environ) is None
    assert wake_handler.service_of({}, {}) is None


@pytest.mark.parametrize("waking", [True, False])
def test_a_crash_between_moving_the_route_and_recording_it_is_completed_by_the_next_run(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, waking: bool
) -> None:
    """The run that moves the route (to the wake target at first, back to the target group once a
    replica serves) dies after the ELB call, before its record: the next run (a new reconciler)
    moves it again, idempotently, and records it; the listener and the record agree."""
    from tests.support.reconciler_world import Crash

    world = stack.world
    world.create(service=to_zero(world.server.port))
    if not waking:
        world.converge()
        stack.get(stack.port())
        world.run("svc")
    original = world.reconciler.store.record_endpoint
    crashed: list[bool] = []

    def crashing(service: Any, endpoint: Any) -> None:
        if endpoint.waking is waking and not crashed:
            crashed.append(True)
            raise Crash("crash after the route moved, before its record")
        original(service, endpoint)

    monkeypatch.setattr(world.reconciler.store, "record_endpoint", crashing)
    for _ in range(5):
        with contextlib.suppress(Crash):
            world.run()
        if crashed:
            break
    assert crashed
    recorded = stack.state().service.endpoint
    assert recorded is None or recorded.waking is not waking  # the record lags the route
    world.restart()
    world.run()  # (one run: later ones may scale the idle service back to zero, a legitimate move)
    endpoint = stack.state().service.endpoint
    assert endpoint.waking is waking
    wanted = stack.alb.settings.wake_target_group if waking else endpoint.target_group
    assert stack.default_action() == wanted
    assert len(raw_client("elbv2").describe_listeners(LoadBalancerArn=stack.alb.settings.arn)["Listeners"]) == 1


def test_with_a_domain_the_host_rule_moves_and_the_wake_target_finds_the_service_by_host(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack with DomainName: one listener, a host rule per service. The rule (not a listener)
    forwards to the wake target at zero and back once a replica serves; the function reads the
    service from the Host header, and another host on the same listener gets the listener's 404."""
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    elbv2 = raw_client("elbv2")
    alb = make_alb(domain="svc.example.com")
    group = elbv2.create_target_group(Name="fkwake-0123456789ab", TargetType="lambda")["TargetGroups"][0]
    elbv2.register_targets(TargetGroupArn=group["TargetGroupArn"], Targets=[{"Id": FUNCTION}])
    alb = replace(alb, settings=replace(alb.settings, wake_target_group=group["TargetGroupArn"]))
    world = World(server, balancer=alb, rates=RequestRates(window_seconds=60, lag_seconds=0))
    monkeypatch.setenv("TABLE_NAME", TABLE)
    monkeypatch.setenv("FLEETKEEPER_DOMAIN_NAME", "svc.example.com")
    wake_handler.reset()
    kicks: list[str] = []
    wake_handler._recorder = DemandRecorder(
        Table(TABLE), kicks.append, now=world.clock, monotonic=lambda: world.clock().timestamp()
    )
    strict_aws.elbv2.register_lambda(FUNCTION, wake_handler.lambda_handler)
    try:
        world.create("api", service=to_zero(server.port))
        world.converge()
        state = world.store.load("api")
        assert state is not None and state.service.endpoint is not None and state.service.endpoint.waking
        rule = elbv2.describe_rules(RuleArns=[state.service.endpoint.route])["Rules"][0]
        assert sends_to(rule["Actions"]) == alb.settings.wake_target_group
        # The service's own group stays in the forward (weight 0): the ALB keeps health checking it.
        assert state.service.endpoint.target_group in kept_in_forward(rule["Actions"])

        def get(host: str) -> Any:
            return strict_aws.elbv2.request(alb.settings.arn, 80, world.clock(), host=host)

        assert get("other.svc.example.com").status == 404  # the listener's default: no such service
        answer = get("api.svc.example.com")
        assert answer.status == 503 and answer.headers["Retry-After"] == str(wake.RETRY_AFTER_SECONDS)
        assert kicks == ["api"]
        world.run("api")
        world.converge()
        state = world.store.load("api")
        assert state is not None and state.service.endpoint is not None and not state.service.endpoint.waking
        rule = elbv2.describe_rules(RuleArns=[state.service.endpoint.route])["Rules"][0]
        assert sends_to(rule["Actions"]) == state.service.endpoint.target_group
        served = get("api.svc.example.com")
        assert served.status == 200 and served.counted
    finally:
        wake_handler.reset()
