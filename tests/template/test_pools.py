"""Load-balancer pools in template.yaml (docs/architecture/load-balancer-pools.md): what the
reconciler and the dispatcher are given to make and retire more ALBs, and their permissions,
evaluated with the IAM evaluator: only `fk-<stack id>-*` load balancers and `fkwake-<stack id>-*`
wake groups, only tagged with this stack's id; a neighbouring stack's ALB cannot be changed or
deleted; records only under the domain, in its hosted zone, A only, UPSERT and DELETE only."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.reconciler.balancers.alb import AlbBalancer
from fleetkeeper.settings import Settings
from tests.stacks.test_isolation_iam import all_statements
from tests.support.cfn import ACCOUNT, Resolver, function_role, translate
from tests.support.iam_evaluator import Request, allowed
from tests.template.test_endpoints import deployed, props, reconciler_env

STACK_KEY = "0123456789ab"  # tests/support/cfn.py's AWS::StackId, as template.yaml derives it
ELB = f"arn:aws:elasticloadbalancing:us-east-1:{ACCOUNT}"
OWN = f"{ELB}:loadbalancer/app/fk-{STACK_KEY}-1/50dc6c495c0c9188"
NEIGHBOUR = f"{ELB}:loadbalancer/app/fk-ffffffffffff-1/50dc6c495c0c9188"
ZONE = "Z0123456789ABCDEFGHIJ"
DOMAIN = "svc.example.com"
CERT = "arn:aws:acm:us-east-1:123456789012:certificate/0e0e0e0e-1111-2222-3333-444444444444"


@pytest.fixture(scope="module")
def with_zone() -> dict[str, Any]:
    return translate(overrides={"DomainName": DOMAIN, "CertificateArn": CERT, "HostedZoneId": ZONE})


def policy(translated: dict[str, Any], function: str) -> list[dict[str, Any]]:
    return [{"Version": "2012-10-17", "Statement": all_statements(translated, function_role(translated, function))}]


def may(
    translated: dict[str, Any], function: str, action: str, resource: str, context: dict[str, Any] | None = None
) -> bool:
    role = Resolver(translated).get_att(function_role(translated, function), "Arn")
    return allowed(Request(role, action, resource, context or {}), policy(translated, function))


def tags(stack: str = STACK_KEY, **extra: str) -> dict[str, Any]:
    context: dict[str, Any] = {
        "aws:RequestTag/fleetkeeper:managed": "true",
        "aws:RequestTag/fleetkeeper:stack": stack,
        "aws:TagKeys": ["fleetkeeper:managed", "fleetkeeper:stack", "fleetkeeper:shard"],
    }
    context.update(extra)
    return context


def carrying(stack: str = STACK_KEY) -> dict[str, Any]:
    return {"aws:ResourceTag/fleetkeeper:managed": "true", "aws:ResourceTag/fleetkeeper:stack": stack}


def test_the_reconciler_is_given_what_a_pool_is_made_with(translated: dict[str, Any]) -> None:
    env = reconciler_env(translated)
    resolver = Resolver(translated)
    assert env["FLEETKEEPER_ALB_SECURITY_GROUP_ID"] == resolver.ref("LoadBalancerSecurityGroup")
    assert env["FLEETKEEPER_ALB_SCHEME"] == "internal"
    assert env["FLEETKEEPER_ALB_IDLE_TIMEOUT"] == 300
    assert env["FLEETKEEPER_WAKE_FUNCTION_ARN"] == resolver.get_att("WakeFunction", "Arn")
    assert env["FLEETKEEPER_HOSTED_ZONE_ID"] == ""
    subnets = env["FLEETKEEPER_LOAD_BALANCER_SUBNET_IDS"]
    values = {k: str(v) for k, v in env.items()} | {"TABLE_NAME": "t"}
    values["FLEETKEEPER_LOAD_BALANCER_SUBNET_IDS"] = subnets if isinstance(subnets, str) else ",".join(subnets)
    settings = Settings.from_env(values)
    assert AlbBalancer(settings.alb).pools_enabled
    assert settings.alb.scheme == "internal" and settings.alb.idle_timeout == 300
    assert settings.alb.subnet_ids and settings.alb.security_group_id


def test_the_dispatcher_knows_the_pools_as_the_reconciler_does(translated: dict[str, Any]) -> None:
    reconciler = reconciler_env(translated)
    dispatcher = props(translated, "DispatcherFunction")["Environment"]["Variables"]
    for key in (
        "FLEETKEEPER_LOAD_BALANCER",
        "FLEETKEEPER_ALB_ARN",
        "FLEETKEEPER_ALB_VPC_ID",
        "FLEETKEEPER_DOMAIN_NAME",
        "FLEETKEEPER_WAKE_TARGET_GROUP_ARN",
        "FLEETKEEPER_LOAD_BALANCER_SUBNET_IDS",
        "FLEETKEEPER_ALB_SECURITY_GROUP_ID",
    ):
        assert dispatcher[key] == reconciler[key], key


def test_the_reconciler_makes_only_its_own_stacks_load_balancers(translated: dict[str, Any]) -> None:
    fn = "ReconcilerFunction"
    assert may(translated, fn, "elasticloadbalancing:CreateLoadBalancer", OWN, tags())
    assert not may(translated, fn, "elasticloadbalancing:CreateLoadBalancer", OWN, tags("ffffffffffff"))
    assert not may(translated, fn, "elasticloadbalancing:CreateLoadBalancer", NEIGHBOUR, tags())
    assert not may(translated, fn, "elasticloadbalancing:CreateLoadBalancer", OWN, {})  # untagged
    # Tags only as part of creating: never onto an existing load balancer.
    create = {"elasticloadbalancing:CreateAction": "CreateLoadBalancer"}
    assert may(translated, fn, "elasticloadbalancing:AddTags", OWN, tags(**create))
    assert not may(translated, fn, "elasticloadbalancing:AddTags", NEIGHBOUR, tags(**create))
    assert not may(translated, fn, "elasticloadbalancing:AddTags", OWN, carrying() | {"aws:TagKeys": ["x"]})
    # Its attributes and listeners: its own only.
    assert may(translated, fn, "elasticloadbalancing:ModifyLoadBalancerAttributes", OWN, carrying())
    assert not may(translated, fn, "elasticloadbalancing:ModifyLoadBalancerAttributes", NEIGHBOUR, carrying("f"))
    assert may(translated, fn, "elasticloadbalancing:CreateListener", OWN, tags())
    assert not may(translated, fn, "elasticloadbalancing:CreateListener", NEIGHBOUR, tags())
    listener = OWN.replace(":loadbalancer/", ":listener/") + "/0123456789abcdef"
    rule = OWN.replace(":loadbalancer/", ":listener-rule/") + "/0123456789abcdef/fedcba9876543210"
    assert may(translated, fn, "elasticloadbalancing:CreateRule", listener, tags())
    assert may(translated, fn, "elasticloadbalancing:ModifyListener", listener, carrying())
    assert may(translated, fn, "elasticloadbalancing:DeleteRule", rule, carrying())
    assert not may(translated, fn, "elasticloadbalancing:DeleteRule", rule, carrying("ffffffffffff"))
    neighbours_listener = NEIGHBOUR.replace(":loadbalancer/", ":listener/") + "/0123456789abcdef"
    assert not may(translated, fn, "elasticloadbalancing:DeleteListener", neighbours_listener, carrying())
    # It never deletes a load balancer: the dispatcher retires them.
    assert not may(translated, fn, "elasticloadbalancing:DeleteLoadBalancer", OWN, carrying())


def test_the_reconciler_makes_its_pools_wake_groups_only(translated: dict[str, Any]) -> None:
    fn = "ReconcilerFunction"
    own = f"{ELB}:targetgroup/fkwake-{STACK_KEY}-3/0123456789abcdef"
    template = f"{ELB}:targetgroup/fkwake-{STACK_KEY}/0123456789abcdef"
    neighbour = f"{ELB}:targetgroup/fkwake-ffffffffffff-3/0123456789abcdef"
    assert may(translated, fn, "elasticloadbalancing:CreateTargetGroup", own, tags())
    assert not may(translated, fn, "elasticloadbalancing:CreateTargetGroup", neighbour, tags())
    assert may(translated, fn, "elasticloadbalancing:RegisterTargets", own, carrying())
    assert not may(translated, fn, "elasticloadbalancing:RegisterTargets", template, {})  # the template's own
    assert not may(translated, fn, "elasticloadbalancing:RegisterTargets", neighbour, carrying("ffffffffffff"))


def test_the_dispatcher_retires_only_its_own_stacks_pools(translated: dict[str, Any]) -> None:
    fn = "DispatcherFunction"
    assert may(translated, fn, "elasticloadbalancing:DeleteLoadBalancer", OWN, carrying())
    # A neighbouring stack's ALB cannot be deleted: not by name, not by tag.
    assert not may(translated, fn, "elasticloadbalancing:DeleteLoadBalancer", NEIGHBOUR, carrying("ffffffffffff"))
    assert not may(translated, fn, "elasticloadbalancing:DeleteLoadBalancer", NEIGHBOUR, carrying())
    assert not may(translated, fn, "elasticloadbalancing:DeleteLoadBalancer", OWN, carrying("ffffffffffff"))
    template_alb = f"{ELB}:loadbalancer/app/fk-test-LoadBalancerResource/50dc6c495c0c9188"
    assert not may(translated, fn, "elasticloadbalancing:DeleteLoadBalancer", template_alb, carrying())
    mark = carrying() | {"aws:TagKeys": ["fleetkeeper:empty-since"]}
    assert may(translated, fn, "elasticloadbalancing:AddTags", OWN, mark)
    assert may(translated, fn, "elasticloadbalancing:RemoveTags", OWN, mark)
    assert not may(translated, fn, "elasticloadbalancing:RemoveTags", OWN, carrying() | {"aws:TagKeys": [MANAGED]})
    wake = f"{ELB}:targetgroup/fkwake-{STACK_KEY}-3/0123456789abcdef"
    assert may(translated, fn, "elasticloadbalancing:DeleteTargetGroup", wake, carrying())
    assert not may(
        translated, fn, "elasticloadbalancing:DeleteTargetGroup", f"{ELB}:targetgroup/fkwake-{STACK_KEY}/0a", carrying()
    )


MANAGED = "fleetkeeper:managed"


def test_the_wake_function_may_be_invoked_for_the_pools_wake_groups(translated: dict[str, Any]) -> None:
    permission = props(translated, "WakeShardsInvokePermission")
    assert permission["Principal"] == "elasticloadbalancing.amazonaws.com"
    assert permission["SourceAccount"] == ACCOUNT
    assert permission["SourceArn"] == f"{ELB}:targetgroup/fkwake-{STACK_KEY}-*/*"
    wake_role = policy(translated, "WakeFunction")
    role = Resolver(translated).get_att(function_role(translated, "WakeFunction"), "Arn")
    assert allowed(Request(role, "elasticloadbalancing:DescribeLoadBalancers", "*"), wake_role)


def test_records_only_under_the_domain_in_its_zone(with_zone: dict[str, Any], translated: dict[str, Any]) -> None:
    fn = "ReconcilerFunction"
    zone = f"arn:aws:route53:::hostedzone/{ZONE}"
    assert reconciler_env(with_zone)["FLEETKEEPER_HOSTED_ZONE_ID"] == ZONE

    def change(names: list[str], types: list[str], actions: list[str], resource: str = zone) -> bool:
        context = {
            "route53:ChangeResourceRecordSetsNormalizedRecordNames": names,
            "route53:ChangeResourceRecordSetsRecordTypes": types,
            "route53:ChangeResourceRecordSetsActions": actions,
        }
        return may(with_zone, fn, "route53:ChangeResourceRecordSets", resource, context)

    assert change([f"api.{DOMAIN}"], ["A"], ["UPSERT"])
    assert change([f"api.{DOMAIN}"], ["A"], ["DELETE"])
    assert not change([DOMAIN], ["A"], ["UPSERT"])  # the apex
    assert not change(["api.example.org"], ["A"], ["UPSERT"])
    assert not change([f"api.{DOMAIN}", "www.example.org"], ["A"], ["UPSERT"])
    assert not change([f"api.{DOMAIN}"], ["TXT"], ["UPSERT"])
    assert not change([f"api.{DOMAIN}"], ["A"], ["CREATE"])
    assert not change([f"api.{DOMAIN}"], ["A"], ["UPSERT"], "arn:aws:route53:::hostedzone/ZOTHER")
    assert may(with_zone, fn, "route53:ListResourceRecordSets", zone)
    # Without a hosted zone: no Route 53 permission at all.
    assert "ReconcilerDnsPolicy" not in deployed(translated)
    assert "ReconcilerDnsPolicy" in deployed(with_zone)


def test_every_elbv2_call_of_the_adapter_is_granted(translated: dict[str, Any]) -> None:
    """Each elbv2 operation alb/ calls is granted to the reconciler, or (retiring pools) to the
    dispatcher; and Route 53's two to the reconciler with a hosted zone."""
    import re
    from pathlib import Path

    import fleetkeeper.reconciler.balancers.alb as alb_module

    # The package's every module (alb/__init__.py and its parts).
    source = "".join(part.read_text() for part in sorted(Path(alb_module.__file__).parent.glob("*.py")))
    called = {
        "".join(part.title() for part in name.split("_")) for name in re.findall(r"self\.elbv2\.([a-z_]+)\b", source)
    }
    retiring = {"DeleteLoadBalancer", "RemoveTags"}
    granted: dict[str, set[str]] = {}
    for function in ("ReconcilerFunction", "DispatcherFunction"):
        statements = all_statements(translated, function_role(translated, function))
        granted[function] = {
            str(a).split(":")[1]
            for s in statements
            for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
            if str(a).startswith("elasticloadbalancing:")
        }
    assert called - granted["ReconcilerFunction"] == retiring
    assert retiring <= granted["DispatcherFunction"]
    assert "DeleteLoadBalancer" not in granted["ReconcilerFunction"]


def test_a_scheme_the_template_cannot_give_is_refused() -> None:
    from fleetkeeper.settings import SettingsError

    with pytest.raises(SettingsError, match="FLEETKEEPER_ALB_SCHEME"):
        Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_ALB_SCHEME": "none"})
    bare = Settings.from_env({"TABLE_NAME": "t"})
    # No security group, no subnets: no pool is ever made.
    assert not AlbBalancer(bare.alb).pools_enabled
