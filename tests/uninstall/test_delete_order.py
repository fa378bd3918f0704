"""`sam delete` right after `fleetkeeper down --all`: CloudFormation's delete of the translated
template, in its order, over moto state the real code made outside CloudFormation (tests/uninstall/stack.py).

With UninstallCleanup the stack ends DELETE_COMPLETE with nothing of it left (the table kept, as its
DeletionPolicy says); without it, AWS's refusals leave it DELETE_FAILED; a second stack in the same
account and Region keeps everything.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.deploy import cfn_response
from fleetkeeper.uninstall import handler
from tests.support import TABLE
from tests.support.cfn import translate
from tests.support.reconciler_world import raw_client, run_tagged
from tests.uninstall.granted import Call, denied, observe
from tests.uninstall.stack import (
    CONFIG,
    CloudFormationDelete,
    Deployed,
    ResponseEndpoint,
    delete_event,
    delete_waves,
    dependencies,
    deploy,
    hosted_zone,
    leftovers,
    make_identity,
    run_the_code,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.support.reconciler_world import World

DOMAIN = "svc.example.com"
OTHER = "fedcba987654"


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[ResponseEndpoint]:
    answered = ResponseEndpoint()
    # The test's response URL is 127.0.0.1's, not S3's (test_cleanup.py proves the check itself).
    real = cfn_response.response_url_problem
    monkeypatch.setattr(
        cfn_response, "response_url_problem", lambda url: None if url.startswith("http://127.0.0.1:") else real(url)
    )
    yield answered
    answered.close()


def stack_template(stack: Deployed) -> dict[str, Any]:
    """template.yaml as CloudFormation received it for this stack's parameters."""
    overrides: dict[str, Any] = {}
    if stack.domain:
        overrides["DomainName"] = stack.domain
    if stack.zone_id:
        overrides["HostedZoneId"] = stack.zone_id
    return translate(overrides=overrides)


def the_cleanup(
    endpoint: ResponseEndpoint, calls: list[Call] | None = None
) -> Callable[[str, dict[str, Any]], tuple[bool, str]]:
    """CloudFormation's Delete request to the custom resource: the function, its answer to the URL.
    The AWS calls the function makes go to `calls`, with their parameters."""
    from fleetkeeper import aws

    clock = [0.0]

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        if calls is not None:
            calls.append(observe(model.service_model.service_name, model.name, params))

    def invoke(logical_id: str, properties: dict[str, Any]) -> tuple[bool, str]:
        event = delete_event(endpoint.url, properties)
        clients = [aws.ec2(), aws.elbv2(), aws.iam(), aws.route53(), aws.ssm(), aws.s3(), aws.cloudformation()]
        for client in clients:
            client.meta.events.register("before-parameter-build", record, unique_id="uninstall-test-calls")
        try:
            succeeded, reason = handler.decide(
                event,
                remaining=lambda: 900.0 - clock[0],
                status_of=lambda stack_id: "DELETE_IN_PROGRESS",
                sleep=lambda seconds: clock.__setitem__(0, clock[0] + seconds),
            )
        finally:
            for client in clients:
                client.meta.events.unregister("before-parameter-build", unique_id="uninstall-test-calls")
        handler.answer(event, succeeded, reason)
        response = endpoint.responses[-1]
        assert response["LogicalResourceId"] == logical_id == "UninstallCleanup"
        assert response["PhysicalResourceId"] == handler.PHYSICAL_ID
        return response["Status"] == "SUCCESS", str(response["Reason"])

    return invoke


def without_uninstall(translated: dict[str, Any]) -> dict[str, Any]:
    """The template before UninstallCleanup: its resources gone, nothing depending on it."""
    older = copy.deepcopy(translated)
    for lid in [lid for lid in older["Resources"] if lid.startswith("Uninstall")]:
        del older["Resources"][lid]
    for body in older["Resources"].values():
        if body.get("DependsOn") == "UninstallCleanup":
            del body["DependsOn"]
    return older


