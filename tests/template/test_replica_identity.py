"""Proof on the policies themselves (issue 23, invariant 12): a replica of one owner's service reaches
its own secrets, workdirs and log streams and nothing of another owner's; the reconciler can never
make a role stronger than the boundary; and which API caller may call which route at the IAM layer.

The policies are the ones CloudFormation would receive (template.yaml translated by SAM, intrinsics
resolved by tests/support/cfn.py) and the roles are the ones fleetkeeper.replicas.identity really creates (made on moto,
then read back); the names are those the code derives (replicas.secrets, replicas.workdirs, userdata). Each
request is decided by tests/support/iam_evaluator.py, which tests/strict_aws/test_iam_evaluator.py checks against AWS's
documented evaluation examples first.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetkeeper.local.template import load_template
from fleetkeeper.reconciler.userdata import log_stream
from fleetkeeper.replicas.identity import ReplicaIdentities, owner_scope, role_name, role_path, role_tags
from fleetkeeper.replicas.secrets import SecretStore, parameter_prefix
from fleetkeeper.replicas.workdirs import service_key
from tests import REPO_ROOT
from tests.support.cfn import ACCOUNT, REGION, Resolver, as_list, resources_of_type, translate
from tests.support.iam_evaluator import Decision, Request, evaluate

STACK_KEY = "0123456789ab"  # the last 12 hex digits of tests/support/cfn.py's AWS::StackId
OWNER_A = f"arn:aws:iam::{ACCOUNT}:role/team-a-ci"
OWNER_B = f"arn:aws:iam::{ACCOUNT}:role/ci/team-b-deployer"
DIGEST = "sha256:" + "ab" * 32


def resolved(value: Any, resolver: Resolver) -> Any:
    """A policy as CloudFormation hands it to IAM: intrinsics resolved, `${!x}` unescaped to `${x}`."""
    return json.loads(json.dumps(resolver.resolve(value)).replace("${!", "${"))


class Stack:
    """One translated stack: its policies, and the names and ARNs its code uses."""

    def __init__(self, translated: dict[str, Any]) -> None:
        self.translated = translated
        self.resolver = Resolver(translated)
        self.table = str(self.resolver.ref("Table"))
        self.bucket = str(self.resolver.ref("WorkdirBucket"))
        self.log_group = str(self.resolver.ref("ReplicaLogGroup"))
        self.owner_policy_arn = str(self.resolver.ref("ReplicaOwnerPolicy"))
        self.shared_role = str(self.resolver.ref("ReplicaRoleArn"))
        self.key = str(self.resolver.get_att("SecretsKey", "Arn"))
        self.key_policy = dict(
            resolved(translated["Resources"]["SecretsKey"]["Properties"]["KeyPolicy"], self.resolver)
        )

    def managed(self, logical_id: str) -> dict[str, Any]:
        return dict(resolved(self.translated["Resources"][logical_id]["Properties"]["PolicyDocument"], self.resolver))

    def role_policies(self, role_id: str) -> list[dict[str, Any]]:
        """A role's inline policies and every AWS::IAM::RolePolicy naming it."""
        resources = self.translated["Resources"]
        inline = [p["PolicyDocument"] for p in resources[role_id]["Properties"].get("Policies", [])]
        attached = [
            body["Properties"]["PolicyDocument"]
            for logical_id, body in resources_of_type(self.translated, "AWS::IAM::RolePolicy").items()
            if body["Properties"]["RoleName"] == {"Ref": role_id}
            and ("Condition" not in body or self.resolver.condition(body["Condition"]))
        ]
        return [resolved(p, self.resolver) for p in inline + attached]

    # -- the names the code derives, as ARNs --

    def secret(self, service: str, owner: str) -> str:
        name = SecretStore(parameter_prefix(self.table)).parameter_name(service, "0011223344556677", "ref0", owner)
        return f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{name}"

    def workdir(self, service: str, owner: str) -> str:
        return f"arn:aws:s3:::{self.bucket}/{service_key(service, '0011223344556677', DIGEST, owner)}"

    def stream(self, service: str, owner: str, replica: int = 1) -> str:
        name = log_stream(service, "0011223344556677", replica, owner)
        return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{self.log_group}:log-stream:{name}"


