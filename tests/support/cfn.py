"""Offline translation of template.yaml (SAM -> CloudFormation) and helpers to inspect the result.

The tests assert on what CloudFormation would actually receive, not on the SAM shorthand: SAM
generates the REST API's OpenAPI body, the roles, the event source mappings and the schedules.
Translation needs no AWS account: the managed-policy loader is a stub (SAM only needs it to expand
managed policy *names*, which this template does not use).

The `translated` fixture (template.yaml translated once per test process; read it, never change it)
is registered for every test by tests/conftest.py; the tests/template/ files share it.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from fleetkeeper.local.template import load_template

REGION = "us-east-1"
ACCOUNT = "123456789012"
STACK = "fk-test"
PSEUDO = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::StackName": STACK,
    "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/1a2b3c4d-5e6f-4a8b-9c0d-0123456789ab",
    "AWS::URLSuffix": "amazonaws.com",
}


class _NoManagedPolicies:
    """samtranslator's managed-policy loader, without IAM: no names to expand."""

    def load(self) -> dict[str, str]:
        return {}


def sentinel(name: str, definition: dict[str, Any]) -> Any:
    """A plausible value for a parameter that has no default (the reconciler's subnets, roles...)."""
    kind = str(definition.get("Type", "String"))
    if kind.startswith("List<AWS::EC2::Subnet::Id>"):
        return "subnet-0aaaaaaaaaaaaaaa1,subnet-0bbbbbbbbbbbbbbb2"
    if kind.startswith("List<AWS::EC2::SecurityGroup::Id>"):
        return "sg-0aaaaaaaaaaaaaaa1"
    if kind == "AWS::EC2::SecurityGroup::Id":
        return "sg-0aaaaaaaaaaaaaaa1"
    if kind == "AWS::EC2::Subnet::Id":
        return "subnet-0aaaaaaaaaaaaaaa1"
    if kind == "AWS::EC2::VPC::Id":
        return "vpc-0aaaaaaaaaaaaaaa1"
    if kind == "CommaDelimitedList" and name.endswith("PrincipalArns"):
        # Principals named in policies (DeployerPrincipalArns): role ARNs, one with a path.
        return f"arn:aws:iam::{ACCOUNT}:role/deploy/test-{name}-a,arn:aws:iam::{ACCOUNT}:role/test-{name}-b"
    if kind.startswith("List<") or kind == "CommaDelimitedList":
        return f"test-{name}-a,test-{name}-b"
    if kind == "Number":
        return "1"
    lowered = name.lower()
    if "profile" in lowered and lowered.endswith("arn"):
        return f"arn:aws:iam::{ACCOUNT}:instance-profile/test-{name}"
    if "role" in lowered and lowered.endswith("arn"):
        return f"arn:aws:iam::{ACCOUNT}:role/test-{name}"
    return f"test-{name}"


