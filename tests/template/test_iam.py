"""Least privilege across every role of the translated stack, checked by structure and by parliament.

Roles of functions that are not in the template yet are simply not iterated; their specific
assertions live in tests/template/test_reconciler.py and tests/template/test_cleanup.py.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests import TESTS_DIR
from tests.support.cfn import (
    Resolver,
    as_list,
    function_ids,
    function_role,
    refers_to,
    resources_of_type,
    role_policies,
    role_statements,
)

ALLOWLIST_PATH = TESTS_DIR / "parliament_allowlist.yaml"


def roles(translated: dict[str, Any]) -> list[str]:
    return sorted(resources_of_type(translated, "AWS::IAM::Role"))


def wildcard_actions(statements: list[dict[str, Any]]) -> list[str]:
    """Actions that are or contain a wildcard, and any NotAction (an allow-everything-but)."""
    found = []
    for statement in statements:
        if "NotAction" in statement:
            found.append(f"NotAction {statement['NotAction']!r}")
        found += [str(a) for a in as_list(statement.get("Action", [])) if "*" in str(a)]
    return found


def test_no_role_allows_a_wildcard_action(translated: dict[str, Any]) -> None:
    assert roles(translated), "no roles found"
    offenders = {role: wildcard_actions(role_statements(translated, role)) for role in roles(translated)}
    assert {role: bad for role, bad in offenders.items() if bad} == {}


def test_the_wildcard_check_can_fail() -> None:
    statements = [{"Effect": "Allow", "Action": ["ec2:Describe*", "logs:PutLogEvents"], "Resource": "*"}]
    assert wildcard_actions(statements) == ["ec2:Describe*"]
    assert wildcard_actions([{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}]) == ["NotAction 'iam:*'"]


def test_no_role_attaches_managed_policies(translated: dict[str, Any]) -> None:
    """AWS managed policies (e.g. AWSLambdaBasicExecutionRole, which SAM attaches to the roles it
    generates) grant logs:* actions on Resource "*" and cannot be audited offline. Every function
    gets an explicit role whose log permissions name its own log group instead."""
    attached = {
        role: props["ManagedPolicyArns"]
        for role in roles(translated)
        if (props := translated["Resources"][role]["Properties"]).get("ManagedPolicyArns")
    }
    assert attached == {}


def test_roles_are_assumable_by_their_service_only(translated: dict[str, Any]) -> None:
    for role in roles(translated):
        trust = translated["Resources"][role]["Properties"]["AssumeRolePolicyDocument"]
        for statement in as_list(trust["Statement"]):
            principal = statement["Principal"]
            assert set(principal) == {"Service"}, f"{role} trusts {principal!r}"
            assert all(str(s).endswith(".amazonaws.com") for s in as_list(principal["Service"])), role


def test_every_function_logs_to_its_own_group_with_retention(translated: dict[str, Any]) -> None:
    groups = resources_of_type(translated, "AWS::Logs::LogGroup")
    for function in function_ids(translated):
        props = translated["Resources"][function]["Properties"]
        configured = (props.get("LoggingConfig") or {}).get("LogGroup")
        if configured is not None:
            owners = [lid for lid in groups if refers_to(configured, lid)]
        else:
            # The default group, /aws/lambda/<function name>, created by the stack with retention.
            owners = [
                lid
                for lid, group in groups.items()
                if refers_to(group["Properties"].get("LogGroupName"), function)
                and "/aws/lambda/${" in json.dumps(group["Properties"]["LogGroupName"])
            ]
        assert len(owners) == 1, f"{function}: no log group of the stack receives its logs"
        assert groups[owners[0]]["Properties"].get("RetentionInDays") == {"Ref": "LogRetentionDays"}, function


def test_log_permissions_name_the_functions_own_group(translated: dict[str, Any]) -> None:
    resolver = Resolver(translated)
    groups = resources_of_type(translated, "AWS::Logs::LogGroup")
    for function in function_ids(translated):
        role = function_role(translated, function)
        log_statements = [
            s
            for s in role_statements(translated, role)
            if any(str(a).startswith("logs:") for a in as_list(s["Action"]))
        ]
        assert log_statements, f"{role} cannot write logs"
        props = translated["Resources"][function]["Properties"]
        configured = (props.get("LoggingConfig") or {}).get("LogGroup")
        if configured is not None:
            group_name = str(resolver.resolve(configured))
        else:
            group_name = next(
                str(resolver.resolve(g["Properties"]["LogGroupName"]))
                for g in groups.values()
                if refers_to(g["Properties"].get("LogGroupName"), function)
            )
        for statement in log_statements:
            for resource in as_list(resolver.resolve(statement["Resource"])):
                assert f":log-group:{group_name}:" in resource, f"{role}: {resource} is not {group_name}"


# --- parliament --------------------------------------------------------------------------------------


def load_allowlist(translated: dict[str, Any]) -> list[dict[str, Any]]:
    """The allow list, each entry bound to a role id (entries name a function; its role is looked up).

    Entries for functions not in the template yet (merged from other branches) are left out.
    """
    document = yaml.safe_load(ALLOWLIST_PATH.read_text(encoding="utf-8")) or {}
    entries: list[dict[str, Any]] = []
    for entry in document.get("allow") or []:
        assert {"function", "issue", "why"} <= set(entry), f"an entry needs function, issue and why: {entry}"
        assert len(str(entry["why"]).strip()) > 40, f"say why: {entry}"
        if entry["function"] in translated["Resources"]:
            entries.append({**entry, "role": function_role(translated, entry["function"])})
    return entries


def parliament_findings(policy: dict[str, Any]) -> list[tuple[str, str]]:
    """(issue, detail) of every parliament finding on one policy document."""
    import parliament

    analyzed = parliament.analyze_policy_string(json.dumps(policy))
    return [(f.issue, json.dumps(f.detail, sort_keys=True, default=str)) for f in analyzed.findings]


def allowed(role: str, finding: tuple[str, str], entries: list[dict[str, Any]]) -> bool:
    issue, detail = finding
    return any(
        e["role"] == role and e["issue"] == issue and str(e.get("detail_contains", "")) in detail for e in entries
    )


def test_parliament_audits_and_finds_real_problems() -> None:
    """The auditor is wired up: a table action on Resource "*" and an unknown action are reported."""
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*"},
            {"Effect": "Allow", "Action": "dynamodb:GetItemz", "Resource": "*"},
        ],
    }
    issues = {issue for issue, _ in parliament_findings(policy)}
    assert {"RESOURCE_STAR", "UNKNOWN_ACTION"} <= issues


def test_roles_pass_parliament(translated: dict[str, Any]) -> None:
    entries = load_allowlist(translated)
    resolver = Resolver(translated)
    unexpected: dict[str, list[tuple[str, str]]] = {}
    for role in roles(translated):
        for policy in role_policies(translated, role):
            findings = parliament_findings(resolver.resolve(policy))
            bad = [f for f in findings if not allowed(role, f, entries)]
            if bad:
                unexpected.setdefault(role, []).extend(bad)
    assert unexpected == {}, "parliament findings not in tests/parliament_allowlist.yaml"


def test_allowlist_has_no_stale_entries(translated: dict[str, Any]) -> None:
    """An allowance for a role that is deployed but no longer needs it must be removed."""
    resolver = Resolver(translated)
    for entry in load_allowlist(translated):
        findings = [
            f
            for policy in role_policies(translated, entry["role"])
            for f in parliament_findings(resolver.resolve(policy))
        ]
        assert any(allowed(entry["role"], f, [entry]) for f in findings), f"stale allowance: {entry}"


# --- the api function -------------------------------------------------------------------------------


SECRETS_ARN = "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter/fleetkeeper/${Table}/*"
HMAC_KEY_ARN = (
    "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter/fleetkeeper-api/${Table}/request-hmac-key"
)


REPLICA_STREAMS = (
    "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:${ReplicaLogGroup}:log-stream:*"
)


def test_replicas_may_read_their_workdirs_and_secrets_ship_their_logs_and_nothing_else(
    translated: dict[str, Any],
) -> None:
    policy = translated["Resources"]["ReplicaAccessPolicy"]["Properties"]["PolicyDocument"]
    # What the shared role may not reach (owners' scoped names) is proven by evaluation in
    # tests/template/test_replica_identity.py.
    grants = {
        a: s["Resource"]
        for s in as_list(policy["Statement"])
        if s.get("Effect") == "Allow"
        for a in as_list(s["Action"])
    }
    assert grants == {
        "s3:GetObject": {"Fn::Sub": "${WorkdirBucket.Arn}/services/*"},
        "ssm:GetParameter": {"Fn::Sub": SECRETS_ARN},
        # How the boot verifies the parameter's type and key (reconciler/replica_boot.py).
        "ssm:GetParameterHistory": {"Fn::Sub": SECRETS_ARN},
        # The values' key, through Parameter Store only (tests/replicas/test_secrets_kms_key.py).
        "kms:Decrypt": {"Fn::GetAtt": ["SecretsKey", "Arn"]},
        # Their own streams in the stack's replica log group, nothing else of CloudWatch Logs.
        "logs:CreateLogStream": {"Fn::Sub": REPLICA_STREAMS},
        "logs:PutLogEvents": {"Fn::Sub": REPLICA_STREAMS},
    }
    group = translated["Resources"]["ReplicaLogGroup"]["Properties"]
    assert group["RetentionInDays"] == {"Ref": "ReplicaLogRetentionDays"}
    assert translated["Outputs"]["ReplicaLogGroup"]["Value"] == {"Ref": "ReplicaLogGroup"}
    outputs = translated["Outputs"]
    assert outputs["ReplicaAccessPolicyArn"]["Value"] == {"Ref": "ReplicaAccessPolicy"}


def test_the_workdir_bucket_is_private_encrypted_tls_only_and_expires_unadopted_uploads(
    translated: dict[str, Any],
) -> None:
    bucket = translated["Resources"]["WorkdirBucket"]["Properties"]
    assert bucket["PublicAccessBlockConfiguration"] == dict.fromkeys(
        ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"), True
    )
    sse = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
    assert sse["SSEAlgorithm"] == "aws:kms"
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpireUnadoptedUploads"]["Prefix"] == "uploads/"
    assert rules["ExpireUnadoptedUploads"]["ExpirationInDays"] == 1
    # Adopted copies (services/) are never expired by age: a replica launched months later reads them.
    assert all(r.get("Prefix", "") != "services/" for r in rules.values())
    policy = translated["Resources"]["WorkdirBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in policy)


def test_api_function_only_reads_and_writes_the_table_and_kicks_the_reconciler(
    translated: dict[str, Any],
) -> None:
    role = function_role(translated, "ApiFunction")
    allowed_actions = {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:Query",
        "dynamodb:ConditionCheckItem",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "sqs:SendMessage",
        # Workdirs: presigned uploads (signed with this role), their copies per incarnation.
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:ListBucket",
        # A version's secret values (one SecureString each, under /fleetkeeper/<table>/).
        "ssm:PutParameter",
        "ssm:GetParameter",
        "ssm:DeleteParameter",
        "ssm:DeleteParameters",
        "ssm:GetParametersByPath",
        # Tagging what it creates with the stack's id (conditioned on it: tests/stacks/test_isolation_iam.py).
        "s3:PutObjectTagging",
        "ssm:AddTagsToResource",
    }
    for statement in role_statements(translated, role):
        assert statement["Effect"] == "Allow"
        actions = set(as_list(statement["Action"]))
        assert actions <= allowed_actions, actions - allowed_actions
        resources = as_list(statement["Resource"])
        if any(a.startswith("dynamodb:") for a in actions):
            assert all(refers_to(r, "Table") for r in resources), resources
        if "sqs:SendMessage" in actions:
            assert resources and all(refers_to(r, "KickQueue") for r in resources), resources
        if any(a.startswith("s3:") for a in actions):
            assert resources and all(refers_to(r, "WorkdirBucket") for r in resources), resources
        if any(a.startswith("ssm:") for a in actions):
            # Its secrets' path, or the one parameter of the idempotency fingerprint's HMAC key
            # (fleetkeeper/api/request_hmac.py): read and created, nothing else.
            assert resources in ([{"Fn::Sub": SECRETS_ARN}], [{"Fn::Sub": HMAC_KEY_ARN}]), resources
            if resources == [{"Fn::Sub": HMAC_KEY_ARN}]:
                # (AddTagsToResource: its stack-id tag at creation, tests/stacks/test_isolation_iam.py.)
                assert actions in ({"ssm:GetParameter", "ssm:PutParameter"}, {"ssm:AddTagsToResource"}), actions
