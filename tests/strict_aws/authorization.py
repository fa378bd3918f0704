"""IAM and the network, as AWS applies them to each call of the stack's functions.

Every attempt a template function makes (tests/strict_aws/callers.py says which) is, before moto
sees it:

1. *reached*: a function in the VPC (its template resource has a VpcConfig: the reconciler) reaches
   only the services infra/network.yaml gives it an endpoint for, unless the test says the VPC has a
   NAT (`StrictAws.nat_gateway`, which docs/DEPLOY.md requires of stacks with a hosted zone). Any
   other service does not answer: the attempt hangs for the client's connect timeout and fails with
   botocore's ConnectTimeoutError, as a connection to an unroutable address does.
   https://docs.aws.amazon.com/vpc/latest/privatelink/aws-services-privatelink-support.html
   https://docs.aws.amazon.com/lambda/latest/dg/configuration-vpc-internet.html
2. *authorized*: each IAM action the call needs, on each resource it names, with the condition keys
   AWS puts in its request context, is decided by tests/support/iam_evaluator.py against the function's role
   (tests/strict_aws/stack_policies.py) and the resource's policy; the actions include those AWS
   checks on the caller's behalf:
   - Elastic Load Balancing checks EC2 permissions of the caller ("Elastic Load Balancing API
     permissions": CreateLoadBalancer needs ec2:DescribeAccountAttributes, DescribeAddresses,
     DescribeInternetGateways, DescribeSecurityGroups, DescribeSubnets, DescribeVpcs and
     iam:CreateServiceLinkedRole; CreateTargetGroup ec2:DescribeInternetGateways and DescribeVpcs;
     RegisterTargets ec2:DescribeInstances, DescribeInternetGateways, DescribeSubnets, DescribeVpcs),
     https://docs.aws.amazon.com/elasticloadbalancing/latest/userguide/elb-api-permissions.html
     and tagging on creation needs elasticloadbalancing:AddTags with elasticloadbalancing:CreateAction;
     https://docs.aws.amazon.com/elasticloadbalancing/latest/application/tagging-resources-api-permissions.html
   - RunInstances: the instance, volume, image, subnet, security group and network interface (and
     the spot request) resources, ec2:CreateTags with ec2:CreateAction=RunInstances for tags at
     launch, and iam:PassRole (iam:PassedToService ec2.amazonaws.com) on the instance profile's role;
     https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ExamplePolicies_EC2.html
     https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/supported-iam-actions-tagging.html
     https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_use_passrole.html
   - SSM SecureString parameters under a customer managed key: kms:Encrypt (PutParameter) and
     kms:Decrypt (reads WithDecryption) for the caller, with kms:ViaService and the
     PARAMETER_ARN encryption context, decided by the key policy;
     https://docs.aws.amazon.com/systems-manager/latest/userguide/sysman-paramstore-access.html
     https://docs.aws.amazon.com/kms/latest/developerguide/services-parameter-store.html
   - IAM: CreateRole/CreateInstanceProfile with tags need iam:TagRole/iam:TagInstanceProfile;
     AddRoleToInstanceProfile needs iam:PassRole on the role;
     https://docs.aws.amazon.com/IAM/latest/UserGuide/id_tags_roles.html
     https://docs.aws.amazon.com/IAM/latest/APIReference/API_AddRoleToInstanceProfile.html
   - DynamoDB: each item of a transaction or batch is authorized as its single-item action, with
     dynamodb:LeadingKeys; a Query on an index on the index's ARN.
     https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis-iam.html
     https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/specifying-conditions.html
   A denied call answers as its service does: UnauthorizedOperation (EC2, 403),
   AccessDeniedException (DynamoDB, SSM, KMS, CloudWatch Logs: 400), AccessDenied (IAM, ELB, S3,
   Route 53, SQS, CloudWatch: 403), with AWS's message "User: <arn> is not authorized to perform:
   <action> on resource: <arn> because no identity-based policy allows the <action> action" (or
   "with an explicit deny in a <kind> policy").
   https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_access-denied.html

Not modelled: STS GetCallerIdentity needs no permission; the replicas' own calls (replica_boot
signs with the standard library, not botocore: they never reach this layer; their roles are judged
on the template in tests/template/test_replica_identity.py); service-linked roles' existence
(iam:CreateServiceLinkedRole is checked only when the code calls it).
"""

from __future__ import annotations

import re
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.strict_aws import stack_policies
from tests.strict_aws.stack_policies import ACCOUNT, Bindings
from tests.strict_aws.wire import Call, Response, ec2_error, json_error, request_id
from tests.support.iam_evaluator import Decision, Request, evaluate

# The endpoints infra/network.yaml creates (ServiceName com.amazonaws.<region>.<name>), by the first
# label of the host a client calls. tests/strict_aws/test_authorization.py reads them off the file.
VPC_ENDPOINTS = frozenset({"dynamodb", "s3", "ec2", "elasticloadbalancing", "monitoring", "sqs", "ssm", "logs"})


