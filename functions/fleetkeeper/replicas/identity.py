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

Who makes them: the dispatcher, never the reconciler. IAM is a global service that the reconciler's
network does not reach (it runs in the stack's VPC, whose endpoints have no IAM one: IAM offers an
interface endpoint only to VPCs in us-east-1, https://docs.aws.amazon.com/IAM/latest/UserGuide/access_iam-vpc-endpoint.html,
and the supplied network has no NAT), while the dispatcher runs outside any VPC and lists every
service's owner each period anyway. So each period the dispatcher makes the identities of owners
that lack one (`IdentityKeeper.ensure`) and records each in the table (fleetkeeper.store.identities),
and removes those of owners with no service left (`IdentityKeeper.sweep`). The reconciler reads the
record (`OwnerProfiles`) and launches with the profile's deterministic name; with no record yet it
does not launch (an environment refusal: the identity is at most a period away).

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

    from fleetkeeper.store.identities import IdentityRecords

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
# ...and for an owner whose identity the dispatcher has not made yet (a new owner: at most a period,
# longer when IAM refuses it: a denied permission, a full quota, which the dispatcher logs): the stack's
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
    """Makes, finds and removes the owners' roles of one stack in IAM: the dispatcher's (outside the VPC)."""

    stack_id: str
    policy_arn: str
    now: Callable[[], float] = time.time

    @property
    def iam(self) -> Any:
        return aws.iam()

    def make(self, scope: str, owner: str) -> Profile:
        """The owner's role and instance profile, made or completed; idempotent.

        Each step is idempotent and ordered so that a profile holding the role implies the role is
        whole (its policy and boundary are attached before the profile is made), so a run that crashed
        between any two calls leaves a state the next run completes.
        """
        name = role_name(self.stack_id, scope)
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
            # is set again, the only boundary the dispatcher may set (template.yaml).
            self.iam.put_role_permissions_boundary(RoleName=name, PermissionsBoundary=self.policy_arn)
        self.iam.attach_role_policy(RoleName=name, PolicyArn=self.policy_arn)
        try:
            tags = role_tags(self.stack_id, scope)
            self.iam.create_instance_profile(InstanceProfileName=name, Path=path, Tags=tags)
        except ClientError as exc:
            if _code(exc) != "EntityAlreadyExists":
                raise
        try:
            self.iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        except ClientError as exc:
            # A profile holds one role: LimitExceeded means it holds it already (added by a lost run).
            if _code(exc) != "LimitExceeded":
                raise
        return Profile(name, self.now(), fresh=True)

    def complete(self) -> dict[str, float]:
        """{scope: created (epoch seconds)} of every owner's instance profile of this stack that holds
        its role, hence whole (ListInstanceProfiles on the stack's path: a page per 1,000)."""
        found: dict[str, float] = {}
        kwargs: dict[str, Any] = {"PathPrefix": role_path(self.stack_id)}
        while True:
            page = self.iam.list_instance_profiles(**kwargs)
            for profile in page.get("InstanceProfiles", []):
                name = str(profile.get("InstanceProfileName", ""))
                scope = scope_of_role(self.stack_id, name)
                if scope is not None and any(r.get("RoleName") == name for r in profile.get("Roles", [])):
                    found[scope] = _epoch(profile.get("CreateDate"))
            if not page.get("IsTruncated"):
                return found
            kwargs["Marker"] = page["Marker"]

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

    def unused(self, owners: Iterable[str]) -> list[str]:
        """The scopes of roles whose owner has no service left and that are past the grace period."""
        in_use = {scope for scope in (owner_scope(o) for o in owners) if scope}
        now = self.now()
        return [
            scope
            for scope, created in sorted(self.scopes().items())
            if scope not in in_use and now - created >= SWEEP_GRACE_SECONDS
        ]


@dataclass
class EnsureReport:
    made: list[str] = field(default_factory=list)  # scopes whose identity IAM made (or completed)
    recorded: list[str] = field(default_factory=list)  # scopes whose record was written
    refused: dict[str, str] = field(default_factory=dict)  # scope -> why IAM would not make it
    deferred: int = 0  # owners left for the next period (the per-period bound)


