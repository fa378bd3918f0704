"""The deploy-time zone check (fleetkeeper/deploy/zone_check.py): the custom resource that fails a deployment
whose LoadBalancerSubnetIds leave out a zone of ReplicaSubnetIds.

The template's side as CloudFormation receives it (present only with subnets of the load balancer's
own, its least-privilege role), and the function itself against EC2 on the strict layer, answering
CloudFormation's presigned URL: a real HTTP server on 127.0.0.1 that records the PUT.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.deploy import cfn_response, zone_check
from fleetkeeper.reconciler.balancer import served_subnets
from tests.support.cfn import Resolver, translate
from tests.support.iam_evaluator import Decision, Request, evaluate
from tests.support.reconciler_world import raw_client
from tests.template.test_endpoints import deployed, props

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.strict_aws import StrictAws

CHECK = (
    "LoadBalancerZoneCheck",
    "LoadBalancerZoneCheckFunction",
    "LoadBalancerZoneCheckRole",
    "LoadBalancerZoneCheckLogGroup",
)
ALB_SUBNETS = "subnet-0ccccccccccccccc3,subnet-0ddddddddddddddd4"


@pytest.fixture(scope="module")
def with_balancer_subnets() -> dict[str, Any]:
    return translate(overrides={"LoadBalancerSubnetIds": ALB_SUBNETS})


# --- the template ---------------------------------------------------------------------------


def test_the_check_exists_only_when_the_load_balancer_has_subnets_of_its_own(
    translated: dict[str, Any], with_balancer_subnets: dict[str, Any]
) -> None:
    # Without LoadBalancerSubnetIds the ALB is on the replicas' subnets: covered by construction.
    assert not set(CHECK) & set(deployed(translated))
    assert set(CHECK) <= set(deployed(with_balancer_subnets))
    no_balancer = translate(overrides={"LoadBalancer": "none", "LoadBalancerSubnetIds": ALB_SUBNETS})
    assert not set(CHECK) & set(deployed(no_balancer))


def test_the_check_is_given_both_lists_and_answers_within_two_minutes(with_balancer_subnets: dict[str, Any]) -> None:
    check = props(with_balancer_subnets, "LoadBalancerZoneCheck")
    assert with_balancer_subnets["Resources"]["LoadBalancerZoneCheck"]["Type"] == "AWS::CloudFormation::CustomResource"
    assert check["ServiceToken"] == Resolver(with_balancer_subnets).get_att("LoadBalancerZoneCheckFunction", "Arn")
    assert check["ServiceTimeout"] == 120
    # (the test resolver renders a list parameter's Ref as its comma-joined text; CloudFormation
    # passes a list of strings: the function reads both, zone_check._subnet_list)
    assert zone_check._subnet_list(check, "LoadBalancerSubnetIds") == ALB_SUBNETS.split(",")
    assert zone_check._subnet_list(check, "ReplicaSubnetIds") == [
        "subnet-0aaaaaaaaaaaaaaa1",
        "subnet-0bbbbbbbbbbbbbbb2",
    ]
    function = props(with_balancer_subnets, "LoadBalancerZoneCheckFunction")
    assert function["Handler"] == "fleetkeeper.deploy.zone_check.lambda_handler"
    assert "VpcConfig" not in function  # the response URL is S3's, on the internet
    # Its retries while the new role propagates, and the response's PUT, end before the function's
    # timeout (a margin for the calls themselves), which ends before CloudFormation's.
    retrying = sum(zone_check.PROPAGATION_DELAYS) + zone_check.RESPONSE_TIMEOUT_SECONDS
    assert retrying + 15 <= function["Timeout"] < check["ServiceTimeout"]


def test_the_checks_role_reads_subnets_and_writes_its_own_logs_only(with_balancer_subnets: dict[str, Any]) -> None:
    resolver = Resolver(with_balancer_subnets)
    role = with_balancer_subnets["Resources"]["LoadBalancerZoneCheckRole"]["Properties"]
    policies = [resolver.resolve(p["PolicyDocument"]) for p in role["Policies"]]
    log_group = resolver.get_att("LoadBalancerZoneCheckLogGroup", "Arn")

    principal = resolver.get_att("LoadBalancerZoneCheckRole", "Arn")

    def decide(action: str, resource: str) -> Decision:
        return evaluate(Request(principal, action, resource), policies)

    assert decide("ec2:DescribeSubnets", "*") is Decision.ALLOW
    assert decide("logs:PutLogEvents", log_group) is Decision.ALLOW
    for action, resource in [
        ("ec2:DescribeInstances", "*"),
        ("ec2:RunInstances", "*"),
        ("ec2:ModifySubnetAttribute", "arn:aws:ec2:us-east-1:123456789012:subnet/subnet-0aaaaaaaaaaaaaaa1"),
        ("logs:PutLogEvents", "arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/other:*"),
        ("dynamodb:GetItem", "*"),
    ]:
        assert decide(action, resource) is not Decision.ALLOW, action


# --- the pure verdict ---------------------------------------------------------------------------

ZONES = {
    "subnet-a": "us-east-1a",
    "subnet-b": "us-east-1b",
    "subnet-c": "us-east-1c",
    "subnet-pa": "us-east-1a",
    "subnet-pb": "us-east-1b",
}


@pytest.mark.parametrize(
    ("replicas", "balancer", "expected"),
    [
        # the usual layout: public ALB subnets, private replica subnets, the same zones
        (["subnet-a", "subnet-b"], ["subnet-pa", "subnet-pb"], None),
        (["subnet-a"], ["subnet-pa", "subnet-pb"], None),
        (["subnet-a", "subnet-c"], ["subnet-pa", "subnet-pb"], "ReplicaSubnetIds subnet-c are in us-east-1c"),
        (["subnet-c"], ["subnet-pa"], "Add a subnet of us-east-1c to LoadBalancerSubnetIds"),
        (["subnet-a", "subnet-x"], ["subnet-pa"], "EC2 does not know subnet(s) subnet-x"),
        (["subnet-a"], ["subnet-y"], "EC2 does not know subnet(s) subnet-y"),
    ],
)
def test_coverage_problem(replicas: list[str], balancer: list[str], expected: str | None) -> None:
    problem = zone_check.coverage_problem(replicas, balancer, ZONES)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem


def test_the_reason_names_the_subnets_their_zones_and_the_zone_to_add() -> None:
    assert zone_check.coverage_problem(["subnet-a", "subnet-c"], ["subnet-pa", "subnet-pb"], ZONES) == (
        "ReplicaSubnetIds subnet-c are in us-east-1c, where LoadBalancerSubnetIds (subnet-pa, subnet-pb: "
        "us-east-1a, us-east-1b) has no subnet: the load balancer would send replicas there no request "
        "(Target.NotInUse). Add a subnet of us-east-1c to LoadBalancerSubnetIds, or leave those zones out of "
        "ReplicaSubnetIds"
    )


def test_served_subnets_keeps_the_replica_order() -> None:
    assert served_subnets(["subnet-c", "subnet-b", "subnet-a"], ["subnet-pa", "subnet-pb"], ZONES) == [
        "subnet-b",
        "subnet-a",
    ]


# --- the function, against EC2 on the strict layer, answering a real URL ------------------------


class _CloudFormation:
    """The presigned response URL: records each PUT's headers and JSON body."""

    def __init__(self) -> None:
        self.responses: list[dict[str, Any]] = []
        self.content_types: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                length = int(self.headers["Content-Length"])
                outer.content_types.append(self.headers.get("Content-Type"))
                outer.responses.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/response?X-Amz-Signature=x"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def cloudformation(monkeypatch: pytest.MonkeyPatch) -> Iterator[_CloudFormation]:
    endpoint = _CloudFormation()
    # The local endpoint stands for CloudFormation's S3 URL: it alone is let through besides S3's.
    real = cfn_response.response_url_problem
    monkeypatch.setattr(cfn_response, "response_url_problem", lambda url: None if url == endpoint.url else real(url))
    yield endpoint
    endpoint.server.shutdown()
    endpoint.server.server_close()


