"""The ALB's health check derived from the readiness probe, as the ALB can honour it.

On the strict layer: every request is held to ELBv2's model (HealthCheckPath at most 1,024
characters, timeout 2-120, interval 5-300) and to its cross-field rules (interval greater than the
timeout, matcher codes 200-499). Before this, the probe's path was copied as it was (a 1,500-character
path made CreateTargetGroup fail every run), headers and post_data were dropped silently, the
timeout was 4 s whatever the probe's, and a new version's path was applied to the whole target group
mid-rollout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.model import BalancerState
from fleetkeeper.reconciler.health_check import FALLBACK_CODES, HealthCheck, alb_check, shared_check, timing
from fleetkeeper.spec.service import ReadinessProbe
from tests.support.reconciler_world import World, make_alb, raw_client

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer


def group_of(world: World, name: str = "svc") -> dict[str, Any]:
    state = world.store.load(name)
    assert state is not None and state.service.endpoint is not None
    arn = state.service.endpoint.target_group
    return dict(raw_client("elbv2").describe_target_groups(TargetGroupArns=[arn])["TargetGroups"][0])


def check_of(group: dict[str, Any]) -> tuple[str, str, int, int]:
    return (
        group["HealthCheckPath"],
        group["Matcher"]["HttpCode"],
        group["HealthCheckTimeoutSeconds"],
        group["HealthCheckIntervalSeconds"],
    )


def alb_world(server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    server.requests.clear()
    return World(server, balancer=make_alb())


def service(server: ProbeServer, probe: Any, replicas: int = 1) -> dict[str, Any]:
    return {"readiness_probe": probe, "replicas": replicas, "ports": server.port}


# -- on the strict layer, through the reconciler --------------------------------------------------------


def test_a_probe_path_longer_than_an_alb_takes_gets_the_fallback_check_and_an_endpoint(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = alb_world(server, monkeypatch)
    path = "/" + "p" * 1499
    world.create(service=service(server, path))
    report = world.run()
    assert report.errors == []  # before: CreateTargetGroup's ValidationError, every run
    assert strict_aws.violations == []
    assert check_of(group_of(world)) == ("/", FALLBACK_CODES, 15, 16)
    world.converge()
    # The reconciler's own probe still sends the whole path before the replica is registered.
    assert any(p == path for _, p, _, _ in server.requests)


def test_a_probe_with_headers_gets_the_fallback_check(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = alb_world(server, monkeypatch)
    world.create(service=service(server, {"path": "/ready", "headers": {"Authorization": "Bearer x"}}))
    world.converge()
    assert check_of(group_of(world)) == ("/", FALLBACK_CODES, 15, 16)
    sent = [headers for _, p, _, headers in server.requests if p == "/ready"]
    assert sent and all(h.get("Authorization") == "Bearer x" for h in sent)


def test_a_15_second_probe_gives_a_15_second_alb_timeout(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = alb_world(server, monkeypatch)
    world.create(service=service(server, {"path": "/health", "timeout_seconds": 15}))
    world.converge()
    assert check_of(group_of(world)) == ("/health", "200", 15, 16)  # before: 4 s every 5 s


def test_a_rollout_from_path_a_to_path_b_never_checks_a_version_with_the_others_path(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = alb_world(server, monkeypatch)
    world.create(service=service(server, "/a", replicas=2))
    world.converge()
    assert check_of(group_of(world))[:2] == ("/a", "200")
    # A rollout (the envs change what the replicas run; a probe change alone is taken in place).
    world.update(service=service(server, "/b", replicas=2), envs={"RELEASE": "2"})
    seen: list[tuple[set[int], str]] = []
    for _ in range(20):
        world.run()
        state = world.store.load("svc")
        assert state is not None
        registered = {
            r.version
            for r in state.replicas.values()
            if r.balancer in (BalancerState.REGISTERING, BalancerState.REGISTERED)
        }
        path, codes, _, _ = check_of(group_of(world))
        seen.append((registered, path))
        if registered == {1}:
            assert (path, codes) == ("/a", "200")
        elif registered == {2}:
            assert (path, codes) == ("/b", "200")
        elif registered == {1, 2}:
            assert (path, codes) == ("/", FALLBACK_CODES)  # both versions answer it
        if registered == {2} and all(r.version == 2 for r in state.replicas.values()):
            break
    assert any(versions == {1, 2} for versions, _ in seen), seen  # both versions were registered at once
    assert seen[-1] == ({2}, "/b")


# -- the strict layer itself ----------------------------------------------------------------------------


def test_the_strict_layer_refuses_what_elb_refuses(aws: None, strict_aws: StrictAws) -> None:
    elbv2 = raw_client("elbv2")
    vpc = raw_client("ec2").create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    base = {"Protocol": "HTTP", "Port": 80, "VpcId": vpc, "TargetType": "instance"}
    with pytest.raises(ClientError, match="less than or equal to 1024"):
        elbv2.create_target_group(Name="long", HealthCheckPath="/" + "x" * 1500, **base)
    with pytest.raises(ClientError, match="interval must be greater than the timeout"):
        elbv2.create_target_group(Name="t", HealthCheckTimeoutSeconds=15, HealthCheckIntervalSeconds=15, **base)
    with pytest.raises(ClientError, match="200-499"):
        elbv2.create_target_group(Name="m", Matcher={"HttpCode": "200-500"}, **base)
    made = elbv2.create_target_group(
        Name="ok", HealthCheckTimeoutSeconds=15, HealthCheckIntervalSeconds=16, Matcher={"HttpCode": "200-499"}, **base
    )["TargetGroups"][0]["TargetGroupArn"]
    with pytest.raises(ClientError, match="interval must be greater than the timeout"):
        elbv2.modify_target_group(TargetGroupArn=made, HealthCheckTimeoutSeconds=20)


# -- the derivation, pure ---------------------------------------------------------------------------------


def probe(**fields: Any) -> ReadinessProbe:
    return ReadinessProbe.model_validate({"path": "/health", **fields})


@pytest.mark.parametrize(
    ("probe_timeout", "expected"),
    [(1, (2, 5)), (2, (2, 5)), (4, (4, 5)), (15, (15, 16)), (120, (120, 121)), (600, (120, 121))],
)
def test_timing_stays_within_the_albs_ranges_with_the_interval_above_the_timeout(
    probe_timeout: int, expected: tuple[int, int]
) -> None:
    timeout, interval = timing(probe_timeout)
    assert (timeout, interval) == expected
    assert 2 <= timeout <= 120 and 5 <= interval <= 300 and interval > timeout


def test_envs_are_filled_in_and_any_other_variable_falls_back() -> None:
    assert alb_check(probe(path="/health/$MODEL"), {"MODEL": "llama"}).path == "/health/llama"
    # A secret (or a task variable) is never written into the ALB's configuration.
    assert alb_check(probe(path="/health/$TOKEN"), {"MODEL": "llama"}).fallback
    assert alb_check(probe(path="/health/${MODEL}x"), {}).fallback


def test_post_data_falls_back_and_a_1024_character_path_does_not() -> None:
    assert alb_check(probe(post_data={"prompt": "hi"}), {}).fallback
    exact = "/" + "p" * 1023
    assert alb_check(probe(path=exact), {}) == HealthCheck(exact, "200", 15, 16)
    assert alb_check(probe(path=exact + "p"), {}).fallback


def test_versions_that_disagree_share_the_fallback_with_the_longest_timing() -> None:
    a, b = HealthCheck("/a", "200", 4, 5), HealthCheck("/b", "200", 30, 31)
    assert shared_check([a, a]) == a
    assert shared_check([a, b]) == HealthCheck("/", FALLBACK_CODES, 30, 31)
    assert shared_check([]) is None