@dataclass
class IdentityKeeper:
    """The dispatcher's part: the identities of the listed owners made and recorded, those of owners
    with no service left removed. Level-triggered: each period compares IAM, the records and the
    owners, and changes only what differs (steady state: ListInstanceProfiles and BatchGetItem, no write)."""

    identities: ReplicaIdentities
    records: IdentityRecords
    # New identities made per period at most: each is 4-5 IAM writes, IAM's request rate is the
    # account's (shared with every other caller) and the dispatcher's run is short; the rest wait a period.
    max_made: int = 20

    def ensure(self, owners: Iterable[str]) -> EnsureReport:
        wanted = {scope: owner for owner in sorted(set(owners)) if (scope := owner_scope(owner))}
        report = EnsureReport()
        if not wanted:
            return report
        complete = self.identities.complete()
        records = self.records.get_many(wanted)
        pending = sorted(wanted.items())
        for position, (scope, owner) in enumerate(pending):
            record = records.get(scope)
            try:
                if scope in complete:
                    if record is None:
                        # Made by a run that crashed before recording it (or recorded, then lost).
                        self._record(scope, owner, complete[scope], report)
                    continue
                if len(report.made) >= self.max_made:
                    report.deferred += 1
                    continue
                try:
                    made = self.identities.make(scope, owner)
                except (ClientError, IdentityError) as exc:
                    why = f"{_code(exc)}: {exc}" if isinstance(exc, ClientError) else str(exc)
                    report.refused[scope] = why
                    logger.error("IAM would not make the replica identity of owner %s: %s", owner, why)
                    continue
                report.made.append(scope)
                self._record(scope, owner, made.created_at, report)
            except aws.DeadlineReached as reached:
                # The time given to the identities is spent (fleetkeeper.aws.deadline): this owner and
                # those after it wait for the next period, which completes a half-made one (make is
                # idempotent, and resumable between any two calls).
                report.deferred += len(pending) - position
                logger.warning("out of time for replica identities (%s): %d owner(s) wait", reached, report.deferred)
                break
        return report

    def _record(self, scope: str, owner: str, made_at: float, report: EnsureReport) -> None:
        name = role_name(self.identities.stack_id, scope)
        # Imported here: the api imports this module for owner_scope, and must not load the store's records.
        from fleetkeeper.store.identities import IdentityRecord

        self.records.put(IdentityRecord(scope=scope, owner=owner, profile=name, made_at=made_at))
        report.recorded.append(scope)

    def sweep(self, owners: Iterable[str]) -> list[str]:
        """Remove the identities of owners with no service left; returns the scopes removed. The record
        goes first: the reconciler never launches with a profile about to disappear."""
        removed = []
        for scope in self.identities.unused(owners):
            self.records.delete(scope)
            self.identities.remove(scope)
            removed.append(scope)
        return removed


@dataclass
class OwnerProfiles:
    """The reconciler's part: an owner's instance profile as the table records it. No IAM call (the
    reconciler's network does not reach IAM). One per run: each owner's record is read once."""

    stack_id: str
    records: IdentityRecords
    now: Callable[[], float] = time.time
    _profiles: dict[str, Profile | None] = field(default_factory=dict, repr=False)

    def profile(self, scope: str) -> Profile | None:
        """The owner's profile, or None when the dispatcher has not made (recorded) it yet."""
        if scope not in self._profiles:
            self._profiles[scope] = self._read(scope, consistent=False)
        return self._profiles[scope]

    def recheck(self, scope: str) -> Profile | None:
        """The record read again, strongly consistent: after EC2 refused the profile, whether it is
        still the one the run launched with (it may have been removed, or made again, meanwhile)."""
        self._profiles[scope] = self._read(scope, consistent=True)
        return self._profiles[scope]

    def _read(self, scope: str, *, consistent: bool) -> Profile | None:
        record = self.records.get(scope, consistent=consistent)
        if record is None:
            return None
        return Profile(record.profile, record.made_at, fresh=False)


def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return 0.0
