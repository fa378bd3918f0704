"""Every call the uninstall function made, judged against its role with the IAM evaluator: the action
AWS authorizes it as, on the resources it names (ARNs of what `deploy` made), with the condition keys
AWS sets (the resource's tags as they were at the call, Route 53's change keys, iam:PolicyARN).

The calls are recorded from the function's own clients (botocore's `before-call`, with their
parameters); the role's statements are resolved with the deployed stack's physical ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.support.cfn import ACCOUNT, REGION, as_list, function_role, role_statements
from tests.support.iam_evaluator import Request, allowed
from tests.support.reconciler_world import raw_client
from tests.uninstall.stack import DeployedResolver

if TYPE_CHECKING:
    from collections.abc import Iterator


@dataclass(frozen=True)
class Call:
    service: str
    operation: str
    params: dict[str, Any]
    # What AWS reads at the call, taken before it (a deleted resource has no tags after): tags by ARN
    # or instance id, a role's or profile's path by name.
    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)


def _elb_tags(arns: list[str]) -> dict[str, dict[str, str]]:
    described = raw_client("elbv2").describe_tags(ResourceArns=arns)["TagDescriptions"]
    return {d["ResourceArn"]: {t["Key"]: t["Value"] for t in d.get("Tags", [])} for d in described}


def observe(service: str, operation: str, params: dict[str, Any]) -> Call:
    """The call, with what AWS will read of its resources (read now, before it runs)."""
    tags: dict[str, dict[str, str]] = {}
    paths: dict[str, str] = {}
    if service == "elbv2" and operation.startswith("Delete"):
        arn = next(str(v) for k, v in params.items() if k.endswith("Arn"))
        tags = _elb_tags([arn])
    if service == "ec2" and operation == "TerminateInstances":
        reservations = raw_client("ec2").describe_instances(InstanceIds=params["InstanceIds"])["Reservations"]
        for instance in (i for r in reservations for i in r["Instances"]):
            tags[instance["InstanceId"]] = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    if service == "iam" and "RoleName" in params:
        paths[params["RoleName"]] = raw_client("iam").get_role(RoleName=params["RoleName"])["Role"]["Path"]
    if service == "iam" and "InstanceProfileName" in params:
        name = params["InstanceProfileName"]
        profile = raw_client("iam").get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        paths["profile:" + name] = profile["Path"]
    return Call(service, operation, dict(params), tags, paths)


def _tag_context(tags: dict[str, str]) -> dict[str, str | list[str]]:
    return {f"aws:ResourceTag/{key}": value for key, value in tags.items()}


def requests(call: Call) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(IAM action, resource ARN, condition keys) AWS authorizes the call as, one per resource."""
    service, operation, params = call.service, call.operation, call.params
    region = f"{REGION}:{ACCOUNT}"
    if service == "ec2":
        if operation == "TerminateInstances":
            for instance in params["InstanceIds"]:
                arn = f"arn:aws:ec2:{region}:instance/{instance}"
                yield "ec2:TerminateInstances", arn, _tag_context(call.tags.get(instance, {}))
        else:
            yield f"ec2:{operation}", "*", {}
    elif service == "elbv2":
        if operation.startswith("Delete"):
            arn = next(str(v) for k, v in params.items() if k.endswith("Arn"))
            yield f"elasticloadbalancing:{operation}", arn, _tag_context(call.tags.get(arn, {}))
        else:
            yield f"elasticloadbalancing:{operation}", "*", {}
    elif service == "iam":
        if operation == "ListRoles":
            yield "iam:ListRoles", "*", {}
        elif "InstanceProfileName" in params:
            name = params["InstanceProfileName"]
            path = call.paths["profile:" + name]
            yield f"iam:{operation}", f"arn:aws:iam::{ACCOUNT}:instance-profile{path}{name}", {}
        else:
            name = params["RoleName"]
            context = {"iam:PolicyARN": params["PolicyArn"]} if "PolicyArn" in params else {}
            yield f"iam:{operation}", f"arn:aws:iam::{ACCOUNT}:role{call.paths[name]}{name}", context
    elif service == "route53":
        zone = f"arn:aws:route53:::hostedzone/{params['HostedZoneId']}"
        if operation == "ChangeResourceRecordSets":
            changes = params["ChangeBatch"]["Changes"]
            context = {
                "route53:ChangeResourceRecordSetsNormalizedRecordNames": [
                    str(c["ResourceRecordSet"]["Name"]).lower().rstrip(".") for c in changes
                ],
                "route53:ChangeResourceRecordSetsRecordTypes": [c["ResourceRecordSet"]["Type"] for c in changes],
                "route53:ChangeResourceRecordSetsActions": [c["Action"] for c in changes],
            }
            yield "route53:ChangeResourceRecordSets", zone, context
        else:
            yield f"route53:{operation}", zone, {}
    elif service == "ssm":
        if operation == "GetParametersByPath":
            yield "ssm:GetParametersByPath", f"arn:aws:ssm:{region}:parameter{params['Path']}", {}
        else:
            for name in params["Names"]:
                yield f"ssm:{operation}", f"arn:aws:ssm:{region}:parameter{name}", {}
    elif service == "s3":
        bucket = params["Bucket"]
        if operation == "ListObjectsV2":  # https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html
            yield "s3:ListBucket", f"arn:aws:s3:::{bucket}", {}
        elif operation == "DeleteObjects":  # s3:DeleteObject per key: .../API_DeleteObjects.html
            for item in params["Delete"]["Objects"]:
                yield "s3:DeleteObject", f"arn:aws:s3:::{bucket}/{item['Key']}", {}
        else:
            yield f"s3:{operation}", f"arn:aws:s3:::{bucket}", {}
    elif service == "cloudformation":
        yield f"cloudformation:{operation}", str(params["StackName"]), {}
    else:
        raise AssertionError(f"no IAM mapping for {service}:{operation}")


class StackResolver(DeployedResolver):
    """DeployedResolver, with the attributes of what `deploy` made too."""

    def get_att(self, name: str, attribute: str) -> str:
        target = self.physical.get(name)
        if isinstance(target, str):
            if (name, attribute) == ("LoadBalancerResource", "LoadBalancerFullName"):
                return target.split(":loadbalancer/", 1)[1]
            if (name, attribute) == ("WorkdirBucket", "Arn"):
                return f"arn:aws:s3:::{target}"
            if attribute == "Arn" and self.resources[name]["Type"] == "AWS::Logs::LogGroup":
                return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{target}:*"
        return super().get_att(name, attribute)


def denied(calls: list[Call], translated: dict[str, Any], physical: dict[str, Any]) -> list[str]:
    """The calls (one line per resource) the function's role does not allow."""
    resolver = StackResolver(translated, physical)
    role = function_role(translated, "UninstallFunction")
    statements = list(role_statements(translated, role))
    for body in translated["Resources"].values():
        live = "Condition" not in body or resolver.condition(body["Condition"])
        if live and body["Type"] == "AWS::IAM::RolePolicy" and body["Properties"]["RoleName"] == {"Ref": role}:
            statements.extend(as_list(body["Properties"]["PolicyDocument"]["Statement"]))
    policy = [{"Version": "2012-10-17", "Statement": [resolver.resolve(s) for s in statements]}]
    principal = f"arn:aws:iam::{ACCOUNT}:role/{resolver.physical_id(role)}"
    refused = []
    for call in calls:
        for action, resource, context in requests(call):
            if not allowed(Request(principal, action, resource, context), policy):
                refused.append(f"{action} on {resource} {context}")
    return refused
