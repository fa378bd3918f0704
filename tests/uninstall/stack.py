"""A deployed stack in moto, what its code made outside CloudFormation, and CloudFormation's delete.

`deploy` makes, in this test's moto, the template resources whose deletion AWS can refuse because of
what the code made (the ALB, its security group and the replicas' ingress from it, the domain's
listener, WakeTargetGroup, ReplicaOwnerPolicy, WorkdirBucket, the replicas' log group; the table is
the world's), with the names and tags template.yaml gives them. `run_the_code` then has the real
code make what it makes at run time: services launched by the reconciler with their owners' roles,
their endpoints through the alb adapter (past the template's ALB onto pools, with Route 53
records), one of them routed to the wake target (a service at zero), secrets, workdir copies and
the api's HMAC key. Then `fleetkeeper down --all`: every service deleted, nothing run after it.

`CloudFormationDelete` deletes the translated template's resources in CloudFormation's order: a
resource goes only once every resource referring to it (Ref, GetAtt, Sub, DependsOn) is gone, in
waves of what may go together (CloudFormation deletes those in parallel, so each wave's refusals are
judged on the state at its start). It models the refusals AWS makes and moto lacks (IAM DeletePolicy
while the policy is attached or a boundary: DeleteConflict; EC2 DeleteSecurityGroup while a load
balancer, a network interface or another group's rule uses the group: DependencyViolation) and those
moto has (ELB DeleteTargetGroup while a listener or rule forwards to it: ResourceInUse; S3
DeleteBucket while objects remain: BucketNotEmpty), checked here explicitly. A resource type whose
deletion nothing outside CloudFormation can hold up (functions, queues, alarms, roles' inline
policies...) is deleted without an AWS call. A refusal leaves the resource and everything it
depends on in place, and the stack DELETE_FAILED, as CloudFormation does.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any

from fleetkeeper.api.request_hmac import key_parameter
from fleetkeeper.model import EndpointConfig
from fleetkeeper.reconciler.balancers.alb import AlbBalancer, PoolQuotas
from fleetkeeper.replicas.identity import owner_scope
from fleetkeeper.replicas.secrets import SecretStore, parameter_prefix
from fleetkeeper.replicas.workdirs import S3WorkdirStore
from fleetkeeper.settings import AlbSettings
from fleetkeeper.spec.service import ServiceSpec
from tests.strict_aws import active_controller
from tests.support.cfn import PSEUDO, Resolver
from tests.support.reconciler_world import raw_client, spec_dict

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.reconciler_world import World

STACK = "0123456789ab"  # what template.yaml derives from tests.support.cfn's AWS::StackId
STACK_ID = PSEUDO["AWS::StackId"]
OWNERS = ("arn:aws:iam::123456789012:role/team-a-ci", "arn:aws:iam::123456789012:role/team-b-ci")
CONFIG = EndpointConfig(port=8080, policy="least_load", drain_seconds=30, health_path="/")
WAKE_FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:fk-wake"
POLICY_DOCUMENT = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}],
}


@dataclass
class Deployed:
    """One stack's template resources in moto: logical id -> physical id, and its ALB as the code sees it."""

    stack: str
    physical: dict[str, Any]
    alb: AlbBalancer
    table: str
    bucket: str
    policy_arn: str
    replica_group: str
    zone_id: str | None
    domain: str | None


