"""Replica identity: which IAM role a replica runs as, and the names only that role may reach.

Every replica's user code runs as root with the instance metadata service reachable, so whatever
its instance role may do, the service's code may do. Replicas of services of different owners must
not read each other's secrets or workdirs or write each other's logs (docs/architecture/replicas.md,
"Replica identity"), so each owner (`ServiceRecord.owner`) gets a role and an instance profile of its
own, created and removed by the stack:

    role and profile   fk-<stack id>-<scope>, path /fleetkeeper/<stack id>/, tagged
                       fleetkeeper:stack=<stack id> and fleetkeeper-scope=<scope>
    permissions        the stack's ReplicaOwnerPolicy (template.yaml), attached, and the same policy
                       as the permissions boundary: it grants, through ${aws:PrincipalTag/fleetkeeper-scope},
                       only names carrying the role's own scope:
    secrets            /fleetkeeper/<table>/_o/<scope>/<service>/<uid>/<ref>
    workdirs           services/_o/<scope>/<service>/<uid>/<sha256>.tar.gz
    log streams        _o/<scope>/<service>/<uid>/<replica id>

`scope` is 16 hex digits of the SHA-256 of the owner's ARN (names must be short and made of few
characters; 64 bits make a collision between a stack's owners as likely as guessing a random
64-bit key). `_o` cannot begin a service name ([a-z][a-z0-9-]*), so a scoped name is never a legacy
one (`<service>/...`). A service without an owner (written before ownership existed) keeps the legacy
names and the stack's shared instance profile (ReplicaInstanceProfileArn), which can read no scoped
name (template.yaml denies it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

SCOPE_SEGMENT = "_o"
SCOPE_TAG = "fleetkeeper-scope"
STACK_TAG = "fleetkeeper:stack"
# IAM's limits (botocore's iam model: roleNameType max 64, pathType max 512, instanceProfileNameType
# max 128); a role's name is also its instance profile's.
MAX_ROLE_NAME_LENGTH = 64
MAX_PATH_LENGTH = 512
SCOPE_LENGTH = 16
# How long after an instance profile was created (or got its role) EC2 may still refuse it with
# InvalidParameterValue ("Invalid IAM Instance Profile name"): AWS documents IAM changes as eventually
# consistent (typically seconds). A refusal within this long is the profile's youth, retried next run.
PROFILE_SETTLE_SECONDS = 60.0
# The reconciler's own refusal code for it (an ENVIRONMENT refusal: reconciler/plan/failures.py).
PROFILE_NOT_READY = "Fleetkeeper.InstanceProfileNotReady"
# ...and for an owner's identity IAM would not make (a denied permission, a full quota): the stack's
# configuration or the account's limits, never the version's (an ENVIRONMENT refusal too).
IDENTITY_UNAVAILABLE = "Fleetkeeper.IdentityUnavailable"
# A role younger than this is never swept: the services index the dispatcher lists is eventually
# consistent, so a service created a moment ago (whose run made its owner's role) may not be listed.
SWEEP_GRACE_SECONDS = 3600.0

TRUST_POLICY = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    },
    separators=(",", ":"),
)


class IdentityError(Exception):
    """An owner's identity cannot be made (a name over IAM's limits)."""


def owner_scope(owner: str) -> str | None:
    """The scope of an owner's replicas' names and role; None for a service without an owner."""
    if not owner:
        return None
    return hashlib.sha256(owner.encode()).hexdigest()[:SCOPE_LENGTH]


def scope_prefix(scope: str | None) -> str:
    """`_o/<scope>/`, what a scoped name starts with below its store's prefix ("" for legacy names)."""
    return f"{SCOPE_SEGMENT}/{scope}/" if scope else ""


def role_path(stack_id: str) -> str:
    path = f"/fleetkeeper/{stack_id}/"
    if len(path) > MAX_PATH_LENGTH:
        raise IdentityError(f"role path {path!r} is longer than IAM's {MAX_PATH_LENGTH} characters")
    return path


def role_name(stack_id: str, scope: str) -> str:
    """The owner's role and instance profile name: deterministic, so a crashed run's half-made identity
    is found and completed by the next."""
    name = f"fk-{stack_id}-{scope}"
    if len(name) > MAX_ROLE_NAME_LENGTH:
        raise IdentityError(f"role name {name!r} is longer than IAM's {MAX_ROLE_NAME_LENGTH} characters")
    return name


def scope_of_role(stack_id: str, name: str) -> str | None:
    """The scope a role of this stack's path was made for (None: not one of ours)."""
    prefix = f"fk-{stack_id}-"
    scope = name.removeprefix(prefix)
    if scope == name or len(scope) != SCOPE_LENGTH or any(c not in "0123456789abcdef" for c in scope):
        return None
    return scope


def role_tags(stack_id: str, scope: str) -> list[dict[str, str]]:
    """The tags of an owner's role and profile: the policy reads the scope through the role's tag."""
    return [{"Key": STACK_TAG, "Value": stack_id}, {"Key": SCOPE_TAG, "Value": scope}]


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@dataclass
class Profile:
    """An owner's instance profile, as the launch needs it."""

    name: str
    created_at: float  # when it (or its role's attachment) was made, epoch seconds
    fresh: bool  # made or completed by this run

    def young(self, now: float) -> bool:
        return self.fresh or now - self.created_at < PROFILE_SETTLE_SECONDS


