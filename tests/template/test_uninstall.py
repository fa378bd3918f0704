"""The uninstall custom resource in template.yaml (fleetkeeper/uninstall): present in every
configuration, outside the VPC, given what its cleanup works on, deleted before what it unblocks and
after what makes things (tests/uninstall/test_delete_order.py walks the whole order), and its role's
permissions, evaluated with the IAM evaluator: only this stack's instances, roles on its path, load balancer pools,
target groups, routes of its own ALB, records under its domain, parameters of its table, objects of
its bucket, its own stack's status."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.uninstall.handler import scope_of
from tests.stacks.test_isolation_iam import all_statements
from tests.support.cfn import ACCOUNT, Resolver, function_role, translate
from tests.support.iam_evaluator import Request, allowed
from tests.template.test_endpoints import deployed, props

STACK_KEY = "0123456789ab"
NEIGHBOUR = "ffffffffffff"
ELB = f"arn:aws:elasticloadbalancing:us-east-1:{ACCOUNT}"
ZONE = "Z0123456789ABCDEFGHIJ"
DOMAIN = "svc.example.com"
CERT = "arn:aws:acm:us-east-1:123456789012:certificate/0e0e0e0e-1111-2222-3333-444444444444"
PARTS = ("UninstallCleanup", "UninstallFunction", "UninstallRole", "UninstallLogGroup")


@pytest.fixture(scope="module")
def with_zone() -> dict[str, Any]:
    return translate(overrides={"DomainName": DOMAIN, "CertificateArn": CERT, "HostedZoneId": ZONE})


def may(translated: dict[str, Any], action: str, resource: str, context: dict[str, Any] | None = None) -> bool:
    role = function_role(translated, "UninstallFunction")
    statements = all_statements(translated, role)
    arn = Resolver(translated).get_att(role, "Arn")
    return allowed(Request(arn, action, resource, context or {}), [{"Version": "2012-10-17", "Statement": statements}])


def carrying(stack: str = STACK_KEY, managed: bool = True) -> dict[str, Any]:
    context: dict[str, Any] = {"aws:ResourceTag/fleetkeeper:stack": stack}
    if managed:
        context["aws:ResourceTag/fleetkeeper:managed"] = "true"
    return context


def test_the_cleanup_is_in_every_configuration_with_the_permissions_it_needs(
    translated: dict[str, Any], with_zone: dict[str, Any]
) -> None:
    none = translate(overrides={"LoadBalancer": "none"})
    for template in (none, translated, with_zone):
        assert set(PARTS) <= set(deployed(template))
    assert "UninstallEndpointsPolicy" not in deployed(none)
    assert "UninstallEndpointsPolicy" in deployed(translated) and "UninstallDnsPolicy" not in deployed(translated)
    assert {"UninstallEndpointsPolicy", "UninstallDnsPolicy"} <= set(deployed(with_zone))


def test_the_function_runs_outside_the_vpc_and_answers_within_the_resources_timeout(translated: dict[str, Any]) -> None:
    function = props(translated, "UninstallFunction")
    assert "VpcConfig" not in function  # IAM, Route 53 and CloudFormation have no endpoint in the network stack
    assert function["Handler"] == "fleetkeeper.uninstall.handler.lambda_handler"
    assert function["Timeout"] == 900  # Lambda's longest
    resource = props(translated, "UninstallCleanup")
    assert resource["ServiceToken"] == Resolver(translated).get_att("UninstallFunction", "Arn")
    assert function["Timeout"] < int(resource["ServiceTimeout"]) <= 3600


def test_the_properties_are_what_the_cleanup_reads(translated: dict[str, Any], with_zone: dict[str, Any]) -> None:
    none = translate(overrides={"LoadBalancer": "none"})
    plain = scope_of(props(none, "UninstallCleanup"))
    resolver = Resolver(none)
    assert plain.stack_id == STACK_KEY
    assert plain.table_name == resolver.ref("Table")
    assert plain.workdir_bucket == resolver.ref("WorkdirBucket")
    assert plain.replica_policy_arn == resolver.ref("ReplicaOwnerPolicy")
    assert (plain.load_balancer_arn, plain.listener_arns, plain.hosted_zone_id) == ("", (), "")
    ports = scope_of(props(translated, "UninstallCleanup"))
    assert ports.load_balancer_arn == Resolver(translated).ref("LoadBalancerResource")
    assert ports.security_group_id == Resolver(translated).ref("LoadBalancerSecurityGroup")
    assert ports.listener_arns == ()  # without a domain every service has a listener of its own
    zoned = scope_of(props(with_zone, "UninstallCleanup"))
    resolver = Resolver(with_zone)
    assert zoned.listener_arns == (resolver.ref("HttpsListener"), resolver.ref("HttpToHttpsListener"))
    assert (zoned.hosted_zone_id, zoned.domain_name) == (ZONE, DOMAIN)
    http = translate(overrides={"DomainName": DOMAIN})
    assert scope_of(props(http, "UninstallCleanup")).listener_arns == (Resolver(http).ref("HttpListener"),)


def test_what_makes_things_is_deleted_before_the_cleanup_runs(translated: dict[str, Any]) -> None:
    for function in ("ApiFunction", "DispatcherFunction", "ReconcilerFunction"):
        assert translated["Resources"][function].get("DependsOn") in ("UninstallCleanup", ["UninstallCleanup"])


# --- the role -----------------------------------------------------------------------------------------


def test_it_terminates_only_this_stacks_instances(translated: dict[str, Any]) -> None:
    instance = f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/i-0123456789abcdef0"
    assert may(translated, "ec2:TerminateInstances", instance, carrying())
    assert not may(translated, "ec2:TerminateInstances", instance, carrying(NEIGHBOUR))
    assert not may(translated, "ec2:TerminateInstances", instance, {"aws:ResourceTag/fleetkeeper:stack": STACK_KEY})
    assert not may(translated, "ec2:TerminateInstances", instance)


def test_it_removes_only_the_roles_and_profiles_on_this_stacks_path(translated: dict[str, Any]) -> None:
    policy = Resolver(translated).ref("ReplicaOwnerPolicy")
    own = f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/{STACK_KEY}/fk-{STACK_KEY}-0011223344556677"
    other = f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/{NEIGHBOUR}/fk-{NEIGHBOUR}-0011223344556677"
    assert may(translated, "iam:DeleteRole", own)
    assert not may(translated, "iam:DeleteRole", other)
    assert not may(translated, "iam:DeleteRole", f"arn:aws:iam::{ACCOUNT}:role/admin")
    assert may(translated, "iam:DetachRolePolicy", own, {"iam:PolicyARN": policy})
    assert not may(translated, "iam:DetachRolePolicy", own, {"iam:PolicyARN": f"arn:aws:iam::{ACCOUNT}:policy/other"})
    profile = f"arn:aws:iam::{ACCOUNT}:instance-profile/fleetkeeper/{STACK_KEY}/fk-{STACK_KEY}-0011223344556677"
    for action in ("iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"):
        assert may(translated, action, profile)
        assert not may(translated, action, profile.replace(STACK_KEY, NEIGHBOUR))
    assert may(translated, "iam:ListRoles", "*")
    # Nothing that makes or widens a role.
    for action in ("iam:CreateRole", "iam:AttachRolePolicy", "iam:PutRolePolicy", "iam:PassRole"):
        assert not may(translated, action, own)


def test_it_deletes_only_this_stacks_pools_groups_and_routes(translated: dict[str, Any]) -> None:
    alb = Resolver(translated).get_att("LoadBalancerResource", "LoadBalancerFullName")
    pool = f"{ELB}:loadbalancer/app/fk-{STACK_KEY}-1/50dc6c495c0c9188"
    assert may(translated, "elasticloadbalancing:DeleteLoadBalancer", pool, carrying())
    assert not may(translated, "elasticloadbalancing:DeleteLoadBalancer", pool, carrying(NEIGHBOUR))
    neighbour = f"{ELB}:loadbalancer/app/fk-{NEIGHBOUR}-1/50dc6c495c0c9188"
    assert not may(translated, "elasticloadbalancing:DeleteLoadBalancer", neighbour, carrying(NEIGHBOUR))
    # The template's ALB is CloudFormation's.
    assert not may(translated, "elasticloadbalancing:DeleteLoadBalancer", f"{ELB}:loadbalancer/{alb}", carrying())
    group = f"{ELB}:targetgroup/fk-{STACK_KEY}-0011223344556677/0123456789abcdef"
    assert may(translated, "elasticloadbalancing:DeleteTargetGroup", group, carrying())
    assert not may(translated, "elasticloadbalancing:DeleteTargetGroup", group, carrying(NEIGHBOUR))
    wake = f"{ELB}:targetgroup/fkwake-{STACK_KEY}-1/0123456789abcdef"
    assert may(translated, "elasticloadbalancing:DeleteTargetGroup", wake, carrying())
    # WakeTargetGroup (fkwake-<stack id>, the stack tag only) is CloudFormation's.
    template_wake = f"{ELB}:targetgroup/fkwake-{STACK_KEY}/0123456789abcdef"
    assert not may(translated, "elasticloadbalancing:DeleteTargetGroup", template_wake, carrying(managed=False))
    listener = f"{ELB}:listener/{alb}/0123456789abcdef"
    managed = {"aws:ResourceTag/fleetkeeper:managed": "true"}
    assert may(translated, "elasticloadbalancing:DeleteListener", listener, managed)
    assert not may(translated, "elasticloadbalancing:DeleteListener", listener)  # the template's own
    assert not may(translated, "elasticloadbalancing:DeleteListener", f"{ELB}:listener/app/other/1/2", managed)
    rule = f"{ELB}:listener-rule/{alb}/0123456789abcdef/0a0b0c"
    assert may(translated, "elasticloadbalancing:DeleteRule", rule, managed)
    assert not may(translated, "elasticloadbalancing:DeleteRule", rule)
    for action in ("elasticloadbalancing:CreateLoadBalancer", "elasticloadbalancing:ModifyListener"):
        assert not may(translated, action, pool, carrying())


def test_it_deletes_only_a_records_under_the_domain_in_its_zone(with_zone: dict[str, Any]) -> None:
    zone = f"arn:aws:route53:::hostedzone/{ZONE}"

    def change(names: list[str], actions: list[str], types: list[str] | None = None) -> dict[str, Any]:
        return {
            "route53:ChangeResourceRecordSetsNormalizedRecordNames": names,
            "route53:ChangeResourceRecordSetsActions": actions,
            "route53:ChangeResourceRecordSetsRecordTypes": types or ["A"] * len(names),
        }

    assert may(
        with_zone, "route53:ChangeResourceRecordSets", zone, change([f"web.{DOMAIN}", f"api.{DOMAIN}"], ["DELETE"])
    )
    assert not may(with_zone, "route53:ChangeResourceRecordSets", zone, change([f"web.{DOMAIN}"], ["UPSERT"]))
    assert not may(with_zone, "route53:ChangeResourceRecordSets", zone, change([DOMAIN], ["DELETE"]))
    assert not may(with_zone, "route53:ChangeResourceRecordSets", zone, change(["web.other.com"], ["DELETE"]))
    assert not may(with_zone, "route53:ChangeResourceRecordSets", zone, change([f"web.{DOMAIN}"], ["DELETE"], ["TXT"]))
    assert not may(
        with_zone,
        "route53:ChangeResourceRecordSets",
        "arn:aws:route53:::hostedzone/ZOTHER",
        change([f"web.{DOMAIN}"], ["DELETE"]),
    )
    assert may(with_zone, "route53:ListResourceRecordSets", zone)


def test_it_deletes_only_its_tables_parameters_and_its_buckets_objects(translated: dict[str, Any]) -> None:
    resolver = Resolver(translated)
    table, bucket = resolver.ref("Table"), resolver.ref("WorkdirBucket")
    ssm = f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter"
    assert may(translated, "ssm:GetParametersByPath", f"{ssm}/fleetkeeper/{table}")
    assert may(translated, "ssm:DeleteParameters", f"{ssm}/fleetkeeper/{table}/_o/0011223344556677/web/uid/ref")
    assert may(translated, "ssm:DeleteParameters", f"{ssm}/fleetkeeper-api/{table}/request-hmac-key")
    assert not may(translated, "ssm:DeleteParameters", f"{ssm}/fleetkeeper/other-table/web/uid/ref")
    assert not may(translated, "ssm:GetParameter", f"{ssm}/fleetkeeper/{table}/web/uid/ref")  # never reads a secret
    assert may(translated, "s3:ListBucket", f"arn:aws:s3:::{bucket}")
    assert may(translated, "s3:DeleteObject", f"arn:aws:s3:::{bucket}/services/web/uid/x.tar.gz")
    assert not may(translated, "s3:DeleteObject", "arn:aws:s3:::another-bucket/x")
    assert not may(translated, "s3:GetObject", f"arn:aws:s3:::{bucket}/services/web/uid/x.tar.gz")
    stack = resolver.ref("AWS::StackId")
    assert may(translated, "cloudformation:DescribeStacks", stack)
    assert not may(translated, "cloudformation:DescribeStacks", stack.replace("fk-test", "another"))
    assert not may(translated, "cloudformation:DeleteStack", stack)