def deploy(
    *,
    stack: str = STACK,
    table: str,
    domain: str | None = None,
    zone_id: str | None = None,
    name: str = "tpl",
    cidr: str = "10.42",
) -> Deployed:
    """The template's resources as CloudFormation made them (names and tags as template.yaml has them)."""
    ec2, elbv2 = raw_client("ec2"), raw_client("elbv2")
    vpc = ec2.create_vpc(CidrBlock=f"{cidr}.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"{cidr}.{n}.0/24", AvailabilityZone=f"us-east-1{zone}")["Subnet"][
            "SubnetId"
        ]
        for n, zone in ((1, "a"), (2, "b"))
    ]
    # ReplicaSecurityGroupIds is a parameter (the network stack's); the ingress from the ALB is the template's.
    replica_group = ec2.create_security_group(GroupName=f"{name}-replicas", Description="replicas", VpcId=vpc)[
        "GroupId"
    ]
    alb_group = ec2.create_security_group(GroupName=f"{name}-alb", Description="fleetkeeper endpoints", VpcId=vpc)[
        "GroupId"
    ]
    ec2.authorize_security_group_ingress(
        GroupId=replica_group,
        IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 1024, "ToPort": 65535, "UserIdGroupPairs": [{"GroupId": alb_group}]}
        ],
    )
    made = elbv2.create_load_balancer(
        Name=f"{name}-alb", Subnets=subnets, SecurityGroups=[alb_group], Scheme="internal", Type="application"
    )["LoadBalancers"][0]
    physical: dict[str, Any] = {
        "LoadBalancerSecurityGroup": alb_group,
        "ReplicaFromLoadBalancerIngress": (replica_group, alb_group),
        "LoadBalancerResource": made["LoadBalancerArn"],
    }
    listener = None
    if domain:
        listener = elbv2.create_listener(
            LoadBalancerArn=made["LoadBalancerArn"],
            Protocol="HTTP",
            Port=80,
            DefaultActions=[
                {
                    "Type": "fixed-response",
                    "FixedResponseConfig": {"StatusCode": "404", "ContentType": "application/json"},
                }
            ],
        )["Listeners"][0]["ListenerArn"]
        physical["HttpListener"] = listener
    wake = elbv2.create_target_group(
        Name=f"fkwake-{stack}", TargetType="lambda", Tags=[{"Key": "fleetkeeper:stack", "Value": stack}]
    )["TargetGroups"][0]["TargetGroupArn"]
    elbv2.register_targets(TargetGroupArn=wake, Targets=[{"Id": WAKE_FUNCTION}])
    physical["WakeTargetGroup"] = wake
    policy = raw_client("iam").create_policy(
        PolicyName=f"{name}-ReplicaOwnerPolicy", PolicyDocument=json.dumps(POLICY_DOCUMENT)
    )["Policy"]["Arn"]
    physical["ReplicaOwnerPolicy"] = policy
    bucket = f"{name}-workdirbucket-{stack}"
    raw_client("s3").create_bucket(Bucket=bucket)
    physical["WorkdirBucket"] = bucket
    logs = raw_client("logs")
    for logical, group in (
        ("ReplicaLogGroup", f"/fleetkeeper/{name}/replicas"),
        ("UninstallLogGroup", f"/aws/lambda/{name}-uninstall"),
    ):
        logs.create_log_group(logGroupName=group)
        physical[logical] = group
    physical["Table"] = table
    settings = AlbSettings(
        arn=made["LoadBalancerArn"],
        dns_name=made["DNSName"],
        vpc_id=vpc,
        listener_arn=listener,
        domain_name=domain,
        stack_id=stack,
        wake_target_group=wake,
        subnet_ids=tuple(subnets),
        security_group_id=alb_group,
        wake_function_arn=WAKE_FUNCTION,
        hosted_zone_id=zone_id,
    )
    # One service per load balancer: three services make two pools.
    alb = AlbBalancer(settings, quotas=PoolQuotas(listeners=1, rules=1))
    return Deployed(stack, physical, alb, table, bucket, policy, replica_group, zone_id, domain)


def hosted_zone(domain: str) -> str:
    """The user's hosted zone (a parameter, not the stack's), with the user's wildcard record."""
    route53 = raw_client("route53")
    zone = route53.create_hosted_zone(Name=domain, CallerReference=domain)["HostedZone"]["Id"].rsplit("/", 1)[-1]
    # docs/DEPLOY.md: a stack with a hosted zone has a NAT (Route 53 has no VPC endpoint).
    controller = active_controller()
    if controller is not None:
        controller.nat_gateway = True
    route53.change_resource_record_sets(
        HostedZoneId=zone,
        ChangeBatch={
            "Changes": [
                {
                    "Action": "CREATE",
                    "ResourceRecordSet": {
                        "Name": f"*.{domain}",
                        "Type": "CNAME",
                        "TTL": 60,
                        "ResourceRecords": [{"Value": "the-users-own.example.org"}],
                    },
                }
            ]
        },
    )
    return str(zone)


