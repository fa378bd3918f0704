"""The strict layer's IAM and network (tests/strict_aws/authorization.py): who is calling, what AWS
checks on its behalf, how a refusal answers, and what a function in the VPC cannot reach.

Each test drives real botocore clients (fleetkeeper's, or the tests' own) over moto.
"""

from __future__ import annotations

import contextlib
import copy
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError

from fleetkeeper import aws
from fleetkeeper.aws import CONNECT_TIMEOUT_SECONDS
from tests.strict_aws import StrictAws, callers, stack_policies
from tests.strict_aws.authorization import VPC_ENDPOINTS, endpoint_name
from tests.support import TABLE, cfn
from tests.support.handler_client import HandlerClient
from tests.support.reconciler_world import raw_client
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]


def _error(exc: ClientError) -> tuple[str, int, str]:
    error = exc.response.get("Error", {})
    return str(error.get("Code")), int(exc.response["ResponseMetadata"]["HTTPStatusCode"]), str(error.get("Message"))


def _vpc(ec2: Any) -> tuple[str, str]:
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24")["Subnet"]["SubnetId"]
    return vpc, subnet


@contextlib.contextmanager
def template_without(resource: str, action: str) -> Iterator[None]:
    """The stack's policies as if template.yaml's `resource` (a role or a role policy) did not grant
    `action` anywhere (the fault a test of the layer plants: a role one permission short)."""
    original = stack_policies._translations()

    def documents(props: dict[str, Any]) -> list[dict[str, Any]]:
        if "PolicyDocument" in props:
            return [props["PolicyDocument"]]
        return [policy["PolicyDocument"] for policy in props.get("Policies") or []]

    def pruned() -> tuple[dict[str, Any], ...]:
        result = []
        for translated in original:
            changed = copy.deepcopy(translated)
            for document in documents(changed["Resources"][resource]["Properties"]):
                for statement in cfn.as_list(document["Statement"]):
                    actions = cfn.as_list(statement["Action"])
                    statement["Action"] = [a for a in actions if a != action] or ["none:Nothing"]
            result.append(changed)
        return tuple(result)

    saved = stack_policies._translations
    stack_policies._translations = pruned  # type: ignore[assignment]
    stack_policies.for_bindings.cache_clear()
    stack_policies.function_policies.cache_clear()
    try:
        yield
    finally:
        stack_policies._translations = saved
        stack_policies.for_bindings.cache_clear()
        stack_policies.function_policies.cache_clear()


# -- who is calling --------------------------------------------------------------------------------


def test_the_caller_is_the_function_whose_handler_runs(strict_aws: StrictAws, api: HandlerClient) -> None:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert strict_aws.authorizer.decided > 0
    assert strict_aws.denials == []


def test_a_tests_own_calls_are_the_operators_and_not_judged(strict_aws: StrictAws, table: str) -> None:
    aws.dynamodb().put_item(TableName=TABLE, Item={"PK": {"S": "X"}, "SK": {"S": "Y"}})
    assert strict_aws.authorizer.decided == 0
    assert callers.calling_function() is None


def test_every_handler_of_the_template_is_known_to_the_caller_table() -> None:
    translated = cfn.translate()
    handlers = {
        lid: body["Properties"]["Handler"]
        for lid, body in cfn.resources_of_type(translated, "AWS::Lambda::Function").items()
    }
    known = {f"{module}.{function}": lid for (module, function), lid in callers.HANDLERS.items()}
    assert {handler: lid for lid, handler in handlers.items()} == known