def test_the_delete_order_puts_the_cleanup_after_what_makes_things_and_before_what_it_unblocks(
    translated: dict[str, Any],
) -> None:
    with_domain = translate(overrides={"DomainName": DOMAIN, "HostedZoneId": "Z0123456789ABC"})
    for template in (translated, with_domain):
        waves = delete_waves(dependencies(template))
        wave_of = {lid: n for n, wave in enumerate(waves) for lid in wave}
        cleanup = wave_of["UninstallCleanup"]
        for maker in ("ApiFunction", "DispatcherFunction", "ReconcilerFunction", "ReconcilerFunctionShards"):
            assert wave_of[maker] < cleanup, maker
        for unblocked in (
            "ReplicaOwnerPolicy",
            "LoadBalancerSecurityGroup",
            "WakeTargetGroup",
            "LoadBalancerResource",
            "WorkdirBucket",
            "Table",
        ):
            assert wave_of[unblocked] > cleanup, unblocked
        for needed in ("UninstallFunction", "UninstallRole", "UninstallLogGroup", "UninstallEndpointsPolicy"):
            assert wave_of[needed] > cleanup, needed
    waves = delete_waves(dependencies(with_domain))
    wave_of = {lid: n for n, wave in enumerate(waves) for lid in wave}
    assert wave_of["HttpListener"] > wave_of["UninstallCleanup"]
    assert wave_of["UninstallDnsPolicy"] > wave_of["UninstallCleanup"]


@pytest.fixture
def deployed(world: World, monkeypatch: pytest.MonkeyPatch) -> Deployed:
    """A stack with a domain and a hosted zone, used and then emptied by `fleetkeeper down --all`."""
    zone = hosted_zone(DOMAIN)
    stack = deploy(table=TABLE, domain=DOMAIN, zone_id=zone)
    run_the_code(world, stack, monkeypatch)
    return stack


def assert_deleted_completely(
    stack: Deployed, endpoint: ResponseEndpoint, calls: list[tuple[str, str]] | None = None
) -> None:
    before = leftovers(stack)
    # What the code made is there: instances, pools and their groups, roles, secrets (and records).
    assert {"instances", "load balancers", "target groups", "roles", "instance profiles", "parameters"} <= set(
        before
    ), before
    outcome = CloudFormationDelete(stack_template(stack), stack.physical, the_cleanup(endpoint, calls)).run()
    assert outcome.failures == {}
    assert outcome.status == "DELETE_COMPLETE"
    assert leftovers(stack) == {}
    assert outcome.kept == ["Table"]  # DeletionPolicy: Retain (docs/DEPLOY.md, Uninstall step 3)
    assert raw_client("dynamodb").describe_table(TableName=TABLE)["Table"]["TableName"] == TABLE
    (answer,) = endpoint.responses
    assert answer["Status"] == "SUCCESS" and "removed what the stack made outside CloudFormation" in answer["Reason"]


def test_sam_delete_right_after_down_all_completes_with_nothing_left(
    deployed: Deployed, endpoint: ResponseEndpoint
) -> None:
    assert "records" in leftovers(deployed)
    calls: list[Call] = []
    assert_deleted_completely(deployed, endpoint, calls)
    # Every call it made is allowed by its role, on the resources it named, with AWS's condition keys.
    made = {(call.service, call.operation) for call in calls}
    assert {("iam", "DeleteRole"), ("route53", "ChangeResourceRecordSets"), ("elbv2", "DeleteLoadBalancer")} <= made
    assert {("ec2", "TerminateInstances"), ("s3", "DeleteObjects"), ("ssm", "DeleteParameters")} <= made
    assert denied(calls, stack_template(deployed), deployed.physical) == []
    # The user's wildcard record is the user's.
    zone = raw_client("route53").list_resource_record_sets(HostedZoneId=deployed.zone_id)["ResourceRecordSets"]
    assert {f"\\052.{DOMAIN}.", f"*.{DOMAIN}."} & {r["Name"] for r in zone}  # AWS writes * as \\052


def test_without_a_domain_too(world: World, monkeypatch: pytest.MonkeyPatch, endpoint: ResponseEndpoint) -> None:
    """Without a domain the services' routes are listeners of their own, on the template's ALB and pools."""
    stack = deploy(table=TABLE)
    run_the_code(world, stack, monkeypatch)
    assert_deleted_completely(stack, endpoint)


def test_without_the_cleanup_aws_refuses_the_delete(deployed: Deployed) -> None:
    """The policy stays attached to the owners' roles; the host rule of a service at zero forwards to
    WakeTargetGroup (and what depends on them stays too)."""
    outcome = CloudFormationDelete(without_uninstall(stack_template(deployed)), deployed.physical, None).run()
    assert outcome.status == "DELETE_FAILED"
    assert outcome.failures["ReplicaOwnerPolicy"].startswith("DeleteConflict")
    assert outcome.failures["WakeTargetGroup"].startswith("ResourceInUse")
    left = leftovers(deployed)
    assert {"instances", "load balancers", "roles", "records", "parameters", "buckets"} <= set(left), left


