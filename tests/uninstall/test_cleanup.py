"""The uninstall custom resource's function on (strict) moto: what it answers CloudFormation, when it
cleans (only while its own stack is being deleted), its time bound, its idempotency, what it waits
for, and which response URLs it answers. (CloudFormation's whole delete: test_delete_order.py.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.deploy import cfn_response
from fleetkeeper.reconciler.driver import client_token
from fleetkeeper.uninstall import handler
from fleetkeeper.uninstall.cleanup import StackScope, Uninstall
from tests.support.reconciler_world import instance_state, raw_client, run_tagged
from tests.uninstall.stack import STACK, STACK_ID, ResponseEndpoint, delete_event, deploy, make_identity

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.uninstall.stack import Deployed

OWNER = "arn:aws:iam::123456789012:role/team-a-ci"


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[ResponseEndpoint]:
    answered = ResponseEndpoint()
    real = cfn_response.response_url_problem
    monkeypatch.setattr(
        cfn_response, "response_url_problem", lambda url: None if url.startswith("http://127.0.0.1:") else real(url)
    )
    yield answered
    answered.close()


@pytest.fixture
def stack(table: str, strict_aws: Any) -> Deployed:
    return deploy(table=table)


def properties(stack: Deployed) -> dict[str, Any]:
    return {
        "StackKey": stack.stack,
        "TableName": stack.table,
        "WorkdirBucket": stack.bucket,
        "ReplicaOwnerPolicyArn": stack.policy_arn,
        "LoadBalancerArn": stack.alb.settings.arn,
        "LoadBalancerSecurityGroupId": stack.physical["LoadBalancerSecurityGroup"],
        "WakeTargetGroupArn": stack.physical["WakeTargetGroup"],
        "HostedZoneId": "",
        "DomainName": "",
    }


def an_instance(stack_id: str = STACK, uid: str = "00000000000000aa") -> str:
    """An instance as the reconciler launches it: the managed and stack tags and its ClientToken."""
    return run_tagged(
        {
            "fleetkeeper:managed": "true",
            "fleetkeeper:stack": stack_id,
            "fleetkeeper:uid": uid,
            "fleetkeeper:replica-id": "0",
            "fleetkeeper:service": "web",
        },
        client_token=client_token(uid, 0, stack=stack_id),
    )


def an_owner_role(stack: Deployed) -> str:
    return make_identity(stack.stack, stack.policy_arn, OWNER)


def clean(stack: Deployed, *, seconds: float = 900.0, pause: float = 10.0) -> Any:
    clock = [0.0]
    return Uninstall(
        StackScope(
            stack_id=stack.stack,
            table_name=stack.table,
            workdir_bucket=stack.bucket,
            replica_policy_arn=stack.policy_arn,
            load_balancer_arn=stack.alb.settings.arn,
            security_group_id=stack.physical["LoadBalancerSecurityGroup"],
        ),
        remaining=lambda: seconds - clock[0],
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
        pause_seconds=pause,
    ).run()


# --- answering CloudFormation ---------------------------------------------------------------------


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_create_and_update_touch_nothing_and_keep_one_physical_id(
    stack: Deployed, endpoint: ResponseEndpoint, request_type: str
) -> None:
    instance = an_instance()
    handler.lambda_handler(delete_event(endpoint.url, properties(stack), request_type), None)
    (response,) = endpoint.responses
    assert response["Status"] == "SUCCESS"
    assert response["PhysicalResourceId"] == handler.PHYSICAL_ID
    assert (response["StackId"], response["RequestId"]) == (STACK_ID, "req-1")
    assert instance_state(instance) == "running"


@pytest.mark.parametrize(
    "status",
    [
        "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS",
        "UPDATE_ROLLBACK_IN_PROGRESS",
        "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS",
    ],
)
def test_a_delete_while_the_stack_stays_removes_nothing(
    stack: Deployed, endpoint: ResponseEndpoint, monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    """CloudFormation deletes the resource from a live stack when an update removes or replaces it, or
    when a failed update that added it rolls back: the stack's services keep running."""
    monkeypatch.setattr(handler, "stack_status", lambda stack_id: status)
    instance = an_instance()
    role = an_owner_role(stack)
    handler.lambda_handler(delete_event(endpoint.url, properties(stack)), None)
    (response,) = endpoint.responses
    assert response["Status"] == "SUCCESS" and "nothing removed" in response["Reason"]
    assert instance_state(instance) == "running"
    assert raw_client("iam").get_role(RoleName=role)["Role"]["RoleName"] == role