@pytest.fixture
def subnets(aws: None, strict_aws: StrictAws) -> dict[str, str]:
    ec2 = raw_client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    made = {}
    for name, cidr, zone in [
        ("a", "10.7.1.0/24", "us-east-1a"),
        ("b", "10.7.2.0/24", "us-east-1b"),
        ("c", "10.7.3.0/24", "us-east-1c"),
        ("pa", "10.7.11.0/24", "us-east-1a"),
        ("pb", "10.7.12.0/24", "us-east-1b"),
    ]:
        made[name] = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
    return made


def _event(url: str, request_type: str, replicas: list[str], balancer: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "RequestType": request_type,
        "ResponseURL": url,
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/fk-test/1a2b",
        "RequestId": "req-1",
        "LogicalResourceId": "LoadBalancerZoneCheck",
        "ResourceType": "AWS::CloudFormation::CustomResource",
        # CloudFormation passes a List<...> parameter's value as a list of strings.
        "ResourceProperties": {
            "ServiceToken": "arn:fn",
            "ReplicaSubnetIds": replicas,
            "LoadBalancerSubnetIds": balancer,
        },
        **extra,
    }


def test_a_covering_load_balancer_succeeds(subnets: dict[str, str], cloudformation: _CloudFormation) -> None:
    event = _event(cloudformation.url, "Create", [subnets["a"], subnets["b"]], [subnets["pa"], subnets["pb"]])
    zone_check.lambda_handler(event, None)
    (response,) = cloudformation.responses
    assert response["Status"] == "SUCCESS"
    assert response["PhysicalResourceId"] == zone_check.PHYSICAL_ID
    assert (response["StackId"], response["RequestId"], response["LogicalResourceId"]) == (
        event["StackId"],
        "req-1",
        "LoadBalancerZoneCheck",
    )
    assert cloudformation.content_types == [""]  # the presigned URL is signed without one