def run_the_code(
    world: World,
    stack: Deployed,
    monkeypatch: Any,
    *,
    services: int = 3,
    waking: bool = True,
    identity: str = "owner",
) -> dict[str, str]:
    """What the stack's code makes while it runs, then `fleetkeeper down --all`; {service: uid}."""
    from fleetkeeper.api import request_hmac

    monkeypatch.setenv("FLEETKEEPER_REPLICA_IDENTITY", identity)
    monkeypatch.setenv("FLEETKEEPER_REPLICA_POLICY_ARN", stack.policy_arn)
    monkeypatch.setenv("FLEETKEEPER_STACK_ID", stack.stack)
    monkeypatch.setenv("WORKDIR_BUCKET", stack.bucket)
    monkeypatch.setenv("TABLE_NAME", stack.table)
    world.restart()
    uids: dict[str, str] = {}
    for n in range(services):
        spec = ServiceSpec.model_validate(spec_dict(world.server.port, replicas=1))
        uids[f"svc{n}"] = world.commands.create(f"svc{n}", spec, owner=OWNERS[n % 2]).service.uid
    # The owners' roles and profiles, and the replicas launched with them (strict IAM: a profile must
    # settle before EC2 takes it).
    if identity == "owner":
        for owner in OWNERS[: min(services, 2)]:
            make_identity(stack.stack, stack.policy_arn, owner, stack.table)
    world.run()
    from tests.strict_aws import active_controller

    controller = active_controller()
    if controller is not None:
        controller.iam.settle()
    world.converge()
    assert len(world.instances()) == services
    # Endpoints: the template's ALB, then pools (with a domain and a zone, records for the pools').
    records = {name: stack.alb.ensure(name, uid, CONFIG, None) for name, uid in uids.items()}
    if waking:  # a service at zero: its route forwards to the wake target
        stack.alb.route(records["svc0"], waking=True)
    # Secrets, workdir copies (uploaded, then adopted), the api's HMAC key.
    secrets = SecretStore(parameter_prefix(stack.table), stack_id=stack.stack)
    workdirs = S3WorkdirStore(stack.bucket, stack_id=stack.stack)
    packed = b"a packed workdir"
    digest = "sha256:" + hashlib.sha256(packed).hexdigest()
    raw_client("s3").put_object(
        Bucket=stack.bucket, Key=f"uploads/{hashlib.sha256(packed).hexdigest()}.tar.gz", Body=packed
    )
    for n, (name, uid) in enumerate(uids.items()):
        secrets.put(name, uid, "ref0", {"TOKEN": f"secret-{n}"}, owner=OWNERS[n % 2])
        workdirs.adopt(digest, name, uid, owner=OWNERS[n % 2])
    request_hmac.forget_keys()
    request_hmac.RequestHmac(key_parameter(stack.table), stack_id=stack.stack).digest({"a": "b"})
    # `fleetkeeper down --all`, and `sam delete` right after: the reconciler runs no more.
    for name in uids:
        world.delete(name)
    return uids


def make_identity(stack_id: str, policy_arn: str, owner: str, table: str | None = None) -> str:
    """An owner's replica role and profile as the stack's code makes them; the role's name.

    Whichever part of the code makes them: the reconciler's `ReplicaIdentities.profile` (before the
    dispatcher made identities), or the dispatcher's `IdentityKeeper`, which also records them in the
    table (`table`; None: the role and profile only, no record)."""
    import importlib

    from fleetkeeper.replicas import identity

    scope = owner_scope(owner)
    assert scope is not None
    identities = identity.ReplicaIdentities(stack_id, policy_arn)
    keeper = getattr(identity, "IdentityKeeper", None)
    if keeper is not None and table is not None:
        records = importlib.import_module("fleetkeeper.store.identities").IdentityRecords
        from fleetkeeper.store.table import Table

        keeper(identities, records(Table(table))).ensure([owner])
    else:
        maker = "make" if hasattr(identities, "make") else "profile"
        getattr(identities, maker)(scope, owner)
    return identity.role_name(stack_id, scope)


# --- what is left of a stack --------------------------------------------------------------------------


