"""The endpoints' deployment: one ALB per stack, its security groups and listeners for each choice
of LoadBalancer / DomainName / CertificateArn, the reconciler's settings, and its scoped
elasticloadbalancing permissions (structure and parliament), as CloudFormation receives them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cfn import Resolver, as_list, resources_of_type, translate
from tests.template.test_iam import parliament_findings

MANAGED = "fleetkeeper:managed"
CERT = "arn:aws:acm:us-east-1:123456789012:certificate/0e0e0e0e-1111-2222-3333-444444444444"


@pytest.fixture(scope="module")
def with_domain() -> dict[str, Any]:
    return translate(overrides={"DomainName": "svc.example.com", "CertificateArn": CERT})


@pytest.fixture(scope="module")
def without_balancer() -> dict[str, Any]:
    return translate(overrides={"LoadBalancer": "none"})


def deployed(translated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The resources CloudFormation creates for these parameter values (their Condition holds)."""
    resolver = Resolver(translated)
    return {
        lid: body
        for lid, body in translated["Resources"].items()
        if "Condition" not in body or resolver.condition(body["Condition"])
    }


def props(translated: dict[str, Any], logical_id: str) -> dict[str, Any]:
    resolved: dict[str, Any] = Resolver(translated).resolve(translated["Resources"][logical_id]["Properties"])
    return resolved


