"""The doctor's last check on AWS (fleetkeeper.cli.leftovers), against moto behind the strict layer:
what the reconciler makes for an incarnation, named and tagged as it makes them, is found while it is
there, and nothing of another stack's or another incarnation's is taken for it."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from fleetkeeper.cli.leftovers import AwsLeftovers, CheckFailed, Made
from fleetkeeper.reconciler.balancer import MANAGED_TAG, SERVICE_TAG, STACK_TAG, UID_TAG, target_group_name

STACK = "0a1b2c3d4e5f"
OTHER_STACK = "ffffffffffff"
WEB = Made("fk-doctor-abc123", "00000000000000a1")
OTHER = Made("fk-doctor-abc123-b", "00000000000000b2")
REGION = "us-east-1"


def tags(made: Made, stack: str = STACK) -> list[dict[str, str]]:
    return [
        {"Key": MANAGED_TAG, "Value": "true"},
        {"Key": STACK_TAG, "Value": stack},
        {"Key": SERVICE_TAG, "Value": made.name},
        {"Key": UID_TAG, "Value": made.uid},
    ]


@pytest.fixture
def world(aws: None) -> dict[str, Any]:
    ec2 = boto3.client("ec2", region_name=REGION)
    elbv2 = boto3.client("elbv2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{n}.0/24", AvailabilityZone=f"{REGION}{zone}")["Subnet"][
            "SubnetId"
        ]
        for n, zone in ((1, "a"), (2, "b"))
    ]
    balancer = elbv2.create_load_balancer(Name="fleetkeeper-alb", Subnets=subnets, Scheme="internal")["LoadBalancers"][
        0
    ]
    return {"ec2": ec2, "elbv2": elbv2, "vpc": vpc, "subnets": subnets, "balancer": balancer}


def checker(world: dict[str, Any], stack: str = STACK) -> AwsLeftovers:
    return AwsLeftovers(world["ec2"], world["elbv2"], stack, world["balancer"]["DNSName"].upper())


def launch(world: dict[str, Any], made: Made, stack: str = STACK) -> str:
    image = world["ec2"].describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance: str = world["ec2"].run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        SubnetId=world["subnets"][0],
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [*tags(made, stack), {"Key": "fleetkeeper:replica-id", "Value": "0"}]}
        ],
    )["Instances"][0]["InstanceId"]
    return instance


def group(world: dict[str, Any], made: Made, stack: str = STACK) -> str:
    arn: str = world["elbv2"].create_target_group(
        Name=target_group_name(made.uid, stack), Protocol="HTTP", Port=8080, VpcId=world["vpc"], Tags=tags(made, stack)
    )["TargetGroups"][0]["TargetGroupArn"]
    return arn


def test_nothing_made_means_nothing_left(world: dict[str, Any]) -> None:
    assert checker(world).find([WEB, OTHER]) == []


def test_an_instance_is_left_until_it_is_terminated(world: dict[str, Any]) -> None:
    instance = launch(world, WEB)
    launch(world, Made(WEB.name, "00000000000000c3"))  # another incarnation of the name: not this one's
    launch(world, WEB, stack=OTHER_STACK)  # another stack's (its uid too: not ours)

    assert checker(world).find([WEB]) == [f"instance {instance} (running) of {WEB.name} replica 0"]

    world["ec2"].terminate_instances(InstanceIds=[instance])
    left = checker(world).find([WEB])
    # AWS keeps a terminated instance in DescribeInstances for a while: it is not left; one still
    # shutting down is (the doctor asks again until it is gone).
    assert left in ([], [f"instance {instance} (shutting-down) of {WEB.name} replica 0"])


def test_a_target_group_is_left_until_it_is_deleted(world: dict[str, Any]) -> None:
    arn = group(world, WEB)
    group(world, WEB, stack=OTHER_STACK)

    assert checker(world).find([WEB, OTHER]) == [f"target group {arn} of {WEB.name}"]

    world["elbv2"].delete_target_group(TargetGroupArn=arn)
    assert checker(world).find([WEB, OTHER]) == []


def test_a_services_own_listener_is_left_until_it_is_deleted(world: dict[str, Any]) -> None:
    elbv2 = world["elbv2"]
    target = group(world, WEB)
    listener = elbv2.create_listener(
        LoadBalancerArn=world["balancer"]["LoadBalancerArn"],
        Protocol="HTTP",
        Port=10000,
        DefaultActions=[{"Type": "forward", "TargetGroupArn": target}],
        Tags=tags(WEB),
    )["Listeners"][0]["ListenerArn"]

    found = checker(world).routes([WEB])
    assert found == [f"listener {listener} (port 10000) of {WEB.name}"]

    elbv2.delete_listener(ListenerArn=listener)
    assert checker(world).routes([WEB]) == []


def test_a_host_rule_on_the_stacks_listener_is_left_by_its_uid_or_its_host(world: dict[str, Any]) -> None:
    elbv2 = world["elbv2"]
    target = group(world, WEB)
    shared = elbv2.create_listener(
        LoadBalancerArn=world["balancer"]["LoadBalancerArn"],
        Protocol="HTTP",
        Port=80,
        DefaultActions=[{"Type": "fixed-response", "FixedResponseConfig": {"StatusCode": "404"}}],
    )["Listeners"][0]["ListenerArn"]
    forward = [{"Type": "forward", "TargetGroupArn": target}]
    tagged = elbv2.create_rule(
        ListenerArn=shared,
        Priority=1,
        Conditions=[{"Field": "host-header", "HostHeaderConfig": {"Values": [f"{WEB.name}.example.com"]}}],
        Actions=forward,
        Tags=tags(WEB),
    )["Rules"][0]["RuleArn"]
    untagged = elbv2.create_rule(
        ListenerArn=shared,
        Priority=2,
        Conditions=[{"Field": "host-header", "HostHeaderConfig": {"Values": [f"{OTHER.name}.example.com"]}}],
        Actions=forward,
    )["Rules"][0]["RuleArn"]
    elbv2.create_rule(  # someone else's host: not ours
        ListenerArn=shared,
        Priority=3,
        Conditions=[{"Field": "host-header", "HostHeaderConfig": {"Values": ["web.example.com"]}}],
        Actions=forward,
    )

    assert checker(world).routes([WEB, OTHER]) == [
        f"rule {tagged} of {WEB.name}",
        f"rule {untagged} for host {OTHER.name}.example.com",
    ]

    elbv2.delete_rule(RuleArn=tagged)
    elbv2.delete_rule(RuleArn=untagged)
    assert checker(world).routes([WEB, OTHER]) == []


def test_only_the_stacks_load_balancers_are_read(world: dict[str, Any]) -> None:
    elbv2 = world["elbv2"]
    stranger = elbv2.create_load_balancer(Name="someone-else", Subnets=world["subnets"], Scheme="internal")[
        "LoadBalancers"
    ][0]
    pool = elbv2.create_load_balancer(Name=f"fk-{STACK}-1", Subnets=world["subnets"], Scheme="internal")[
        "LoadBalancers"
    ][0]
    for balancer, port in ((stranger, 10001), (pool, 10002)):
        elbv2.create_listener(
            LoadBalancerArn=balancer["LoadBalancerArn"],
            Protocol="HTTP",
            Port=port,
            DefaultActions=[{"Type": "fixed-response", "FixedResponseConfig": {"StatusCode": "503"}}],
            Tags=tags(WEB),
        )

    found = checker(world).routes([WEB])
    assert len(found) == 1 and "(port 10002)" in found[0]  # the pool's, not the stranger's


def test_a_refused_read_names_the_iam_action_it_needs(world: dict[str, Any]) -> None:
    from botocore.stub import Stubber

    stubber = Stubber(world["ec2"])
    stubber.add_client_error("describe_instances", "UnauthorizedOperation", "You are not authorized")
    with stubber, pytest.raises(CheckFailed) as refused:
        checker(world).instances([WEB])
    assert str(refused.value) == (
        "could not check (ec2:DescribeInstances): UnauthorizedOperation: You are not authorized"
    )