def parameter_values(template: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every parameter's value: its default, else a sentinel; then `overrides`."""
    values: dict[str, Any] = {}
    for name, definition in (template.get("Parameters") or {}).items():
        values[name] = definition["Default"] if "Default" in definition else sentinel(name, definition)
    values.update(overrides or {})
    return values


def sam_template() -> dict[str, Any]:
    """template.yaml as `sam package` would upload it: local CodeUris replaced by S3 locations."""
    template = load_template()
    function_globals = (template.get("Globals") or {}).get("Function") or {}
    if "CodeUri" in function_globals:
        function_globals["CodeUri"] = "s3://fleetkeeper-artifacts/code.zip"
    for body in template["Resources"].values():
        props = body.get("Properties") or {}
        if body["Type"] == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            props["CodeUri"] = "s3://fleetkeeper-artifacts/code.zip"
    return template


def translate(template: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The CloudFormation template SAM would deploy (no AWS call is made)."""
    from samtranslator.translator.transform import transform

    source = copy.deepcopy(template) if template is not None else sam_template()
    values = {**PSEUDO, **parameter_values(source, overrides)}
    translated: dict[str, Any] = transform(source, values, _NoManagedPolicies())
    translated["__parameter_values__"] = values
    return translated


@pytest.fixture(scope="session")
def translated() -> dict[str, Any]:
    """template.yaml as CloudFormation receives it, with every parameter at its default or a sentinel."""
    return translate()


def resources_of_type(translated: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {lid: body for lid, body in translated["Resources"].items() if body["Type"] == kind}


def refers_to(value: Any, logical_id: str) -> bool:
    """True when `value` is a Ref/GetAtt of `logical_id` or a Sub that names it."""
    if isinstance(value, dict):
        if value.get("Ref") == logical_id:
            return True
        get_att = value.get("Fn::GetAtt")
        if isinstance(get_att, list) and get_att and get_att[0] == logical_id:
            return True
        sub = value.get("Fn::Sub")
        if sub is not None:
            text = sub if isinstance(sub, str) else sub[0]
            return re.search(r"\$\{" + re.escape(logical_id) + r"(\.[A-Za-z.]+)?\}", text) is not None
    return False


# --- intrinsic functions, resolved to plausible strings (for parliament and ARN checks) -------------


class Resolver:
    """Resolves Ref/GetAtt/Sub/Join/If/Select/Split against parameter values and fake physical ids."""

    def __init__(self, translated: dict[str, Any]) -> None:
        self.translated = translated
        self.values: dict[str, Any] = translated["__parameter_values__"]
        self.resources: dict[str, Any] = translated["Resources"]

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.translated.get("Conditions", {})[name]))

    def physical_id(self, logical_id: str) -> str:
        body = self.resources[logical_id]
        props = body.get("Properties") or {}
        for key in ("LogGroupName", "FunctionName", "TableName", "QueueName", "RoleName"):
            if key in props:
                return str(self.resolve(props[key]))
        return f"{STACK}-{logical_id}-ABC123"

    def ref(self, name: str) -> Any:
        if name in self.values:
            kind = str(((self.translated.get("Parameters") or {}).get(name) or {}).get("Type", ""))
            value = self.values[name]
            if (kind == "CommaDelimitedList" or kind.startswith("List<")) and isinstance(value, str):
                return [part for part in value.split(",") if part]  # a list parameter's Ref is a list
            return value
        if name == "AWS::NoValue":
            return None
        if name not in self.resources:
            raise KeyError(f"Ref to unknown {name}")
        kind = self.resources[name]["Type"]
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{self.physical_id(name)}"
        if kind == "AWS::ElasticLoadBalancingV2::LoadBalancer":
            full_name = self.get_att(name, "LoadBalancerFullName")
            return f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:loadbalancer/{full_name}"
        if kind == "AWS::IAM::ManagedPolicy":
            return f"arn:aws:iam::{ACCOUNT}:policy/{self.physical_id(name)}"
        if kind == "AWS::ElasticLoadBalancingV2::Listener":
            alb = self.get_att("LoadBalancerResource", "LoadBalancerFullName")
            return f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:listener/{alb}/{name.lower()}"
        return self.physical_id(name)

    def get_att(self, name: str, attribute: str) -> str:
        kind = self.resources[name]["Type"]
        pid = self.physical_id(name)
        arns = {
            ("AWS::DynamoDB::Table", "Arn"): f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{pid}",
            # A real stream label has colons (2026-01-01T00:00:00.000), which parliament splits the
            # ARN on and then misreads; the label is made colon-free so the ARN itself is audited.
            ("AWS::DynamoDB::Table", "StreamArn"): (
                f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{pid}/stream/2026-01-01T00-00-00.000"
            ),
            ("AWS::Lambda::Function", "Arn"): f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{pid}",
            ("AWS::SQS::Queue", "Arn"): f"arn:aws:sqs:{REGION}:{ACCOUNT}:{pid}",
            ("AWS::SQS::Queue", "QueueName"): pid,
            ("AWS::Logs::LogGroup", "Arn"): f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{pid}:*",
            ("AWS::IAM::Role", "Arn"): f"arn:aws:iam::{ACCOUNT}:role/{pid}",
            ("AWS::IAM::InstanceProfile", "Arn"): f"arn:aws:iam::{ACCOUNT}:instance-profile/{pid}",
            ("AWS::SNS::Topic", "TopicArn"): f"arn:aws:sns:{REGION}:{ACCOUNT}:{pid}",
            ("AWS::ElasticLoadBalancingV2::LoadBalancer", "LoadBalancerFullName"): f"app/{STACK}-alb/0123456789abcdef",
            ("AWS::ElasticLoadBalancingV2::LoadBalancer", "DNSName"): (
                f"internal-{STACK}-alb-123456789.{REGION}.elb.amazonaws.com"
            ),
            ("AWS::S3::Bucket", "Arn"): f"arn:aws:s3:::{pid}",
            ("AWS::Events::Rule", "Arn"): f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{pid}",
            ("AWS::KMS::Key", "Arn"): f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{pid}",
        }
        if (kind, attribute) in arns:
            return arns[(kind, attribute)]
        return f"{pid}.{attribute}"

    def sub(self, text: str, variables: dict[str, Any]) -> str:
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return str(self.resolve(variables[name]))
            if "." in name and name.split(".", 1)[0] in self.resources:
                logical_id, attribute = name.split(".", 1)
                return self.get_att(logical_id, attribute)
            return str(self.ref(name))

        return re.sub(r"\$\{([^!][^}]*)\}", replace, text)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [item for item in (self.resolve(v) for v in value) if item is not None]
        if not isinstance(value, dict):
            return value
        if len(value) != 1:
            return {k: self.resolve(v) for k, v in value.items()}
        ((key, arg),) = value.items()
        if key == "Ref":
            return self.ref(arg)
        if key == "Fn::GetAtt":
            logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return self.get_att(logical_id, attribute)
        if key == "Fn::Sub":
            text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
            return self.sub(text, variables)
        if key == "Fn::Join":
            return str(arg[0]).join(str(part) for part in self.resolve(arg[1]))
        if key == "Fn::Select":
            items = self.resolve(arg[1])
            items = items.split(",") if isinstance(items, str) else items
            return items[int(self.resolve(arg[0]))]
        if key == "Fn::Split":
            return str(self.resolve(arg[1])).split(arg[0])
        if key == "Fn::If":
            return self.resolve(arg[1] if self.condition(arg[0]) else arg[2])
        if key == "Fn::Equals":
            left, right = (self.resolve(v) for v in arg)
            return str(left) == str(right)
        if key == "Fn::Not":
            return not self.resolve(arg[0])
        if key == "Fn::And":
            return all(self.resolve(v) for v in arg)
        if key == "Fn::Or":
            return any(self.resolve(v) for v in arg)
        if key == "Condition":
            return self.condition(arg)
        return {key: self.resolve(arg)}


# --- IAM ------------------------------------------------------------------------------------------


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def role_policies(translated: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    """The inline policy documents of a role, as written (intrinsics unresolved)."""
    props = translated["Resources"][role_id]["Properties"]
    return [policy["PolicyDocument"] for policy in props.get("Policies", [])]


def role_statements(translated: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    return [s for doc in role_policies(translated, role_id) for s in as_list(doc["Statement"])]


def function_role(translated: dict[str, Any], function_id: str) -> str:
    """The logical id of the role a function runs as (explicit or generated by SAM)."""
    role = translated["Resources"][function_id]["Properties"]["Role"]
    get_att = role.get("Fn::GetAtt") if isinstance(role, dict) else None
    if not get_att:
        raise AssertionError(f"{function_id} does not run as a role of this stack: {role!r}")
    return str(get_att[0] if isinstance(get_att, list) else get_att.split(".")[0])


def statements_granting(statements: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    """Allow statements whose Action names `action` (case-insensitively, as IAM compares)."""
    wanted = action.lower()
    return [
        s
        for s in statements
        if s.get("Effect") == "Allow" and wanted in {a.lower() for a in as_list(s.get("Action", []))}
    ]


def condition_keys(statement: dict[str, Any]) -> dict[str, Any]:
    """{condition key (lowercased): value} over all operators of a statement's Condition."""
    keys: dict[str, Any] = {}
    for operator_block in (statement.get("Condition") or {}).values():
        for key, value in operator_block.items():
            keys[key.lower()] = value
    return keys


def function_ids(translated: dict[str, Any]) -> list[str]:
    return sorted(resources_of_type(translated, "AWS::Lambda::Function"))


def dumps(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=str)