def reconciler_env(translated: dict[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = props(translated, "ReconcilerFunction")["Environment"]["Variables"]
    return env


def kinds(translated: dict[str, Any]) -> dict[str, str]:
    return {lid: body["Type"] for lid, body in deployed(translated).items() if "ElasticLoadBalancingV2" in body["Type"]}


def test_by_default_an_internal_alb_with_a_listener_port_per_service(translated: dict[str, Any]) -> None:
    assert kinds(translated) == {
        "LoadBalancerResource": "AWS::ElasticLoadBalancingV2::LoadBalancer",
        # The wake target (fleetkeeper/wake/demand.py; tests/template/test_wake.py).
        "WakeTargetGroup": "AWS::ElasticLoadBalancingV2::TargetGroup",
    }
    alb = props(translated, "LoadBalancerResource")
    assert alb["Scheme"] == "internal" and alb["Type"] == "application"
    attributes = {a["Key"]: a["Value"] for a in alb["LoadBalancerAttributes"]}
    assert attributes["idle_timeout.timeout_seconds"] == 300  # streamed answers
    assert attributes["routing.http.drop_invalid_header_fields.enabled"] == "true"
    # Without LoadBalancerSubnetIds it sits in the replicas' subnets.
    subnets = alb["Subnets"] if isinstance(alb["Subnets"], list) else alb["Subnets"].split(",")
    assert subnets == ["subnet-0aaaaaaaaaaaaaaa1", "subnet-0bbbbbbbbbbbbbbb2"]
    env = reconciler_env(translated)
    assert env["FLEETKEEPER_LOAD_BALANCER"] == "alb"
    assert env["FLEETKEEPER_ALB_ARN"].startswith("arn:aws:elasticloadbalancing:")
    assert env["FLEETKEEPER_ALB_LISTENER_PORTS"] == "10000-10049"
    assert env["FLEETKEEPER_ALB_LISTENER_ARN"] == "" and env["FLEETKEEPER_DOMAIN_NAME"] == ""


def ingress(translated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        lid: props(translated, lid)
        for lid, body in deployed(translated).items()
        if body["Type"] == "AWS::EC2::SecurityGroupIngress"
    }


def test_replicas_accept_their_ports_from_the_load_balancer_only(translated: dict[str, Any]) -> None:
    rules = ingress(translated)
    replica = rules["ReplicaFromLoadBalancerIngress"]
    assert replica["GroupId"] == "sg-0aaaaaaaaaaaaaaa1"  # the first of ReplicaSecurityGroupIds
    assert replica["SourceSecurityGroupId"] == props(translated, "LoadBalancerSecurityGroup").get(
        "GroupId", Resolver(translated).ref("LoadBalancerSecurityGroup")
    )
    assert (replica["FromPort"], replica["ToPort"]) == (1, 65535)  # any port, as SkyPilot takes
    assert "CidrIp" not in replica
    # The load balancer admits the allowed range on the services' listener ports only.
    ports = rules["LoadBalancerServicePortsIngress"]
    assert (ports["FromPort"], ports["ToPort"], ports["CidrIp"]) == (10000, 10049, "10.0.0.0/8")
    assert set(rules) == {"ReplicaFromLoadBalancerIngress", "LoadBalancerServicePortsIngress"}
    (egress,) = props(translated, "LoadBalancerSecurityGroup")["SecurityGroupEgress"]
    assert egress["DestinationSecurityGroupId"] == "sg-0aaaaaaaaaaaaaaa1" and "CidrIp" not in egress


def test_a_domain_and_certificate_give_https_host_rules_and_a_redirect(with_domain: dict[str, Any]) -> None:
    assert set(kinds(with_domain)) == {
        "LoadBalancerResource",
        "HttpsListener",
        "HttpToHttpsListener",
        "WakeTargetGroup",
    }
    https = props(with_domain, "HttpsListener")
    assert (https["Protocol"], https["Port"], https["Certificates"]) == ("HTTPS", 443, [{"CertificateArn": CERT}])
    assert https["DefaultActions"][0]["FixedResponseConfig"]["StatusCode"] == "404"
    redirect = props(with_domain, "HttpToHttpsListener")["DefaultActions"][0]
    assert redirect["Type"] == "redirect"
    assert redirect["RedirectConfig"] == {"Protocol": "HTTPS", "Port": "443", "StatusCode": "HTTP_301"}
    env = reconciler_env(with_domain)
    assert env["FLEETKEEPER_DOMAIN_NAME"] == "svc.example.com" and env["FLEETKEEPER_CERTIFICATE_ARN"] == CERT
    assert env["FLEETKEEPER_ALB_LISTENER_ARN"] == Resolver(with_domain).ref("HttpsListener")
    assert {(r["FromPort"], r["ToPort"]) for r in ingress(with_domain).values()} == {
        (443, 443),
        (80, 80),
        (1, 65535),
    }


def test_every_name_of_the_longest_domain_fits_an_albs_host_header_condition(translated: dict[str, Any]) -> None:
    """A service's route is the host rule NAME.<DomainName>, and ELB takes at most 128 characters a
    host-header value (API_HostHeaderConditionConfig): the parameter leaves room for the longest
    name the api accepts, so no service can be created whose rule ELB would refuse."""
    import re

    from fleetkeeper.settings import MAX_DOMAIN_NAME_LENGTH, MAX_HOST_HEADER_LENGTH
    from fleetkeeper.spec.service import NAME_PATTERN

    parameter = translated["Parameters"]["DomainName"]
    assert parameter["MaxLength"] == MAX_DOMAIN_NAME_LENGTH
    longest_name = "a" * 63
    assert re.fullmatch(NAME_PATTERN, longest_name) and not re.fullmatch(NAME_PATTERN, longest_name + "a")
    longest_domain = "d" * 61 + ".io"
    assert len(longest_domain) == parameter["MaxLength"]
    assert re.fullmatch(parameter["AllowedPattern"], longest_domain)
    assert len(f"{longest_name}.{longest_domain}") == MAX_HOST_HEADER_LENGTH


def test_a_domain_without_certificate_carries_its_rules_on_http() -> None:
    plain = translate(overrides={"DomainName": "svc.example.com"})
    assert set(kinds(plain)) == {"LoadBalancerResource", "HttpListener", "WakeTargetGroup"}
    assert reconciler_env(plain)["FLEETKEEPER_ALB_LISTENER_ARN"] == Resolver(plain).ref("HttpListener")


def test_internet_facing_in_subnets_of_its_own() -> None:
    public = translate(
        overrides={"LoadBalancer": "internet-facing", "LoadBalancerSubnetIds": "subnet-0ccccccccccccccc3,subnet-0d"}
    )
    alb = props(public, "LoadBalancerResource")
    subnets = alb["Subnets"] if isinstance(alb["Subnets"], list) else alb["Subnets"].split(",")
    assert alb["Scheme"] == "internet-facing" and subnets == ["subnet-0ccccccccccccccc3", "subnet-0d"]


def test_no_load_balancer_means_no_alb_no_ingress_and_no_permissions(without_balancer: dict[str, Any]) -> None:
    made = deployed(without_balancer)
    assert kinds(without_balancer) == {}
    assert "ReconcilerEndpointsPolicy" not in made and "LoadBalancerSecurityGroup" not in made
    assert ingress(without_balancer) == {}
    env = reconciler_env(without_balancer)
    assert env["FLEETKEEPER_LOAD_BALANCER"] == "none" and env["FLEETKEEPER_ALB_ARN"] == ""


# --- the reconciler's elasticloadbalancing permissions -------------------------------------------------


def endpoint_statements(translated: dict[str, Any]) -> list[dict[str, Any]]:
    policy = props(translated, "ReconcilerEndpointsPolicy")
    assert policy["RoleName"] == Resolver(translated).ref("ReconcilerRole")
    statements: list[dict[str, Any]] = policy["PolicyDocument"]["Statement"]
    return statements


def test_every_change_needs_the_managed_tag_and_names_this_stacks_resources(translated: dict[str, Any]) -> None:
    alb = Resolver(translated).get_att("LoadBalancerResource", "LoadBalancerFullName")
    for statement in endpoint_statements(translated):
        actions = as_list(statement["Action"])
        if all(a.split(":")[1].startswith("Describe") for a in actions):
            assert statement["Resource"] == "*" and "Condition" not in statement
            continue
        condition = statement["Condition"]["StringEquals"]
        tag_keys = {f"aws:RequestTag/{MANAGED}", f"aws:ResourceTag/{MANAGED}"}
        assert tag_keys & set(condition), statement
        assert all(condition[key] == "true" for key in tag_keys & set(condition))
        for resource in as_list(statement["Resource"]):
            assert resource != "*", statement
            resolved = str(Resolver(translated).resolve(resource))
            assert (
                ":targetgroup/fk-*/" in resolved
                or ":targetgroup/fk-0123456789ab-*/" in resolved
                or f"/{alb}" in resolved
            ), resolved


def test_tags_are_only_added_when_creating(translated: dict[str, Any]) -> None:
    (tagging,) = [s for s in endpoint_statements(translated) if "elasticloadbalancing:AddTags" in as_list(s["Action"])]
    assert set(tagging["Condition"]["StringEquals"]["elasticloadbalancing:CreateAction"]) == {
        "CreateTargetGroup",
        "CreateListener",
        "CreateRule",
    }


def test_the_reconciler_may_do_what_the_alb_adapter_does(translated: dict[str, Any]) -> None:
    """Every elbv2 operation of fleetkeeper/reconciler/balancers/alb/ is granted (and no other)."""
    from pathlib import Path

    import fleetkeeper.reconciler.balancers.alb as alb_module

    # The package's every module (alb/__init__.py and its parts).
    source = "".join(part.read_text() for part in sorted(Path(alb_module.__file__).parent.glob("*.py")))
    used = {
        "".join(part.title() for part in name.split("_"))
        for name in (
            "describe_target_groups",
            "describe_target_group_attributes",
            "describe_target_health",
            "describe_listeners",
            "describe_rules",
            "create_target_group",
            "create_listener",
            "create_rule",
            "modify_target_group",
            "modify_target_group_attributes",
            "register_targets",
            "deregister_targets",
            "delete_target_group",
            "modify_rule",
            "delete_rule",
            "delete_listener",
            "modify_listener",
        )
        if f".{name}(" in source or f".{name}," in source
    }
    granted = {
        a.split(":")[1]
        for s in endpoint_statements(translated)
        for a in as_list(s["Action"])
        if a.startswith("elasticloadbalancing:")
    }
    assert granted - {"AddTags"} == used


# What Elastic Load Balancing checks on the caller's behalf, per operation the reconciler calls, from
# https://docs.aws.amazon.com/elasticloadbalancing/latest/userguide/elb-api-permissions.html: without
# them each call is AccessDenied on AWS (moto checks nothing).
ELB_CALLER_SIDE = {
    "CreateTargetGroup": {"ec2:DescribeVpcs", "ec2:DescribeInternetGateways"},
    "RegisterTargets": {
        "ec2:DescribeVpcs",
        "ec2:DescribeInternetGateways",
        "ec2:DescribeInstances",
        "ec2:DescribeSubnets",
    },
    "CreateLoadBalancer": {
        "ec2:DescribeAccountAttributes",
        "ec2:DescribeAddresses",
        "ec2:DescribeInternetGateways",
        "ec2:DescribeSecurityGroups",
        "ec2:DescribeSubnets",
        "ec2:DescribeVpcs",
    },
}


def test_the_reconciler_holds_what_elb_checks_on_its_behalf(translated: dict[str, Any]) -> None:
    from tests.support.iam_evaluator import Decision, Request, evaluate

    resolver = Resolver(translated)
    resources = translated["Resources"]
    documents = [p["PolicyDocument"] for p in resources["ReconcilerRole"]["Properties"].get("Policies", [])]
    documents += [
        body["Properties"]["PolicyDocument"]
        for body in resources_of_type(translated, "AWS::IAM::RolePolicy").values()
        if body["Properties"]["RoleName"] == {"Ref": "ReconcilerRole"}
        and ("Condition" not in body or resolver.condition(body["Condition"]))
    ]
    policies = [resolver.resolve(document) for document in documents]
    role = f"arn:aws:iam::123456789012:role/{resolver.physical_id('ReconcilerRole')}"
    missing = {
        operation: sorted(
            action for action in actions if evaluate(Request(role, action, "*"), policies) is not Decision.ALLOW
        )
        for operation, actions in ELB_CALLER_SIDE.items()
    }
    assert missing == {operation: [] for operation in ELB_CALLER_SIDE}
    # CreateLoadBalancer makes ELB's service-linked role in an account that has none yet.
    linked = (
        "arn:aws:iam::123456789012:role/aws-service-role/elasticloadbalancing.amazonaws.com/"
        "AWSServiceRoleForElasticLoadBalancing"
    )
    context = {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}
    assert evaluate(Request(role, "iam:CreateServiceLinkedRole", linked, context), policies) is Decision.ALLOW


# parliament's findings on the endpoint permissions that are accepted, and why (any other fails).
ACCEPTED = {
    # CreateRule, DeleteListener, ModifyRule and DeleteRule act on the listeners and rules of an
    # application *or* a network load balancer; parliament wants a resource of each kind in the
    # statement. The stack has one application load balancer: its listeners and rules are the only
    # resources the reconciler may touch, so naming a network load balancer's would widen the grant.
    ("RESOURCE_MISMATCH", "listener/net/"),
    ("RESOURCE_MISMATCH", "listener-rule/net/"),
    # elasticloadbalancing:CreateAction (tagging allowed only as part of creating the resource) is
    # a documented condition key of AddTags that parliament's action database predates.
    ("UNKNOWN_CONDITION_FOR_ACTION", "elasticloadbalancing:CreateAction"),
}


def test_the_endpoint_permissions_pass_parliament(translated: dict[str, Any]) -> None:
    document = Resolver(translated).resolve(translated["Resources"]["ReconcilerEndpointsPolicy"]["Properties"])[
        "PolicyDocument"
    ]
    findings = parliament_findings(document)
    assert findings, "parliament saw nothing: is it wired up?"
    unexpected = [f for f in findings if not any(issue == f[0] and part in f[1] for issue, part in ACCEPTED)]
    assert unexpected == []


# --- the autoscaler's request rates ---------------------------------------------------------------------


def test_the_reconciler_may_read_request_rates_and_nothing_more_of_cloudwatch(
    translated: dict[str, Any], without_balancer: dict[str, Any]
) -> None:
    """GetMetricData (no resource-level permissions: Resource "*"), read-only, with a load balancer
    only; and it is the only CloudWatch call the reconciler's metrics module makes."""
    from pathlib import Path

    import fleetkeeper.reconciler.metrics as metrics

    policy = props(translated, "ReconcilerMetricsPolicy")
    assert policy["RoleName"] == Resolver(translated).ref("ReconcilerRole")
    assert policy["PolicyDocument"]["Statement"] == [
        {"Sid": "ReadRequestRates", "Effect": "Allow", "Action": "cloudwatch:GetMetricData", "Resource": "*"}
    ]
    assert parliament_findings(policy["PolicyDocument"]) == []
    assert "ReconcilerMetricsPolicy" in deployed(translated)
    assert "ReconcilerMetricsPolicy" not in deployed(without_balancer)
    source = Path(metrics.__file__).read_text()
    assert "client.get_metric_data(" in source
    # The api reads the same metric for GET .../metrics (a dashboard's plot), with the same one right.
    api = props(translated, "ApiMetricsPolicy")
    assert api["RoleName"] == Resolver(translated).ref("ApiFunctionRole")
    assert api["PolicyDocument"]["Statement"] == policy["PolicyDocument"]["Statement"]
    assert "ApiMetricsPolicy" in deployed(translated) and "ApiMetricsPolicy" not in deployed(without_balancer)
    assert "put_metric_data" not in source and "list_metrics" not in source
