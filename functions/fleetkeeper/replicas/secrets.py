"""Where a version's secret values live: one SSM Parameter Store SecureString per set of values.

A version item holds the secrets' names and a `secrets_ref`, never a value. The values are one JSON
object in the SecureString `/fleetkeeper/<table>/_o/<scope>/<service>/<uid>/<ref>` (`<scope>`: the
service owner's, fleetkeeper.replicas.identity: only that owner's replica role may read below it; a service
without an owner keeps the legacy `/fleetkeeper/<table>/<service>/<uid>/<ref>`), encrypted with the
stack's own KMS key (template.yaml's SecretsKey, whose key policy names the roles that may use it;
the account's `aws/ssm` key where none is configured, as in embedded mode): the api writes it before
the version's transaction, a replica reads it at boot with its own role (the ec2 user data, or the
embedded mode's process driver), the reconciler reads it to fill `$NAME`s of a readiness probe, and
the cleanup deletes every parameter under the incarnation's uid with its items. A ref is random per
set of values (a lost race cannot overwrite the winner's parameter); an update whose values equal
the target's reuses the target's ref.

Why Parameter Store rather than Secrets Manager: the values belong to one version and are written
and deleted with it by fleetkeeper (no rotation, no cross-account sharing, which is what Secrets
Manager adds); standard parameters cost nothing (a secret costs 0.40 USD a month, a version of 50
services x 50 versions would cost 1,000 USD a month), and a version's 4 KB of values fits one.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetkeeper import aws
from fleetkeeper.replicas.identity import owner_scope, scope_prefix
from fleetkeeper.settings import DEFAULT_STACK_ID

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mypy_boto3_ssm import SSMClient
    from mypy_boto3_ssm.type_defs import PutParameterRequestTypeDef

    from fleetkeeper.settings import Settings

# The stack's id on what it creates (the same key as its instances' tag; fleetkeeper.reconciler.ownership).
STACK_TAG = "fleetkeeper:stack"
# DeleteParameters takes at most 10 names per call; GetParametersByPath pages at most 10.
_DELETE_CHUNK = 10


def new_ref() -> str:
    """A fresh secrets ref: random, so two writers never share a parameter."""
    return secrets.token_hex(8)


def parameter_prefix(table_name: str) -> str:
    """The stack's parameters' path (the replica role and the functions may read below it)."""
    return f"/fleetkeeper/{table_name}"


@dataclass(frozen=True)
class SecretStore:
    # The stack's path (its table's name is the stack's own): every parameter under it is the stack's.
    prefix: str
    # The KMS key values are written with (reads need none: Parameter Store knows each value's key).
    key_id: str | None = None
    # Tagged on each parameter (`fleetkeeper:stack`), as on everything else the stack creates.
    stack_id: str = DEFAULT_STACK_ID

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretStore:
        return cls(parameter_prefix(settings.table_name), settings.secrets_key_id, stack_id=settings.stack_id)

    @property
    def ssm(self) -> SSMClient:
        return aws.ssm()

    def incarnation_path(self, service: str, uid: str, owner: str = "") -> str:
        return f"{self.prefix}/{scope_prefix(owner_scope(owner))}{service}/{uid}"

    def parameter_name(self, service: str, uid: str, ref: str, owner: str = "") -> str:
        return f"{self.incarnation_path(service, uid, owner)}/{ref}"

    def put(self, service: str, uid: str, ref: str, values: Mapping[str, str], owner: str = "") -> None:
        """Store a set of values under a fresh ref (never overwrites: a ref is written once)."""
        request: PutParameterRequestTypeDef = {
            "Name": self.parameter_name(service, uid, ref, owner),
            "Value": json.dumps(dict(sorted(values.items())), separators=(",", ":")),
            "Type": "SecureString",
            "Tier": "Standard",
            "Overwrite": False,
            "Description": f"fleetkeeper: secrets of a version of service {service} (incarnation {uid})",
            # Tagging at creation needs ssm:AddTagsToResource beside ssm:PutParameter (template.yaml).
            "Tags": [{"Key": STACK_TAG, "Value": self.stack_id}],
        }
        if self.key_id:
            request["KeyId"] = self.key_id
        self.ssm.put_parameter(**request)

    def get(self, service: str, uid: str, ref: str, owner: str = "") -> dict[str, str]:
        answer = self.ssm.get_parameter(Name=self.parameter_name(service, uid, ref, owner), WithDecryption=True)
        values = json.loads(answer["Parameter"].get("Value", "{}"))
        return {str(k): str(v) for k, v in values.items()}

    def delete(self, service: str, uid: str, refs: list[str], owner: str = "") -> None:
        """Delete these refs' parameters; absent ones are no error."""
        names = [self.parameter_name(service, uid, ref, owner) for ref in refs]
        for start in range(0, len(names), _DELETE_CHUNK):
            self.ssm.delete_parameters(Names=names[start : start + _DELETE_CHUNK])

    def delete_incarnation(self, service: str, uid: str, owner: str = "") -> int:
        """Delete every parameter of one incarnation (the cleanup's part); returns how many."""
        deleted = 0
        # Deleting while paging would shift the pages: collect the names first (a few per version).
        names: list[str] = []
        # An owned incarnation's parameters are under its owner's scope; the legacy path is swept
        # too, so an incarnation of either kind leaves nothing behind.
        paths = dict.fromkeys([self.incarnation_path(service, uid, owner), self.incarnation_path(service, uid)])
        for path in paths:
            token: str | None = None
            while True:
                kwargs = {"Path": path, "Recursive": True, "WithDecryption": False, "MaxResults": 10}
                page = self.ssm.get_parameters_by_path(**kwargs, **({"NextToken": token} if token else {}))  # type: ignore[arg-type]
                names.extend(p["Name"] for p in page.get("Parameters", []) if "Name" in p)
                token = page.get("NextToken")
                if not token:
                    break
        for start in range(0, len(names), _DELETE_CHUNK):
            answer = self.ssm.delete_parameters(Names=names[start : start + _DELETE_CHUNK])
            deleted += len(answer.get("DeletedParameters", []))
        return deleted
