"""Endpoints past one ALB: load-balancer pools (docs/architecture/load-balancer-pools.md), on the
strict layer's ELB (its per-ALB quotas, the per-Region ALB quota, one load balancer per target
group, CreateLoadBalancer's idempotency) and moto's Route 53.

- 1,000 services without a domain fill the template's ALB and 19 pools of 50 listeners; with a
  domain and a hosted zone, 11 load balancers of 99 host rules (100 target groups with the wake
  group), and a record NAME.<domain> -> its pool for each service past the first 99.
- A placed service never moves; a pool that filled up meanwhile (ELB's quota error) is passed over;
  a target group another worker attached meanwhile is followed to its pool.
- A crash before any ELB call of a pool's creation converges to one pool, complete.
- An empty pool is tagged, then deleted once it stayed empty; one that got a route again is kept;
  a neighbouring stack's load balancer is never touched.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.model import EndpointConfig
from fleetkeeper.reconciler.balancer import EndpointRefused, target_group_name
from fleetkeeper.reconciler.balancers.alb import (
    EMPTY_SINCE_TAG,
    RETIRE_AFTER_SECONDS,
    AlbBalancer,
    PoolQuotas,
)
from fleetkeeper.store.codec import endpoint_from_item, endpoint_item
from fleetkeeper.wake import handler as wake_handler
from tests.strict_aws.elbv2 import ElbQuotas
from tests.support.reconciler_world import World, make_pooled_alb, raw_client

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer

STACK = "0123456789ab"
N = 1000
FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:fk-wake"
CONFIG = EndpointConfig(port=8080, policy="least_load", drain_seconds=30, health_path="/")


def pooled(*, domain: str | None = None, zone: bool = False, wake: bool = True, stack: str = STACK) -> AlbBalancer:
    return make_pooled_alb(domain=domain, zone=zone, wake=wake, stack=stack, function=FUNCTION)


def uid(n: int) -> str:
    return f"{n:016x}"


def balancers(stack: str = STACK) -> dict[str, dict[str, Any]]:
    """The Region's load balancers named like this stack's pools, by name."""
    found = raw_client("elbv2").describe_load_balancers()["LoadBalancers"]
    return {b["LoadBalancerName"]: b for b in found if b["LoadBalancerName"].startswith(f"fk-{stack}-")}


def listeners(arn: str) -> list[dict[str, Any]]:
    """Every listener of a load balancer, through DescribeListeners' pages."""
    elbv2 = raw_client("elbv2")
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"LoadBalancerArn": arn}
    while True:
        page = elbv2.describe_listeners(**kwargs)
        found += page["Listeners"]
        if not page.get("NextMarker"):
            return found
        kwargs["Marker"] = page["NextMarker"]


def all_rules(listener: str) -> list[dict[str, Any]]:
    """Every rule of a listener, through DescribeRules' pages."""
    elbv2 = raw_client("elbv2")
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"ListenerArn": listener}
    while True:
        page = elbv2.describe_rules(**kwargs)
        found += page["Rules"]
        if not page.get("NextMarker"):
            return found
        kwargs["Marker"] = page["NextMarker"]


def records(zone: str) -> dict[str, str]:
    """The hosted zone's alias A records: name -> alias target DNS name."""
    route53 = raw_client("route53")
    found: dict[str, str] = {}
    kwargs: dict[str, Any] = {"HostedZoneId": zone}
    while True:
        page = route53.list_resource_record_sets(**kwargs)
        for record in page["ResourceRecordSets"]:
            if record["Type"] == "A" and "AliasTarget" in record:
                found[record["Name"].rstrip(".")] = record["AliasTarget"]["DNSName"].rstrip(".")
        if not page.get("IsTruncated"):
            return found
        kwargs.update(StartRecordName=page["NextRecordName"], StartRecordType=page["NextRecordType"])


# -- 1,000 services ----------------------------------------------------------------------------------