@pytest.fixture(scope="module")
def stack() -> Stack:
    return Stack(translate())


@pytest.fixture(scope="module")
def shared_stack() -> Stack:
    return Stack(translate(overrides={"ReplicaIdentity": "shared"}))


class Replica:
    """An owner's replica as IAM sees it: its role's ARN and tags, its policies and boundary."""

    def __init__(self, arn: str, tags: dict[str, str], policies: list[dict[str, Any]], boundary: Any) -> None:
        self.arn = arn
        self.context: dict[str, str | list[str]] = {f"aws:PrincipalTag/{k}": v for k, v in tags.items()}
        self.policies = policies
        self.boundary = boundary

    def decide(self, action: str, resource: str, **context: str) -> Decision:
        request = Request(self.arn, action, resource, {**self.context, **context})
        return evaluate(request, self.policies, boundary=self.boundary)

    def may(self, action: str, resource: str, **context: str) -> bool:
        return self.decide(action, resource, **context) is Decision.ALLOW


@pytest.fixture(scope="module")
def made(stack: Stack) -> dict[str, Replica]:
    """The roles fleetkeeper.replicas.identity creates for owners A and B (on moto), read back from IAM: their
    tags, attached policies and boundary are what the evaluation uses, not what the test assumes."""
    import boto3
    from moto import mock_aws

    from fleetkeeper import aws as aws_clients

    replicas: dict[str, Replica] = {}
    aws_clients.reset_clients()
    with mock_aws():
        iam = boto3.client("iam", region_name=REGION)
        document = stack.managed("ReplicaOwnerPolicy")
        policy_arn = iam.create_policy(PolicyName="ReplicaOwnerPolicy", PolicyDocument=json.dumps(document))["Policy"][
            "Arn"
        ]
        identities = ReplicaIdentities(STACK_KEY, policy_arn)
        for label, owner in (("A", OWNER_A), ("B", OWNER_B)):
            scope = owner_scope(owner)
            assert scope is not None
            profile = identities.make(scope, owner)
            role = iam.get_role(RoleName=profile.name)["Role"]
            attached = iam.list_attached_role_policies(RoleName=profile.name)["AttachedPolicies"]
            assert iam.list_role_policies(RoleName=profile.name)["PolicyNames"] == []  # no inline policy

            def document_of(arn: str) -> dict[str, Any]:
                version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
                raw = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
                return dict(json.loads(raw) if isinstance(raw, str) else raw)

            replicas[label] = Replica(
                role["Arn"],
                {t["Key"]: t["Value"] for t in role.get("Tags", [])},
                [document_of(p["PolicyArn"]) for p in attached],
                document_of(role["PermissionsBoundary"]["PermissionsBoundaryArn"]),
            )
    aws_clients.reset_clients()
    return replicas


# --- replicas: each owner reaches its own names, and nothing of another owner's -------------------


def test_the_role_the_code_makes_is_bounded_tagged_and_named_within_iams_limits(made: dict[str, Replica]) -> None:
    scope = owner_scope(OWNER_A)
    assert scope is not None
    name = role_name(STACK_KEY, scope)
    assert made["A"].arn == f"arn:aws:iam::{ACCOUNT}:role{role_path(STACK_KEY)}{name}"
    assert len(name) <= 64 and len(role_path(STACK_KEY)) <= 512
    assert made["A"].context == {f"aws:PrincipalTag/{t['Key']}": t["Value"] for t in role_tags(STACK_KEY, scope)}
    assert made["A"].boundary == made["A"].policies[0]


