"""Secret values are encrypted with the stack's own KMS key (template.yaml's SecretsKey), not the
account's aws/ssm key: the api writes each SecureString with that KeyId, and the key policy names
only the roles that use the key (the api, the reconciler, the replicas), each for what it does and
only through Parameter Store, with the account's administrators keeping the key's administration.

The key policy is evaluated with tests/support/iam_evaluator.py (a KMS key policy must allow: IAM policies
count only where it delegates to the account, which it does here for administration, and for the
owners' replica roles narrowed by aws:PrincipalArn).
https://docs.aws.amazon.com/kms/latest/developerguide/key-policies.html
https://docs.aws.amazon.com/kms/latest/developerguide/key-policy-default.html
https://docs.aws.amazon.com/kms/latest/developerguide/conditions-kms.html#conditions-kms-via-service
https://docs.aws.amazon.com/kms/latest/developerguide/services-parameter-store.html
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import boto3
import pytest

from fleetkeeper import aws
from fleetkeeper.settings import SECRETS_KEY_ID_ENV
from tests.support.aws_calls import AwsCalls
from tests.support.cfn import ACCOUNT, REGION, Resolver
from tests.support.iam_evaluator import Decision, Request, evaluate
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from tests.support.handler_client import HandlerClient

VIA_SSM = {"kms:ViaService": f"ssm.{REGION}.amazonaws.com"}
ADMIN = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
KMS_ANYWHERE = {"Statement": [{"Effect": "Allow", "Action": ["kms:Decrypt", "kms:Encrypt"], "Resource": "*"}]}


# --- the api writes with the stack's key -------------------------------------------------------------------


def test_secret_values_are_written_with_the_stacks_key(
    api: HandlerClient, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = boto3.client("kms", region_name=REGION).create_key(Description="the stack's SecretsKey")["KeyMetadata"]
    monkeypatch.setenv(SECRETS_KEY_ID_ENV, key["Arn"])
    with AwsCalls() as calls:
        created = api.post("/v1/services", {"name": "web", "spec": hello_spec(secrets={"TOKEN": "s3cr3t"})})
    assert created.status == 201, created.body
    [put] = [c.params for c in calls.calls if c.operation == "PutParameter"]
    assert put["KeyId"] == key["Arn"] and put["Type"] == "SecureString"
    [parameter] = aws.ssm().describe_parameters()["Parameters"]
    assert parameter["Name"] == put["Name"] and parameter["KeyId"] == key["Arn"]
    # Read back as the reconciler and the replicas read it (Parameter Store knows the key).
    value = aws.ssm().get_parameter(Name=put["Name"], WithDecryption=True)["Parameter"]["Value"]
    assert value == '{"TOKEN":"s3cr3t"}'
    # An update with the same values is compared through the same key: no new version.
    again = api.put("/v1/services/web", {"spec": hello_spec(secrets={"TOKEN": "s3cr3t"})})
    assert again.status == 200 and again.body["changed"] is False


def test_the_idempotency_hmac_key_is_encrypted_with_the_stacks_key_too(
    api: HandlerClient, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key of the HMAC of secret values in Idempotency-Key records (fleetkeeper/api/request_hmac.py)
    would let whoever reads it test guesses of a secret against the table's fingerprints: it is
    encrypted with the stack's key, whose policy lets only the api decrypt it (below)."""
    from fleetkeeper.api.request_hmac import forget_keys, key_parameter

    forget_keys()
    key = boto3.client("kms", region_name=REGION).create_key(Description="the stack's SecretsKey")["KeyMetadata"]
    monkeypatch.setenv(SECRETS_KEY_ID_ENV, key["Arn"])
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec(secrets={"T": "a"})}).status == 201
    updated = api.put("/v1/services/web", {"spec": hello_spec(secrets={"T": "b"})}, headers={"Idempotency-Key": "k1"})
    assert updated.status == 200, updated.body
    name = key_parameter(table)
    [stored] = aws.ssm().describe_parameters(ParameterFilters=[{"Key": "Name", "Values": [name]}])["Parameters"]
    assert (stored["Type"], stored["KeyId"]) == ("SecureString", key["Arn"])
    forget_keys()


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("String", "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="),
        ("SecureString", "c2hvcnQ="),
        ("SecureString", "not base64!"),
    ],
)
def test_a_planted_hmac_key_is_refused_not_used(table: str, kind: str, value: str) -> None:
    """Whoever may ssm:PutParameter there could plant a key they know (a plain String, no KMS right
    needed), then test guesses of secret values against the table's fingerprints: only a SecureString
    of 32 bytes is the api's key; anything else is refused, naming the parameter."""
    from fleetkeeper.api.request_hmac import RequestHmac, RequestHmacKeyError, forget_keys, key_parameter

    forget_keys()
    aws.ssm().put_parameter(Name=key_parameter(table), Value=value, Type=kind)
    with pytest.raises(RequestHmacKeyError, match=f"parameter {key_parameter(table)} is not the api's key"):
        RequestHmac(key_parameter(table)).digest({"T": "a"})
    forget_keys()


