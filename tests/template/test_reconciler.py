"""The reconciler's deployment: its EC2 permissions (enforced by the managed tag), its role passing,
its schedule and kick, and its VPC, as CloudFormation receives them.

Invariant 7 (docs/architecture/invariants.md): the control plane only touches instances carrying its
managed tag, and its IAM policy enforces that. These tests read the translated template, so a policy that says the right
thing in SAM shorthand but not in CloudFormation fails too.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.cfn import (
    ACCOUNT,
    REGION,
    Resolver,
    as_list,
    condition_keys,
    function_role,
    refers_to,
    resources_of_type,
    role_statements,
    statements_granting,
    translate,
)

MANAGED_TAG = "fleetkeeper:managed"
RESOURCE_TAG = f"aws:ResourceTag/{MANAGED_TAG}"
REQUEST_TAG = f"aws:RequestTag/{MANAGED_TAG}"
# The stack's id as template.yaml derives it from the (test) AWS::StackId: its UUID's last group.
STACK_KEY = "0123456789ab"
STACK_REQUEST_TAG = "aws:RequestTag/fleetkeeper:stack"
STACK_RESOURCE_TAG = "aws:ResourceTag/fleetkeeper:stack"
# What Lambda itself does with the function's role to attach it to its VPC (hyperplane ENIs);
# these touch network interfaces, never instances.
LAMBDA_VPC_ACTIONS = {
    "ec2:createnetworkinterface",
    "ec2:deletenetworkinterface",
    "ec2:assignprivateipaddresses",
    "ec2:unassignprivateipaddresses",
}


@pytest.fixture(scope="module")
def statements(translated: dict[str, Any]) -> list[dict[str, Any]]:
    return role_statements(translated, function_role(translated, "ReconcilerFunction"))


def resources(translated: dict[str, Any], statement: dict[str, Any]) -> list[str]:
    return [str(r) for r in as_list(Resolver(translated).resolve(statement["Resource"]))]


def test_launches_must_carry_the_managed_tag(translated: dict[str, Any], statements: list[dict[str, Any]]) -> None:
    """RunInstances also authorizes the image, subnet, security group... which carry no request tag;
    the statements that cover the instance itself, and its volumes, must demand the tag."""
    granting = statements_granting(statements, "ec2:RunInstances")
    assert granting, "the reconciler cannot launch instances"
    on_instances = [s for s in granting if any(r == "*" or ":instance/" in r for r in resources(translated, s))]
    assert on_instances, "no RunInstances statement covers instance resources"
    for statement in on_instances:
        condition = Resolver(translated).resolve(statement["Condition"])
        assert condition == {"StringEquals": {REQUEST_TAG: "true", STACK_REQUEST_TAG: STACK_KEY}}, statement
        assert any(":volume/" in r for r in resources(translated, statement)), "volumes launch untagged"


def test_instances_are_tagged_only_at_launch(translated: dict[str, Any], statements: list[dict[str, Any]]) -> None:
    """The role's own policy: CreateTags only as part of a RunInstances that carries the tags (the
    adoption of untagged replicas is a policy of its own: tests/stacks/test_isolation_iam.py)."""
    granting = statements_granting(statements, "ec2:CreateTags")
    assert granting, "instances could not be tagged at launch"
    for statement in granting:
        assert Resolver(translated).resolve(statement["Condition"]) == {
            "StringEquals": {"ec2:CreateAction": "RunInstances", REQUEST_TAG: "true", STACK_REQUEST_TAG: STACK_KEY}
        }, statement


def test_only_managed_instances_can_be_terminated(translated: dict[str, Any], statements: list[dict[str, Any]]) -> None:
    granting = statements_granting(statements, "ec2:TerminateInstances")
    assert granting, "the reconciler cannot terminate instances"
    for statement in granting:
        assert Resolver(translated).resolve(statement["Condition"]) == {
            "StringEquals": {RESOURCE_TAG: "true", STACK_RESOURCE_TAG: STACK_KEY}
        }, statement


def test_no_other_instance_mutation_without_the_tag(statements: list[dict[str, Any]]) -> None:
    """Any EC2 action that is not a read must be tag-conditioned (ResourceTag or RequestTag)."""
    for statement in statements:
        for action in as_list(statement.get("Action", [])):
            name = str(action).lower()
            if not name.startswith("ec2:") or name.startswith(("ec2:describe", "ec2:get")):
                continue
            if name == "ec2:runinstances" or name in LAMBDA_VPC_ACTIONS:
                continue  # RunInstances is checked by resource type above
            keys = condition_keys(statement)
            assert {RESOURCE_TAG.lower(), REQUEST_TAG.lower()} & set(keys), f"{action} without the managed tag"


def test_only_describe_calls_get_every_resource(statements: list[dict[str, Any]]) -> None:
    for statement in statements:
        if "*" in as_list(statement["Resource"]):
            assert all(str(a).startswith("ec2:Describe") for a in as_list(statement["Action"])), statement


def test_pass_role_only_for_the_replicas_role_and_only_to_ec2(
    translated: dict[str, Any], statements: list[dict[str, Any]]
) -> None:
    granting = statements_granting(statements, "iam:PassRole")
    assert granting, "the reconciler cannot pass the replicas' role (instances would launch without it)"
    for statement in granting:
        # The role comes from the deployment (the ReplicaRoleArn parameter), not a name the template guesses.
        assert statement["Resource"] == {"Ref": "ReplicaRoleArn"}, statement
        assert "ReplicaRoleArn" in translated["Parameters"]
        for arn in resources(translated, statement):
            assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@/-]+", arn), f"not a role ARN: {arn}"
        assert statement["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}


def test_the_reconciler_may_create_the_spot_service_linked_role_and_no_other_role(
    translated: dict[str, Any], statements: list[dict[str, Any]]
) -> None:
    """An account's first spot launch makes EC2 create AWSServiceRoleForEC2Spot with the caller's
    permissions: without the grant it is refused (AuthFailure.ServiceLinkedRoleCreationNotPermitted).
    The grant names that role and that service only."""
    [statement] = statements_granting(statements, "iam:CreateServiceLinkedRole")
    assert resources(translated, statement) == [
        "arn:aws:iam::123456789012:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"
    ]
    assert statement["Condition"] == {"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}}
    others = [s for s in statements if any(str(a).startswith("iam:Create") for a in as_list(s["Action"]))]
    assert others == [statement]


def schedule_of(translated: dict[str, Any]) -> tuple[str, Any]:
    rules = resources_of_type(translated, "AWS::Events::Rule")
    schedules = resources_of_type(translated, "AWS::Scheduler::Schedule")
    found = [
        (lid, body["Properties"]["ScheduleExpression"])
        for lid, body in {**rules, **schedules}.items()
        if "ScheduleExpression" in body["Properties"]
        and any(
            refers_to(target.get("Arn"), "DispatcherFunction")
            for target in as_list(body["Properties"].get("Targets", body["Properties"].get("Target", [])))
        )
    ]
    assert len(found) == 1, f"expected one schedule targeting the dispatcher, got {found}"
    return found[0]


def test_schedule_runs_at_the_parameters_rate(translated: dict[str, Any]) -> None:
    _, expression = schedule_of(translated)
    resolved = Resolver(translated).resolve(expression)
    assert re.fullmatch(r"rate\(\d+ minutes?\)", str(resolved)), resolved
    # Change every parameter that could hold the rate: the schedule must follow.
    rate_params = [name for name, value in translated["__parameter_values__"].items() if str(value) == str(resolved)]
    assert rate_params, f"{resolved} comes from no parameter"
    retranslated = translate(overrides=dict.fromkeys(rate_params, "rate(7 minutes)"))
    _, new_expression = schedule_of(retranslated)
    assert Resolver(retranslated).resolve(new_expression) == "rate(7 minutes)"


def test_default_rate_is_one_minute(translated: dict[str, Any]) -> None:
    _, expression = schedule_of(translated)
    assert Resolver(translated).resolve(expression) == "rate(1 minute)"


def test_the_api_kicks_the_reconciler_through_the_kick_queue(translated: dict[str, Any]) -> None:
    """After each write the api sends a kick to the kick queue (the api role may send to nothing
    else: tests/template/test_iam.py), and the queue's event source runs the reconciler worker."""
    api = translated["Resources"]["ApiFunction"]["Properties"]
    assert refers_to(api["Environment"]["Variables"]["FLEETKEEPER_KICK_QUEUE_URL"], "KickQueue")
    sends = statements_granting(
        role_statements(translated, function_role(translated, "ApiFunction")), "sqs:SendMessage"
    )
    assert [r for s in sends for r in as_list(s["Resource"])] == [{"Fn::GetAtt": ["KickQueue", "Arn"]}], sends


