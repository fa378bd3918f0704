"""The stack's IAM as CloudFormation would create it: each function's role, its policies, the resource
policies, and which functions run in the VPC; from the translated template.yaml.

Bindings. The template names its resources by logical id (Table, KickQueue, SecretsKey ...) and the
suite creates them under names of its own (`fleetkeeper-test`, a queue per test, a moto key). A
request is judged against the policies resolved with the names *the request uses* bound to the
logical resources of their kind (the table in the request is the stack's table, the queue its
queue, the stack key in its tags the stack's key). The layer therefore decides whether a call of
this shape, on this kind of resource, with these tags and condition keys, is allowed to the calling
function of *a* stack: every action, every caller-side permission, every resource type and path,
every condition. That one stack's functions cannot reach another stack's resources is proven on the
template itself (tests/stacks/), with the evaluator, not here.

Configuration. The template is translated with every optional feature that adds grants on (a load
balancer, a domain with a hosted zone and a certificate, an EBS key) and with both replica
identities (owner and shared): a function's policy is the union of those translations' policies.
Feature-specific *denials* are what tests/template/ checks per parameter set.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from tests.support import cfn

ACCOUNT = cfn.ACCOUNT
REGION = cfn.REGION

# Every optional grant on; the two identities translated separately (their grants are alternatives).
FEATURES: dict[str, Any] = {
    "LoadBalancer": "internal",
    "LoadBalancerSubnetIds": "subnet-0aaaaaaaaaaaaaaa1,subnet-0bbbbbbbbbbbbbbb2",
    "DomainName": "fleetkeeper.example.com",
    "HostedZoneId": "Z0000000000000000000A",
    "CertificateArn": f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/00000000-0000-0000-0000-000000000000",
    "EbsKmsKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/00000000-0000-0000-0000-0000000000eb",
    "AdoptUntaggedReplicas": "true",
}
IDENTITIES = ("owner", "shared")

_STACK_KEY_OF_TEMPLATE = "0123456789ab"  # cfn.PSEUDO's StackId ends in ...-0123456789ab


@functools.cache
def _translations() -> tuple[dict[str, Any], ...]:
    return tuple(cfn.translate(overrides={**FEATURES, "ReplicaIdentity": identity}) for identity in IDENTITIES)


@dataclass(frozen=True)
class Bindings:
    """Physical names of the stack's resources, as the request under judgement uses them."""

    stack_key: str = _STACK_KEY_OF_TEMPLATE
    stack_arn: str | None = None  # the stack's id (then `stack_key` is its last group)
    table: str | None = None
    bucket: str | None = None
    queue: str | None = None
    queue_id: str | None = None  # the logical id of the queue `queue` names (one of the stack's queues)
    secrets_key: str | None = None  # a key ARN
    domain: str | None = None
    hosted_zone: str | None = None
    alb_full_name: str | None = None  # app/<name>/<id> of the stack's own load balancer
    replica_role_arn: str | None = None
    replica_policy_arn: str | None = None
    ebs_key: str | None = None