def test_the_stacks_status_is_read_from_cloudformation(stack: Deployed) -> None:
    made = raw_client("cloudformation").create_stack(
        StackName="fk-live", TemplateBody='{"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}}'
    )
    assert handler.stack_status(made["StackId"]) == "CREATE_COMPLETE"
    instance = an_instance()
    event = delete_event("https://example.invalid/", properties(stack)) | {"StackId": made["StackId"]}
    succeeded, reason = handler.decide(event, lambda: 900.0)
    assert succeeded and "CREATE_COMPLETE" in reason
    assert instance_state(instance) == "running"


@pytest.mark.parametrize("status", ["DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS"])
def test_a_delete_of_the_stack_cleans(
    stack: Deployed, endpoint: ResponseEndpoint, monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    monkeypatch.setattr(handler, "stack_status", lambda stack_id: status)
    instance = an_instance()
    role = an_owner_role(stack)
    handler.lambda_handler(delete_event(endpoint.url, properties(stack)), None)
    (response,) = endpoint.responses
    assert response["Status"] == "SUCCESS", response["Reason"]
    assert "1 instances" in response["Reason"] and "1 replica roles" in response["Reason"]
    assert instance_state(instance) in {"shutting-down", "terminated"}
    assert raw_client("iam").list_roles(PathPrefix=f"/fleetkeeper/{STACK}/")["Roles"] == []
    assert role not in [r["RoleName"] for r in raw_client("iam").list_roles()["Roles"]]


def test_bad_properties_are_answered_failed_naming_what_is_wrong(
    stack: Deployed, endpoint: ResponseEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handler, "stack_status", lambda stack_id: "DELETE_IN_PROGRESS")
    for broken, message in (({"StackKey": ""}, "StackKey"), ({"StackKey": "Not-An-Id"}, "FLEETKEEPER_STACK_ID")):
        endpoint.responses.clear()
        handler.lambda_handler(delete_event(endpoint.url, {**properties(stack), **broken}), None)
        (response,) = endpoint.responses
        assert response["Status"] == "FAILED" and message in response["Reason"], response["Reason"]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/arn%3A...?X-Amz-Signature=a", True),
        ("https://cloudformation-custom-resource-response-euwest1.s3.eu-west-1.amazonaws.com/x?sig=1", True),
        ("https://s3.cn-north-1.amazonaws.com.cn/bucket/key?sig=1", True),
        ("http://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/x", False),
        ("file:///etc/passwd", False),
        ("https://s3.amazonaws.com.evil.example/x", False),
        ("https://evil.example/s3.amazonaws.com/x", False),
        ("https://user:pw@bucket.s3.amazonaws.com/x", False),
        ("https://bucket.s3.amazonaws.com:8443/x", False),
        ("https://169.254.169.254/latest/meta-data/", False),
        ("", False),
    ],
)
def test_only_an_https_url_of_s3_is_answered(url: str, allowed: bool) -> None:
    assert (cfn_response.response_url_problem(url) is None) is allowed


def test_an_event_whose_url_is_not_s3s_is_not_answered(stack: Deployed, caplog: pytest.LogCaptureFixture) -> None:
    endpoint = ResponseEndpoint()
    try:
        handler.lambda_handler(delete_event(endpoint.url, properties(stack), "Create"), None)
    finally:
        endpoint.close()
    assert endpoint.responses == []
    assert "not an https URL of S3" in caplog.text


# --- bounded, idempotent, waiting ---------------------------------------------------------------------