def test_reconciler_runs_in_the_deployments_vpc(translated: dict[str, Any]) -> None:
    """Its readiness probes reach replicas' private addresses (.checkov.yaml relies on this test)."""
    vpc = translated["Resources"]["ReconcilerFunction"]["Properties"].get("VpcConfig")
    assert vpc, "the reconciler is not in a VPC: it cannot probe replicas"
    parameters = translated.get("Parameters", {})
    for key in ("SubnetIds", "SecurityGroupIds"):
        assert any(vpc[key] == {"Ref": name} for name in parameters), f"{key} is not a parameter: {vpc[key]!r}"


def test_lambda_may_attach_the_reconciler_to_its_vpc_with_its_role_as_lambdas_guide_lists(
    translated: dict[str, Any], statements: list[dict[str, Any]]
) -> None:
    """Lambda creates and manages the function's network interfaces with the function's role, at
    create and update time: the guide's actions (Configuring a Lambda function to access resources in
    a VPC; the AWSLambdaVPCAccessExecutionRole policy), on the resources EC2 authorizes them against.
    A subnet of a shared VPC belongs to the VPC owner's account: it must be allowed too, or a stack
    in a participant account could not attach its function."""
    from tests.support.iam_evaluator import Decision, Request, evaluate

    role = f"arn:aws:iam::{ACCOUNT}:role/reconciler"
    owner = "210987654321"  # a shared VPC's owner
    arn = f"arn:aws:ec2:{REGION}"
    touched = {
        "ec2:CreateNetworkInterface": [
            f"{arn}:{ACCOUNT}:network-interface/*",
            f"{arn}:{ACCOUNT}:subnet/subnet-0aaaaaaaaaaaaaaa1",
            f"{arn}:{owner}:subnet/subnet-0bbbbbbbbbbbbbbb2",
            f"{arn}:{ACCOUNT}:security-group/sg-0123456789abcdef0",
        ],
        "ec2:DeleteNetworkInterface": [f"{arn}:{ACCOUNT}:network-interface/eni-0123456789abcdef0"],
        "ec2:AssignPrivateIpAddresses": [f"{arn}:{ACCOUNT}:network-interface/eni-0123456789abcdef0"],
        "ec2:UnassignPrivateIpAddresses": [f"{arn}:{ACCOUNT}:network-interface/eni-0123456789abcdef0"],
        "ec2:DescribeNetworkInterfaces": ["*"],
        "ec2:DescribeSubnets": ["*"],
    }
    policies = [Resolver(translated).resolve({"Statement": statements})]
    for action, arns in touched.items():
        for resource in arns:
            decision = evaluate(Request(role, action, resource), policies)
            assert decision is Decision.ALLOW, (action, resource)
    # Another Region's interfaces stay out of reach.
    elsewhere = f"arn:aws:ec2:eu-west-1:{ACCOUNT}:network-interface/eni-0123456789abcdef0"
    assert evaluate(Request(role, "ec2:DeleteNetworkInterface", elsewhere), policies) is not Decision.ALLOW


