"""Same-account principals against every right that changes one of the stack's boundaries.

Teams share an account, and some of its principals hold broad rights (PowerUserAccess, `lambda:*`,
`sqs:*`, `ssm:*`, `kms:*`, `dynamodb:*`, `s3:GetObject` on `*`, an administrator's `*`). A resource
policy that denies one action is no boundary if the same principal may rewrite the policy, grant
around it or drain what it guards: so for each resource the stack owns, each right that changes its
boundary is evaluated (tests/support/iam_evaluator.py, on the translated template and infra/guardrails.yaml)
for these principals, the stack's own roles and its deployers, without the guardrail and with it (as
the service control policy, and as the permissions boundary of the account's other principals).

`EXPECTED` is the table docs/SECURITY.md ("Same-account principals") summarizes: what holds by the
stack's own policies ("held"), what holds only with the guardrail ("guardrail").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.local.template import load_template
from tests.support.cfn import ACCOUNT, PSEUDO, REGION, STACK, Resolver, as_list, resources_of_type
from tests.support.iam_evaluator import Decision, Request, evaluate

INFRA = Path(__file__).resolve().parents[2] / "infra"
KEY = "0123456789ab"  # tests/support/cfn.py's AWS::StackId, as template.yaml derives it
CONTROL_PLANE = "fleetkeeper:control-plane"
FULL_AWS_ACCESS = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
# AWS's PowerUserAccess: everything but IAM, Organizations and Account (and a few IAM reads).
POWER_USER = {
    "Statement": [
        {"Effect": "Allow", "NotAction": ["iam:*", "organizations:*", "account:*"], "Resource": "*"},
        {"Effect": "Allow", "Action": ["iam:CreateServiceLinkedRole", "iam:ListRoles"], "Resource": "*"},
    ]
}


def _star(*services: str) -> dict[str, Any]:
    return {"Statement": [{"Effect": "Allow", "Action": [f"{s}:*" for s in services], "Resource": "*"}]}


@dataclass(frozen=True)
class Principal:
    arn: str
    identity: list[dict[str, Any]]
    tags: dict[str, str] = field(default_factory=dict)
    boundary: dict[str, Any] | None = None
    stacks_own: bool = False  # the stack's role or deployer: never under the guardrail's boundary


# Same-account principals with broad rights (none of them the stack's).
OUTSIDERS = {
    "power-user": Principal(f"arn:aws:iam::{ACCOUNT}:role/PowerUser", [POWER_USER]),
    "lambda-star": Principal(f"arn:aws:iam::{ACCOUNT}:role/lambda-admin", [_star("lambda")]),
    "sqs-star": Principal(f"arn:aws:iam::{ACCOUNT}:role/sqs-admin", [_star("sqs")]),
    "ssm-star": Principal(f"arn:aws:iam::{ACCOUNT}:role/ssm-admin", [_star("ssm")]),
    "kms-star": Principal(f"arn:aws:iam::{ACCOUNT}:role/kms-admin", [_star("kms")]),
    "data-star": Principal(f"arn:aws:iam::{ACCOUNT}:role/data", [_star("dynamodb", "s3")]),
    "admin": Principal(f"arn:aws:iam::{ACCOUNT}:role/Admin", [FULL_AWS_ACCESS]),
}


class _Deployed(Resolver):
    """Values as CloudFormation hands them to AWS: Fn::Sub's `${!x}` is the literal `${x}`."""

    def resolve(self, value: Any) -> Any:
        resolved = super().resolve(value)
        if isinstance(value, dict) and len(value) == 1 and not isinstance(resolved, (bool, type(None))):
            return json.loads(json.dumps(resolved).replace("${!", "${"))
        return resolved