def test_out_of_time_it_reports_what_is_left_and_a_retried_delete_finishes(stack: Deployed) -> None:
    instances = [an_instance(uid=f"{n:016x}") for n in range(3)]
    an_owner_role(stack)
    s3 = raw_client("s3")
    for n in range(5):
        s3.put_object(Bucket=stack.bucket, Key=f"uploads/{n}.tar.gz", Body=b"x")
    # Too little time for even the first pass to end: it stops before a call, and says so.
    short = clean(stack, seconds=31.0)
    assert not short.complete
    assert "not finished" in short.summary() and "Delete the stack again" in short.summary()
    # CloudFormation's retried Delete (the user's `sam delete` again) continues where it stopped.
    done = clean(stack)
    assert done.complete, done.summary()
    assert all(instance_state(i) in {"shutting-down", "terminated"} for i in instances)
    assert s3.list_objects_v2(Bucket=stack.bucket)["KeyCount"] == 0
    # And once more: the work is done, the answer is the same.
    again = clean(stack)
    assert again.complete and again.summary().startswith("removed what the stack made outside CloudFormation: nothing")


def test_a_time_bound_stops_between_calls(stack: Deployed) -> None:
    """No AWS call starts with less than the reserve left: the report comes while there is time to
    answer CloudFormation."""
    calls: list[float] = []
    clock = [0.0]

    def remaining() -> float:
        clock[0] += 10.0  # each look at the clock: ten seconds of work (a slow AWS)
        calls.append(clock[0])
        return 100.0 - clock[0]

    s3 = raw_client("s3")
    for n in range(3):
        s3.put_object(Bucket=stack.bucket, Key=f"k{n}", Body=b"x")
    report = Uninstall(
        StackScope(STACK, stack.table, stack.bucket, stack.policy_arn), remaining=remaining, sleep=lambda s: None
    ).run()
    assert not report.complete and "time ran out" in report.summary()
    # Its last look found less than the reserve left (30 s): it stopped there, with time to answer.
    assert 100.0 - calls[-1] < 30.0 <= 100.0 - calls[-2]


def test_interfaces_of_deleted_pools_are_waited_for_then_reported(stack: Deployed) -> None:
    """A deleted ALB's network interfaces stay in its security group for minutes (AWS releases
    them), and EC2 refuses to delete the group meanwhile: the cleanup waits, bounded."""
    ec2 = raw_client("ec2")
    group = stack.physical["LoadBalancerSecurityGroup"]
    subnet = stack.alb.settings.subnet_ids[0]
    pool_interface = ec2.create_network_interface(
        SubnetId=subnet, Groups=[group], Description=f"ELB app/fk-{STACK}-1/50dc6c495c0c9188"
    )["NetworkInterface"]["NetworkInterfaceId"]
    # The template ALB's own interfaces are CloudFormation's to wait for, another stack's not ours.
    ec2.create_network_interface(SubnetId=subnet, Groups=[group], Description="ELB app/tpl-alb/0123456789abcdef")
    ec2.create_network_interface(SubnetId=subnet, Groups=[group], Description="ELB app/fk-fedcba987654-1/0123")
    waited = clean(stack, seconds=200.0, pause=10.0)
    assert not waited.complete
    assert waited.left["network interfaces"] == 1
    assert "time ran out while AWS finished" in waited.summary()
    ec2.delete_network_interface(NetworkInterfaceId=pool_interface)  # AWS released it
    assert clean(stack).complete


def test_another_stacks_instances_and_an_instance_without_its_token_are_left(stack: Deployed) -> None:
    other = an_instance(stack_id="fedcba987654")
    copied = run_tagged(
        {"fleetkeeper:managed": "true", "fleetkeeper:stack": STACK, "fleetkeeper:uid": "00000000000000bb"}
    )
    ours = an_instance()
    assert clean(stack).complete
    assert instance_state(other) == "running"
    assert instance_state(copied) == "running"  # tags anyone can copy; no ClientToken of this stack
    assert instance_state(ours) in {"shutting-down", "terminated"}