@pytest.mark.parametrize(
    ("me", "other", "owner_me", "owner_other"), [("A", "B", OWNER_A, OWNER_B), ("B", "A", OWNER_B, OWNER_A)]
)
def test_a_replica_reads_its_owners_secrets_and_workdirs_and_writes_its_logs_and_not_the_others(
    stack: Stack, made: dict[str, Replica], me: str, other: str, owner_me: str, owner_other: str
) -> None:
    replica = made[me]
    for owner, expected in ((owner_me, True), (owner_other, False)):
        assert replica.may("ssm:GetParameter", stack.secret("web", owner)) is expected
        # The boot reads the newest version's type and key with it (replica_boot.newest_version).
        assert replica.may("ssm:GetParameterHistory", stack.secret("web", owner)) is expected
        assert replica.may("s3:GetObject", stack.workdir("web", owner)) is expected
        assert replica.may("logs:CreateLogStream", stack.stream("web", owner)) is expected
        assert replica.may("logs:PutLogEvents", stack.stream("web", owner)) is expected
        # A SecureString is decrypted by SSM for the caller, with the parameter's ARN as context.
        ssm = f"ssm.{REGION}.amazonaws.com"
        context = {"kms:ViaService": ssm, "kms:EncryptionContext:PARAMETER_ARN": stack.secret("web", owner)}
        assert replica.may("kms:Decrypt", stack.key, **context) is expected
    # Not even a stream it names itself under the other owner's scope (it would show in their logs).
    other_scope = owner_scope(owner_other)
    forged = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{stack.log_group}:log-stream:_o/{other_scope}/web/x/1"
    assert not replica.may("logs:CreateLogStream", forged)
    assert made[other].may("logs:CreateLogStream", forged)


def test_an_owners_replica_may_have_s3_decrypt_its_workdirs_under_the_aws_s3_key_within_its_boundary(
    stack: Stack, made: dict[str, Replica]
) -> None:
    """The workdir bucket is SSE-KMS under the account's AWS managed aws/s3 key (and a bucket key):
    S3 decrypts a GetObject with the caller's permissions. The key's policy grants every principal of
    the account through S3 (as KMS shows it for an account's aws/s3 key; not readable offline), but
    the owner's role has ReplicaOwnerPolicy as its boundary, whose implicit deny a resource policy
    naming no role session does not lift: the boundary itself must allow the decrypt."""
    aws_s3_key = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/0a1b2c3d-1111-2222-3333-444455556666"
    via_s3 = f"s3.{REGION}.amazonaws.com"
    aws_s3_key_policy = {
        "Statement": [
            {
                "Sid": "Allow access through S3 for all principals in the account that are authorized to use S3",
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
                "Resource": "*",
                "Condition": {"StringEquals": {"kms:ViaService": via_s3, "kms:CallerAccount": ACCOUNT}},
            }
        ]
    }
    bucket_arn = f"arn:aws:s3:::{stack.bucket}"

    def decrypt(replica: Replica, context: dict[str, str | list[str]]) -> Decision:
        request = Request(replica.arn, "kms:Decrypt", aws_s3_key, {**replica.context, **context})
        return evaluate(
            request, replica.policies, boundary=replica.boundary, resource=[aws_s3_key_policy], key_policy=True
        )

    through_s3 = {"kms:ViaService": via_s3, "kms:CallerAccount": ACCOUNT}
    # With the bucket key (the template's): the context is the bucket's ARN.
    assert decrypt(made["A"], {**through_s3, "kms:EncryptionContext:aws:s3:arn": bucket_arn}) is Decision.ALLOW
    # An object encrypted without it: its own ARN, under the owner's prefix only.
    own = {**through_s3, "kms:EncryptionContext:aws:s3:arn": stack.workdir("web", OWNER_A)}
    assert decrypt(made["A"], own) is Decision.ALLOW
    assert decrypt(made["B"], own) is not Decision.ALLOW
    # Another bucket's objects, or a decrypt not made by S3: never.
    other_bucket = {**through_s3, "kms:EncryptionContext:aws:s3:arn": "arn:aws:s3:::someone-elses-bucket"}
    assert decrypt(made["A"], other_bucket) is not Decision.ALLOW
    direct = {"kms:CallerAccount": ACCOUNT, "kms:EncryptionContext:aws:s3:arn": bucket_arn}
    assert decrypt(made["A"], direct) is not Decision.ALLOW