# -- what a refusal looks like -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "code", "status"),
    [
        (
            lambda: aws.dynamodb().put_item(TableName=TABLE, Item={"PK": {"S": "X"}, "SK": {"S": "Y"}}),
            "AccessDeniedException",
            400,
        ),
        (lambda: aws.ssm().get_parameter(Name="/elsewhere/x"), "AccessDeniedException", 400),
        (lambda: aws.iam().create_role(RoleName="r", AssumeRolePolicyDocument="{}"), "AccessDenied", 403),
        (lambda: aws.s3().get_object(Bucket="b", Key="k"), "AccessDenied", 403),
        (
            lambda: aws.elbv2().create_target_group(Name="tg", Protocol="HTTP", Port=80, VpcId="vpc-1"),
            "AccessDenied",
            403,
        ),
        (
            lambda: aws.sqs().receive_message(QueueUrl="https://sqs.us-east-1.amazonaws.com/123456789012/q"),
            "AccessDenied",
            400,
        ),
    ],
    ids=["dynamodb", "ssm", "iam", "s3", "elbv2", "sqs"],
)
def test_a_denied_call_answers_in_its_services_shape(
    strict_aws: StrictAws, table: str, call: Any, code: str, status: int
) -> None:
    with strict_aws.calling_as("CleanupFunction"), pytest.raises(ClientError) as raised:
        call()
    got_code, got_status, message = _error(raised.value)
    assert got_code == code
    assert got_status == status or code == "AccessDenied"
    assert re.match(
        r"User: arn:aws:sts::123456789012:assumed-role/[^ ]+/CleanupFunction is not authorized to perform: "
        r"[a-z0-9-]+:[A-Za-z]+ on resource: \S+ (because no identity-based policy allows|with an explicit deny)",
        message,
    ), message
    assert strict_aws.denials[-1].function == "CleanupFunction"


def test_ec2_refuses_with_unauthorized_operation(strict_aws: StrictAws) -> None:
    with strict_aws.calling_as("ApiFunction"), pytest.raises(ClientError) as raised:
        aws.ec2().run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)
    code, status, message = _error(raised.value)
    assert (code, status) == ("UnauthorizedOperation", 403)
    assert message.startswith("You are not authorized to perform this operation. User: ")


# -- what AWS checks on the caller's behalf ---------------------------------------------------------


def test_creating_a_target_group_needs_the_callers_ec2_describe_rights(strict_aws: StrictAws) -> None:
    """ELB checks ec2:DescribeVpcs for the caller: a reconciler role one permission short has no endpoint."""
    vpc, _ = _vpc(aws.ec2())
    tags = [{"Key": "fleetkeeper:managed", "Value": "true"}, {"Key": "fleetkeeper:stack", "Value": "0123456789ab"}]

    def create(name: str) -> None:
        with strict_aws.calling_as("ReconcilerFunction"):
            aws.elbv2().create_target_group(
                Name=name, Protocol="HTTP", Port=8080, VpcId=vpc, TargetType="instance", Tags=tags
            )

    create("fk-0123456789ab-a")
    with template_without("ReconcilerEndpointsPolicy", "ec2:DescribeVpcs"), pytest.raises(ClientError) as raised:
        create("fk-0123456789ab-b")
    assert "ec2:DescribeVpcs" in _error(raised.value)[2]


def test_run_instances_needs_pass_role_on_the_profiles_role(strict_aws: StrictAws) -> None:
    """The launch of a replica with a profile is refused to a reconciler role without iam:PassRole."""
    iam = aws.iam()
    role = iam.create_role(RoleName="elsewhere", AssumeRolePolicyDocument="{}")["Role"]
    iam.create_instance_profile(InstanceProfileName="elsewhere")
    iam.add_role_to_instance_profile(InstanceProfileName="elsewhere", RoleName="elsewhere")
    strict_aws.iam.settle()
    _, subnet = _vpc(aws.ec2())
    tags = [{"Key": "fleetkeeper:managed", "Value": "true"}, {"Key": "fleetkeeper:stack", "Value": "0123456789ab"}]

    def launch() -> None:
        with strict_aws.calling_as("ReconcilerFunction"):
            aws.ec2().run_instances(
                ImageId="ami-12345678",
                MinCount=1,
                MaxCount=1,
                InstanceType="t3.micro",
                SubnetId=subnet,
                IamInstanceProfile={"Name": "elsewhere"},
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            )

    launch()
    with template_without("ReconcilerRole", "iam:PassRole"), pytest.raises(ClientError) as raised:
        launch()
    assert f"iam:PassRole on resource: {role['Arn']}" in _error(raised.value)[2]