EBS_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def test_a_customer_managed_ebs_key_is_usable_by_the_launching_role_through_ec2_only(
    translated: dict[str, Any],
) -> None:
    """EBS encryption under a customer managed key: RunInstances has EC2 call KMS with the launching
    role (Requirements for Amazon EBS encryption, "Permissions for users"). Without the grant the
    instance goes pending -> terminated (Client.InternalError); with EbsKmsKeyArn the role may, on
    that key only, through EC2 only, and create grants only for AWS resources."""
    from tests.support.iam_evaluator import Decision, Request, evaluate

    role = f"arn:aws:iam::{ACCOUNT}:role/reconciler"
    via_ec2 = {"kms:ViaService": f"ec2.{REGION}.amazonaws.com"}
    needed = [
        ("kms:CreateGrant", {**via_ec2, "kms:GrantIsForAWSResource": "true"}),
        ("kms:Decrypt", via_ec2),
        ("kms:DescribeKey", via_ec2),
        ("kms:GenerateDataKeyWithoutPlaintext", via_ec2),
        ("kms:ReEncryptFrom", via_ec2),
        ("kms:ReEncryptTo", via_ec2),
    ]

    def policies(template: dict[str, Any]) -> list[dict[str, Any]]:
        """The reconciler role's inline policies and the stack's RolePolicy resources on it."""
        from tests.template.test_endpoints import deployed

        resolver = Resolver(template)
        role_id = function_role(template, "ReconcilerFunction")
        found = [resolver.resolve({"Statement": role_statements(template, role_id)})]
        for body in deployed(template).values():
            if body["Type"] == "AWS::IAM::RolePolicy" and body["Properties"]["RoleName"] == {"Ref": role_id}:
                found.append(resolver.resolve(body["Properties"]["PolicyDocument"]))
        return found

    without = policies(translated)
    assert all(evaluate(Request(role, a, EBS_KEY, c), without) is not Decision.ALLOW for a, c in needed)

    keyed = translate(overrides={"EbsKmsKeyArn": EBS_KEY})
    granted = policies(keyed)
    for action, context in needed:
        assert evaluate(Request(role, action, EBS_KEY, context), granted) is Decision.ALLOW, action
    other_key = EBS_KEY.replace("1234abcd", "99999999")
    assert evaluate(Request(role, "kms:Decrypt", other_key, via_ec2), granted) is not Decision.ALLOW
    # Not from the reconciler's own code (no ViaService), nor a grant for a principal of its choosing.
    assert evaluate(Request(role, "kms:Decrypt", EBS_KEY), granted) is not Decision.ALLOW
    grant_for_anyone = {**via_ec2, "kms:GrantIsForAWSResource": "false"}
    assert evaluate(Request(role, "kms:CreateGrant", EBS_KEY, grant_for_anyone), granted) is not Decision.ALLOW
    parameter = keyed["Parameters"]["EbsKmsKeyArn"]
    assert re.fullmatch(parameter["AllowedPattern"], EBS_KEY) and re.fullmatch(parameter["AllowedPattern"], "")
    assert not re.fullmatch(parameter["AllowedPattern"], "alias/aws/ebs")