def test_a_thousand_services_without_a_domain_fill_twenty_load_balancers(aws: None, strict_aws: StrictAws) -> None:
    alb = pooled()
    placed = [alb.ensure(f"s{n}", uid(n), CONFIG, None) for n in range(N)]
    on: dict[str, list[int]] = {}
    for n, record in enumerate(placed):
        assert record.load_balancer is not None
        on.setdefault(record.load_balancer, []).append(n)
    made = balancers()
    assert sorted(made) == sorted(f"fk-{STACK}-{n}" for n in range(1, 20))
    # Lowest first: the template's ALB takes the first 50, pool n the next 50 each.
    assert on[alb.settings.arn] == list(range(50))
    for name, balancer in made.items():
        number = int(name.rsplit("-", 1)[1])
        assert on[balancer["LoadBalancerArn"]] == list(range(50 * number, 50 * number + 50))
        assert len(listeners(balancer["LoadBalancerArn"])) == 50
        assert balancer["Scheme"] == "internal"
        assert placed[50 * number].url == f"http://{balancer['DNSName']}:10000"
        assert placed[50 * number].dimensions[0] == (
            "LoadBalancer",
            balancer["LoadBalancerArn"].split(":loadbalancer/")[1],
        )
        attributes = raw_client("elbv2").describe_load_balancer_attributes(LoadBalancerArn=balancer["LoadBalancerArn"])
        assert {"Key": "idle_timeout.timeout_seconds", "Value": "300"} in attributes["Attributes"]
        assert {"Key": "routing.http.drop_invalid_header_fields.enabled", "Value": "true"} in attributes["Attributes"]
        # Its own wake group, with the wake function in it.
        wake = raw_client("elbv2").describe_target_groups(Names=[f"fkwake-{STACK}-{number}"])["TargetGroups"][0]
        health = raw_client("elbv2").describe_target_health(TargetGroupArn=wake["TargetGroupArn"])
        assert [t["Target"]["Id"] for t in health["TargetHealthDescriptions"]] == [FUNCTION]
    # Ensured again with what was recorded: the same load balancer and route, nothing made.
    mark = dict(strict_aws.attempts)
    fresh = replace(alb)
    fresh.forget()
    for n in (0, 49, 50, 999):
        again = fresh.ensure(f"s{n}", uid(n), CONFIG, placed[n])
        assert (again.load_balancer, again.route, again.url) == (
            placed[n].load_balancer,
            placed[n].route,
            placed[n].url,
        )
    made_calls = {
        op: count - mark.get((svc, op), 0)
        for (svc, op), count in strict_aws.attempts.items()
        if svc == "elastic-load-balancing-v2" and op.startswith("Create") and count - mark.get((svc, op), 0)
    }
    assert made_calls == {}


def test_a_thousand_services_with_a_domain_fill_eleven_and_each_gets_its_record(
    aws: None, strict_aws: StrictAws
) -> None:
    domain = "svc.example.com"
    alb = pooled(domain=domain, zone=True)
    assert alb.settings.hosted_zone_id is not None
    placed = [alb.ensure(f"s{n}", uid(n), CONFIG, None) for n in range(N)]
    made = balancers()
    assert sorted(made) == sorted(f"fk-{STACK}-{n}" for n in range(1, 11))
    by_arn = {b["LoadBalancerArn"]: b for b in made.values()}
    on_template = [n for n, r in enumerate(placed) if r.load_balancer == alb.settings.arn]
    # 100 target groups per ALB, the wake group counted: 99 services each.
    assert on_template == list(range(99))
    published = records(alb.settings.hosted_zone_id)
    assert len(published) == 1000 - 99
    for n, record in enumerate(placed):
        assert record.url == f"http://s{n}.{domain}"
        if n < 99:
            assert f"s{n}.{domain}" not in published  # the user's wildcard record points at pool 0
            continue
        pool = by_arn[str(record.load_balancer)]
        assert published[f"s{n}.{domain}"] == pool["DNSName"].lower()
    for balancer in made.values():
        (host,) = [item for item in listeners(balancer["LoadBalancerArn"]) if item["Port"] == 80]
        rules = all_rules(host["ListenerArn"])
        # Exactly the host rules of the services placed there, one each.
        on_pool = [n for n, r in enumerate(placed) if r.load_balancer == balancer["LoadBalancerArn"]]
        hosts = [r["Conditions"][0]["HostHeaderConfig"]["Values"][0] for r in rules if not r["IsDefault"]]
        assert sorted(hosts) == sorted(f"s{n}.{domain}" for n in on_pool)
        assert host["DefaultActions"][0]["FixedResponseConfig"]["StatusCode"] == "404"
    # Removed: its record goes with its rule.
    alb.remove("s500", uid(500), placed[500])
    assert f"s500.{domain}" not in records(alb.settings.hosted_zone_id)
    assert len(records(alb.settings.hosted_zone_id)) == 1000 - 99 - 1


