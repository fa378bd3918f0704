"""infra/: the CI role may only call the API, from one repository and branch; the network stack
gives the reconciler what it needs without a route to the internet."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.local.template import load_template
from tests import REPO_ROOT
from tests.support.cfn import PSEUDO, Resolver, as_list, parameter_values, resources_of_type

INFRA = REPO_ROOT / "infra"


@pytest.fixture(scope="module")
def ci() -> dict[str, Any]:
    return load_template(INFRA / "ci-role.yaml")


@pytest.fixture(scope="module")
def network() -> dict[str, Any]:
    return load_template(INFRA / "network.yaml")


def test_ci_role_may_only_invoke_the_api(ci: dict[str, Any]) -> None:
    role = ci["Resources"]["CiRole"]["Properties"]
    assert "ManagedPolicyArns" not in role
    statements = [s for policy in role["Policies"] for s in as_list(policy["PolicyDocument"]["Statement"])]
    assert [(s["Effect"], s["Action"], s["Resource"]) for s in statements] == [
        ("Allow", "execute-api:Invoke", {"Ref": "ApiExecuteArn"})
    ]
    # The ARN parameter cannot be widened to every API of the account.
    pattern = ci["Parameters"]["ApiExecuteArn"]["AllowedPattern"]
    assert ":[a-z0-9]{10}/" in pattern


def test_ci_role_trusts_one_repository_and_branch_exactly(ci: dict[str, Any]) -> None:
    (trust,) = ci["Resources"]["CiRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert set(trust["Condition"]) == {"StringEquals"}, "StringLike would admit wildcards in sub"
    condition = trust["Condition"]["StringEquals"]
    assert condition["token.actions.githubusercontent.com:aud"] == "sts.amazonaws.com"
    assert condition["token.actions.githubusercontent.com:sub"] == {
        "Fn::Sub": "repo:${GitHubRepository}:ref:refs/heads/${GitHubBranch}"
    }


def test_api_gateways_logging_role_may_be_assumed_whether_or_not_it_names_the_source_account() -> None:
    """API Gateway's documents do not say it sets aws:SourceAccount when it assumes its CloudWatch
    role: the trust must let it in without the key, and keep another account's API Gateway out when
    the key says so (StringEqualsIfExists)."""
    from tests.support.cfn import ACCOUNT
    from tests.support.iam_evaluator import Decision, Request, evaluate

    template = load_template(INFRA / "apigw-logging.yaml")
    role = f"arn:aws:iam::{ACCOUNT}:role/apigw-logs"
    resolver = Resolver({**template, "__parameter_values__": {**PSEUDO, **parameter_values(template)}})
    trust = resolver.resolve(template["Resources"]["ApiGatewayLogsRole"]["Properties"]["AssumeRolePolicyDocument"])

    def assume(context: dict[str, str | list[str]]) -> Decision:
        return evaluate(Request("apigateway.amazonaws.com", "sts:AssumeRole", role, context), [], resource=[trust])

    assert assume({}) is Decision.ALLOW
    assert assume({"aws:SourceAccount": ACCOUNT}) is Decision.ALLOW
    assert assume({"aws:SourceAccount": "999999999999"}) is not Decision.ALLOW


def test_network_has_no_route_to_the_internet_unless_asked_for_a_nat(network: dict[str, Any]) -> None:
    internet = {"AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::Route", "AWS::EC2::EIP"}
    for name, body in network["Resources"].items():
        if body["Type"] in internet or name.startswith("Public"):
            assert body.get("Condition") == "WithNatGateway", f"{name} exists without NatGateway=true"
    assert network["Parameters"]["NatGateway"]["Default"] == "false"
    for subnet in resources_of_type(network, "AWS::EC2::Subnet").values():
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    # With the NAT: the private subnets' default route goes through it, the public subnet's to the gateway.
    routes = resources_of_type(network, "AWS::EC2::Route")
    assert {r["Properties"]["RouteTableId"]["Ref"]: set(r["Properties"]) for r in routes.values()} == {
        "PrivateRouteTable": {"RouteTableId", "DestinationCidrBlock", "NatGatewayId"},
        "PublicRouteTable": {"RouteTableId", "DestinationCidrBlock", "GatewayId"},
    }


def test_network_reaches_the_apis_the_reconciler_calls(network: dict[str, Any]) -> None:
    services = {
        body["Properties"]["ServiceName"]["Fn::Sub"].rsplit(".", 1)[-1]: body
        for body in resources_of_type(network, "AWS::EC2::VPCEndpoint").values()
    }
    assert {"ec2", "dynamodb", "elasticloadbalancing", "monitoring", "ssm", "logs", "sqs"} <= set(services)
    # Nothing in the VPC calls Lambda: an endpoint for it would cost 14.60 USD a month for nothing. SQS:
    # the reconciler's delayed kick for a spot-interrupted replica's drain (fleetkeeper/kick.py).
    assert "lambda" not in services
    assert services["dynamodb"]["Properties"]["VpcEndpointType"] == "Gateway"
    # monitoring: the autoscaler's GetMetricData (fleetkeeper/reconciler/metrics.py); logs: the
    # replicas' shipper sends their output to CloudWatch Logs.
    for name in ("ec2", "elasticloadbalancing", "monitoring", "ssm", "logs", "sqs"):
        assert "Condition" not in services[name], f"the {name} endpoint must always exist"
        assert services[name]["Properties"]["PrivateDnsEnabled"] is True


def test_no_arn_hard_codes_the_aws_partition() -> None:
    """GovCloud (aws-us-gov) and China (aws-cn) stacks: every ARN is built with ${AWS::Partition}."""
    for path in [INFRA.parent / "template.yaml", *sorted(INFRA.glob("*.yaml"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("#") or "<region>" in line:
                continue  # comments, and the placeholders of documentation strings
            assert "arn:aws:" not in line, f"{path}:{number}: {line.strip()}"


def test_nat_less_replicas_reach_the_amazon_linux_repositories(network: dict[str, Any]) -> None:
    """A replica's setup runs `dnf install`: AL2023's repositories are S3 buckets of AWS's own account,
    which the own-account statement alone would refuse through the gateway endpoint."""
    resolver = Resolver({**network, "__parameter_values__": {**PSEUDO, **parameter_values(network)}})
    policy = network["Resources"]["S3Endpoint"]["Properties"]["PolicyDocument"]
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    repos = [str(resolver.resolve(r)) for r in by_sid["AmazonLinuxRepositories"]["Resource"]]
    assert repos == [
        "arn:aws:s3:::al2023-repos-us-east-1-de612dc2/*",
        "arn:aws:s3:::amazonlinux-2-repos-us-east-1/*",
    ]
    assert by_sid["AmazonLinuxRepositories"]["Action"] == "s3:GetObject"
    assert "Condition" not in by_sid["AmazonLinuxRepositories"]


def test_nothing_connects_to_the_reconciler(network: dict[str, Any]) -> None:
    reconciler = network["Resources"]["ReconcilerSecurityGroup"]["Properties"]
    assert "SecurityGroupIngress" not in reconciler
    ingress = resources_of_type(network, "AWS::EC2::SecurityGroupIngress").values()
    assert not [rule for rule in ingress if rule["Properties"]["GroupId"] == {"Ref": "ReconcilerSecurityGroup"}]
    # Replicas accept connections from the reconciler's group only.
    to_replicas = [r["Properties"] for r in ingress if r["Properties"]["GroupId"] == {"Ref": "ReplicaSecurityGroup"}]
    assert to_replicas and all(
        r.get("SourceSecurityGroupId") == {"Ref": "ReconcilerSecurityGroup"} for r in to_replicas
    )


def test_ci_role_policy_passes_parliament(ci: dict[str, Any]) -> None:
    import json

    import parliament

    (policy,) = ci["Resources"]["CiRole"]["Properties"]["Policies"]
    document = json.loads(
        json.dumps(policy["PolicyDocument"]).replace(
            json.dumps({"Ref": "ApiExecuteArn"}),
            json.dumps("arn:aws:execute-api:us-east-1:123456789012:abcde12345/api/*/v1/*"),
        )
    )
    assert "Ref" not in json.dumps(document)
    assert parliament.analyze_policy_string(json.dumps(document)).findings == []