def test_an_uncovered_zone_fails_the_deployment_and_names_it(
    subnets: dict[str, str], cloudformation: _CloudFormation
) -> None:
    event = _event(cloudformation.url, "Create", [subnets["a"], subnets["c"]], [subnets["pa"], subnets["pb"]])
    zone_check.lambda_handler(event, None)
    (response,) = cloudformation.responses
    assert response["Status"] == "FAILED"
    assert f"ReplicaSubnetIds {subnets['c']} are in us-east-1c" in response["Reason"]
    assert "us-east-1a, us-east-1b" in response["Reason"]


def test_an_update_that_uncovers_a_zone_fails_and_keeps_the_physical_id(
    subnets: dict[str, str], cloudformation: _CloudFormation
) -> None:
    event = _event(
        cloudformation.url,
        "Update",
        [subnets["a"], subnets["b"]],
        [subnets["pa"]],
        PhysicalResourceId=zone_check.PHYSICAL_ID,
    )
    zone_check.lambda_handler(event, None)
    (response,) = cloudformation.responses
    assert response["Status"] == "FAILED" and "us-east-1b" in response["Reason"]
    assert response["PhysicalResourceId"] == zone_check.PHYSICAL_ID


def test_a_subnet_ec2_does_not_know_is_answered_failed_not_left_hanging(
    subnets: dict[str, str], cloudformation: _CloudFormation
) -> None:
    event = _event(cloudformation.url, "Create", [subnets["a"], "subnet-0123456789abcdef0"], [subnets["pa"]])
    zone_check.lambda_handler(event, None)
    (response,) = cloudformation.responses
    assert response["Status"] == "FAILED"
    assert "InvalidSubnetID.NotFound" in response["Reason"]


