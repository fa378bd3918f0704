"""Principals as API Gateway reports callers, and the patterns grants and administrators are written in."""

from __future__ import annotations

import pytest

from fleetkeeper.model import AccessGrant, Lifecycle, ServiceRecord, ServiceStatus
from fleetkeeper.owners.access import Caller, changed_access, describe_change
from fleetkeeper.owners.principals import PrincipalError, canonical_caller, canonical_pattern, matches
from fleetkeeper.settings import Settings, SettingsError

A = "123456789012"


@pytest.mark.parametrize(
    ("user_arn", "principal"),
    [
        # A role session acts as its role (no path: the session ARN has none).
        (f"arn:aws:sts::{A}:assumed-role/team-a-ci/GitHubActions", f"arn:aws:iam::{A}:role/team-a-ci"),
        (f"arn:aws:sts::{A}:assumed-role/team-a-ci/i-0123456789abcdef0", f"arn:aws:iam::{A}:role/team-a-ci"),
        # IAM Identity Center's roles, whose path is aws-reserved/sso.amazonaws.com/.
        (
            f"arn:aws:sts::{A}:assumed-role/AWSReservedSSO_Admin_0123abcd/alice@example.com",
            f"arn:aws:iam::{A}:role/AWSReservedSSO_Admin_0123abcd",
        ),
        (f"arn:aws-cn:sts::{A}:assumed-role/r/s", f"arn:aws-cn:iam::{A}:role/r"),
        (f"arn:aws-us-gov:sts::{A}:assumed-role/r/s", f"arn:aws-us-gov:iam::{A}:role/r"),
        # Users keep their path: it is in their ARN.
        (f"arn:aws:iam::{A}:user/ci-bot", f"arn:aws:iam::{A}:user/ci-bot"),
        (f"arn:aws:iam::{A}:user/division/ci-bot", f"arn:aws:iam::{A}:user/division/ci-bot"),
        (f"arn:aws:iam::{A}:root", f"arn:aws:iam::{A}:root"),
        ("local:alice", "local:alice"),
    ],
)
def test_a_caller_is_its_role_user_or_root(user_arn: str, principal: str) -> None:
    assert canonical_caller(user_arn) == principal


@pytest.mark.parametrize(
    "user_arn",
    [
        "",
        "alice",
        f"arn:aws:iam::{A}:role/team-a-ci",  # API Gateway never reports a role itself, only its sessions
        f"arn:aws:sts::{A}:assumed-role/team-a-ci",
        f"arn:aws:sts::{A}:assumed-role/team a/s",
        "arn:aws:sts::12345:assumed-role/r/s",
        f"arn:aws:s3:::{A}",
        f"arn:aws:iam::{A}:user/*",
        "local:a b",
        "x" * 3000,
    ],
)
def test_an_unknown_shape_of_caller_is_refused(user_arn: str) -> None:
    with pytest.raises(PrincipalError):
        canonical_caller(user_arn)


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        (f"arn:aws:iam::{A}:role/team-b-ci", f"arn:aws:iam::{A}:role/team-b-ci"),
        (f"arn:aws:iam::{A}:role/teams/ci/team-b-ci", f"arn:aws:iam::{A}:role/team-b-ci"),
        (f" arn:aws:iam::{A}:role/team-b-* ", f"arn:aws:iam::{A}:role/team-b-*"),
        ("arn:aws:iam::*:role/deployer", "arn:aws:iam::*:role/deployer"),
        (f"arn:aws:iam::{A}:user/division/*", f"arn:aws:iam::{A}:user/division/*"),
        (f"arn:aws:iam::{A}:root", f"arn:aws:iam::{A}:root"),
        ("local:alice", "local:alice"),
    ],
)
def test_a_pattern_is_stored_canonical(text: str, stored: str) -> None:
    assert canonical_pattern(text) == stored


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("*", "is not an IAM principal ARN"),
        (f"arn:aws:iam::{A}:*", "is not an IAM principal ARN"),
        (f"arn:aws:iam::{A}:role/teams/*", "roles are matched by name"),
        (f"arn:aws:iam::{A}:role/*/team-b-ci", "roles are matched by name"),
        (f"arn:aws:sts::{A}:assumed-role/team-b-ci/run", "one session of a role"),
        (f"arn:aws:iam::{A}:role/**", "one *"),
        (f"arn:aws:iam::{A}:group/devs", "is not an IAM principal ARN"),
        ("arn:aws:iam::1234:role/x", "is not an IAM principal ARN"),
        ("arn:aws:iam::" + A + ":role/" + "x" * 2100, "at most 2048"),
    ],
)
def test_a_bad_pattern_is_refused_saying_why(text: str, words: str) -> None:
    with pytest.raises(PrincipalError, match=None) as refused:
        canonical_pattern(text)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("pattern", "principal", "expected"),
    [
        (f"arn:aws:iam::{A}:role/team-b-ci", f"arn:aws:iam::{A}:role/team-b-ci", True),
        (f"arn:aws:iam::{A}:role/team-b-ci", f"arn:aws:iam::{A}:role/team-b-ci2", False),
        (f"arn:aws:iam::{A}:role/team-b-ci", f"arn:aws:iam::{A}:role/Team-B-CI", False),  # case-sensitive, as IAM
        (f"arn:aws:iam::{A}:role/team-b-*", f"arn:aws:iam::{A}:role/team-b-deploy", True),
        (f"arn:aws:iam::{A}:role/team-b-*", f"arn:aws:iam::{A}:user/team-b-deploy", False),
        (f"arn:aws:iam::{A}:role/team-b-*", "arn:aws:iam::999999999999:role/team-b-ci", False),
        ("arn:aws:iam::*:role/deployer", f"arn:aws:iam::{A}:role/deployer", True),
        (f"arn:aws:iam::{A}:role/a.b", f"arn:aws:iam::{A}:role/aXb", False),  # no regex leaks through
    ],
)
def test_a_pattern_matches_whole_principals_only(pattern: str, principal: str, expected: bool) -> None:
    assert matches(pattern, principal) is expected