def leftovers(stack: Deployed) -> dict[str, list[str]]:
    """Everything of `stack` (its identity: tags, names, path, table, bucket) that still exists."""
    ec2, elbv2, iam, ssm, s3 = (raw_client(s) for s in ("ec2", "elbv2", "iam", "ssm", "s3"))
    found: dict[str, list[str]] = {}
    reservations = ec2.describe_instances(
        Filters=[
            {"Name": "tag:fleetkeeper:stack", "Values": [stack.stack]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped", "shutting-down"]},
        ]
    )["Reservations"]
    found["instances"] = [i["InstanceId"] for r in reservations for i in r["Instances"]]
    found["load balancers"] = [
        b["LoadBalancerName"]
        for b in elbv2.describe_load_balancers()["LoadBalancers"]
        if b["LoadBalancerName"].startswith(f"fk-{stack.stack}-") or b["LoadBalancerArn"] == stack.alb.settings.arn
    ]
    found["target groups"] = [
        g["TargetGroupName"]
        for g in elbv2.describe_target_groups()["TargetGroups"]
        if g["TargetGroupName"].startswith((f"fk-{stack.stack}-", f"fkwake-{stack.stack}"))
    ]
    # Filtered by path here too: moto ignores ListInstanceProfiles' PathPrefix.
    path = f"/fleetkeeper/{stack.stack}/"
    found["roles"] = [r["RoleName"] for r in iam.list_roles(PathPrefix=path)["Roles"] if r["Path"] == path]
    found["instance profiles"] = [
        p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"] if p["Path"] == path
    ]
    found["policies"] = [p["Arn"] for p in iam.list_policies(Scope="Local")["Policies"] if p["Arn"] == stack.policy_arn]
    found["parameters"] = [
        p["Name"]
        for path in (parameter_prefix(stack.table), f"/fleetkeeper-api/{stack.table}")
        for p in ssm.get_parameters_by_path(Path=path, Recursive=True)["Parameters"]
    ]
    found["buckets"] = [b["Name"] for b in s3.list_buckets()["Buckets"] if b["Name"] == stack.bucket]
    groups = [g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]]
    found["security groups"] = [g for g in groups if g == stack.physical["LoadBalancerSecurityGroup"]]
    found["records"] = []
    if stack.zone_id:
        for record in raw_client("route53").list_resource_record_sets(HostedZoneId=stack.zone_id)["ResourceRecordSets"]:
            target = str((record.get("AliasTarget") or {}).get("DNSName", ""))
            if f"fk-{stack.stack}-" in target:
                found["records"].append(record["Name"])
    return {kind: names for kind, names in found.items() if names}


def owner_scopes() -> set[str]:
    return {s for s in (owner_scope(o) for o in OWNERS) if s}


# --- CloudFormation's delete --------------------------------------------------------------------------


class DeployedResolver(Resolver):
    """The translated template's intrinsics, with the physical ids of what `deploy` made."""

    def __init__(self, translated: dict[str, Any], physical: dict[str, Any]) -> None:
        super().__init__(translated)
        self.physical = physical

    def ref(self, name: str) -> Any:
        if name in self.physical and isinstance(self.physical[name], str):
            return self.physical[name]
        return super().ref(name)