class _Propagating:
    """EC2 as a role seconds old sees it: DescribeSubnets refused `refusals` times, then answered."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0
        self.real = raw_client("ec2")

    def describe_subnets(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        self.calls += 1
        if self.calls <= self.refusals:
            error = {"Code": "UnauthorizedOperation", "Message": "You are not authorized to perform this operation."}
            raise ClientError({"Error": error}, "DescribeSubnets")
        return self.real.describe_subnets(**kwargs)


def test_a_role_still_propagating_is_retried_not_answered_failed(
    subnets: dict[str, str], cloudformation: _CloudFormation, monkeypatch: pytest.MonkeyPatch
) -> None:
    ec2 = _Propagating(refusals=3)
    slept: list[float] = []
    monkeypatch.setattr(zone_check.aws, "ec2", lambda: ec2)
    monkeypatch.setattr(zone_check.time, "sleep", slept.append)
    event = _event(cloudformation.url, "Create", [subnets["a"], subnets["b"]], [subnets["pa"], subnets["pb"]])
    zone_check.lambda_handler(event, None)
    (response,) = cloudformation.responses
    assert response["Status"] == "SUCCESS"
    assert ec2.calls == 4
    assert slept == list(zone_check.PROPAGATION_DELAYS[:3])


def test_a_denial_that_outlasts_the_retries_is_answered_failed_with_ec2s_code(
    subnets: dict[str, str], cloudformation: _CloudFormation, monkeypatch: pytest.MonkeyPatch
) -> None:
    ec2 = _Propagating(refusals=100)
    slept: list[float] = []
    monkeypatch.setattr(zone_check.aws, "ec2", lambda: ec2)
    monkeypatch.setattr(zone_check.time, "sleep", slept.append)
    event = _event(cloudformation.url, "Create", [subnets["a"]], [subnets["pa"]])
    zone_check.lambda_handler(event, None)
    (response,) = cloudformation.responses
    assert response["Status"] == "FAILED"
    assert "UnauthorizedOperation" in response["Reason"]
    # Bounded: one attempt per delay and a last one, then the answer.
    assert ec2.calls == len(zone_check.PROPAGATION_DELAYS) + 1
    assert slept == list(zone_check.PROPAGATION_DELAYS)


def test_delete_always_succeeds_and_asks_ec2_nothing(
    cloudformation: _CloudFormation, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_ec2() -> None:
        raise AssertionError("a Delete must not call EC2")

    monkeypatch.setattr(zone_check.aws, "ec2", no_ec2)
    event = _event(
        cloudformation.url, "Delete", ["subnet-gone"], ["subnet-gone-too"], PhysicalResourceId=zone_check.PHYSICAL_ID
    )
    zone_check.lambda_handler(event, None)
    (response,) = cloudformation.responses
    assert response["Status"] == "SUCCESS"


@pytest.mark.parametrize(
    "url",
    [
        "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/arn%3Aaws%3Acloudformation?X-Amz-Signature=x",
        "https://cloudformation-custom-resource-response-uswest2.s3-us-west-2.amazonaws.com/x?X-Amz-Signature=x",
        "https://cloudformation-custom-resource-response-euwest1.s3.eu-west-1.amazonaws.com/x",
        "https://s3.cn-north-1.amazonaws.com.cn/cloudformation-custom-resource-response-cnnorth1/x",
    ],
)
def test_cloudformations_s3_response_urls_are_answered(url: str) -> None:
    assert cfn_response.response_url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/x", "not HTTPS"),
        ("https://169.254.169.254/latest/meta-data/", "not Amazon S3's"),
        ("https://internal.example.com/hook", "not Amazon S3's"),
        ("https://s3.amazonaws.com.evil.example/x", "not Amazon S3's"),
        ("https://bucket.s3.amazonaws.com:8443/x", "port"),
        ("https://user:pw@bucket.s3.amazonaws.com/x", "credentials"),
    ],
)
def test_any_other_response_url_is_not_put_to(
    url: str, problem: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever may invoke the function hands it the URL: it PUTs only to S3, never anywhere else."""
    assert problem in (cfn_response.response_url_problem(url) or "")
    opened: list[object] = []
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: opened.append(a))
    zone_check.respond({"ResponseURL": url}, None)
    assert opened == []
    assert "not CloudFormation's" in caplog.text