class BoundResolver(cfn.Resolver):
    """cfn.Resolver with the bindings' names in place of its invented physical ids."""

    def __init__(self, translated: dict[str, Any], bindings: Bindings) -> None:
        super().__init__(translated)
        self.bindings = bindings
        values = dict(self.values)
        stack_id = bindings.stack_arn or (
            f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{cfn.STACK}/1a2b3c4d-5e6f-4a8b-9c0d-{bindings.stack_key}"
        )
        values["AWS::StackId"] = stack_id
        if bindings.domain:
            values["DomainName"] = bindings.domain
        if bindings.hosted_zone:
            values["HostedZoneId"] = bindings.hosted_zone
        if bindings.replica_role_arn:
            values["ReplicaRoleArn"] = bindings.replica_role_arn
        if bindings.ebs_key:
            values["EbsKmsKeyArn"] = bindings.ebs_key
        self.values = values

    def physical_id(self, logical_id: str) -> str:
        kind = self.resources[logical_id]["Type"]
        b = self.bindings
        if kind == "AWS::DynamoDB::Table" and b.table:
            return b.table
        if kind == "AWS::S3::Bucket" and logical_id == "WorkdirBucket" and b.bucket:
            return b.bucket
        if kind == "AWS::SQS::Queue" and b.queue and logical_id == b.queue_id:
            return b.queue
        return super().physical_id(logical_id)

    def ref(self, name: str) -> Any:
        if name in self.resources:
            kind = self.resources[name]["Type"]
            if kind == "AWS::IAM::ManagedPolicy" and name == "ReplicaOwnerPolicy" and self.bindings.replica_policy_arn:
                return self.bindings.replica_policy_arn
            if kind == "AWS::KMS::Key" and name == "SecretsKey" and self.bindings.secrets_key:
                return self.bindings.secrets_key.rsplit("/", 1)[-1]
        return super().ref(name)

    def get_att(self, name: str, attribute: str) -> str:
        kind = self.resources[name]["Type"]
        b = self.bindings
        if kind == "AWS::KMS::Key" and name == "SecretsKey" and attribute == "Arn" and b.secrets_key:
            return b.secrets_key
        if (
            kind == "AWS::ElasticLoadBalancingV2::LoadBalancer"
            and b.alb_full_name
            and attribute == "LoadBalancerFullName"
        ):
            return b.alb_full_name
        return super().get_att(name, attribute)


@dataclass
class RolePolicies:
    role_arn: str
    tags: dict[str, str]
    identity: list[dict[str, Any]] = field(default_factory=list)
    boundary: dict[str, Any] | None = None


def _role_name(resolver: cfn.Resolver, role_id: str) -> str:
    props = resolver.resources[role_id].get("Properties") or {}
    if "RoleName" in props:
        return str(resolver.resolve(props["RoleName"]))
    return f"{cfn.STACK}-{role_id}-ABC123"


def _targets_role(value: Any, role_id: str) -> bool:
    names = value if isinstance(value, list) else [value]
    return any(cfn.refers_to(item, role_id) for item in names)


def _condition_holds(resolver: cfn.Resolver, body: dict[str, Any]) -> bool:
    condition = body.get("Condition")
    return condition is None or resolver.condition(condition)