def test_images_are_resolved_by_ec2_with_exactly_the_parameters_specs_may_name(
    translated: dict[str, Any], statements: list[dict[str, Any]]
) -> None:
    """The reconciler makes no SSM call: RunInstances' `resolve:ssm:` needs ssm:GetParameters on
    the parameter, for the stack's default image and AWS's public ones (what spec/service.py accepts)."""
    from fleetkeeper.spec.service import PUBLIC_PARAMETERS

    # GetParameter only for the secrets a readiness probe names (fleetkeeper.replicas.secrets's path).
    reading = statements_granting(statements, "ssm:GetParameter")
    table = Resolver(translated).physical_id("Table")
    assert [resources(translated, s) for s in reading] == [
        [f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/fleetkeeper/{table}/*"]
    ]
    granting = statements_granting(statements, "ssm:GetParameters")
    assert len(granting) == 1
    arns = resources(translated, granting[0])
    assert len(arns) == 2
    assert any(arn.endswith(f":parameter{PUBLIC_PARAMETERS}*") for arn in arns), arns
    assert all(":ssm:" in arn for arn in arns)


def test_the_deep_learning_amis_are_resolvable_and_launchable_with_the_reconcilers_role(
    translated: dict[str, Any], statements: list[dict[str, Any]]
) -> None:
    """A GPU or Neuron type without image_id launches `resolve:ssm:<DLAMI parameter>`
    (fleetkeeper.spec.images): EC2 resolves it on the reconciler's ssm:GetParameters for that parameter's
    ARN (AWS's public parameters carry no account id), and RunInstances must be allowed on the
    Amazon-owned image it names. Nothing broader than the statements that already exist."""
    from fnmatch import fnmatchcase

    from fleetkeeper.settings import DEFAULT_IMAGE_PARAMETER
    from fleetkeeper.spec.images import GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER, for_architecture

    [granting] = statements_granting(statements, "ssm:GetParameters")
    assert granting["Effect"] == "Allow" and "Condition" not in granting
    patterns = resources(translated, granting)
    # Every parameter the code resolves without image_id: the DLAMIs, and the default Ubuntu with the
    # arm64 build a Graviton type boots (public too: the stack's own DefaultImageParameter grant would
    # not cover it).
    default = translated["Parameters"]["DefaultImageParameter"]["Default"]
    assert default == DEFAULT_IMAGE_PARAMETER
    arm64 = for_architecture(default, "m7g.large")
    assert arm64 != default
    for parameter in (GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER, default, arm64):
        arn = f"arn:aws:ssm:{REGION}::parameter{parameter}"
        assert any(fnmatchcase(arn, pattern) for pattern in patterns), (arn, patterns)
        # ...and only as a public parameter of the stack's region, never another account's or region's.
        assert not any(fnmatchcase(f"arn:aws:ssm:{REGION}:999999999999:parameter{parameter}", p) for p in patterns)
        assert not any(fnmatchcase(f"arn:aws:ssm:eu-west-1::parameter{parameter}", p) for p in patterns)
    image = f"arn:aws:ec2:{REGION}::image/ami-0123456789abcdef0"
    launching = [s for s in statements_granting(statements, "ec2:RunInstances") if "Condition" not in s]
    assert any(fnmatchcase(image, pattern) for s in launching for pattern in resources(translated, s))