def live(translated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The resources CloudFormation made: those whose Condition holds."""
    resolver = Resolver(translated)
    return {
        lid: body
        for lid, body in translated["Resources"].items()
        if "Condition" not in body or resolver.condition(body["Condition"])
    }


def references(value: Any, resolver: Resolver, ids: set[str]) -> set[str]:
    """The resources `value` refers to (Ref, GetAtt, Sub), in the branches its conditions take."""
    found: set[str] = set()
    if isinstance(value, list):
        for item in value:
            found |= references(item, resolver, ids)
    elif isinstance(value, dict):
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Fn::If":
                return references(arg[1] if resolver.condition(arg[0]) else arg[2], resolver, ids)
            if key == "Ref":
                return {arg} & ids
            if key == "Fn::GetAtt":
                return {(arg if isinstance(arg, list) else arg.split("."))[0]} & ids
            if key == "Fn::Sub":
                text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
                import re

                named = {m.split(".")[0] for m in re.findall(r"\$\{([^!}][^}]*)\}", text)}
                return (named & ids) | references(variables, resolver, ids)
        for item in value.values():
            found |= references(item, resolver, ids)
    return found


def dependencies(translated: dict[str, Any]) -> dict[str, set[str]]:
    """{resource: the resources it depends on} for the resources CloudFormation made."""
    resources = live(translated)
    ids = set(resources)
    resolver = Resolver(translated)
    graph: dict[str, set[str]] = {}
    for lid, body in resources.items():
        depends_on = body.get("DependsOn", [])
        explicit = {depends_on} if isinstance(depends_on, str) else set(depends_on)
        graph[lid] = (references(body.get("Properties", {}), resolver, ids) | (explicit & ids)) - {lid}
    return graph


def delete_waves(graph: dict[str, set[str]]) -> list[list[str]]:
    """CloudFormation's delete order: each wave holds the resources no remaining resource depends on."""
    remaining = set(graph)
    waves: list[list[str]] = []
    while remaining:
        wave = sorted(r for r in remaining if not any(r in graph[other] for other in remaining if other != r))
        if not wave:
            raise AssertionError(f"a dependency cycle among {sorted(remaining)}")
        waves.append(wave)
        remaining -= set(wave)
    return waves


@dataclass
class Outcome:
    status: str  # DELETE_COMPLETE or DELETE_FAILED
    failures: dict[str, str] = field(default_factory=dict)  # logical id -> AWS's refusal
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # DeletionPolicy Retain


class CloudFormationDelete:
    """`sam delete` of the translated template over what `deploy` made."""

    def __init__(
        self,
        translated: dict[str, Any],
        physical: dict[str, Any],
        custom_resource: Callable[[str, dict[str, Any]], tuple[bool, str]] | None,
    ) -> None:
        self.translated = translated
        self.physical = physical
        self.custom_resource = custom_resource
        self.resolver = DeployedResolver(translated, physical)
        self.graph = dependencies(translated)

    def run(self) -> Outcome:
        outcome = Outcome("DELETE_COMPLETE")
        gone: set[str] = set()
        for wave in delete_waves(self.graph):
            # CloudFormation deletes a wave's resources in parallel: each is judged on the state at the
            # wave's start; one whose dependents were not all deleted stays.
            ready = [lid for lid in wave if all(d in gone for d in self._dependents(lid))]
            refusals = {lid: self.refusal(lid) for lid in ready}
            for lid in ready:
                body = self.translated["Resources"][lid]
                if refusals[lid]:
                    outcome.failures[lid] = str(refusals[lid])
                    continue
                if body.get("DeletionPolicy") == "Retain":
                    outcome.kept.append(lid)
                    gone.add(lid)
                    continue
                failure = self.delete(lid)
                if failure:
                    outcome.failures[lid] = failure
                    continue
                outcome.deleted.append(lid)
                gone.add(lid)
        if outcome.failures or len(gone) != len(self.graph):
            outcome.status = "DELETE_FAILED"
        return outcome

    def _dependents(self, lid: str) -> list[str]:
        return [other for other, deps in self.graph.items() if lid in deps]

    # -- AWS's refusals ------------------------------------------------------------------------------

    def refusal(self, lid: str) -> str | None:
        kind = self.translated["Resources"][lid]["Type"]
        target = self.physical.get(lid)
        if target is None:
            return None
        if kind == "AWS::IAM::ManagedPolicy":
            iam = raw_client("iam")
            attached = iam.list_entities_for_policy(PolicyArn=target)
            entities = attached["PolicyRoles"] + attached["PolicyUsers"] + attached["PolicyGroups"]
            bounded = [
                r["RoleName"]
                for r in iam.list_roles()["Roles"]
                if (r.get("PermissionsBoundary") or {}).get("PermissionsBoundaryArn") == target
            ]
            if entities or bounded:
                return "DeleteConflict: Cannot delete a policy attached to entities."
        if kind == "AWS::EC2::SecurityGroup":
            ec2, elbv2 = raw_client("ec2"), raw_client("elbv2")
            users = [
                b["LoadBalancerName"]
                for b in elbv2.describe_load_balancers()["LoadBalancers"]
                if target in b.get("SecurityGroups", [])
            ]
            interfaces = ec2.describe_network_interfaces(Filters=[{"Name": "group-id", "Values": [target]}])[
                "NetworkInterfaces"
            ]
            referring = [
                g["GroupId"]
                for g in ec2.describe_security_groups()["SecurityGroups"]
                if g["GroupId"] != target
                and any(
                    pair.get("GroupId") == target
                    for p in g.get("IpPermissions", [])
                    for pair in p.get("UserIdGroupPairs", [])
                )
            ]
            if users or interfaces or referring:
                holders = [*users, *referring, *(i["NetworkInterfaceId"] for i in interfaces)]
                return f"DependencyViolation: resource {target} has a dependent object: {holders}"
        if kind == "AWS::ElasticLoadBalancingV2::TargetGroup" and self._forwarded_to(target):
            return f"ResourceInUse: Target group '{target}' is currently in use by a listener or a rule"
        if kind == "AWS::S3::Bucket" and raw_client("s3").list_objects_v2(Bucket=target).get("KeyCount", 0):
            return "BucketNotEmpty: The bucket you tried to delete is not empty"
        return None

    @staticmethod
    def _forwarded_to(group: str) -> bool:
        elbv2 = raw_client("elbv2")
        for balancer in elbv2.describe_load_balancers()["LoadBalancers"]:
            for listener in elbv2.describe_listeners(LoadBalancerArn=balancer["LoadBalancerArn"])["Listeners"]:
                actions = list(listener.get("DefaultActions", []))
                for rule in elbv2.describe_rules(ListenerArn=listener["ListenerArn"])["Rules"]:
                    actions.extend(rule.get("Actions", []))
                for action in actions:
                    arns = {action.get("TargetGroupArn")} | {
                        g["TargetGroupArn"] for g in (action.get("ForwardConfig") or {}).get("TargetGroups", [])
                    }
                    if group in arns:
                        return True
        return False

    # -- deleting ------------------------------------------------------------------------------------

    def delete(self, lid: str) -> str | None:
        """Delete one resource as CloudFormation would; the failure, if any."""
        body = self.translated["Resources"][lid]
        kind = body["Type"]
        if kind == "AWS::CloudFormation::CustomResource":
            if self.custom_resource is None:
                return None
            properties = self.resolver.resolve(body.get("Properties", {}))
            succeeded, reason = self.custom_resource(lid, properties)
            return None if succeeded else f"custom resource answered FAILED: {reason}"
        target = self.physical.get(lid)
        if target is None:
            return None  # nothing outside CloudFormation can hold it up: deleted, no call modelled
        if kind == "AWS::IAM::ManagedPolicy":
            raw_client("iam").delete_policy(PolicyArn=target)
        elif kind == "AWS::EC2::SecurityGroup":
            raw_client("ec2").delete_security_group(GroupId=target)
        elif kind == "AWS::EC2::SecurityGroupIngress":
            group, source = target
            raw_client("ec2").revoke_security_group_ingress(
                GroupId=group,
                IpPermissions=[
                    {"IpProtocol": "tcp", "FromPort": 1024, "ToPort": 65535, "UserIdGroupPairs": [{"GroupId": source}]}
                ],
            )
        elif kind == "AWS::ElasticLoadBalancingV2::TargetGroup":
            raw_client("elbv2").delete_target_group(TargetGroupArn=target)
        elif kind == "AWS::ElasticLoadBalancingV2::Listener":
            raw_client("elbv2").delete_listener(ListenerArn=target)
        elif kind == "AWS::ElasticLoadBalancingV2::LoadBalancer":
            raw_client("elbv2").delete_load_balancer(LoadBalancerArn=target)
        elif kind == "AWS::S3::Bucket":
            raw_client("s3").delete_bucket(Bucket=target)
        elif kind == "AWS::Logs::LogGroup":
            raw_client("logs").delete_log_group(logGroupName=target)
        return None


class ResponseEndpoint:
    """CloudFormation's pre-signed response URL: a real HTTP server on 127.0.0.1 that records the PUT."""

    def __init__(self) -> None:
        self.responses: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                length = int(self.headers["Content-Length"])
                outer.responses.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/response?X-Amz-Signature=x"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def delete_event(url: str, properties: dict[str, Any], request_type: str = "Delete") -> dict[str, Any]:
    from fleetkeeper.uninstall.handler import PHYSICAL_ID

    event: dict[str, Any] = {
        "RequestType": request_type,
        "ResponseURL": url,
        "StackId": STACK_ID,
        "RequestId": "req-1",
        "LogicalResourceId": "UninstallCleanup",
        "ResourceType": "AWS::CloudFormation::CustomResource",
        "ResourceProperties": {"ServiceToken": "arn:fn", **properties},
    }
    if request_type != "Create":
        event["PhysicalResourceId"] = PHYSICAL_ID
    return event
