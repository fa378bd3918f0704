"""The strict layer refuses what a service model forbids and botocore lets through (maximum lengths,
patterns, enums, ranges, list sizes), as AWS's own validation does, for any service and operation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import botocore.session
import pytest
from botocore.exceptions import ClientError

from tests.strict_aws import model_validation
from tests.support.reconciler_world import raw_client

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws


def _input(service: str, operation: str) -> Any:
    return botocore.session.get_session().get_service_model(service).operation_model(operation).input_shape


@pytest.mark.parametrize(
    ("service", "operation", "params", "expected"),
    [
        # ELB's HealthCheckPath: 1 to 1,024 characters (a readiness probe's path may be 2,048).
        (
            "elbv2",
            "CreateTargetGroup",
            {"Name": "fk", "HealthCheckPath": "/" + "a" * 1024},
            ("healthCheckPath", "Member must have length less than or equal to 1024"),
        ),
        (
            "elbv2",
            "CreateTargetGroup",
            {"Name": "fk", "HealthCheckTimeoutSeconds": 121},
            ("healthCheckTimeoutSeconds", "Member must have value less than or equal to 120"),
        ),
        (
            "elbv2",
            "CreateTargetGroup",
            {"Name": "fk", "Protocol": "GOPHER"},
            (
                "protocol",
                "Member must satisfy enum value set: [HTTP, HTTPS, TCP, TLS, UDP, TCP_UDP, GENEVE, QUIC, TCP_QUIC]",
            ),
        ),
        # A list's maximum size, and where in the list the bad member is.
        (
            "elbv2",
            "AddTags",
            {"ResourceArns": ["a"], "Tags": [{"Key": "k", "Value": "v" * 257}]},
            ("tags.1.member.value", "Member must have length less than or equal to 256"),
        ),
        (
            "dynamodb",
            "Query",
            {"TableName": "t" * 1025},
            ("tableName", "Member must have length less than or equal to 1024"),
        ),
        # A Java pattern with \p{} classes (CloudWatch Logs' stream names refuse ':' and '*').
        (
            "logs",
            "CreateLogStream",
            {"logGroupName": "g", "logStreamName": "web:1"},
            ("logStreamName", "Member must satisfy regular expression pattern: [^:*]*"),
        ),
    ],
)
def test_the_first_violation_names_the_member_and_the_constraint(
    service: str, operation: str, params: dict[str, Any], expected: tuple[str, str]
) -> None:
    found = model_validation.first_violation(_input(service, operation), params)
    assert found is not None
    assert (found[0], found[2]) == expected


def test_what_the_models_allow_passes() -> None:
    params = {"Name": "fk-abc", "Protocol": "HTTP", "Port": 8080, "HealthCheckPath": "/health", "VpcId": "vpc-1"}
    assert model_validation.first_violation(_input("elbv2", "CreateTargetGroup"), params) is None
    # EC2 takes instance types newer than a botocore release's enum: its enums are not held.
    run = {"ImageId": "ami-1", "MinCount": 1, "MaxCount": 1, "InstanceType": "x99.huge"}
    found = model_validation.first_violation(_input("ec2", "RunInstances"), run, check_enums=False)
    assert found is None


def test_a_request_breaking_its_model_is_refused_as_aws_refuses_it_and_never_reaches_moto(
    strict_aws: StrictAws,
) -> None:
    elbv2 = raw_client("elbv2")
    vpc = raw_client("ec2").describe_vpcs()["Vpcs"][0]["VpcId"]
    with pytest.raises(ClientError) as caught:
        elbv2.create_target_group(Name="fk-long", Protocol="HTTP", Port=80, VpcId=vpc, HealthCheckPath="/" + "p" * 1100)
    error = caught.value.response["Error"]
    assert error["Code"] == "ValidationError"
    assert (
        "at 'healthCheckPath' failed to satisfy constraint: Member must have length less than or equal to 1024"
        in (error["Message"])
    )
    assert elbv2.describe_target_groups()["TargetGroups"] == []  # nothing half-made
    assert [v.operation for v in strict_aws.violations] == ["CreateTargetGroup"]
    # The JSON services answer Coral's ValidationException.
    with pytest.raises(ClientError) as json_caught:
        raw_client("dynamodb").query(TableName="t" * 1100, KeyConditionExpression="PK = :p")
    assert json_caught.value.response["Error"]["Code"] == "ValidationException"


def test_limits_the_model_does_not_carry_are_not_invented() -> None:
    """Only the model's constraints are checked generically; a documented limit the model lacks (a
    target group's name: 32 characters) is the per-service layers' to model."""
    found = model_validation.first_violation(_input("elbv2", "CreateTargetGroup"), {"Name": "x" * 40})
    assert found is None  # the model gives Name no maximum: ELB's 32 is documented, not modelled