# -- placement -----------------------------------------------------------------------------------------


def test_a_pool_that_elb_says_is_full_is_passed_over(aws: None, strict_aws: StrictAws) -> None:
    """The adapter counts 50 listeners per ALB; ELB says 2 (another worker's routes, a lowered quota):
    its TooManyListeners moves the service to the next pool."""
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=2)
    placed = [alb.ensure(f"s{n}", uid(n), CONFIG, None) for n in range(5)]
    pools = [r.load_balancer for r in placed]
    made = balancers()
    assert pools == [
        alb.settings.arn,
        alb.settings.arn,
        made[f"fk-{STACK}-1"]["LoadBalancerArn"],
        made[f"fk-{STACK}-1"]["LoadBalancerArn"],
        made[f"fk-{STACK}-2"]["LoadBalancerArn"],
    ]


def test_a_placed_service_never_moves(aws: None, strict_aws: StrictAws) -> None:
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1)
    first = alb.ensure("first", uid(1), CONFIG, None)
    second = alb.ensure("second", uid(2), CONFIG, None)
    assert first.load_balancer == alb.settings.arn and second.load_balancer != alb.settings.arn
    alb.remove("first", uid(1), first)  # room on the template's ALB again
    alb.forget()
    again = alb.ensure("second", uid(2), replace(CONFIG, drain_seconds=60), second)
    assert again.load_balancer == second.load_balancer and again.route == second.route
    # A crashed run's unrecorded route (the group attached to a pool) is found there, not placed anew.
    alb.forget()
    unrecorded = alb.ensure("second", uid(2), CONFIG, None)
    assert unrecorded.load_balancer == second.load_balancer and unrecorded.route == second.route


def test_a_group_another_worker_attached_meanwhile_is_followed_to_its_pool(aws: None, strict_aws: StrictAws) -> None:
    """Two workers place the same service: the other put its target group on pool 1 between our
    describe and our CreateListener on the template's ALB. ELB refuses ours (a target group is
    attached to one load balancer only: TargetGroupAssociationLimit); the service is on pool 1."""
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=2)
    zero = alb.ensure("zero", uid(0), CONFIG, None)
    alb.ensure("also", uid(1), CONFIG, None)
    alb.ensure("one", uid(2), CONFIG, None)  # on pool 1
    alb.remove("zero", uid(0), zero)  # room on the template's ALB again
    alb.forget()
    elbv2 = raw_client("elbv2")
    pool = balancers()[f"fk-{STACK}-1"]

    def other_worker() -> None:
        group = elbv2.describe_target_groups(Names=[target_group_name(uid(7), STACK)])["TargetGroups"][0]
        elbv2.create_listener(
            LoadBalancerArn=pool["LoadBalancerArn"],
            Protocol="HTTP",
            Port=10001,
            DefaultActions=[{"Type": "forward", "TargetGroupArn": group["TargetGroupArn"]}],
        )

    strict_aws.elbv2.before("CreateListener", other_worker)
    record = alb.ensure("seven", uid(7), CONFIG, None)
    assert strict_aws.attempts[("elastic-load-balancing-v2", "CreateListener")] >= 1
    assert record.load_balancer == pool["LoadBalancerArn"]
    assert record.url.endswith(":10001")
    assert record.route in [r["ListenerArn"] for r in listeners(pool["LoadBalancerArn"])]
    assert all(
        record.target_group not in str(r["DefaultActions"]) for r in listeners(alb.settings.arn)
    )  # nothing of it on the template's ALB


def test_the_per_region_quota_of_load_balancers_is_the_services_status(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1, load_balancers_per_region=2)
    world = World(server, balancer=alb)
    service = {"readiness_probe": "/health", "replicas": 1, "ports": server.port}
    world.create("one", service=service)
    world.create("two", service=service)
    world.converge()
    world.create("three", service=service)
    assert world.run().errors == []
    three = world.store.load("three")
    assert three is not None and three.service.endpoint is None
    assert "TooManyLoadBalancers" in three.service.status_message
    two = world.store.load("two")
    assert two is not None and two.service.endpoint is not None
    assert two.service.endpoint.load_balancer == balancers()[f"fk-{STACK}-1"]["LoadBalancerArn"]
    # The record round-trips through the table with its load balancer.
    assert endpoint_from_item(endpoint_item(two.service.endpoint)) == two.service.endpoint