@dataclass(frozen=True)
class Check:
    action: str
    resource: str
    context: dict[str, str | list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Denial:
    function: str
    action: str
    resource: str
    decision: Decision


def endpoint_name(url: str) -> str:
    """The service part of an AWS host: dynamodb.us-east-1.amazonaws.com -> dynamodb,
    bucket.s3.us-east-1.amazonaws.com -> s3, iam.amazonaws.com -> iam."""
    labels = (urlsplit(url).hostname or "").split(".")
    if "amazonaws" not in labels:
        return labels[0]
    prefix = labels[: labels.index("amazonaws")]
    if len(prefix) >= 2 and re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", prefix[-1]):
        return prefix[-2]
    return prefix[-1] if prefix else ""


# -- moto's state, read directly (a client call would come back through the layer) ----------------


def _ec2_backend(region: str) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[ACCOUNT][region]


def _ec2_tags(region: str, resource_id: str) -> dict[str, str]:
    return dict(_ec2_backend(region).tags.get(resource_id, {}))


def _instance_exists(region: str, instance_id: str) -> bool:
    backend = _ec2_backend(region)
    return any(i.id == instance_id for r in backend.reservations.values() for i in r.instances)


def _elb_tags(region: str, arn: str) -> dict[str, str]:
    from moto.elbv2.models import elbv2_backends

    try:
        return dict(elbv2_backends[ACCOUNT][region].tagging_service.get_tag_dict_for_resource(arn))
    except Exception:
        return {}


def _iam() -> Any:
    from moto.iam.models import iam_backends

    return iam_backends[ACCOUNT]["global"]


def _role(name: str) -> Any | None:
    try:
        return _iam().get_role(name)
    except Exception:
        return None


def _profile(name: str) -> Any | None:
    try:
        return _iam().get_instance_profile(name)
    except Exception:
        return None


def _ssm_parameter(region: str, name: str) -> Any | None:
    from moto.ssm.models import ssm_backends

    try:
        return ssm_backends[ACCOUNT][region].get_parameter(name)
    except Exception:
        return None


def _parameters_under(region: str, path: str, recursive: bool) -> list[str]:
    from moto.ssm.models import ssm_backends

    prefix = path.rstrip("/") + "/"
    names = [str(n) for n in ssm_backends[ACCOUNT][region]._parameters if str(n).startswith(prefix)]
    return names if recursive else [n for n in names if "/" not in n[len(prefix) :]]


def _kms_key_arn(region: str, key_id: str) -> str | None:
    """The ARN of a customer managed key named by id, ARN or alias; None for AWS managed keys."""
    if not key_id or key_id.startswith("alias/aws/") or ":alias/aws/" in key_id:
        return None
    from moto.kms.models import kms_backends

    backend = kms_backends[ACCOUNT][region]
    try:
        resolved = backend.any_id_to_key_id(key_id)
        key = backend.keys[resolved]
    except Exception:
        return key_id if key_id.startswith("arn:") else f"arn:aws:kms:{region}:{ACCOUNT}:key/{key_id}"
    return str(key.arn)


# -- request parsing ----------------------------------------------------------------------------


def _tags_context(tags: dict[str, str], prefix: str = "aws:RequestTag/") -> dict[str, str | list[str]]:
    context: dict[str, str | list[str]] = {f"{prefix}{k}": v for k, v in tags.items()}
    if prefix == "aws:RequestTag/":
        context["aws:TagKeys"] = sorted(tags)
    return context


def _resource_tags(tags: dict[str, str]) -> dict[str, str | list[str]]:
    return {f"aws:ResourceTag/{k}": v for k, v in tags.items()}


def _indexed(form: list[tuple[str, str]], prefix: str) -> dict[str, dict[str, str]]:
    """Query-protocol members `<prefix>.<n>.<field>` grouped by n."""
    groups: dict[str, dict[str, str]] = {}
    for key, value in form:
        if key.startswith(prefix + "."):
            rest = key[len(prefix) + 1 :]
            number, _, name = rest.partition(".")
            groups.setdefault(number, {})[name] = value
    return groups


def _members(form: list[tuple[str, str]], prefix: str) -> list[str]:
    pattern = re.compile(re.escape(prefix) + r"\.(member\.)?\d+$")
    return [value for key, value in form if pattern.fullmatch(key)]


def _query_tags(form: list[tuple[str, str]], prefix: str = "Tags.member") -> dict[str, str]:
    return {g["Key"]: g.get("Value", "") for g in _indexed(form, prefix).values() if "Key" in g}


def _ddb_pk(key: dict[str, Any] | None) -> list[str]:
    if not key:
        return []
    value = key.get("PK") or next(iter(key.values()), None)
    if isinstance(value, dict):
        return [str(next(iter(value.values())))]
    return []


class Authorizer:
    """Builds each call's checks and decides them; the binding of names is the request's own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.denials: list[Denial] = []
        self.decided = 0

    # -- per service: (checks, bindings) --

    def checks(self, call: Call, function: str) -> tuple[list[Check], Bindings]:
        region = call.region
        handler = getattr(self, f"_{call.service.replace('-', '_')}", None)
        if handler is None:
            # A service the stack's functions are not expected to call: its action on "*", so a
            # policy that does not grant it denies (and the suite learns of the call).
            return [Check(f"{_prefix(call)}:{call.operation}", "*")], Bindings()
        checks, bindings = handler(call, region, function)
        return checks, bindings

    # DynamoDB
    def _dynamodb(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        body = call.json()
        op = call.operation

        def arn(table: str, index: str | None = None) -> str:
            base = f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{table}"
            return f"{base}/index/{index}" if index else base

        checks: list[Check] = []
        tables: set[str] = set()
        if op in ("TransactWriteItems", "TransactGetItems"):
            kinds = {
                "ConditionCheck": "ConditionCheckItem",
                "Put": "PutItem",
                "Update": "UpdateItem",
                "Delete": "DeleteItem",
                "Get": "GetItem",
            }
            for item in body.get("TransactItems") or []:
                ((kind, spec),) = item.items()
                table = spec["TableName"]
                tables.add(table)
                keys = _ddb_pk(spec.get("Key") or spec.get("Item"))
                checks.append(Check(f"dynamodb:{kinds[kind]}", arn(table), {"dynamodb:LeadingKeys": keys}))
        elif op in ("BatchGetItem", "BatchWriteItem"):
            for table, request in (body.get("RequestItems") or {}).items():
                tables.add(table)
                if op == "BatchGetItem":
                    keys = [k for key in request.get("Keys") or [] for k in _ddb_pk(key)]
                else:
                    keys = [
                        k
                        for entry in request
                        for k in _ddb_pk(
                            (entry.get("PutRequest") or {}).get("Item") or (entry.get("DeleteRequest") or {}).get("Key")
                        )
                    ]
                checks.append(Check(f"dynamodb:{op}", arn(table), {"dynamodb:LeadingKeys": keys}))
        elif op in ("ListStreams", "ListTables", "DescribeLimits"):
            checks.append(Check(f"dynamodb:{op}", "*"))
        elif op in ("DescribeStream", "GetShardIterator", "GetRecords"):
            stream = body.get("StreamArn") or ""
            if op == "GetRecords":
                stream = _stream_of_iterator(body.get("ShardIterator") or "") or stream
            table = stream.split(":table/", 1)[-1].split("/", 1)[0] if ":table/" in stream else ""
            tables.add(table)
            checks.append(Check(f"dynamodb:{op}", _colon_free_stream(stream)))
        else:
            table = body.get("TableName") or ""
            tables.add(table)
            context: dict[str, str | list[str]] = {}
            keys = _ddb_pk(body.get("Key") or body.get("Item"))
            if keys:
                context["dynamodb:LeadingKeys"] = keys
            checks.append(Check(f"dynamodb:{op}", arn(table, body.get("IndexName")), context))
        return checks, Bindings(table=_one(tables))

    def _dynamodb_streams(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        return self._dynamodb(call, region, function)

    # SQS
    def _sqs(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        body = call.json()
        url = body.get("QueueUrl") or ""
        action = {
            "SendMessageBatch": "SendMessage",
            "DeleteMessageBatch": "DeleteMessage",
            "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
        }.get(call.operation, call.operation)
        if call.operation == "GetQueueUrl":
            name = body.get("QueueName") or ""
            return [Check("sqs:GetQueueUrl", f"arn:aws:sqs:{region}:{ACCOUNT}:{name}")], Bindings(queue=name)
        queue_arn = stack_policies.queue_arn(url) if url else "*"
        return [Check(f"sqs:{action}", queue_arn)], Bindings(queue=url.rstrip("/").rsplit("/", 1)[-1] or None)

    # SSM, and KMS on its caller's behalf
    def _ssm(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        body = call.json()
        op = call.operation

        def arn(name: str) -> str:
            name = name.split(":parameter", 1)[-1] if name.startswith("arn:") else name
            account = "" if name.startswith("/aws/service/") else ACCOUNT
            return f"arn:aws:ssm:{region}:{account}:parameter{name if name.startswith('/') else '/' + name}"

        names: list[str] = []
        if op in ("GetParameters", "DeleteParameters"):
            names = list(body.get("Names") or [])
        elif op == "GetParametersByPath":
            names = [body.get("Path") or "/"]
        elif op == "AddTagsToResource" or op == "ListTagsForResource" or op == "RemoveTagsFromResource":
            names = [body.get("ResourceId") or ""]
        elif body.get("Name"):
            names = [body["Name"]]
        context: dict[str, str | list[str]] = {}
        if op == "AddTagsToResource":
            context = _tags_context({t["Key"]: t.get("Value", "") for t in body.get("Tags") or []})
        checks = [Check(f"ssm:{op}", arn(name), context) for name in names] or [Check(f"ssm:{op}", "*")]
        bindings = Bindings(table=_table_of_parameter_path(names))
        secrets_key: str | None = None
        # KMS, for SecureStrings under a customer managed key.
        if op == "PutParameter" and body.get("Type") == "SecureString":
            key = _kms_key_arn(region, body.get("KeyId") or "")
            if key:
                secrets_key = key
                checks.append(_kms_via_ssm("kms:Encrypt", key, arn(names[0]), region))
        if body.get("WithDecryption") and op in (
            "GetParameter",
            "GetParameters",
            "GetParameterHistory",
            "GetParametersByPath",
        ):
            read = (
                _parameters_under(region, names[0], bool(body.get("Recursive")))
                if op == "GetParametersByPath"
                else names
            )
            for name in read:
                parameter = _ssm_parameter(region, name)
                if parameter is not None and parameter.parameter_type == "SecureString":
                    key = _kms_key_arn(region, parameter.keyid or "")
                    if key:
                        secrets_key = key
                        checks.append(_kms_via_ssm("kms:Decrypt", key, arn(name), region))
        if secrets_key:
            bindings = Bindings(table=bindings.table, secrets_key=secrets_key)
        return checks, bindings

    # KMS called directly
    def _kms(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        key = _kms_key_arn(region, call.json().get("KeyId") or "")
        return [Check(f"kms:{call.operation}", key or "*")], Bindings(secrets_key=key)

    # EC2
    def _ec2(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        form = call.form()
        op = call.operation
        base = f"arn:aws:ec2:{region}:{ACCOUNT}"
        if op.startswith(("Describe", "Get")):
            return [Check(f"ec2:{op}", "*")], Bindings()
        if op == "RunInstances":
            return self._run_instances(call, region, form, base)
        if op in ("TerminateInstances", "StopInstances", "StartInstances", "RebootInstances"):
            ids = _members(form, "InstanceId")
            checks = []
            key = None
            for instance in ids:
                if not _instance_exists(region, instance):
                    continue  # EC2 answers InvalidInstanceID.NotFound (moto does too)
                tags = _ec2_tags(region, instance)
                key = key or tags.get("fleetkeeper:stack")
                checks.append(Check(f"ec2:{op}", f"{base}:instance/{instance}", _resource_tags(tags)))
            return checks, Bindings(stack_key=key or stack_policies._STACK_KEY_OF_TEMPLATE)
        if op in ("CreateTags", "DeleteTags"):
            tags = {g["Key"]: g.get("Value", "") for g in _indexed(form, "Tag").values() if "Key" in g}
            checks = []
            for resource in _members(form, "ResourceId"):
                context = {**_tags_context(tags), **_resource_tags(_ec2_tags(region, resource))}
                checks.append(Check(f"ec2:{op}", f"{base}:{_ec2_resource_type(resource)}/{resource}", context))
            return checks, Bindings(stack_key=tags.get("fleetkeeper:stack") or stack_policies._STACK_KEY_OF_TEMPLATE)
        return [Check(f"ec2:{op}", "*")], Bindings()

    def _run_instances(
        self, call: Call, region: str, form: list[tuple[str, str]], base: str
    ) -> tuple[list[Check], Bindings]:
        by_type: dict[str, dict[str, str]] = {}
        for spec in _indexed(form, "TagSpecification").values():
            kind = spec.get("ResourceType", "")
            tags = {}
            for key, value in spec.items():
                match = re.fullmatch(r"Tag\.(\d+)\.Key", key)
                if match:
                    tags[value] = spec.get(f"Tag.{match.group(1)}.Value", "")
            by_type.setdefault(kind, {}).update(tags)
        instance_tags = by_type.get("instance", {})
        stack_key = instance_tags.get("fleetkeeper:stack") or stack_policies._STACK_KEY_OF_TEMPLATE
        spot = any(k.startswith("InstanceMarketOptions.MarketType") and v == "spot" for k, v in form)
        checks = [
            Check("ec2:RunInstances", f"{base}:instance/*", _tags_context(instance_tags)),
            Check("ec2:RunInstances", f"{base}:volume/*", _tags_context(by_type.get("volume", instance_tags))),
            Check("ec2:RunInstances", f"{base}:network-interface/*"),
        ]
        image = call.param("ImageId")
        if image:
            image = image if image.startswith("ami-") else "ami-resolved"
            checks.append(Check("ec2:RunInstances", f"arn:aws:ec2:{region}::image/{image}"))
        subnets = [v for k, v in form if k == "SubnetId" or re.fullmatch(r"NetworkInterface\.\d+\.SubnetId", k)]
        for subnet in subnets:
            checks.append(Check("ec2:RunInstances", f"{base}:subnet/{subnet}"))
        groups = [
            v for k, v in form if re.fullmatch(r"(SecurityGroupId|NetworkInterface\.\d+\.SecurityGroupId)\.\d+", k)
        ]
        for group in groups:
            checks.append(Check("ec2:RunInstances", f"{base}:security-group/{group}"))
        if spot:
            checks.append(
                Check(
                    "ec2:RunInstances",
                    f"{base}:spot-instances-request/*",
                    _tags_context(by_type.get("spot-instances-request", {})),
                )
            )
        for kind, tags in by_type.items():
            if tags:
                context = {**_tags_context(tags), "ec2:CreateAction": "RunInstances"}
                checks.append(Check("ec2:CreateTags", f"{base}:{kind}/*", context))
        role_arn = None
        profile = call.param("IamInstanceProfile.Arn") or call.param("IamInstanceProfile.Name")
        if profile:
            found = _profile(profile.rsplit("/", 1)[-1])
            if found is not None and found.roles:
                role_arn = str(found.roles[0].arn)
                checks.append(Check("iam:PassRole", role_arn, {"iam:PassedToService": "ec2.amazonaws.com"}))
        return checks, Bindings(stack_key=stack_key, replica_role_arn=role_arn)

    # Elastic Load Balancing
    def _elastic_load_balancing_v2(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        form = call.form()
        op = call.operation
        base = f"arn:aws:elasticloadbalancing:{region}:{ACCOUNT}"
        describe = {
            "Describe" + x
            for x in (
                "TargetGroups",
                "TargetGroupAttributes",
                "TargetHealth",
                "Listeners",
                "Rules",
                "LoadBalancers",
                "LoadBalancerAttributes",
                "Tags",
                "ListenerCertificates",
                "SSLPolicies",
                "AccountLimits",
                "ListenerAttributes",
                "TrustStores",
                "CapacityReservation",
            )
        }
        if op in describe:
            return [Check(f"elasticloadbalancing:{op}", "*")], Bindings()
        tags = _query_tags(form)
        checks: list[Check] = []
        alb: str | None = None
        stack_key = tags.get("fleetkeeper:stack")

        def own(arn: str, action: str = op, extra: dict[str, str | list[str]] | None = None) -> None:
            nonlocal stack_key
            existing = _elb_tags(region, arn)
            stack_key = stack_key or existing.get("fleetkeeper:stack")
            checks.append(Check(f"elasticloadbalancing:{action}", arn, {**_resource_tags(existing), **(extra or {})}))

        def tag_on_create(arn: str) -> None:
            if tags:
                checks.append(
                    Check(
                        "elasticloadbalancing:AddTags",
                        arn,
                        {**_tags_context(tags), "elasticloadbalancing:CreateAction": op},
                    )
                )

        def caller_side(*actions: str) -> None:
            checks.extend(Check(f"ec2:{action}", "*") for action in actions)

        if op == "CreateTargetGroup":
            arn = f"{base}:targetgroup/{call.param('Name')}/*"
            checks.append(Check("elasticloadbalancing:CreateTargetGroup", arn, _tags_context(tags)))
            tag_on_create(arn)
            if call.param("TargetType") != "lambda":
                caller_side("DescribeInternetGateways", "DescribeVpcs")
        elif op == "CreateLoadBalancer":
            arn = f"{base}:loadbalancer/app/{call.param('Name')}/*"
            checks.append(Check("elasticloadbalancing:CreateLoadBalancer", arn, _tags_context(tags)))
            tag_on_create(arn)
            caller_side(
                "DescribeAccountAttributes",
                "DescribeAddresses",
                "DescribeInternetGateways",
                "DescribeSecurityGroups",
                "DescribeSubnets",
                "DescribeVpcs",
            )
        elif op == "CreateListener":
            lb = call.param("LoadBalancerArn") or ""
            alb = _full_name(lb)
            checks.append(Check("elasticloadbalancing:CreateListener", lb, _tags_context(tags)))
            tag_on_create(f"{base}:listener/{alb}/*")
        elif op == "CreateRule":
            listener = call.param("ListenerArn") or ""
            alb = _full_name(listener)
            checks.append(Check("elasticloadbalancing:CreateRule", listener, _tags_context(tags)))
            tag_on_create(f"{base}:listener-rule/{listener.split(':listener/', 1)[-1]}/*")
        elif op in (
            "RegisterTargets",
            "DeregisterTargets",
            "ModifyTargetGroup",
            "ModifyTargetGroupAttributes",
            "DeleteTargetGroup",
        ):
            own(call.param("TargetGroupArn") or "")
            if op == "RegisterTargets" and not _lambda_targets(form):
                caller_side("DescribeInstances", "DescribeInternetGateways", "DescribeSubnets", "DescribeVpcs")
        elif op in ("DeleteListener", "ModifyListener", "ModifyListenerAttributes"):
            listener = call.param("ListenerArn") or ""
            alb = _full_name(listener)
            own(listener)
        elif op in ("ModifyRule", "DeleteRule"):
            rule = call.param("RuleArn") or ""
            alb = _full_name(rule)
            own(rule)
        elif op == "SetRulePriorities":
            for group in _indexed(form, "RulePriorities.member").values():
                alb = _full_name(group.get("RuleArn", ""))
                own(group.get("RuleArn", ""))
        elif op in ("DeleteLoadBalancer", "ModifyLoadBalancerAttributes", "SetSecurityGroups", "SetSubnets"):
            lb = call.param("LoadBalancerArn") or ""
            alb = _full_name(lb)
            own(lb)
        elif op in ("AddTags", "RemoveTags"):
            for arn in _members(form, "ResourceArns"):
                own(arn, extra=_tags_context(tags) if op == "AddTags" else None)
        else:
            checks.append(Check(f"elasticloadbalancing:{op}", "*"))
        # The stack's own load balancer, not one of its pools (fk-<stack key>-<n>, balancers/alb/pools.py).
        own_alb = alb if alb and not re.fullmatch(r"app/fk-[a-z0-9]+-\d+/[^/]+", alb) else None
        return checks, Bindings(stack_key=stack_key or stack_policies._STACK_KEY_OF_TEMPLATE, alb_full_name=own_alb)

    # IAM
    def _iam(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        form = call.form()
        op = call.operation
        role_name = call.param("RoleName")
        profile_name = call.param("InstanceProfileName")
        tags = _query_tags(form)
        checks: list[Check] = []
        stack_key: str | None = None
        policy_arn: str | None = None

        def role_arn(name: str, path: str | None = None) -> str:
            role = _role(name)
            path = path or (role.path if role is not None else "/")
            return f"arn:aws:iam::{ACCOUNT}:role{path}{name}"

        def profile_arn(name: str, path: str | None = None) -> str:
            profile = _profile(name)
            path = path or (profile.path if profile is not None else "/")
            return f"arn:aws:iam::{ACCOUNT}:instance-profile{path}{name}"

        def boundary_of(name: str) -> dict[str, str | list[str]]:
            role = _role(name)
            boundary = getattr(role, "permissions_boundary_arn", None) if role is not None else None
            return {"iam:PermissionsBoundary": boundary} if boundary else {}

        if op == "CreateRole" and role_name:
            arn = role_arn(role_name, call.param("Path") or "/")
            boundary = call.param("PermissionsBoundary")
            policy_arn = boundary
            context = {**_tags_context(tags), **({"iam:PermissionsBoundary": boundary} if boundary else {})}
            checks.append(Check("iam:CreateRole", arn, context))
            if tags:
                checks.append(Check("iam:TagRole", arn, _tags_context(tags)))
        elif op == "CreateInstanceProfile" and profile_name:
            arn = profile_arn(profile_name, call.param("Path") or "/")
            checks.append(Check("iam:CreateInstanceProfile", arn, _tags_context(tags)))
            if tags:
                checks.append(Check("iam:TagInstanceProfile", arn, _tags_context(tags)))
        elif op in ("AttachRolePolicy", "DetachRolePolicy", "PutRolePermissionsBoundary") and role_name:
            policy_arn = call.param("PolicyArn") or call.param("PermissionsBoundary")
            context = dict(boundary_of(role_name))
            if op == "PutRolePermissionsBoundary" and policy_arn:
                context["iam:PermissionsBoundary"] = policy_arn
            elif policy_arn:
                context["iam:PolicyARN"] = policy_arn
            checks.append(Check(f"iam:{op}", role_arn(role_name), context))
        elif op == "AddRoleToInstanceProfile" and profile_name and role_name:
            checks.append(Check("iam:AddRoleToInstanceProfile", profile_arn(profile_name)))
            checks.append(Check("iam:PassRole", role_arn(role_name)))
        elif op == "CreateServiceLinkedRole":
            service = call.param("AWSServiceName") or ""
            checks.append(
                Check(
                    "iam:CreateServiceLinkedRole",
                    f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/{service}/*",
                    {"iam:AWSServiceName": service},
                )
            )
        elif profile_name:
            if _profile(profile_name) is None:
                return [], Bindings()  # IAM answers NoSuchEntity (not verified: whether it authorizes first)
            checks.append(Check(f"iam:{op}", profile_arn(profile_name)))
        elif role_name:
            if _role(role_name) is None:
                return [], Bindings()
            checks.append(Check(f"iam:{op}", role_arn(role_name), _tags_context(tags) if tags else {}))
        else:
            checks.append(Check(f"iam:{op}", "*"))
        for check in checks:
            match = re.search(r":(?:role|instance-profile)/fleetkeeper/([^/]+)/", check.resource)
            if match:
                stack_key = match.group(1)
        return checks, Bindings(
            stack_key=stack_key or stack_policies._STACK_KEY_OF_TEMPLATE,
            replica_policy_arn=policy_arn if policy_arn and ":policy/" in policy_arn else None,
        )

    # S3
    def _s3(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        bucket, key = _s3_location(call.request.url)
        op = call.operation
        object_arn = f"arn:aws:s3:::{bucket}/{key}"
        actions = {
            "GetObject": "GetObject",
            "HeadObject": "GetObject",
            "PutObject": "PutObject",
            "CreateMultipartUpload": "PutObject",
            "UploadPart": "PutObject",
            "CompleteMultipartUpload": "PutObject",
            "AbortMultipartUpload": "AbortMultipartUpload",
            "DeleteObject": "DeleteObject",
            "PutObjectTagging": "PutObjectTagging",
            "GetObjectTagging": "GetObjectTagging",
        }
        checks: list[Check] = []
        if op in ("ListObjectsV2", "ListObjects", "ListObjectVersions"):
            query = dict(_query_pairs(call.request.url))
            checks.append(Check("s3:ListBucket", f"arn:aws:s3:::{bucket}", {"s3:prefix": query.get("prefix", "")}))
        elif op == "CopyObject":
            # "you must have s3:GetObject on the source object and s3:PutObject on the destination"
            # https://docs.aws.amazon.com/AmazonS3/latest/API/API_CopyObject.html
            raw = call.request.headers.get("x-amz-copy-source", "")
            raw = raw.decode() if isinstance(raw, bytes) else str(raw)
            source = unquote(raw).lstrip("/").split("?", 1)[0]
            checks.append(Check("s3:GetObject", f"arn:aws:s3:::{source}"))
            checks.append(Check("s3:PutObject", object_arn))
            tagging = _header(call, "x-amz-tagging")
            if tagging and _header(call, "x-amz-tagging-directive") == "REPLACE":
                checks.append(
                    Check("s3:PutObjectTagging", object_arn, _object_tags(dict(_query_pairs("?" + str(tagging)))))
                )
        elif op == "DeleteObjects":
            for name in _delete_keys(call.body_bytes()):
                checks.append(Check("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{name}"))
        elif op in actions:
            checks.append(Check(f"s3:{actions[op]}", object_arn))
            tagging = _header(call, "x-amz-tagging")
            if op == "PutObjectTagging":
                tags = _s3_tagging(call.body_bytes())
                checks[-1] = Check("s3:PutObjectTagging", object_arn, _object_tags(tags))
            elif tagging:
                tags = dict(_query_pairs("?" + str(tagging)))
                checks.append(Check("s3:PutObjectTagging", object_arn, _object_tags(tags)))
        else:
            checks.append(Check(f"s3:{op}", f"arn:aws:s3:::{bucket}"))
        stack_key = next(
            (
                str(c.context["s3:RequestObjectTag/fleetkeeper:stack"])
                for c in checks
                if "s3:RequestObjectTag/fleetkeeper:stack" in c.context
            ),
            stack_policies._STACK_KEY_OF_TEMPLATE,
        )
        return checks, Bindings(bucket=bucket or None, stack_key=stack_key)

    # Route 53
    def _route_53(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        path = urlsplit(call.request.url).path
        match = re.search(r"/hostedzone/([^/]+)", path)
        zone = match.group(1) if match else None
        op = call.operation
        if zone is None:
            return [Check(f"route53:{op}", "*")], Bindings()
        arn = f"arn:aws:route53:::hostedzone/{zone}"
        context: dict[str, str | list[str]] = {}
        if op == "ChangeResourceRecordSets":
            names, types, actions = _record_changes(call.body_bytes())
            context = {
                "route53:ChangeResourceRecordSetsNormalizedRecordNames": names,
                "route53:ChangeResourceRecordSetsRecordTypes": types,
                "route53:ChangeResourceRecordSetsActions": actions,
            }
        domain = _zone_name(zone)
        return [Check(f"route53:{op}", arn, context)], Bindings(hosted_zone=zone, domain=domain)

    # CloudWatch, CloudWatch Logs
    def _cloudwatch(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        return [Check(f"cloudwatch:{call.operation}", "*")], Bindings()

    def _cloudwatch_logs(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        body = call.json()
        group = body.get("logGroupName") or body.get("logGroupIdentifier") or ""
        stream = body.get("logStreamName")
        if not group:
            return [Check(f"logs:{call.operation}", "*")], Bindings()
        arn = f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{group}"
        arn += f":log-stream:{stream}" if stream else ":*"
        return [Check(f"logs:{call.operation}", arn)], Bindings()

    def _cloudformation(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        name = call.param("StackName") or ""
        if not name:
            return [Check(f"cloudformation:{call.operation}", "*")], Bindings()
        if name.startswith("arn:"):
            key = name.rsplit("-", 1)[-1]
            return [Check(f"cloudformation:{call.operation}", name)], Bindings(stack_key=key, stack_arn=name)
        return [
            Check(f"cloudformation:{call.operation}", f"arn:aws:cloudformation:{region}:{ACCOUNT}:stack/{name}/*")
        ], Bindings()

    def _sts(self, call: Call, region: str, function: str) -> tuple[list[Check], Bindings]:
        if call.operation == "GetCallerIdentity":
            return [], Bindings()  # "No permissions are required to perform this operation."
        return [Check(f"sts:{call.operation}", "*")], Bindings()

    # -- the decision --

    def decide(self, call: Call, function: str) -> tuple[Check, Decision, str] | None:
        """The first check the function's policies do not allow (its decision and the caller's ARN), or None."""
        checks, bindings = self.checks(call, function)
        if not checks:
            return None
        # A queue the request names is one of the stack's queues, which one the request does not say:
        # the call is allowed when it is under some choice of that one (the others keep their names).
        alternatives = [bindings]
        if bindings.queue:
            alternatives = [replace(bindings, queue_id=q) for q in stack_policies.queue_ids()]
        refusal: tuple[Check, Decision, str] | None = None
        for alternative in alternatives:
            refusal = self._first_refusal(checks, alternative, function)
            if refusal is None:
                return None
        assert refusal is not None
        check, decision, _ = refusal
        with self.lock:
            self.denials.append(Denial(function, check.action, check.resource, decision))
        return refusal

    def _first_refusal(
        self, checks: list[Check], bindings: Bindings, function: str
    ) -> tuple[Check, Decision, str] | None:
        role = stack_policies.function_policies(function, bindings)
        policies = stack_policies.for_bindings(bindings)
        principal_context: dict[str, str | list[str]] = {f"aws:PrincipalTag/{k}": v for k, v in role.tags.items()}
        for check in checks:
            resource, key_policy = policies.resource_policies(check.resource)
            request = Request(role.role_arn, check.action, check.resource, {**principal_context, **check.context})
            decision = evaluate(request, role.identity, resource=resource, key_policy=key_policy)
            with self.lock:
                self.decided += 1
            if decision is not Decision.ALLOW:
                return check, decision, role.role_arn
        return None


def _prefix(call: Call) -> str:
    return endpoint_name(call.request.url) or call.service


def _one(values: set[str]) -> str | None:
    values.discard("")
    return next(iter(values)) if len(values) == 1 else None


def _table_of_parameter_path(names: list[str]) -> str | None:
    for name in names:
        match = re.match(r"^/(?:fleetkeeper|fleetkeeper-api)/([^/]+)(?:/|$)", name)
        if match:
            return match.group(1)
    return None


def _kms_via_ssm(action: str, key_arn: str, parameter_arn: str, region: str) -> Check:
    return Check(
        action,
        key_arn,
        {"kms:ViaService": f"ssm.{region}.amazonaws.com", "kms:EncryptionContext:PARAMETER_ARN": parameter_arn},
    )


def _colon_free_stream(stream_arn: str) -> str:
    # tests/support/cfn.py's Resolver makes the stream label colon-free; the label is the stream's, any will do.
    return re.sub(r"/stream/.*$", "/stream/2026-01-01T00-00-00.000", stream_arn)


def _stream_of_iterator(iterator: str) -> str | None:
    match = re.search(r"arn:aws:dynamodb:[^|\"]+?/stream/[^|\"]+", iterator)
    return match.group(0) if match else None


def _ec2_resource_type(resource_id: str) -> str:
    prefix = resource_id.split("-", 1)[0]
    return {
        "i": "instance",
        "vol": "volume",
        "sg": "security-group",
        "subnet": "subnet",
        "vpc": "vpc",
        "eni": "network-interface",
        "sir": "spot-instances-request",
        "ami": "image",
        "lt": "launch-template",
    }.get(prefix, prefix)


def _full_name(arn: str) -> str | None:
    """app/<name>/<id> of the load balancer an ELB ARN belongs to."""
    match = re.search(r":(?:loadbalancer|listener|listener-rule)/(app/[^/]+/[^/]+)", arn)
    return match.group(1) if match else None


def _lambda_targets(form: list[tuple[str, str]]) -> bool:
    ids = [g.get("Id", "") for g in _indexed(form, "Targets.member").values()]
    return bool(ids) and all(i.startswith("arn:") for i in ids)


def _header(call: Call, name: str) -> str | None:
    value = call.request.headers.get(name)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _query_pairs(url: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(urlsplit(url).query, keep_blank_values=True)


def _s3_location(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    path = unquote(parts.path.lstrip("/"))
    labels = host.split(".")
    if labels and labels[0] not in ("s3",) and "s3" in labels[1:3]:
        return labels[0], path
    bucket, _, key = path.partition("/")
    return bucket, key


def _xml_texts(body: bytes, tag: str) -> list[str]:
    if not body:
        return []
    root = ET.fromstring(body)
    return [el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == tag]


def _delete_keys(body: bytes) -> list[str]:
    return _xml_texts(body, "Key")


def _s3_tagging(body: bytes) -> dict[str, str]:
    keys, values = _xml_texts(body, "Key"), _xml_texts(body, "Value")
    return dict(zip(keys, values, strict=False))


def _object_tags(tags: dict[str, str]) -> dict[str, str | list[str]]:
    context: dict[str, str | list[str]] = {f"s3:RequestObjectTag/{k}": v for k, v in tags.items()}
    context["s3:RequestObjectTagKeys"] = sorted(tags)
    return context


def _record_changes(body: bytes) -> tuple[list[str], list[str], list[str]]:
    names = sorted({n.lower().rstrip(".") for n in _xml_texts(body, "Name")})
    types = sorted(set(_xml_texts(body, "Type")))
    actions = sorted(set(_xml_texts(body, "Action")))
    return names, types, actions


def _zone_name(zone: str) -> str | None:
    from moto.route53.models import route53_backends

    try:
        return str(route53_backends[ACCOUNT]["global"].get_hosted_zone(zone).name).rstrip(".")
    except Exception:
        return None


# -- answers --

_JSON_DENIED = {
    "dynamodb": ("AccessDeniedException", "com.amazon.coral.service"),
    "dynamodb-streams": ("AccessDeniedException", "com.amazon.coral.service"),
    "ssm": ("AccessDeniedException", "com.amazon.coral.service"),
    "kms": ("AccessDeniedException", "com.amazon.coral.service"),
    "cloudwatch-logs": ("AccessDeniedException", "com.amazon.coral.service"),
    "sqs": ("AccessDenied", "com.amazonaws.sqs"),
    "cloudwatch": ("AccessDenied", "com.amazonaws.cloudwatch"),
}


def denied_message(principal_arn: str, check: Check, decision: Decision, function: str) -> str:
    session = principal_arn.replace(":iam::", ":sts::").replace(":role/", ":assumed-role/") + f"/{function}"
    because = (
        "with an explicit deny in an identity-based or resource-based policy"
        if decision is Decision.EXPLICIT_DENY
        else f"because no identity-based policy allows the {check.action} action"
    )
    return f"User: {session} is not authorized to perform: {check.action} on resource: {check.resource} {because}"


def denied(call: Call, message: str) -> Response:
    """The service's own answer to a request IAM denied."""
    if call.service in _JSON_DENIED:
        code, prefix = _JSON_DENIED[call.service]
        status, headers, body = json_error(code, message, prefix=prefix)
        if call.service == "sqs":
            headers["x-amzn-query-error"] = "AccessDenied;Sender"
        return status, headers, body
    if call.service == "ec2":
        return ec2_error(
            "UnauthorizedOperation", f"You are not authorized to perform this operation. {message}", status=403
        )
    from xml.sax.saxutils import escape

    if call.service in ("s3", "route-53"):
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>{escape(message)}'
            f"</Message><RequestId>{request_id()}</RequestId></Error>"
        )
        if call.service == "route-53":
            body = (
                '<?xml version="1.0"?>\n<ErrorResponse xmlns="https://route53.amazonaws.com/doc/2013-04-01/">'
                f"<Error><Type>Sender</Type><Code>AccessDenied</Code><Message>{escape(message)}</Message></Error>"
                f"<RequestId>{request_id()}</RequestId></ErrorResponse>"
            )
        return 403, {"Content-Type": "application/xml"}, body.encode()
    body = (
        "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
        f"<Message>{escape(message)}</Message></Error><RequestId>{request_id()}</RequestId></ErrorResponse>"
    )
    return 403, {"Content-Type": "text/xml"}, body.encode()