def test_a_reconciler_terminates_only_the_stacks_managed_instances(strict_aws: StrictAws) -> None:
    """A call on a resource answers by its tags: the same TerminateInstances, two instances."""
    managed = [{"Key": "fleetkeeper:managed", "Value": "true"}, {"Key": "fleetkeeper:stack", "Value": "0123456789ab"}]
    ours = aws.ec2().run_instances(
        ImageId="ami-12345678",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": managed}],
    )["Instances"][0]["InstanceId"]
    theirs = aws.ec2().run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    with strict_aws.calling_as("ReconcilerFunction"):
        aws.ec2().terminate_instances(InstanceIds=[ours])
        with pytest.raises(ClientError) as raised:
            aws.ec2().terminate_instances(InstanceIds=[theirs])
    assert _error(raised.value)[0] == "UnauthorizedOperation"


def test_reading_a_secure_string_needs_the_key_policy(strict_aws: StrictAws, table: str) -> None:
    key = raw_client("kms").create_key()["KeyMetadata"]["Arn"]
    name = f"/fleetkeeper/{TABLE}/svc/1/secrets"
    aws.ssm().put_parameter(Name=name, Value="x", Type="SecureString", KeyId=key)
    # The cleanup may list the path, not decrypt under the stack's key (the key policy names the
    # api and the reconciler): a Decrypt on its behalf is refused.
    with strict_aws.calling_as("CleanupFunction"), pytest.raises(ClientError) as raised:
        aws.ssm().get_parameters_by_path(Path=f"/fleetkeeper/{TABLE}/", Recursive=True, WithDecryption=True)
    assert "kms:Decrypt" in _error(raised.value)[2] or "ssm:GetParametersByPath" not in _error(raised.value)[2]


# -- the network -------------------------------------------------------------------------------------


def test_the_endpoints_are_those_of_infra_network_yaml() -> None:
    text = (ROOT / "infra" / "network.yaml").read_text()
    names = set(re.findall(r'ServiceName: !Sub "com\.amazonaws\.\$\{AWS::Region\}\.([a-z0-9-]+)"', text))
    assert names - {"ssmmessages", "ec2messages"} == VPC_ENDPOINTS


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://dynamodb.us-east-1.amazonaws.com/", "dynamodb"),
        ("https://bucket.s3.us-east-1.amazonaws.com/key", "s3"),
        ("https://bucket.s3.amazonaws.com/key", "s3"),
        ("https://iam.amazonaws.com/", "iam"),
        ("https://route53.amazonaws.com/2013-04-01/hostedzone/Z", "route53"),
        ("https://elasticloadbalancing.eu-west-1.amazonaws.com/", "elasticloadbalancing"),
    ],
)
def test_endpoint_names(url: str, name: str) -> None:
    assert endpoint_name(url) == name


def test_the_reconciler_cannot_reach_iam_from_the_vpc(strict_aws: StrictAws) -> None:
    start = strict_aws.clock.time()
    with strict_aws.calling_as("ReconcilerFunction"), pytest.raises(ConnectTimeoutError):
        aws.iam().list_roles()
    # Each attempt waits out the connect timeout; botocore retried them all.
    assert strict_aws.clock.time() - start >= CONNECT_TIMEOUT_SECONDS
    assert any(f.kind == "hang:connect" for f in strict_aws.faults_injected)


def test_route_53_needs_the_nat_the_deploy_guide_requires(strict_aws: StrictAws) -> None:
    with strict_aws.calling_as("ReconcilerFunction"), pytest.raises(ConnectTimeoutError):
        aws.route53().list_hosted_zones()
    strict_aws.nat_gateway = True
    with strict_aws.calling_as("ReconcilerFunction"), pytest.raises(ClientError) as raised:
        aws.route53().list_hosted_zones()
    assert _error(raised.value)[0] == "AccessDenied"  # reached, and refused: the role lists no zones


def test_functions_outside_the_vpc_reach_iam(strict_aws: StrictAws) -> None:
    with strict_aws.calling_as("DispatcherFunction"):
        aws.iam().list_roles()