def test_without_the_cleanup_pools_hold_the_security_group_and_objects_the_bucket(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ReplicaIdentity shared no owner's role holds ReplicaOwnerPolicy, so CloudFormation gets as
    far as the security group (the pools use it) and the bucket (the objects)."""
    stack = deploy(table=TABLE)
    run_the_code(world, stack, monkeypatch, waking=False, identity="shared")
    template = without_uninstall(translate(overrides={"ReplicaIdentity": "shared"}))
    outcome = CloudFormationDelete(template, stack.physical, None).run()
    assert outcome.status == "DELETE_FAILED"
    assert "ReplicaOwnerPolicy" in outcome.deleted
    assert outcome.failures["LoadBalancerSecurityGroup"].startswith("DependencyViolation")
    assert outcome.failures["WorkdirBucket"].startswith("BucketNotEmpty")
    assert "WakeTargetGroup" in outcome.deleted  # no route forwarded to it


def test_a_second_stack_in_the_account_keeps_everything(
    deployed: Deployed, endpoint: ResponseEndpoint, world: World
) -> None:
    """Another stack of the template in the same account, Region and hosted zone: its instances,
    pools, target groups, records, roles, secrets and objects are not this stack's to delete."""
    from fleetkeeper.reconciler.driver import client_token
    from fleetkeeper.replicas.secrets import SecretStore, parameter_prefix

    other = deploy(stack=OTHER, table="other-table", domain=DOMAIN, zone_id=deployed.zone_id, name="oth", cidr="10.43")
    for n in range(3):
        other.alb.ensure(f"other{n}", f"{n + 100:016x}", CONFIG, None)
    make_identity(OTHER, other.policy_arn, "arn:aws:iam::123456789012:role/team-c-ci")
    uid = f"{7:016x}"
    run_tagged(
        {
            "fleetkeeper:managed": "true",
            "fleetkeeper:stack": OTHER,
            "fleetkeeper:uid": uid,
            "fleetkeeper:replica-id": "0",
            "fleetkeeper:service": "other0",
        },
        client_token=client_token(uid, 0, stack=OTHER),
    )
    SecretStore(parameter_prefix("other-table"), stack_id=OTHER).put("other0", uid, "ref0", {"K": "v"})
    raw_client("s3").put_object(Bucket=other.bucket, Key="uploads/x.tar.gz", Body=b"x")
    from tests.strict_aws import active_controller

    controller = active_controller()
    assert controller is not None
    controller.iam.settle()
    before = leftovers(other)
    assert {"instances", "load balancers", "target groups", "roles", "parameters", "records"} <= set(before), before

    outcome = CloudFormationDelete(stack_template(deployed), deployed.physical, the_cleanup(endpoint)).run()
    assert outcome.status == "DELETE_COMPLETE", outcome.failures
    assert leftovers(deployed) == {}
    assert leftovers(other) == before
    assert raw_client("s3").list_objects_v2(Bucket=other.bucket)["KeyCount"] == 1


def test_the_judge_of_the_calls_refuses_what_the_role_does_not_allow(aws: None) -> None:
    """The check above can fail: calls on another stack's resources, or with conditions unmet."""
    stack = deploy(table=TABLE, domain=DOMAIN, zone_id="Z0123456789ABC")
    template = stack_template(stack)
    foreign = [
        Call("ec2", "TerminateInstances", {"InstanceIds": ["i-1"]}, tags={"i-1": {"fleetkeeper:stack": OTHER}}),
        Call("iam", "DeleteRole", {"RoleName": "r"}, paths={"r": f"/fleetkeeper/{OTHER}/"}),
        Call(
            "iam",
            "DetachRolePolicy",
            {"RoleName": "r", "PolicyArn": "arn:aws:iam::123456789012:policy/x"},
            paths={"r": "/fleetkeeper/0123456789ab/"},
        ),
        Call("s3", "DeleteObjects", {"Bucket": "another", "Delete": {"Objects": [{"Key": "k"}]}}),
        Call("ssm", "DeleteParameters", {"Names": ["/fleetkeeper/another-table/x"]}),
        Call(
            "route53",
            "ChangeResourceRecordSets",
            {
                "HostedZoneId": "Z0123456789ABC",
                "ChangeBatch": {
                    "Changes": [{"Action": "UPSERT", "ResourceRecordSet": {"Name": f"a.{DOMAIN}", "Type": "A"}}]
                },
            },
        ),
    ]
    assert len(denied(foreign, template, stack.physical)) == len(foreign)