def service(owner: str = "", access: tuple[AccessGrant, ...] = ()) -> ServiceRecord:
    return ServiceRecord(
        name="web",
        uid="u",
        generation=1,
        lifecycle=Lifecycle.ACTIVE,
        target_version=1,
        latest_version=1,
        status=ServiceStatus.READY,
        status_message="",
        observed_generation=1,
        created_at="t",
        updated_at="t",
        owner=owner,
        access=access,
    )


def test_a_callers_mode_comes_from_owner_administrators_and_the_strongest_grant() -> None:
    role_b = f"arn:aws:iam::{A}:role/team-b-ci"
    grants = (AccessGrant(f"arn:aws:iam::{A}:role/team-b-*", "read"), AccessGrant(role_b, "write"))
    assert Caller(role_b).mode_on(service("x", grants)) == "write"
    assert Caller(f"arn:aws:iam::{A}:role/team-b-x").mode_on(service("x", grants)) == "read"
    assert Caller("someone").mode_on(service("x", grants)) is None
    assert Caller("x").mode_on(service("x")) == "write"
    # A service without an owner (from before owners) is nobody's: "" never matches "".
    assert Caller("").mode_on(service("")) is None
    assert Caller("anyone", admin=True).mode_on(service("")) == "write"
    admins = (f"arn:aws:iam::{A}:role/platform-*",)
    assert Caller.of(f"arn:aws:iam::{A}:role/platform-admins", admins).admin
    assert not Caller.of(f"arn:aws:iam::{A}:role/team-a", admins).admin


def test_changes_keep_the_order_first_granted_and_say_what_changed() -> None:
    x, y, z = (f"arn:aws:iam::{A}:role/{n}" for n in "xyz")
    before = (AccessGrant(x, "read"), AccessGrant(y, "write"))
    after = changed_access(before, [AccessGrant(z, "read"), AccessGrant(x, "write")], [y])
    assert after == (AccessGrant(x, "write"), AccessGrant(z, "read"))
    assert describe_change(before, after) == [f"{x}: read -> write", f"granted read to {z}", f"revoked {y}"]
    assert describe_change(after, after) == []


def test_the_administrators_setting_is_checked_and_canonical() -> None:
    settings = Settings.from_env(
        {
            "TABLE_NAME": "t",
            "FLEETKEEPER_ADMIN_PRINCIPALS": f"arn:aws:iam::{A}:role/ops/platform-admins, arn:aws:iam::{A}:user/alice,",
        }
    )
    assert settings.admin_principals == (f"arn:aws:iam::{A}:role/platform-admins", f"arn:aws:iam::{A}:user/alice")
    assert Settings.from_env({"TABLE_NAME": "t"}).admin_principals == ()
    with pytest.raises(SettingsError, match="FLEETKEEPER_ADMIN_PRINCIPALS: 'platform-admins' is not"):
        Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_ADMIN_PRINCIPALS": "platform-admins"})


@pytest.mark.parametrize(
    "arn", [f"arn:aws:sts::{A}:federated-user/bob", f"arn:aws-cn:sts::{A}:federated-user/ci@example.com"]
)
def test_a_federated_user_is_refused_as_a_caller_and_as_a_pattern(arn: str) -> None:
    """GetFederationToken's caller picks the name: any IAM user allowed it signs as any federated user
    (Name: letters, digits and _=,.@-). Such an ARN identifies nobody, so it owns and names nothing."""
    with pytest.raises(PrincipalError, match=r"federated users .* are refused: NAME is whatever the caller"):
        canonical_caller(arn)
    with pytest.raises(PrincipalError, match=r"federated users .* are refused"):
        canonical_pattern(arn)
    with pytest.raises(PrincipalError, match=r"federated users .* are refused"):
        canonical_pattern(f"arn:aws:sts::{A}:federated-user/*")
    with pytest.raises(SettingsError, match="federated users"):
        Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_ADMIN_PRINCIPALS": arn})