@pytest.fixture(scope="module")
def world(translated: dict[str, Any]) -> dict[str, Any]:
    """The stack's resources, their policies, its principals, and the guardrail made for it."""
    resolver = _Deployed(translated)
    resources = translated["Resources"]
    outputs = {name: resolver.resolve(body["Value"]) for name, body in translated["Outputs"].items()}

    def identity(role: str) -> list[dict[str, Any]]:
        docs = [p["PolicyDocument"] for p in resources[role]["Properties"].get("Policies", [])]
        for body in resources.values():
            attached = body["Type"] == "AWS::IAM::RolePolicy" and body["Properties"]["RoleName"] == {"Ref": role}
            if attached and ("Condition" not in body or resolver.condition(body["Condition"])):
                docs.append(body["Properties"]["PolicyDocument"])
        return [resolver.resolve(d) for d in docs]

    tag = {CONTROL_PLANE: KEY}
    roles = {
        name: Principal(resolver.get_att(role, "Arn"), identity(role), tag, stacks_own=True)
        for name, role in (
            ("api", "ApiFunctionRole"),
            ("reconciler", "ReconcilerRole"),
            ("dispatcher", "DispatcherRole"),
            ("cleanup", "CleanupRole"),
            ("wake", "WakeRole"),
        )
    }
    owner_policy = resolver.resolve(resources["ReplicaOwnerPolicy"]["Properties"]["PolicyDocument"])
    scope = "00aa11bb22cc33dd"
    roles["owner"] = Principal(
        f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/{KEY}/fk-{KEY}-{scope}",
        [owner_policy],
        {"fleetkeeper:stack": KEY, "fleetkeeper-scope": scope},
        boundary=owner_policy,
        stacks_own=True,
    )
    deployers = resolver.ref("DeployerPrincipalArns")
    for index, arn in enumerate(deployers):
        roles[f"deployer-{index}"] = Principal(arn, [FULL_AWS_ACCESS], stacks_own=True)

    table = resolver.get_att("Table", "Arn")
    table_name = resolver.ref("Table")
    guard = load_template(INFRA / "guardrails.yaml")
    guard["__parameter_values__"] = {
        **PSEUDO,
        "StackName": STACK,
        "StackKey": outputs["StackKey"],
        "DeployerPrincipalArns": deployers,
        "FunctionArns": sorted(set(outputs["FunctionArns"].split(","))),
        "StackRoleArns": [*outputs["ControlPlaneRoleArns"].split(","), resolver.ref("ReplicaRoleArn")],
        "TableArn": outputs["TableArn"],
        "QueueArns": outputs["QueueArns"].split(","),
        "WorkdirBucketName": resolver.ref("WorkdirBucket"),
        "SecretsKeyArn": outputs["SecretsKeyArn"],
        "OrganizationTargetIds": ["ou-abcd-12345678"],
    }
    guard_resolver = Resolver(guard)
    scps = [
        guard_resolver.resolve(guard["Resources"][lid]["Properties"]["Content"])
        for lid in ("FunctionsAndRolesPolicy", "DataAndPoliciesPolicy")
    ]
    boundary = guard_resolver.resolve(guard["Resources"]["PermissionsBoundary"]["Properties"]["PolicyDocument"])

    def function_policy(function: str) -> dict[str, Any]:
        """A function's resource policy: its AWS::Lambda::Permission resources, as Lambda writes them."""
        arn = resolver.get_att(function, "Arn")
        statements = []
        for body in resources_of_type(translated, "AWS::Lambda::Permission").values():
            props = resolver.resolve(body["Properties"])
            if props["FunctionName"] in (arn, resolver.ref(function)):
                condition = {"ArnLike": {"aws:SourceArn": props["SourceArn"]}} if "SourceArn" in props else None
                statement = {
                    "Effect": "Allow",
                    "Principal": {"Service": props["Principal"]},
                    "Action": props["Action"],
                    "Resource": arn,
                }
                if condition:
                    statement["Condition"] = condition
                statements.append(statement)
        return {"Statement": statements}

    def queue_policy(policy_id: str) -> dict[str, Any]:
        return dict(resolver.resolve(resources[policy_id]["Properties"]["PolicyDocument"]))

    bucket = resolver.get_att("WorkdirBucket", "Arn")
    return {
        "roles": roles,
        "scps": scps,
        "boundary": boundary,
        "guard": guard,
        "outputs": outputs,
        "resources": {
            "key": (
                resolver.get_att("SecretsKey", "Arn"),
                resolver.resolve(resources["SecretsKey"]["Properties"]["KeyPolicy"]),
            ),
            "kick-queue": (resolver.get_att("KickQueue", "Arn"), queue_policy("KickQueuePolicy")),
            "reconcile-queue": (resolver.get_att("ReconcileQueue", "Arn"), queue_policy("ReconcileQueuePolicy")),
            "failure-queue": (
                resolver.get_att("CleanupFailureQueue", "Arn"),
                queue_policy("CleanupFailureQueuePolicy"),
            ),
            "bucket": (bucket, resolver.resolve(resources["WorkdirBucketPolicy"]["Properties"]["PolicyDocument"])),
            "workdir": (f"{bucket}/services/_o/{scope}/web/u1/abc.tar.gz", None),
            "other-owners-workdir": (f"{bucket}/services/_o/ffffffffffffffff/web/u1/abc.tar.gz", None),
            "table": (table, resolver.resolve(resources["Table"]["Properties"]["ResourcePolicy"]["PolicyDocument"])),
            "role-path": (f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/{KEY}/fk-{KEY}-eeeeeeeeeeeeeeee", None),
            "parameters": (
                f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/fleetkeeper/{table_name}/_o/{scope}/web/u1/1",
                None,
            ),
            **{
                name: (resolver.get_att(function, "Arn"), function_policy(function))
                for name, function in (
                    ("api-function", "ApiFunction"),
                    ("cleanup-function", "CleanupFunction"),
                    ("wake-function", "WakeFunction"),
                    ("reconciler-function", "ReconcilerFunction"),
                )
            },
        },
        "owner-boundary": resolver.ref("ReplicaOwnerPolicy"),
    }


def decide(
    world: dict[str, Any],
    who: Principal,
    action: str,
    resource: str,
    *,
    guardrail: str | None = None,
    context: dict[str, str | list[str]] | None = None,
) -> Decision:
    """`who` asks for `action` on the stack's resource `resource` (a name of world["resources"]), with
    no guardrail, with the SCP, or with the guardrail as the permissions boundary of principals that
    are not the stack's."""
    base = resource.split("/")[0] if resource.startswith("bucket/") else resource
    arn, policy = world["resources"][base]
    if base == "bucket" and resource != "bucket":
        arn = f"{arn}/{resource.split('/', 1)[1]}"
    if resource in ("workdir", "other-owners-workdir"):
        policy = world["resources"]["bucket"][1]
    request_context: dict[str, str | list[str]] = {f"aws:PrincipalTag/{k}": v for k, v in who.tags.items()}
    request_context.update(context or {})
    boundary = who.boundary
    if guardrail == "boundary" and not who.stacks_own:
        boundary = world["boundary"]
    scps = [FULL_AWS_ACCESS, *world["scps"]] if guardrail == "scp" else None
    return evaluate(
        Request(who.arn, action, arn, request_context),
        who.identity,
        boundary=boundary,
        resource=[policy] if policy else None,
        key_policy=resource == "key",
        scps=scps,
    )


# (resource, action, context): every right that changes a boundary of the stack, or goes around one.
VIA_SSM = {"kms:ViaService": f"ssm.{REGION}.amazonaws.com"}
BOUNDARY_RIGHTS: list[tuple[str, str, dict[str, Any]]] = [
    ("key", "kms:CreateGrant", {}),
    ("key", "kms:PutKeyPolicy", {}),
    ("key", "kms:DisableKey", {}),
    ("key", "kms:ScheduleKeyDeletion", {}),
    ("kick-queue", "sqs:SetQueueAttributes", {}),
    ("kick-queue", "sqs:AddPermission", {}),
    ("kick-queue", "sqs:PurgeQueue", {}),
    ("kick-queue", "sqs:ReceiveMessage", {}),
    ("kick-queue", "sqs:DeleteMessage", {}),
    ("kick-queue", "sqs:SendMessage", {}),
    ("reconcile-queue", "sqs:SetQueueAttributes", {}),
    ("reconcile-queue", "sqs:PurgeQueue", {}),
    ("failure-queue", "sqs:PurgeQueue", {}),
    ("failure-queue", "sqs:SetQueueAttributes", {}),
    ("bucket", "s3:PutBucketPolicy", {}),
    ("bucket", "s3:PutReplicationConfiguration", {}),
    ("bucket", "s3:ListBucket", {}),
    ("workdir", "s3:GetObject", {}),
    ("workdir", "s3:PutObject", {}),
    ("table", "dynamodb:PutResourcePolicy", {}),
    ("table", "dynamodb:PutItem", {}),
    ("table", "dynamodb:UpdateItem", {}),
    ("table", "dynamodb:GetItem", {}),
    ("table", "dynamodb:ExportTableToPointInTime", {}),
    ("role-path", "iam:CreateRole", {}),
    ("role-path", "iam:PutRolePolicy", {}),
    ("role-path", "iam:TagRole", {}),
    ("role-path", "iam:UpdateAssumeRolePolicy", {}),
    ("api-function", "lambda:InvokeFunction", {}),
    ("api-function", "lambda:AddPermission", {}),
    ("api-function", "lambda:UpdateFunctionCode", {}),
    ("api-function", "lambda:UpdateFunctionConfiguration", {}),
    ("cleanup-function", "lambda:InvokeFunction", {}),
    ("wake-function", "lambda:InvokeFunction", {}),
    ("wake-function", "lambda:PutFunctionConcurrency", {}),
    ("parameters", "ssm:PutParameter", {}),
    ("parameters", "ssm:DeleteParameter", {}),
]

# What holds without the guardrail, by the stack's own policies: the key, queue, bucket and table
# policies. Lambda's function policies cannot deny, IAM has no resource policy for role creation, and
# a parameter has none: those rights are the account's IAM policies' to give, and only the guardrail
# takes them from the principals that have them.
HELD_BY_THE_STACK = {"key", "kick-queue", "reconcile-queue", "failure-queue", "bucket", "workdir", "table"}


@pytest.mark.parametrize("outsider", sorted(OUTSIDERS))
@pytest.mark.parametrize(("resource", "action", "context"), BOUNDARY_RIGHTS)
def test_no_same_account_principal_changes_a_boundary_with_the_guardrail(
    world: dict[str, Any], outsider: str, resource: str, action: str, context: dict[str, Any]
) -> None:
    who = OUTSIDERS[outsider]
    for guardrail in ("scp", "boundary"):
        decision = decide(world, who, action, resource, guardrail=guardrail, context=context)
        assert decision is not Decision.ALLOW, (guardrail, outsider, action, resource)


@pytest.mark.parametrize("outsider", sorted(OUTSIDERS))
@pytest.mark.parametrize(("resource", "action", "context"), BOUNDARY_RIGHTS)
def test_without_the_guardrail_the_stacks_own_policies_hold_what_they_can(
    world: dict[str, Any], outsider: str, resource: str, action: str, context: dict[str, Any]
) -> None:
    """The key, queues, bucket and table deny every outsider by themselves (an administrator's `*`
    included); what remains is what the outsider's own IAM policy grants on the functions, the role
    path and the parameters (docs/SECURITY.md lists it)."""
    who = OUTSIDERS[outsider]
    decision = decide(world, who, action, resource, context=context)
    if resource in HELD_BY_THE_STACK:
        assert decision is not Decision.ALLOW, (outsider, action, resource)
    else:
        granted = evaluate(Request(who.arn, action, world["resources"][resource][0]), who.identity)
        assert (decision is Decision.ALLOW) == (granted is Decision.ALLOW), (outsider, action, resource)


# What the stack's own principals must keep, with the guardrail attached as the SCP (they are never
# under its boundary). (principal, resource, action, context)
KEPT: list[tuple[str, str, str, dict[str, Any]]] = [
    ("api", "table", "dynamodb:PutItem", {}),
    ("api", "table", "dynamodb:Query", {}),
    ("reconciler", "table", "dynamodb:UpdateItem", {}),
    ("cleanup", "table", "dynamodb:GetItem", {}),
    ("cleanup", "table", "dynamodb:BatchWriteItem", {}),
    ("wake", "table", "dynamodb:UpdateItem", {"dynamodb:LeadingKeys": ["SVC#web"]}),
    ("api", "kick-queue", "sqs:SendMessage", {}),
    ("reconciler", "kick-queue", "sqs:ReceiveMessage", {}),
    ("reconciler", "kick-queue", "sqs:DeleteMessage", {}),
    ("reconciler", "reconcile-queue", "sqs:ReceiveMessage", {}),
    ("dispatcher", "reconcile-queue", "sqs:SendMessage", {}),
    ("cleanup", "failure-queue", "sqs:SendMessage", {}),
    ("api", "bucket/uploads/abc", "s3:PutObject", {}),
    ("api", "bucket/services/_o/00aa11bb22cc33dd/web/u1/abc.tar.gz", "s3:PutObject", {}),
    ("api", "bucket", "s3:ListBucket", {}),
    ("cleanup", "bucket/services/web/u1/abc.tar.gz", "s3:DeleteObject", {}),
    ("owner", "workdir", "s3:GetObject", {}),
    ("api", "parameters", "ssm:PutParameter", {}),
    ("api", "key", "kms:Encrypt", {}),
    ("owner", "key", "kms:Decrypt", {}),
]
for _deployer in ("deployer-0", "deployer-1"):
    KEPT += [
        (_deployer, "key", "kms:PutKeyPolicy", {}),
        (_deployer, "key", "kms:ScheduleKeyDeletion", {}),
        (_deployer, "key", "kms:CreateAlias", {}),
        (_deployer, "kick-queue", "sqs:SetQueueAttributes", {}),
        (_deployer, "failure-queue", "sqs:ReceiveMessage", {}),
        (_deployer, "bucket", "s3:PutBucketPolicy", {}),
        (_deployer, "bucket", "s3:DeleteBucket", {}),
        (_deployer, "table", "dynamodb:PutResourcePolicy", {}),
        (_deployer, "table", "dynamodb:UpdateTable", {}),
        (_deployer, "api-function", "lambda:UpdateFunctionCode", {}),
        (_deployer, "api-function", "lambda:AddPermission", {}),
        (_deployer, "parameters", "ssm:DeleteParameter", {}),
    ]


def _context_of(world: dict[str, Any], who: str, resource: str, action: str) -> dict[str, Any]:
    """What AWS puts in these requests besides the principal's tags."""
    if resource == "key":
        parameter = world["resources"]["parameters"][0]
        return {**VIA_SSM, "kms:EncryptionContext:PARAMETER_ARN": parameter}
    if action == "iam:CreateRole":
        return {
            "iam:PermissionsBoundary": world["owner-boundary"],
            "aws:RequestTag/fleetkeeper:stack": KEY,
            "aws:TagKeys": ["fleetkeeper:stack", "fleetkeeper-scope"],
        }
    return {}


def test_the_stacks_role_that_makes_owner_identities_keeps_making_them(world: dict[str, Any]) -> None:
    """Whichever of the stack's roles creates the owners' roles on its path (its identity policy
    allows it, with the owner policy as the boundary), the guardrail leaves it that right."""
    context = _context_of(world, "", "role-path", "iam:CreateRole")
    makers = [
        name
        for name, role in world["roles"].items()
        if role.tags.get(CONTROL_PLANE) == KEY
        and decide(world, role, "iam:CreateRole", "role-path", context=context) is Decision.ALLOW
    ]
    assert makers
    for name in makers:
        for guardrail in ("scp", "boundary"):
            decision = decide(
                world, world["roles"][name], "iam:CreateRole", "role-path", guardrail=guardrail, context=context
            )
            assert decision is Decision.ALLOW, (name, guardrail)


@pytest.mark.parametrize(("who", "resource", "action", "context"), KEPT)
def test_the_stacks_roles_and_deployers_keep_what_they_do(
    world: dict[str, Any], who: str, resource: str, action: str, context: dict[str, Any]
) -> None:
    principal = world["roles"][who]
    full_context = {**_context_of(world, who, resource, action), **context}
    for guardrail in (None, "scp", "boundary"):
        decision = decide(world, principal, action, resource, guardrail=guardrail, context=full_context)
        assert decision is Decision.ALLOW, (guardrail, who, action, resource, decision)


# --- each attack of the review --------------------------------------------------------------------


def test_only_api_gateway_invokes_the_api_and_nobody_but_the_load_balancer_the_wake_target(
    world: dict[str, Any],
) -> None:
    """A direct invocation names any caller in requestContext.identity: with the guardrail no IAM
    principal of the account invokes the api (the deployers included); API Gateway (a service
    principal, which SCPs do not filter) still does, for its own API only."""
    api_arn, api_policy = world["resources"]["api-function"]
    gateway = Request(
        "apigateway.amazonaws.com",
        "lambda:InvokeFunction",
        api_arn,
        {"aws:SourceArn": f"arn:aws:execute-api:{REGION}:{ACCOUNT}:fk-test-Api-ABC123/api/POST/v1/services"},
    )
    scps = [FULL_AWS_ACCESS, *world["scps"]]
    assert evaluate(gateway, [], resource=[api_policy], scps=scps) is Decision.ALLOW
    other_api = Request(
        gateway.principal, gateway.action, api_arn, {"aws:SourceArn": "arn:aws:execute-api:x:1:other/*"}
    )
    assert evaluate(other_api, [], resource=[api_policy], scps=scps) is not Decision.ALLOW
    for function in ("api-function", "cleanup-function", "wake-function", "reconciler-function"):
        for who in (*OUTSIDERS.values(), *world["roles"].values()):
            assert decide(world, who, "lambda:InvokeFunction", function, guardrail="scp") is Decision.EXPLICIT_DENY
    wake_arn, wake_policy = world["resources"]["wake-function"]
    group = f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT}:targetgroup/fkwake-{KEY}/0123456789abcdef"
    elb = Request("elasticloadbalancing.amazonaws.com", "lambda:InvokeFunction", wake_arn, {"aws:SourceArn": group})
    assert evaluate(elb, [], resource=[wake_policy], scps=scps) is Decision.ALLOW