@dataclass
class ReplicaIdentities:
    """Makes, finds and removes the owners' roles of one stack. One per reconciler run (it caches)."""

    stack_id: str
    policy_arn: str
    now: Callable[[], float] = time.time
    _profiles: dict[str, Profile] = field(default_factory=dict, repr=False)

    @property
    def iam(self) -> Any:
        return aws.iam()

    def profile(self, scope: str, owner: str) -> Profile:
        """The owner's instance profile, made (or completed) if it is not whole.

        Steady state: one GetInstanceProfile per owner per run that launches. Each step is idempotent
        and ordered so that a profile holding the role implies the role is whole (its policy and
        boundary are attached before the profile is made), so a run that crashed between any two calls
        leaves a state the next run completes.
        """
        if scope in self._profiles:
            return self._profiles[scope]
        name = role_name(self.stack_id, scope)
        found = self._get_profile(name)
        if found is not None and any(r.get("RoleName") == name for r in found.get("Roles", [])):
            made = Profile(name, _epoch(found.get("CreateDate")), fresh=False)
        else:
            made = self._make(scope, owner, name, found)
        self._profiles[scope] = made
        return made

    def _get_profile(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"])
        except ClientError as exc:
            if _code(exc) == "NoSuchEntity":
                return None
            raise

    def _make(self, scope: str, owner: str, name: str, found: dict[str, Any] | None) -> Profile:
        path = role_path(self.stack_id)
        logger.info("making the replica identity %s%s for owner %s", path, name, owner)
        try:
            self.iam.create_role(
                RoleName=name,
                Path=path,
                AssumeRolePolicyDocument=TRUST_POLICY,
                PermissionsBoundary=self.policy_arn,
                # IAM's limit is 1,000 characters; an owner ARN is at most 2,048 (path 512 + name 64).
                Description=f"fleetkeeper replicas of {owner}"[:1000],
                Tags=role_tags(self.stack_id, scope),
            )
        except ClientError as exc:
            if _code(exc) != "EntityAlreadyExists":
                raise
            # Made by a run that crashed (or by a stack update that changed the policy): the boundary
            # is set again, the only boundary the reconciler may set (template.yaml).
            self.iam.put_role_permissions_boundary(RoleName=name, PermissionsBoundary=self.policy_arn)
        self.iam.attach_role_policy(RoleName=name, PolicyArn=self.policy_arn)
        if found is None:
            try:
                tags = role_tags(self.stack_id, scope)
                made = self.iam.create_instance_profile(InstanceProfileName=name, Path=path, Tags=tags)
                found = dict(made["InstanceProfile"])
            except ClientError as exc:
                if _code(exc) != "EntityAlreadyExists":
                    raise
                found = self._get_profile(name) or {}
        try:
            self.iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        except ClientError as exc:
            # A profile holds one role: LimitExceeded means it holds it already (added by a lost run).
            if _code(exc) != "LimitExceeded":
                raise
        return Profile(name, self.now(), fresh=True)

    def scopes(self) -> dict[str, float]:
        """{scope: created (epoch seconds)} of every owner's role of this stack (ListRoles on its path)."""
        found: dict[str, float] = {}
        kwargs: dict[str, Any] = {"PathPrefix": role_path(self.stack_id)}
        while True:
            page = self.iam.list_roles(**kwargs)
            for role in page.get("Roles", []):
                scope = scope_of_role(self.stack_id, str(role.get("RoleName", "")))
                if scope is not None:
                    found[scope] = _epoch(role.get("CreateDate"))
            if not page.get("IsTruncated"):
                return found
            kwargs["Marker"] = page["Marker"]

    def remove(self, scope: str) -> None:
        """Remove an owner's profile and role; parts already gone are no error (a crashed removal is
        finished by the next)."""
        name = role_name(self.stack_id, scope)
        steps: list[tuple[str, dict[str, str]]] = [
            ("remove_role_from_instance_profile", {"InstanceProfileName": name, "RoleName": name}),
            ("delete_instance_profile", {"InstanceProfileName": name}),
            ("detach_role_policy", {"RoleName": name, "PolicyArn": self.policy_arn}),
            ("delete_role", {"RoleName": name}),
        ]
        for method, kwargs in steps:
            try:
                getattr(self.iam, method)(**kwargs)
            except ClientError as exc:
                if _code(exc) != "NoSuchEntity":
                    raise
        self._profiles.pop(scope, None)

    def sweep(self, owners: Iterable[str]) -> list[str]:
        """Remove the roles of owners with no service left; returns the scopes removed."""
        in_use = {scope for scope in (owner_scope(o) for o in owners) if scope}
        now = self.now()
        removed = []
        for scope, created in sorted(self.scopes().items()):
            if scope in in_use or now - created < SWEEP_GRACE_SECONDS:
                continue
            self.remove(scope)
            removed.append(scope)
        return removed


def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return 0.0