def test_a_domain_without_a_hosted_zone_is_refused_past_the_first_load_balancer(
    aws: None, strict_aws: StrictAws
) -> None:
    alb = pooled(domain="svc.example.com")
    strict_aws.elbv2.quotas = ElbQuotas(rules_per_load_balancer=1)
    assert alb.ensure("one", uid(1), CONFIG, None).load_balancer == alb.settings.arn
    with pytest.raises(EndpointRefused, match="HostedZoneId"):
        alb.ensure("two", uid(2), CONFIG, None)
    assert balancers() == {}


def test_without_a_security_group_no_pool_is_made(aws: None, strict_aws: StrictAws) -> None:
    alb = pooled()
    alb = replace(alb, settings=replace(alb.settings, security_group_id=None))
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1)
    alb.ensure("one", uid(1), CONFIG, None)
    with pytest.raises(EndpointRefused, match="TooManyListeners"):
        alb.ensure("two", uid(2), CONFIG, None)
    assert balancers() == {}


def test_an_old_record_without_a_load_balancer_is_the_template_albs(aws: None, strict_aws: StrictAws) -> None:
    alb = pooled()
    record = alb.ensure("old", uid(1), CONFIG, None)
    item = endpoint_item(record)
    del item["load_balancer"]
    old = endpoint_from_item(item)
    assert old.load_balancer is None
    again = alb.ensure("old", uid(1), CONFIG, old)
    assert again.load_balancer == alb.settings.arn and again.route == record.route


# -- crashes --------------------------------------------------------------------------------------------


class Crash(Exception):
    pass


def test_a_crash_before_any_call_of_a_pools_creation_converges(aws: None, strict_aws: StrictAws) -> None:
    """For each ELB call of placing a service on a new pool: crash just before it, then run again
    (a new balancer, as a new invocation): one pool, complete, and the service's route on it."""
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1, load_balancers_per_region=200)
    layer = strict_aws.elbv2
    original = layer.send
    calls: list[str] = []
    crash_at: list[int] = []

    def send(call: Any) -> Any:
        calls.append(call.operation)
        if crash_at and len(calls) == crash_at[0]:
            raise Crash(call.operation)
        return original(call)

    layer.send = send  # type: ignore[method-assign]
    # A clean placement first: the calls to crash before.
    alb = pooled(stack="c1ea0000c1ea")
    alb.ensure("zero", uid(0), CONFIG, None)
    calls.clear()
    alb.ensure("one", uid(1), CONFIG, None)
    clean = list(calls)
    assert "CreateLoadBalancer" in clean and "RegisterTargets" in clean and "ModifyLoadBalancerAttributes" in clean
    for k in range(1, len(clean) + 1):
        stack = f"{k:012x}"
        alb = pooled(stack=stack)
        alb.ensure("zero", uid(0), CONFIG, None)
        calls.clear()
        crash_at[:] = [k]
        with pytest.raises(Crash):
            alb.ensure("one", uid(1), CONFIG, None)
        crash_at.clear()
        fresh = replace(alb)
        fresh.forget()
        record = fresh.ensure("one", uid(1), CONFIG, None)
        made = balancers(stack)
        assert list(made) == [f"fk-{stack}-1"], (k, clean[k - 1])
        pool = made[f"fk-{stack}-1"]
        assert record.load_balancer == pool["LoadBalancerArn"]
        assert [r["ListenerArn"] for r in listeners(pool["LoadBalancerArn"])] == [record.route]
        attributes = raw_client("elbv2").describe_load_balancer_attributes(LoadBalancerArn=pool["LoadBalancerArn"])
        assert {"Key": "idle_timeout.timeout_seconds", "Value": "300"} in attributes["Attributes"], clean[k - 1]
        wake = raw_client("elbv2").describe_target_groups(Names=[f"fkwake-{stack}-1"])["TargetGroups"]
        health = raw_client("elbv2").describe_target_health(TargetGroupArn=wake[0]["TargetGroupArn"])
        assert [t["Target"]["Id"] for t in health["TargetHealthDescriptions"]] == [FUNCTION], clean[k - 1]


# -- removal --------------------------------------------------------------------------------------------