def test_a_replica_reaches_nothing_else(stack: Stack, made: dict[str, Replica]) -> None:
    replica = made["A"]
    own_secret, own_workdir = stack.secret("web", OWNER_A), stack.workdir("web", OWNER_A)
    # Legacy names (services without an owner) are the shared role's, not an owner's.
    assert not replica.may("ssm:GetParameter", stack.secret("web", ""))
    assert not replica.may("s3:GetObject", stack.workdir("web", ""))
    assert not replica.may("logs:PutLogEvents", stack.stream("web", ""))
    # Read-only on its own names; nothing of the table, the uploads, or decrypting outside SSM.
    assert not replica.may("ssm:PutParameter", own_secret)
    assert not replica.may("ssm:GetParametersByPath", own_secret)
    assert not replica.may("s3:PutObject", own_workdir)
    assert not replica.may("s3:GetObject", f"arn:aws:s3:::{stack.bucket}/uploads/{'ab' * 32}.tar.gz")
    assert not replica.may("dynamodb:GetItem", f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{stack.table}")
    assert not replica.may(
        "execute-api:Invoke", f"arn:aws:execute-api:{REGION}:{ACCOUNT}:abcdefghij/api/GET/v1/services"
    )
    # Decrypting is SSM's, on the replica's behalf: never a direct call.
    assert not replica.may("kms:Decrypt", stack.key, **{"kms:EncryptionContext:PARAMETER_ARN": own_secret})


def test_a_role_without_the_scope_tag_reaches_nothing(stack: Stack, made: dict[str, Replica]) -> None:
    """The policy names the scope only through ${aws:PrincipalTag/fleetkeeper-scope}: a role on the
    path without the tag (or the tag of another stack only) has no value for it and matches nothing."""
    untagged = Replica(made["A"].arn, {"fleetkeeper:stack": STACK_KEY}, made["A"].policies, made["A"].boundary)
    for owner in (OWNER_A, OWNER_B, ""):
        assert not untagged.may("ssm:GetParameter", stack.secret("web", owner))
        assert not untagged.may("s3:GetObject", stack.workdir("web", owner))
        assert not untagged.may("logs:PutLogEvents", stack.stream("web", owner))


def test_the_shared_role_reads_legacy_names_and_no_owners(stack: Stack, shared_stack: Stack) -> None:
    shared = Replica(stack.shared_role, {}, [stack.managed("ReplicaAccessPolicy")], None)
    assert shared.may("ssm:GetParameter", stack.secret("web", ""))
    assert shared.may("ssm:GetParameterHistory", stack.secret("web", ""))
    assert shared.may("s3:GetObject", stack.workdir("web", ""))
    assert shared.may("logs:PutLogEvents", stack.stream("web", ""))
    for owner in (OWNER_A, OWNER_B):
        assert shared.decide("ssm:GetParameter", stack.secret("web", owner)) is Decision.EXPLICIT_DENY
        assert shared.decide("ssm:GetParameterHistory", stack.secret("web", owner)) is Decision.EXPLICIT_DENY
        assert shared.decide("s3:GetObject", stack.workdir("web", owner)) is Decision.EXPLICIT_DENY
        assert shared.decide("logs:CreateLogStream", stack.stream("web", owner)) is Decision.EXPLICIT_DENY
    # ReplicaIdentity=shared: every replica runs with the shared role, which then reads every name
    # (no isolation between owners: the documented choice of that mode).
    shared_mode = Replica(shared_stack.shared_role, {}, [shared_stack.managed("ReplicaAccessPolicy")], None)
    assert shared_mode.may("ssm:GetParameter", shared_stack.secret("web", OWNER_A))
    assert shared_mode.may("s3:GetObject", shared_stack.workdir("web", OWNER_B))


# --- the reconciler and the dispatcher: never a role stronger than the boundary --------------------


def _principal(stack: Stack, role_id: str) -> tuple[str, list[dict[str, Any]]]:
    return f"arn:aws:iam::{ACCOUNT}:role/{stack.resolver.physical_id(role_id)}", stack.role_policies(role_id)


def test_the_dispatcher_makes_owner_roles_only_on_its_path_and_only_with_the_boundary(stack: Stack) -> None:
    arn, policies = _principal(stack, "DispatcherRole")
    scope = owner_scope(OWNER_A)
    assert scope is not None
    role = f"arn:aws:iam::{ACCOUNT}:role{role_path(STACK_KEY)}{role_name(STACK_KEY, scope)}"
    profile = f"arn:aws:iam::{ACCOUNT}:instance-profile{role_path(STACK_KEY)}{role_name(STACK_KEY, scope)}"
    boundary = {"iam:PermissionsBoundary": stack.owner_policy_arn}

    def may(action: str, resource: str, context: dict[str, str | list[str]]) -> Decision:
        return evaluate(Request(arn, action, resource, context), policies)

    assert may("iam:CreateRole", role, boundary) is Decision.ALLOW
    # Without the boundary, with another one, or off the stack's path: never.
    assert may("iam:CreateRole", role, {}) is Decision.IMPLICIT_DENY
    admin = "arn:aws:iam::aws:policy/AdministratorAccess"
    assert may("iam:CreateRole", role, {"iam:PermissionsBoundary": admin}) is Decision.IMPLICIT_DENY
    elsewhere = f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/otherstack12/fk-otherstack12-{scope}"
    assert may("iam:CreateRole", elsewhere, boundary) is Decision.IMPLICIT_DENY
    assert may("iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/{role_name(STACK_KEY, scope)}", boundary) is (
        Decision.IMPLICIT_DENY
    )
    # It attaches only the owners' policy, to a role bounded by it.
    attach = {"iam:PolicyARN": stack.owner_policy_arn, **boundary}
    assert may("iam:AttachRolePolicy", role, attach) is Decision.ALLOW
    assert may("iam:AttachRolePolicy", role, {"iam:PolicyARN": admin, **boundary}) is Decision.IMPLICIT_DENY
    assert may("iam:AttachRolePolicy", role, {"iam:PolicyARN": stack.owner_policy_arn}) is Decision.IMPLICIT_DENY
    # No inline policy, no lifting of the boundary, ever.
    assert may("iam:PutRolePolicy", role, {}) is Decision.EXPLICIT_DENY
    assert may("iam:DeleteRolePermissionsBoundary", role, {}) is Decision.EXPLICIT_DENY
    assert may("iam:PutRolePermissionsBoundary", role, {"iam:PermissionsBoundary": admin}) is Decision.IMPLICIT_DENY
    # Tags: the stack's two keys only (the scope tag is what the policy reads).
    assert may("iam:TagRole", role, {"aws:TagKeys": ["fleetkeeper:stack", "fleetkeeper-scope"]}) is Decision.ALLOW
    assert may("iam:TagRole", role, {"aws:TagKeys": ["fleetkeeper-scope", "team"]}) is Decision.IMPLICIT_DENY
    for action in ("iam:CreateInstanceProfile", "iam:AddRoleToInstanceProfile"):
        assert may(action, profile, {}) is Decision.ALLOW, action
    # AddRoleToInstanceProfile passes the role: only the stack's owner roles.
    assert may("iam:PassRole", role, {}) is Decision.ALLOW
    assert may("iam:PassRole", stack.shared_role, {}) is Decision.IMPLICIT_DENY
    assert may("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/admin", {}) is Decision.IMPLICIT_DENY
    assert may("iam:ListInstanceProfiles", "*", {}) is Decision.ALLOW
    # Its table rights are the identity records' alone.
    table = stack.resolver.get_att("Table", "Arn")
    for action in ("dynamodb:BatchGetItem", "dynamodb:PutItem", "dynamodb:DeleteItem"):
        assert may(action, table, {"dynamodb:LeadingKeys": ["IDENTITY#0123456789abcdef"]}) is Decision.ALLOW
        assert may(action, table, {"dynamodb:LeadingKeys": ["SVC#web"]}) is Decision.IMPLICIT_DENY


def test_the_reconciler_makes_no_iam_call_and_passes_owner_roles_to_ec2_only(stack: Stack) -> None:
    """IAM is not reachable from the reconciler's VPC: it may only pass the roles the dispatcher made."""
    arn, policies = _principal(stack, "ReconcilerRole")
    scope = owner_scope(OWNER_A)
    assert scope is not None
    role = f"arn:aws:iam::{ACCOUNT}:role{role_path(STACK_KEY)}{role_name(STACK_KEY, scope)}"
    profile = f"arn:aws:iam::{ACCOUNT}:instance-profile{role_path(STACK_KEY)}{role_name(STACK_KEY, scope)}"
    boundary = {"iam:PermissionsBoundary": stack.owner_policy_arn}

    def may(action: str, resource: str, context: dict[str, str | list[str]]) -> Decision:
        return evaluate(Request(arn, action, resource, context), policies)

    for action in ("iam:CreateRole", "iam:AttachRolePolicy", "iam:PutRolePermissionsBoundary", "iam:TagRole"):
        assert may(action, role, boundary) is Decision.IMPLICIT_DENY, action
    for action in ("iam:CreateInstanceProfile", "iam:GetInstanceProfile", "iam:AddRoleToInstanceProfile"):
        assert may(action, profile, {}) is Decision.IMPLICIT_DENY, action
    # It passes the owners' roles (and the shared one) to EC2 only.
    ec2 = {"iam:PassedToService": "ec2.amazonaws.com"}
    assert may("iam:PassRole", role, ec2) is Decision.ALLOW
    assert may("iam:PassRole", stack.shared_role, ec2) is Decision.ALLOW
    assert may("iam:PassRole", role, {"iam:PassedToService": "lambda.amazonaws.com"}) is Decision.IMPLICIT_DENY
    assert may("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/admin", ec2) is Decision.IMPLICIT_DENY
    assert may("iam:DeleteRole", role, {}) is Decision.IMPLICIT_DENY


def test_the_dispatcher_removes_owner_roles_of_its_own_stack_only(stack: Stack) -> None:
    arn, policies = _principal(stack, "DispatcherRole")
    scope = owner_scope(OWNER_A)
    assert scope is not None
    role = f"arn:aws:iam::{ACCOUNT}:role{role_path(STACK_KEY)}{role_name(STACK_KEY, scope)}"
    profile = f"arn:aws:iam::{ACCOUNT}:instance-profile{role_path(STACK_KEY)}{role_name(STACK_KEY, scope)}"

    def may(action: str, resource: str, **context: str) -> bool:
        return evaluate(Request(arn, action, resource, dict(context)), policies) is Decision.ALLOW

    assert may("iam:ListRoles", "*")
    assert may("iam:RemoveRoleFromInstanceProfile", profile) and may("iam:DeleteInstanceProfile", profile)
    assert may("iam:DetachRolePolicy", role, **{"iam:PolicyARN": stack.owner_policy_arn})
    assert may("iam:DeleteRole", role)
    assert not may("iam:DetachRolePolicy", role, **{"iam:PolicyARN": "arn:aws:iam::aws:policy/ReadOnlyAccess"})
    assert not may("iam:DeleteRole", f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/otherstack12/fk-otherstack12-{scope}")
    assert not may("iam:DeleteRole", stack.shared_role)


def test_in_shared_mode_the_functions_get_no_iam_permissions(shared_stack: Stack) -> None:
    for role_id in ("ReconcilerRole", "DispatcherRole"):
        arn, policies = _principal(shared_stack, role_id)
        request = Request(arn, "iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/{STACK_KEY}/x")
        assert evaluate(request, policies) is not Decision.ALLOW


# --- API callers x routes, at the IAM layer ---------------------------------------------------------


def _routes() -> list[tuple[str, str]]:
    events = load_template()["Resources"]["ApiFunction"]["Properties"]["Events"]
    routes = sorted({(e["Properties"]["Method"].upper(), e["Properties"]["Path"]) for e in events.values()})
    assert routes, "no routes"
    return routes


API_ID = "abcdefghij"


def _route_arn(method: str, path: str, *, api: str = API_ID, stage: str = "api") -> str:
    concrete = path.replace("{name}", "web").replace("{version}", "2")
    return f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{api}/{stage}/{method}{concrete}"


def _ci_policy(stack: Stack) -> dict[str, Any]:
    """infra/ci-role.yaml's policy, with ApiExecuteArn = the stack's ApiInvokeArn output."""
    invoke = str(stack.resolver.resolve(stack.translated["Outputs"]["ApiInvokeArn"]["Value"]))
    invoke = invoke.replace(str(stack.resolver.ref("Api")), API_ID)
    ci = load_template(REPO_ROOT / "infra" / "ci-role.yaml")
    (policy,) = ci["Resources"]["CiRole"]["Properties"]["Policies"]
    return dict(
        json.loads(json.dumps(policy["PolicyDocument"]).replace('{"Ref": "ApiExecuteArn"}', json.dumps(invoke)))
    )


def test_every_api_caller_type_against_every_route(stack: Stack, made: dict[str, Replica]) -> None:
    """At the IAM layer the API answers to CI roles (one per team, infra/ci-role.yaml) on every route
    of this API's stage and to nobody else of the stack: no replica role, no function role. Which
    service a CI role may see or change is decided by the api itself (ServiceRecord.owner and its
    grants, branch `owners`); IAM cannot tell two teams' services apart by route."""
    ci_policy = _ci_policy(stack)
    ci_roles = {
        "ci team A": f"arn:aws:iam::{ACCOUNT}:role/team-a-ci",
        "ci team B": f"arn:aws:iam::{ACCOUNT}:role/team-b-ci",
    }
    others: dict[str, tuple[str, list[dict[str, Any]], Any]] = {
        "replica of A": (made["A"].arn, made["A"].policies, made["A"].boundary),
        "replica (shared role)": (stack.shared_role, [stack.managed("ReplicaAccessPolicy")], None),
    }
    for role_id in ("ReconcilerRole", "DispatcherRole", "CleanupRole", "ApiFunctionRole"):
        arn, policies = _principal(stack, role_id)
        others[role_id] = (arn, policies, None)
    for method, path in _routes():
        for caller, arn in ci_roles.items():
            request = Request(arn, "execute-api:Invoke", _route_arn(method, path))
            assert evaluate(request, [ci_policy]) is Decision.ALLOW, (caller, method, path)
            # Another API, or another stage of this one, is not what the role was given.
            for elsewhere in (_route_arn(method, path, api="zyxwvutsrq"), _route_arn(method, path, stage="test")):
                assert evaluate(Request(arn, "execute-api:Invoke", elsewhere), [ci_policy]) is not Decision.ALLOW
        for caller, (arn, policies, boundary) in others.items():
            request = Request(arn, "execute-api:Invoke", _route_arn(method, path))
            assert evaluate(request, policies, boundary=boundary) is not Decision.ALLOW, (caller, method, path)


def test_every_statement_of_the_stack_is_one_the_evaluator_reads(stack: Stack) -> None:
    """The proofs above would be void if the evaluator skipped what it cannot read: it raises instead,
    and every role and managed policy of the stack goes through it here."""
    documents = [stack.managed(p) for p in resources_of_type(stack.translated, "AWS::IAM::ManagedPolicy")]
    for role_id in resources_of_type(stack.translated, "AWS::IAM::Role"):
        documents += stack.role_policies(role_id)
    probe = Request(f"arn:aws:iam::{ACCOUNT}:role/x", "s3:GetObject", "arn:aws:s3:::b/k")
    for document in documents:
        for statement in as_list(document["Statement"]):
            evaluate(probe, [{"Statement": [statement]}])


# parliament's findings on the identity policies that are accepted, and why.
ACCEPTED_FINDINGS = {
    # parliament splits a Resource on ":" before substituting policy variables, so the colon of
    # ${aws:PrincipalTag/fleetkeeper-scope} misplaces the ARN's parts; IAM substitutes first (AWS's
    # policy-variables page uses ${aws:PrincipalTag/team} in S3 ARNs the same way).
    ("ReplicaOwnerPolicy", "RESOURCE_MISMATCH"),
    # iam:PermissionsBoundary compared with StringEquals to the policy's ARN, as AWS's own example on
    # the permissions-boundaries page does ("usable", says parliament).
    ("DispatcherIdentityPolicy", "MISMATCHED_TYPE_BUT_USABLE"),
}


def test_the_identity_policies_pass_parliament_but_for_what_is_accepted(stack: Stack) -> None:
    from tests.template.test_iam import parliament_findings

    found = set()
    for logical_id in ("ReplicaOwnerPolicy", "ReconcilerIdentityPolicy", "DispatcherIdentityPolicy"):
        document = stack.managed(logical_id)
        found |= {(logical_id, issue) for issue, _ in parliament_findings(document)}
    assert found == ACCEPTED_FINDINGS


def test_the_functions_still_reach_the_scoped_names(stack: Stack) -> None:
    """The api writes an owned service's secrets and workdir copies under its owner's scope, the
    reconciler reads a probe's secrets there, the cleanup lists and deletes them there."""
    secret, workdir = stack.secret("web", OWNER_A), stack.workdir("web", OWNER_A)
    incarnation_path = secret.rsplit("/", 1)[0]
    bucket = f"arn:aws:s3:::{stack.bucket}"
    prefix = workdir.removeprefix(bucket + "/").rsplit("/", 1)[0] + "/"

    def may(role_id: str, action: str, resource: str, **context: str) -> bool:
        arn, policies = _principal(stack, role_id)
        return evaluate(Request(arn, action, resource, dict(context)), policies) is Decision.ALLOW

    assert may("ApiFunctionRole", "ssm:PutParameter", secret)
    assert may("ApiFunctionRole", "ssm:GetParameter", secret)
    assert may("ApiFunctionRole", "s3:PutObject", workdir)  # CopyObject's target
    assert may("ReconcilerRole", "ssm:GetParameter", secret)
    assert may("CleanupRole", "ssm:GetParametersByPath", incarnation_path)
    assert may("CleanupRole", "ssm:DeleteParameters", secret)
    assert may("CleanupRole", "s3:ListBucket", bucket, **{"s3:prefix": prefix})
    assert may("CleanupRole", "s3:DeleteObject", workdir)


def test_the_stacks_key_decrypts_an_owners_secrets_for_that_owners_replicas_only(
    stack: Stack, made: dict[str, Replica]
) -> None:
    """The key policy (SecretsKey, statement SecretsReadByOwnersReplicas) admits the roles of the
    stack's path; each role's own policy narrows it to its owner's parameters. KMS needs both."""
    via_ssm = {"kms:ViaService": f"ssm.{REGION}.amazonaws.com"}

    def decrypt(replica: Replica, owner: str) -> Decision:
        context = {**replica.context, **via_ssm, "kms:EncryptionContext:PARAMETER_ARN": stack.secret("web", owner)}
        request = Request(replica.arn, "kms:Decrypt", stack.key, context)
        return evaluate(
            request, replica.policies, boundary=replica.boundary, resource=[stack.key_policy], key_policy=True
        )

    assert decrypt(made["A"], OWNER_A) is Decision.ALLOW
    assert decrypt(made["A"], OWNER_B) is Decision.IMPLICIT_DENY
    assert decrypt(made["B"], OWNER_B) is Decision.ALLOW
    assert decrypt(made["A"], "") is Decision.IMPLICIT_DENY
    # Another role of the account, however broad its own policy, is not on the stack's path.
    anywhere = {"Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": "*"}]}
    elsewhere = Replica(f"arn:aws:iam::{ACCOUNT}:role/team-b-ci", {}, [anywhere], None)
    assert decrypt(elsewhere, OWNER_A) is Decision.IMPLICIT_DENY
    # Nor is another stack's owner role, though its tag names the same scope.
    other_stack = Replica(
        made["A"].arn.replace(f"/fleetkeeper/{STACK_KEY}/", "/fleetkeeper/otherstack12/"),
        {"fleetkeeper-scope": str(owner_scope(OWNER_A))},
        made["A"].policies,
        made["A"].boundary,
    )
    assert decrypt(other_stack, OWNER_A) is Decision.IMPLICIT_DENY