def test_records_only_the_stacks_pools_aliases_under_its_domain(strict_aws: Any, table: str) -> None:
    route53 = raw_client("route53")
    zone = route53.create_hosted_zone(Name="example.com", CallerReference="z")["HostedZone"]["Id"].rsplit("/", 1)[-1]

    def alias(name: str, target: str) -> dict[str, Any]:
        return {
            "Action": "CREATE",
            "ResourceRecordSet": {
                "Name": name,
                "Type": "A",
                "AliasTarget": {"HostedZoneId": "Z35SXDOTRQ7X7K", "DNSName": target, "EvaluateTargetHealth": False},
            },
        }

    route53.change_resource_record_sets(
        HostedZoneId=zone,
        ChangeBatch={
            "Changes": [
                alias("a.svc.example.com", f"internal-fk-{STACK}-1-1234567890.us-east-1.elb.amazonaws.com"),
                alias("b.svc.example.com", f"dualstack.fk-{STACK}-12-99.us-east-1.elb.amazonaws.com"),
                alias(
                    "c.svc.example.com", "internal-fk-fedcba987654-1-1.us-east-1.elb.amazonaws.com"
                ),  # another stack's
                alias("d.svc.example.com", "internal-tpl-alb-1.us-east-1.elb.amazonaws.com"),  # pool 0: the wildcard's
                alias("e.other.example.com", f"internal-fk-{STACK}-1-1.us-east-1.elb.amazonaws.com"),  # not the domain
                alias("*.svc.example.com", f"internal-fk-{STACK}-1-1.us-east-1.elb.amazonaws.com"),  # the user's
            ]
        },
    )
    stack = deploy(table=table)
    report = Uninstall(
        StackScope(
            STACK,
            table,
            stack.bucket,
            stack.policy_arn,
            load_balancer_arn=stack.alb.settings.arn,
            hosted_zone_id=zone,
            domain_name="svc.example.com",
        ),
        remaining=lambda: 900.0,
    ).run()
    assert report.complete and report.deleted["records"] == 2
    names = {r["Name"] for r in route53.list_resource_record_sets(HostedZoneId=zone)["ResourceRecordSets"]}
    assert not {"a.svc.example.com.", "b.svc.example.com."} & names
    assert {"c.svc.example.com.", "d.svc.example.com.", "e.other.example.com."} <= names


def test_without_a_load_balancer_no_elastic_load_balancing_call_is_made(stack: Deployed) -> None:
    """LoadBalancer none: the role has no Elastic Load Balancing permission (UninstallEndpointsPolicy
    is not made) and the code made no endpoint."""
    from fleetkeeper import aws

    calls: list[str] = []
    elbv2 = aws.elbv2()
    elbv2.meta.events.register("before-call", lambda model, **_: calls.append(model.name), unique_id="no-elb")
    try:
        instance = an_instance()
        report = Uninstall(
            StackScope(STACK, stack.table, stack.bucket, stack.policy_arn), remaining=lambda: 900.0
        ).run()
    finally:
        elbv2.meta.events.unregister("before-call", unique_id="no-elb")
    assert report.complete and calls == []
    assert instance_state(instance) in {"shutting-down", "terminated"}


def test_much_to_delete_goes_through_every_page_and_batch(stack: Deployed, strict_aws: Any) -> None:
    """More than a page or a batch of each: 45 target groups (DescribeTags takes 20 ARNs), 25
    parameters (GetParametersByPath pages of 10, DeleteParameters batches of 10), 1,100 objects
    (DeleteObjects batches of 1,000)."""
    elbv2, ssm, s3 = raw_client("elbv2"), raw_client("ssm"), raw_client("s3")
    tags = [{"Key": "fleetkeeper:managed", "Value": "true"}, {"Key": "fleetkeeper:stack", "Value": STACK}]
    for n in range(45):
        elbv2.create_target_group(
            Name=f"fk-{STACK}-{n:016x}", Protocol="HTTP", Port=80, VpcId=stack.alb.settings.vpc_id, Tags=tags
        )
    for n in range(25):
        ssm.put_parameter(Name=f"/fleetkeeper/{stack.table}/web/{n:016x}/ref0", Value="{}", Type="SecureString")
    for n in range(1100):
        s3.put_object(Bucket=stack.bucket, Key=f"services/web/{n:05d}.tar.gz", Body=b"")
    report = clean(stack)
    assert report.complete, report.summary()
    assert (report.deleted["target groups"], report.deleted["parameters"], report.deleted["objects"]) == (45, 25, 1100)
    assert [
        g for g in elbv2.describe_target_groups()["TargetGroups"] if g["TargetGroupName"].startswith(f"fk-{STACK}-")
    ] == []
    assert s3.list_objects_v2(Bucket=stack.bucket)["KeyCount"] == 0