def test_an_empty_pool_is_retired_once_it_stayed_empty(aws: None, strict_aws: StrictAws) -> None:
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1)
    placed = [alb.ensure(f"s{n}", uid(n), CONFIG, None) for n in range(4)]  # pools 0, 1, 2, 3
    made = balancers()
    assert sorted(made) == [f"fk-{STACK}-1", f"fk-{STACK}-2", f"fk-{STACK}-3"]
    # A neighbouring stack's pool (another id) and an ALB of this name pattern it does not own.
    other = pooled(stack="ffffffffffff")
    other.ensure("x", uid(9), CONFIG, None)
    other.ensure("y", uid(10), CONFIG, None)
    neighbour = balancers("ffffffffffff")["fk-ffffffffffff-1"]
    alb.remove("s2", uid(2), placed[2])
    alb.remove("s3", uid(3), placed[3])

    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert alb.retire_pools(now) == []  # first seen empty: tagged
    tags = raw_client("elbv2").describe_tags(ResourceArns=[made[f"fk-{STACK}-2"]["LoadBalancerArn"]])
    assert EMPTY_SINCE_TAG in {t["Key"] for t in tags["TagDescriptions"][0]["Tags"]}
    # A placement passes a retiring pool over: a new service goes to a new pool 4, not 2 or 3.
    alb.forget()
    newcomer = alb.ensure("new", uid(5), CONFIG, None)
    assert newcomer.load_balancer == balancers()[f"fk-{STACK}-4"]["LoadBalancerArn"]
    # Pool 3 gets a route again before it is deleted (a worker that placed before the tag): kept.
    raw_client("elbv2").create_listener(
        LoadBalancerArn=made[f"fk-{STACK}-3"]["LoadBalancerArn"],
        Protocol="HTTP",
        Port=10000,
        DefaultActions=[{"Type": "fixed-response", "FixedResponseConfig": {"StatusCode": "404"}}],
    )
    assert alb.retire_pools(now + timedelta(seconds=RETIRE_AFTER_SECONDS - 1)) == []
    assert alb.retire_pools(now + timedelta(seconds=RETIRE_AFTER_SECONDS)) == [f"fk-{STACK}-2"]
    left = balancers()
    assert sorted(left) == [f"fk-{STACK}-1", f"fk-{STACK}-3", f"fk-{STACK}-4"]
    tags = raw_client("elbv2").describe_tags(ResourceArns=[left[f"fk-{STACK}-3"]["LoadBalancerArn"]])
    assert EMPTY_SINCE_TAG not in {t["Key"] for t in tags["TagDescriptions"][0]["Tags"]}
    groups = {g["TargetGroupName"] for g in raw_client("elbv2").describe_target_groups()["TargetGroups"]}
    assert f"fkwake-{STACK}-2" not in groups and f"fkwake-{STACK}-1" in groups
    # The neighbour's pool, empty too, is its own stack's to retire.
    other.remove("y", uid(10), None)
    alb.retire_pools(now + timedelta(days=1))
    alb.retire_pools(now + timedelta(days=2))
    assert neighbour["LoadBalancerName"] in balancers("ffffffffffff")


def test_a_deleted_services_pool_goes_through_the_dispatchers_sweep(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1)
    world = World(server, balancer=alb)
    service = {"readiness_probe": "/health", "replicas": 1, "ports": server.port}
    world.create("one", service=service)
    world.create("two", service=service)
    world.converge()
    two = world.store.load("two")
    assert two is not None and two.service.endpoint is not None
    assert two.service.endpoint.load_balancer == balancers()[f"fk-{STACK}-1"]["LoadBalancerArn"]
    world.delete("two")
    world.converge()

    start = world.clock()
    assert alb.retire_pools(start) == []
    assert alb.retire_pools(start + timedelta(seconds=RETIRE_AFTER_SECONDS)) == [f"fk-{STACK}-1"]
    assert balancers() == {}


# -- wake from zero on a pool ----------------------------------------------------------------------------