def test_a_role_made_on_the_stacks_path_decrypts_only_with_the_stacks_tags_and_the_guardrail_stops_making_one(
    world: dict[str, Any],
) -> None:
    """The key policy admitted every role under role/fleetkeeper/<stack>/: whoever may iam:CreateRole
    there made one and decrypted every owner's secrets. Now the role must carry the stack's tag, and
    decrypts only parameters of the scope its own tag names; CreateRole (or TagRole) on the path with
    those tags is what still changes the boundary, and the guardrail denies it to all but the stack's
    roles."""
    key_arn, key_policy = world["resources"]["key"]
    owner = world["roles"]["owner"]
    mine, theirs = (
        world["resources"]["parameters"][0],
        world["resources"]["parameters"][0].replace("00aa11bb22cc33dd", "ffffffffffffffff"),
    )
    attacker_policy = [_star("kms")]
    untagged = Principal(f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper/{KEY}/made-by-someone", attacker_policy)
    forged = Principal(
        untagged.arn, attacker_policy, {"fleetkeeper:stack": KEY, "fleetkeeper-scope": "ffffffffffffffff"}
    )

    def decrypt(who: Principal, parameter: str) -> Decision:
        context: dict[str, Any] = {**VIA_SSM, "kms:EncryptionContext:PARAMETER_ARN": parameter}
        context.update({f"aws:PrincipalTag/{k}": v for k, v in who.tags.items()})
        return evaluate(
            Request(who.arn, "kms:Decrypt", key_arn, context), who.identity, resource=[key_policy], key_policy=True
        )

    assert decrypt(untagged, theirs) is Decision.IMPLICIT_DENY  # the path alone is no longer enough
    assert decrypt(owner, mine) is Decision.ALLOW
    assert decrypt(owner, theirs) is not Decision.ALLOW  # its own scope only, by the key policy too
    # A role made with the stack's tags, by a principal allowed iam:CreateRole and iam:TagRole there:
    assert decrypt(forged, theirs) is Decision.ALLOW  # what the guardrail is for
    admin = OUTSIDERS["admin"]
    create = {"aws:RequestTag/fleetkeeper:stack": KEY, "aws:TagKeys": ["fleetkeeper:stack", "fleetkeeper-scope"]}
    assert decide(world, admin, "iam:CreateRole", "role-path", context=create) is Decision.ALLOW
    assert (
        decide(world, admin, "iam:CreateRole", "role-path", guardrail="scp", context=create) is Decision.EXPLICIT_DENY
    )


def test_a_principal_may_not_pass_the_stacks_roles_nor_tag_itself_as_the_control_plane(world: dict[str, Any]) -> None:
    """Passing the api's role to a function of one's own acts as the api (it writes the table, its
    policies' tag admits it); tagging one's own role fleetkeeper:control-plane passes the table's
    policy. Both are the guardrail's."""
    admin = OUTSIDERS["admin"]
    scps = [FULL_AWS_ACCESS, *world["scps"]]
    api_role = world["roles"]["api"].arn
    passing = Request(admin.arn, "iam:PassRole", api_role, {"iam:PassedToService": "lambda.amazonaws.com"})
    assert evaluate(passing, admin.identity) is Decision.ALLOW
    assert evaluate(passing, admin.identity, scps=scps) is Decision.EXPLICIT_DENY
    tagging = Request(admin.arn, "iam:TagRole", admin.arn, {"aws:TagKeys": [CONTROL_PLANE]})
    assert evaluate(tagging, admin.identity, scps=scps) is Decision.EXPLICIT_DENY
    # A version or an alias of a function is the function (its qualified ARN).
    qualified = f"{world['resources']['api-function'][0]}:$LATEST"
    invoking = Request(admin.arn, "lambda:InvokeFunction", qualified)
    assert evaluate(invoking, admin.identity) is Decision.ALLOW
    assert evaluate(invoking, admin.identity, scps=scps) is Decision.EXPLICIT_DENY
    for function_arn in (world["resources"]["api-function"][0], qualified):
        mapping = Request(admin.arn, "lambda:CreateEventSourceMapping", "*", {"lambda:FunctionArn": function_arn})
        assert evaluate(mapping, admin.identity, scps=scps) is Decision.EXPLICIT_DENY
    # The table admits a principal by the tag: one that carries it passes the table's own policy.
    tagged = Principal(admin.arn, admin.identity, {CONTROL_PLANE: KEY})
    assert decide(world, tagged, "dynamodb:PutItem", "table") is Decision.ALLOW
    assert decide(world, admin, "dynamodb:PutItem", "table") is Decision.EXPLICIT_DENY


def test_an_owner_role_reads_only_its_own_workdirs_and_a_path_role_without_the_tag_none(world: dict[str, Any]) -> None:
    owner = world["roles"]["owner"]
    assert decide(world, owner, "s3:GetObject", "workdir") is Decision.ALLOW
    assert decide(world, owner, "s3:GetObject", "other-owners-workdir") is Decision.EXPLICIT_DENY
    # Even with an identity policy of its own that allows every object (a role made otherwise).
    wide = Principal(owner.arn, [_star("s3")], owner.tags)
    assert decide(world, wide, "s3:GetObject", "other-owners-workdir") is Decision.EXPLICIT_DENY
    assert decide(world, wide, "s3:GetObject", "bucket/uploads/abc") is Decision.EXPLICIT_DENY
    untagged = Principal(owner.arn, [_star("s3")], {"fleetkeeper-scope": "00aa11bb22cc33dd"})
    assert decide(world, untagged, "s3:GetObject", "workdir") is Decision.EXPLICIT_DENY


def test_anyone_can_no_longer_tell_whether_a_digest_was_uploaded(world: dict[str, Any]) -> None:
    """ListBucket turned a HeadObject's 403 into a 404 for a missing key; both are the stack's own now."""
    for who in OUTSIDERS.values():
        assert decide(world, who, "s3:ListBucket", "bucket") is not Decision.ALLOW
        assert decide(world, who, "s3:GetObject", "bucket/uploads/abc") is not Decision.ALLOW


# --- the guardrail itself ---------------------------------------------------------------------------


def test_the_scps_and_the_boundary_deny_the_same_rights(world: dict[str, Any]) -> None:
    scp = {s["Sid"]: s for policy in world["scps"] for s in policy["Statement"]}
    assert len(scp) == sum(len(policy["Statement"]) for policy in world["scps"])  # no Sid twice
    boundary = {s["Sid"]: s for s in world["boundary"]["Statement"] if s["Effect"] == "Deny"}
    assert set(boundary) - set(scp) == {"DenyRemovingBoundaries"}
    for sid, statement in scp.items():
        assert statement == boundary[sid], sid
    assert all(s["Effect"] == "Deny" for s in scp.values())
    # The boundary allows whatever else its principal's policies do (a boundary grants nothing).
    assert {"Sid": "EverythingElse", "Effect": "Allow", "Action": "*", "Resource": "*"} in world["boundary"][
        "Statement"
    ]


def test_each_scp_fits_organizations_limit(world: dict[str, Any]) -> None:
    """Organizations takes at most 5,120 characters an SCP: CloudFormation sends the Content as
    compact JSON. Measured with a stack name of 40 characters (the generated names of its functions
    and roles grow with it) and three deployers. Not verified: whether Organizations counts the
    JSON as CloudFormation serializes it or minified; compact is the smallest it can be."""
    long_name = "a" * 40
    for policy in world["scps"]:
        text = json.dumps(policy, separators=(",", ":")).replace(STACK, long_name)
        third = (
            f',"arn:aws:iam::{ACCOUNT}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Deployers_0123456789abcdef"'
        )
        text = text.replace('-DeployerPrincipalArns-b"', '-DeployerPrincipalArns-b"' + third)
        assert len(text) <= 5120, len(text)


def test_the_scp_is_made_only_when_it_has_targets(world: dict[str, Any]) -> None:
    guard = dict(world["guard"])
    guard["__parameter_values__"] = {**guard["__parameter_values__"], "OrganizationTargetIds": []}
    assert not Resolver(guard).condition("CreatesServiceControlPolicy")
    assert Resolver(world["guard"]).condition("CreatesServiceControlPolicy")
    for lid in ("FunctionsAndRolesPolicy", "DataAndPoliciesPolicy"):
        assert world["guard"]["Resources"][lid]["Condition"] == "CreatesServiceControlPolicy"


def test_the_guardrails_parameters_are_the_stacks_outputs(translated: dict[str, Any], world: dict[str, Any]) -> None:
    """Every list the guardrail takes is an output of the stack (or a parameter of it), so a platform
    team copies values, never guesses names."""
    outputs = world["outputs"]
    assert outputs["StackKey"] == KEY
    functions = set(outputs["FunctionArns"].split(","))
    resolver = Resolver(translated)
    lambdas = {
        resolver.get_att(lid, "Arn")
        for lid, body in resources_of_type(translated, "AWS::Lambda::Function").items()
        if ("Condition" not in body or resolver.condition(body["Condition"])) and lid != "UninstallFunction"
    }
    # The uninstall cleanup is left out (the SCP would pass Organizations' size limit): a forged
    # invocation of it removes nothing unless its own stack is being deleted (tests/uninstall).
    assert functions == lambdas
    roles = set(outputs["ControlPlaneRoleArns"].split(","))
    tagged = {
        Resolver(translated).get_att(lid, "Arn")
        for lid, body in resources_of_type(translated, "AWS::IAM::Role").items()
        if {"Key": CONTROL_PLANE, "Value": KEY} in Resolver(translated).resolve(body["Properties"].get("Tags", []))
    }
    assert roles == tagged
    assert {"ApiFunctionRole", "ReconcilerRole", "DispatcherRole", "CleanupRole", "WakeRole"} == {
        lid
        for lid, body in resources_of_type(translated, "AWS::IAM::Role").items()
        if any(t["Key"] == CONTROL_PLANE for t in as_list(body["Properties"].get("Tags", [])))
    }