class StackPolicies:
    """The resolved policies of one set of bindings (cached: `for_bindings`)."""

    def __init__(self, bindings: Bindings) -> None:
        self.bindings = bindings
        self.resolvers = [BoundResolver(t, bindings) for t in _translations()]
        # Resolved once per resource: every call on it asks again.
        self._resource_policies: dict[str, tuple[list[dict[str, Any]], bool]] = {}
        self._targets: list[tuple[str, tuple[str, ...], dict[str, Any]]] | None = None

    def function_role(self, function: str) -> RolePolicies:
        first = self.resolvers[0]
        role_id = cfn.function_role(first.translated, function)
        name = _role_name(first, role_id)
        role_props = first.resources[role_id]["Properties"]
        tags = {str(t["Key"]): str(first.resolve(t["Value"])) for t in role_props.get("Tags") or []}
        policies = RolePolicies(role_arn=f"arn:aws:iam::{ACCOUNT}:role/{name}", tags=tags)
        for resolver in self.resolvers:
            resources = resolver.resources
            if not _condition_holds(resolver, resources[role_id]):
                continue
            props = resources[role_id]["Properties"]
            policies.identity += [resolver.resolve(p["PolicyDocument"]) for p in props.get("Policies") or []]
            for arn in props.get("ManagedPolicyArns") or []:
                policies.identity.append(self._managed(resolver, arn))
            for body in resources.values():
                kind, p = body["Type"], body.get("Properties") or {}
                if not _condition_holds(resolver, body):
                    continue
                attached = (kind == "AWS::IAM::RolePolicy" and _targets_role(p.get("RoleName"), role_id)) or (
                    kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")
                    and _targets_role(p.get("Roles") or [], role_id)
                )
                if attached:
                    policies.identity.append(resolver.resolve(p["PolicyDocument"]))
        return policies

    @staticmethod
    def _managed(resolver: cfn.Resolver, arn: Any) -> dict[str, Any]:
        resolved = resolver.resolve(arn)
        for lid, body in resolver.resources.items():
            if body["Type"] == "AWS::IAM::ManagedPolicy" and resolver.ref(lid) == resolved:
                return resolver.resolve(body["Properties"]["PolicyDocument"])  # type: ignore[no-any-return]
        raise AssertionError(f"a managed policy the layer has no document of: {resolved}")

    def in_vpc(self, function: str) -> bool:
        props = self.resolvers[0].resources[function]["Properties"]
        return bool(props.get("VpcConfig"))

    def resource_policies(self, arn: str) -> tuple[list[dict[str, Any]], bool]:
        """The resource-based policies that apply to `arn` (and whether they are a KMS key policy)."""
        if arn not in self._resource_policies:
            self._resource_policies[arn] = self._find_resource_policies(arn)
        return self._resource_policies[arn]

    def _find_resource_policies(self, arn: str) -> tuple[list[dict[str, Any]], bool]:
        found: list[dict[str, Any]] = []
        key_policy = False
        for kind, targets, document in self._resource_policy_targets():
            if kind == "AWS::DynamoDB::Table":
                hit = any(arn == t or arn.startswith(t + "/index/") for t in targets)
            elif kind == "AWS::S3::BucketPolicy":
                hit = any(arn == t or arn.startswith(t + "/") for t in targets)
            else:
                hit = arn in targets
            if hit:
                found.append(document)
                key_policy = key_policy or kind == "AWS::KMS::Key"
        return found, key_policy

    def _resource_policy_targets(self) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
        """(kind, the ARNs it is for, the policy) of every resource-based policy of the template, in
        the template's order: resolved once, not for every new ARN a call names (a test of 1,000
        services names 1,000 target groups)."""
        if self._targets is not None:
            return self._targets
        resolver = self.resolvers[0]
        targets: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
        for lid, body in resolver.resources.items():
            kind, props = body["Type"], body.get("Properties") or {}
            if not _condition_holds(resolver, body):
                continue
            if kind == "AWS::DynamoDB::Table" and props.get("ResourcePolicy"):
                document = resolver.resolve(props["ResourcePolicy"]["PolicyDocument"])
                targets.append((kind, (resolver.get_att(lid, "Arn"),), document))
            elif kind == "AWS::SQS::QueuePolicy":
                queues = tuple(_queue_arn(url) for url in resolver.resolve(props["Queues"]))
                targets.append((kind, queues, resolver.resolve(props["PolicyDocument"])))
            elif kind == "AWS::S3::BucketPolicy":
                bucket = f"arn:aws:s3:::{resolver.resolve(props['Bucket'])}"
                targets.append((kind, (bucket,), resolver.resolve(props["PolicyDocument"])))
            elif kind == "AWS::KMS::Key":
                targets.append((kind, (resolver.get_att(lid, "Arn"),), resolver.resolve(props["KeyPolicy"])))
        self._targets = targets
        return targets


def queue_ids() -> list[str]:
    return sorted(cfn.resources_of_type(_translations()[0], "AWS::SQS::Queue"))


def _queue_arn(url: str) -> str:
    # https://sqs.<region>.amazonaws.com/<account>/<name>
    parts = url.rstrip("/").split("/")
    region = re.sub(r"^sqs\.|\.amazonaws\.com.*$", "", parts[2]) if len(parts) > 2 else REGION
    return f"arn:aws:sqs:{region}:{parts[-2]}:{parts[-1]}"


def queue_arn(url: str) -> str:
    return _queue_arn(url)


@functools.lru_cache(maxsize=256)
def for_bindings(bindings: Bindings) -> StackPolicies:
    return StackPolicies(bindings)


@functools.lru_cache(maxsize=64)
def function_policies(function: str, bindings: Bindings) -> RolePolicies:
    return for_bindings(bindings).function_role(function)