def test_the_wake_function_finds_a_service_on_a_pool_by_its_port(
    aws: None, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1)
    alb.ensure("zero", uid(0), CONFIG, None)
    record = alb.ensure("napper", uid(1), CONFIG, None)
    pool = balancers()[f"fk-{STACK}-1"]
    assert record.load_balancer == pool["LoadBalancerArn"]
    alb.route(record, waking=True)
    (listener,) = listeners(pool["LoadBalancerArn"])
    forward = listener["DefaultActions"][0]["ForwardConfig"]["TargetGroups"]
    wake = raw_client("elbv2").describe_target_groups(Names=[f"fkwake-{STACK}-1"])["TargetGroups"][0]
    assert {g["TargetGroupArn"]: g["Weight"] for g in forward} == {wake["TargetGroupArn"]: 1, record.target_group: 0}
    monkeypatch.setenv("FLEETKEEPER_STACK_ID", STACK)
    monkeypatch.setenv("FLEETKEEPER_ALB_ARN", alb.settings.arn)
    monkeypatch.delenv("FLEETKEEPER_DOMAIN_NAME", raising=False)
    wake_handler.reset()
    seen: list[str | None] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        group = event["requestContext"]["elb"]["targetGroupArn"]
        seen.append(wake_handler.service_of(event["headers"], {"FLEETKEEPER_STACK_ID": STACK}, group))
        return {"statusCode": 503, "body": "waking", "headers": {}}

    strict_aws.elbv2.register_lambda(FUNCTION, handler)

    answer = strict_aws.elbv2.request(pool["LoadBalancerArn"], 10000, datetime.now(UTC))
    assert answer.status == 503 and answer.target_group == wake["TargetGroupArn"]
    # Port 10000 is also the template ALB's "zero": the wake group tells the load balancers apart.
    assert seen == ["napper"]
    alb.route(record, waking=False)
    (listener,) = listeners(pool["LoadBalancerArn"])
    assert listener["DefaultActions"][0]["TargetGroupArn"] == record.target_group