def test_the_api_made_hmac_key_is_accepted(table: str) -> None:
    from fleetkeeper.api.request_hmac import RequestHmac, forget_keys, key_parameter

    forget_keys()
    first = RequestHmac(key_parameter(table)).digest({"T": "a"})
    forget_keys()  # read back from Parameter Store, checked
    assert RequestHmac(key_parameter(table)).digest({"T": "a"}) == first
    forget_keys()


def test_without_a_configured_key_parameter_store_chooses(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded mode has no stack key: no KeyId, so Parameter Store's default (aws/ssm)."""
    monkeypatch.delenv(SECRETS_KEY_ID_ENV, raising=False)
    with AwsCalls() as calls:
        assert api.post("/v1/services", {"name": "web", "spec": hello_spec(secrets={"T": "x"})}).status == 201
    [put] = [c.params for c in calls.calls if c.operation == "PutParameter"]
    assert "KeyId" not in put


# --- the template: the key, its policy, and the roles' side ------------------------------------------------


def test_the_key_rotates_and_the_api_is_told_which_it_is(translated: dict[str, Any]) -> None:
    key = translated["Resources"]["SecretsKey"]["Properties"]
    assert key["EnableKeyRotation"] is True
    assert key["KeySpec"] == "SYMMETRIC_DEFAULT"  # Parameter Store takes symmetric keys only
    env = translated["Resources"]["ApiFunction"]["Properties"]["Environment"]["Variables"]
    assert env[SECRETS_KEY_ID_ENV] == {"Fn::GetAtt": ["SecretsKey", "Arn"]}


@pytest.fixture(scope="module")
def key(translated: dict[str, Any]) -> dict[str, Any]:
    resolver = Resolver(translated)
    resources = translated["Resources"]
    parameter = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/fleetkeeper/{resolver.ref('Table')}/web/u1/r1"

    def policies(*policy_ids: str) -> list[dict[str, Any]]:
        return [resolver.resolve(resources[lid]["Properties"]["PolicyDocument"]) for lid in policy_ids]

    return {
        "policy": resolver.resolve(resources["SecretsKey"]["Properties"]["KeyPolicy"]),
        "arn": resolver.get_att("SecretsKey", "Arn"),
        "api": resolver.get_att("ApiFunctionRole", "Arn"),
        "reconciler": resolver.get_att("ReconcilerRole", "Arn"),
        "replica": resolver.ref("ReplicaRoleArn"),
        "dispatcher": resolver.get_att("DispatcherRole", "Arn"),
        "cleanup": resolver.get_att("CleanupRole", "Arn"),
        "context": {**VIA_SSM, "kms:EncryptionContext:PARAMETER_ARN": parameter},
        "identity": {
            "api": policies("ApiSecretsKeyPolicy"),
            "reconciler": policies("ReconcilerSecretsKeyPolicy"),
            "replica": policies("ReplicaAccessPolicy"),
        },
    }


def _use(
    key: dict[str, Any],
    action: str,
    who: str,
    *,
    context: dict[str, str] | None = None,
    identity: list[dict[str, Any]] | None = None,
) -> Decision:
    """`action` on the key by `who` (a role of the stack by name, or an ARN), with `who`'s own
    policies unless `identity` gives others."""
    request = Request(key.get(who, who), action, key["arn"], dict(key["context"] if context is None else context))
    policies = key["identity"].get(who, []) if identity is None else identity
    return evaluate(request, policies, resource=[key["policy"]], key_policy=True)


@pytest.mark.parametrize(
    ("who", "action"),
    [("api", "kms:Encrypt"), ("api", "kms:Decrypt"), ("reconciler", "kms:Decrypt"), ("replica", "kms:Decrypt")],
)
def test_each_role_may_do_what_it_does_through_parameter_store(key: dict[str, Any], who: str, action: str) -> None:
    assert _use(key, action, who) is Decision.ALLOW


@pytest.mark.parametrize(
    ("who", "action"),
    [
        ("reconciler", "kms:Encrypt"),
        ("replica", "kms:Encrypt"),
        ("api", "kms:GenerateDataKey"),
        ("api", "kms:ReEncryptFrom"),
        ("dispatcher", "kms:Decrypt"),
        ("cleanup", "kms:Decrypt"),
    ],
)
def test_nothing_more(key: dict[str, Any], who: str, action: str) -> None:
    assert _use(key, action, who, identity=[KMS_ANYWHERE]) is not Decision.ALLOW


def test_only_the_api_decrypts_the_idempotency_hmac_key(key: dict[str, Any], translated: dict[str, Any]) -> None:
    table = Resolver(translated).ref("Table")
    hmac_key = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/fleetkeeper-api/{table}/request-hmac-key"
    context = {**VIA_SSM, "kms:EncryptionContext:PARAMETER_ARN": hmac_key}
    assert _use(key, "kms:Encrypt", "api", context=context) is Decision.ALLOW
    assert _use(key, "kms:Decrypt", "api", context=context) is Decision.ALLOW
    for who in ("reconciler", "replica", "dispatcher", "cleanup"):
        assert _use(key, "kms:Decrypt", who, context=context, identity=[KMS_ANYWHERE]) is not Decision.ALLOW, who


def test_the_shared_role_decrypts_no_owners_parameter_whatever_its_iam_policies(key: dict[str, Any]) -> None:
    """With owner identities an owner's parameters (`_o/<scope>/...`) are its role's alone: the shared
    replica role (a deployer's role, which may hold other policies: GetParametersByPath on the table's
    path lists them) is refused by the key policy itself."""
    owners = key["context"]["kms:EncryptionContext:PARAMETER_ARN"].replace(
        "/web/u1/r1", "/_o/00aa11bb22cc33dd/web/u1/1"
    )
    context = {**VIA_SSM, "kms:EncryptionContext:PARAMETER_ARN": owners}
    assert _use(key, "kms:Decrypt", "replica", context=context, identity=[KMS_ANYWHERE]) is Decision.IMPLICIT_DENY
    assert _use(key, "kms:Decrypt", "replica", identity=[KMS_ANYWHERE]) is Decision.ALLOW  # a service without an owner


def test_with_shared_identity_the_shared_role_runs_every_replica_and_decrypts_their_secrets() -> None:
    from tests.support.cfn import translate

    translated = translate(overrides={"ReplicaIdentity": "shared"})
    resolver = Resolver(translated)
    policy = resolver.resolve(translated["Resources"]["SecretsKey"]["Properties"]["KeyPolicy"])
    table = resolver.ref("Table")
    owners = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/fleetkeeper/{table}/_o/00aa11bb22cc33dd/web/u1/1"
    request = Request(
        resolver.ref("ReplicaRoleArn"), "kms:Decrypt", "k", {**VIA_SSM, "kms:EncryptionContext:PARAMETER_ARN": owners}
    )
    assert evaluate(request, [], resource=[policy], key_policy=True) is Decision.ALLOW


def test_not_outside_parameter_store_nor_for_another_stacks_parameters(key: dict[str, Any]) -> None:
    # Called directly (no kms:ViaService): a role's own Decrypt of a ciphertext it got elsewhere.
    direct = _use(key, "kms:Decrypt", "replica", context={"kms:EncryptionContext:PARAMETER_ARN": "x"})
    assert direct is not Decision.ALLOW
    # Through SSM, but another parameter than this stack's.
    other = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/someone/else"
    context = {**VIA_SSM, "kms:EncryptionContext:PARAMETER_ARN": other}
    assert _use(key, "kms:Decrypt", "replica", context=context) is not Decision.ALLOW
    # Through SSM in another region.
    context = {**key["context"], "kms:ViaService": "ssm.eu-west-1.amazonaws.com"}
    assert _use(key, "kms:Decrypt", "api", context=context) is not Decision.ALLOW


@pytest.mark.parametrize(
    "who", [f"arn:aws:iam::{ACCOUNT}:role/Admin", f"arn:aws:iam::{ACCOUNT}:role/reads-every-parameter"]
)
def test_other_principals_of_the_account_cannot_decrypt_whatever_their_iam_policies(
    key: dict[str, Any], who: str
) -> None:
    """The finding: with aws/ssm, ssm:GetParameter on the path was enough to read the values."""
    for identity in ([ADMIN], [KMS_ANYWHERE]):
        assert _use(key, "kms:Decrypt", who, identity=identity) is Decision.IMPLICIT_DENY


def test_the_deployers_administer_the_key_and_the_accounts_kms_star_principals_do_not(
    key: dict[str, Any], translated: dict[str, Any]
) -> None:
    """The key policy names the deployers (DeployerPrincipalArns: CloudFormation calls KMS with their
    credentials): creating, updating and deleting the stack pass the lockout safety check. A principal
    of the account allowed kms:* (an administrator, PowerUserAccess) is not named and the policy does
    not delegate administration to the account: no grant, no new policy, no disabling."""
    deployers = Resolver(translated).resolve({"Ref": "DeployerPrincipalArns"})
    for deployer in deployers.split(",") if isinstance(deployers, str) else deployers:
        for action in ("kms:DescribeKey", "kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:EnableKeyRotation"):
            assert _use(key, action, deployer, identity=[]) is Decision.ALLOW, (deployer, action)
        assert _use(key, "kms:CreateGrant", deployer, identity=[ADMIN]) is Decision.IMPLICIT_DENY
        assert _use(key, "kms:Decrypt", deployer, identity=[ADMIN]) is Decision.IMPLICIT_DENY
    admin = f"arn:aws:iam::{ACCOUNT}:role/Admin"
    for action in ("kms:PutKeyPolicy", "kms:CreateGrant", "kms:DisableKey", "kms:ScheduleKeyDeletion"):
        assert _use(key, action, admin, identity=[ADMIN]) is Decision.IMPLICIT_DENY, action
    # The account's root user (and no IAM principal) can put a new policy: the way back.
    assert _use(key, "kms:PutKeyPolicy", f"arn:aws:iam::{ACCOUNT}:root", identity=[]) is Decision.ALLOW


def test_the_key_policy_names_these_principals_and_no_other(translated: dict[str, Any]) -> None:
    policy = translated["Resources"]["SecretsKey"]["Properties"]["KeyPolicy"]
    named = {s["Sid"]: s["Principal"] for s in policy["Statement"]}
    assert named == {
        "KeyAdministeredByTheDeployers": {"AWS": {"Ref": "DeployerPrincipalArns"}},
        # The root user only (aws:PrincipalArn), and metadata reads for the account's auditors.
        "RootUserRecoversTheKey": {"AWS": {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}},
        "AccountReadsTheKeysMetadata": {"AWS": {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}},
        "SecretsWrittenAndComparedByTheApi": {"AWS": {"Fn::GetAtt": ["ApiFunctionRole", "Arn"]}},
        "SecretsReadByTheReconciler": {"AWS": {"Fn::GetAtt": ["ReconcilerRole", "Arn"]}},
        "SecretsReadByReplicas": {"AWS": {"Ref": "ReplicaRoleArn"}},
        # The owners' replica roles (issue 23): the account, narrowed to the stack's role path by
        # aws:PrincipalArn (tests/template/test_replica_identity.py evaluates it).
        "SecretsReadByOwnersReplicas": {"AWS": {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}},
    }
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    for statement in Resolver(translated).resolve(policy)["Statement"]:
        if statement["Sid"].startswith("Secrets"):
            assert statement["Condition"]["StringEquals"]["kms:ViaService"] == f"ssm.{REGION}.amazonaws.com", statement[
                "Sid"
            ]