def test_a_warm_wake_function_finds_a_pool_made_again_under_its_name(
    aws: None, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool the dispatcher retired and the reconciler made again has a new ARN: the wake function
    that looked the old one up (a warm Lambda instance) must not keep asking for it, which ELB
    answers LoadBalancerNotFound (before: the invocation failed, for ever)."""
    alb = pooled()
    strict_aws.elbv2.quotas = ElbQuotas(listeners_per_load_balancer=1)
    alb.ensure("zero", uid(0), CONFIG, None)
    first = alb.ensure("napper", uid(1), CONFIG, None)
    wake_group = raw_client("elbv2").describe_target_groups(Names=[f"fkwake-{STACK}-1"])["TargetGroups"][0]
    environ = {"FLEETKEEPER_STACK_ID": STACK, "FLEETKEEPER_ALB_ARN": alb.settings.arn}
    wake_handler.reset()
    headers = {"x-forwarded-port": "10000"}
    assert wake_handler.service_of(headers, environ, wake_group["TargetGroupArn"]) == "napper"

    # The service goes, its pool is retired and made again for another service on the same port.
    alb.remove("napper", uid(1), first)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    alb.forget()
    assert alb.retire_pools(start) == []
    assert alb.retire_pools(start + timedelta(seconds=RETIRE_AFTER_SECONDS)) == [f"fk-{STACK}-1"]
    alb.forget()
    again = alb.ensure("sleeper", uid(2), CONFIG, None)
    assert again.load_balancer != first.load_balancer
    assert again.load_balancer == balancers()[f"fk-{STACK}-1"]["LoadBalancerArn"]
    wake_group = raw_client("elbv2").describe_target_groups(Names=[f"fkwake-{STACK}-1"])["TargetGroups"][0]

    # A minute on, the port's answer is stale and looked up again, on the pool as it is now.
    later = wake_handler.time.monotonic() + 61
    monkeypatch.setattr(wake_handler.time, "monotonic", lambda: later)
    assert wake_handler.service_of(headers, environ, wake_group["TargetGroupArn"]) == "sleeper"


def test_a_name_the_hosted_zone_gives_to_something_else_is_refused_and_nothing_is_made(
    aws: None, strict_aws: StrictAws
) -> None:
    """Another system's record NAME.<domain> shadows the wildcard that serves pool 0, and UPSERT would
    overwrite it for a pool past it: a service (any team may name one) never takes over such a name.
    An alias to one of the stack's own load balancers (a crashed removal's, an earlier incarnation's)
    is the stack's, and is brought to the service's pool."""
    domain = "svc.example.com"
    alb = replace(pooled(domain=domain, zone=True), quotas=PoolQuotas(rules=1))
    assert alb.settings.hosted_zone_id is not None
    route53 = raw_client("route53")

    def put(name: str, record: dict[str, Any]) -> None:
        route53.change_resource_record_sets(
            HostedZoneId=alb.settings.hosted_zone_id,
            ChangeBatch={"Changes": [{"Action": "CREATE", "ResourceRecordSet": {"Name": name, **record}}]},
        )

    put(f"www.{domain}", {"Type": "A", "TTL": 60, "ResourceRecords": [{"Value": "192.0.2.10"}]})
    put(f"docs.{domain}", {"Type": "CNAME", "TTL": 60, "ResourceRecords": [{"Value": "elsewhere.example.org"}]})
    for name, kind in (("www", "A"), ("docs", "CNAME")):
        with pytest.raises(EndpointRefused) as refused:
            alb.ensure(name, uid(1), CONFIG, None)
        assert str(refused.value) == (
            f"the hosted zone {alb.settings.hosted_zone_id} already has a record {name}.{domain} ({kind}) that is not "
            "this stack's: give the service another name, or delete that record"
        )
    groups = raw_client("elbv2").describe_target_groups()["TargetGroups"]
    assert target_group_name(uid(1), STACK) not in [g["TargetGroupName"] for g in groups]
    # Both records as they were, and no other (the zone's own NS and SOA at its apex aside).
    zone_records = route53.list_resource_record_sets(HostedZoneId=alb.settings.hosted_zone_id)["ResourceRecordSets"]
    assert [(r["Name"], r["Type"], r.get("ResourceRecords")) for r in zone_records if r["Name"] != f"{domain}."] == [
        (f"docs.{domain}.", "CNAME", [{"Value": "elsewhere.example.org"}]),
        (f"www.{domain}.", "A", [{"Value": "192.0.2.10"}]),
    ]

    # The stack's own stale record (an alias to its template ALB) is no obstacle: the service's pool
    # takes it over.
    alb.ensure("first", uid(2), CONFIG, None)  # fills the template ALB (one rule)
    put(
        f"second.{domain}",
        {
            "Type": "A",
            "AliasTarget": {
                "HostedZoneId": "Z35SXDOTRQ7X7K",
                "DNSName": alb.settings.dns_name,
                "EvaluateTargetHealth": False,
            },
        },
    )
    second = alb.ensure("second", uid(3), CONFIG, None)
    pool = balancers()[f"fk-{STACK}-1"]
    assert second.load_balancer == pool["LoadBalancerArn"]
    assert records(alb.settings.hosted_zone_id) == {f"second.{domain}": pool["DNSName"].lower()}


def test_a_record_already_naming_the_services_pool_is_not_written_again(aws: None, strict_aws: StrictAws) -> None:
    """Route 53's request rate is the account's (its other callers share it): an ensure whose claim
    read finds NAME.<domain> already aliased to the service's pool writes nothing; a record gone
    meanwhile is written again."""
    from fleetkeeper import aws as aws_clients

    domain = "svc.example.com"
    alb = replace(pooled(domain=domain, zone=True), quotas=PoolQuotas(rules=1))
    assert alb.settings.hosted_zone_id is not None
    alb.ensure("first", uid(1), CONFIG, None)  # fills the template ALB (one rule)
    placed = alb.ensure("second", uid(2), CONFIG, None)
    pool = balancers()[f"fk-{STACK}-1"]
    assert records(alb.settings.hosted_zone_id) == {f"second.{domain}": pool["DNSName"].lower()}

    writes: list[str] = []
    aws_clients.route53().meta.events.register(
        "before-parameter-build.route53.ChangeResourceRecordSets",
        lambda params, **_: writes.extend(c["Action"] for c in params["ChangeBatch"]["Changes"]),
    )
    changed = replace(CONFIG, health_path="/ready")
    again = alb.ensure("second", uid(2), changed, placed)
    assert (again.load_balancer, again.url, writes) == (placed.load_balancer, placed.url, [])

    raw_client("route53").change_resource_record_sets(
        HostedZoneId=alb.settings.hosted_zone_id,
        ChangeBatch={
            "Changes": [
                {
                    "Action": "DELETE",
                    "ResourceRecordSet": raw_client("route53").list_resource_record_sets(
                        HostedZoneId=alb.settings.hosted_zone_id, StartRecordName=f"second.{domain}", MaxItems="1"
                    )["ResourceRecordSets"][0],
                }
            ]
        },
    )
    assert records(alb.settings.hosted_zone_id) == {}
    alb.ensure("second", uid(2), CONFIG, again)
    assert writes == ["UPSERT"]
    assert records(alb.settings.hosted_zone_id) == {f"second.{domain}": pool["DNSName"].lower()}
