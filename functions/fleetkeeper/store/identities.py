"""The owners' replica identities as the table records them (fleetkeeper.replicas.identity).

IAM is a global service the reconciler's network does not reach (its VPC has no NAT and IAM has no
endpoint there), so the dispatcher, outside the VPC, makes each owner's role and instance profile and
records here when it did; the reconciler reads the record before launching with the profile. The
record is the fact the reconciler acts on: no record, no launch (the identity is not made yet); a
record younger than IAM's propagation time explains a refused profile as the environment's delay.

Written only when it changes (a new identity, one found without its record, one made again), deleted
before the identity itself is removed, so a record always names a profile that exists or is about to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetkeeper.store import keys

if TYPE_CHECKING:
    from collections.abc import Iterable

    from fleetkeeper.store.table import Table

# BatchGetItem's ceiling on keys per call.
BATCH_GET_LIMIT = 100
# Rounds of UnprocessedKeys (what DynamoDB left unread under load, which botocore does not retry)
# before the read gives up: a record must never be taken as missing because it went unread.
UNPROCESSED_ROUNDS = 4


class UnreadRecords(Exception):
    """DynamoDB left some identity records unread: their state is unknown this run."""


@dataclass(frozen=True)
class IdentityRecord:
    scope: str
    owner: str
    profile: str  # the instance profile's name (also its role's)
    made_at: float  # when IAM made it (or gave the profile its role), epoch seconds


class IdentityRecords:
    """Reads and writes the identity records of one table."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def get(self, scope: str, *, consistent: bool = False) -> IdentityRecord | None:
        found = self.table.client.get_item(
            TableName=self.table.name, Key=_raw_key(scope), ConsistentRead=consistent
        ).get("Item")
        return _record(found) if found else None

    def get_many(self, scopes: Iterable[str]) -> dict[str, IdentityRecord]:
        """{scope: record} of those that have one (eventually consistent: a miss is retried later)."""
        wanted = sorted(set(scopes))
        found: dict[str, IdentityRecord] = {}
        for start in range(0, len(wanted), BATCH_GET_LIMIT):
            pending: dict[str, Any] = {
                self.table.name: {"Keys": [_raw_key(scope) for scope in wanted[start : start + BATCH_GET_LIMIT]]}
            }
            for round_ in range(UNPROCESSED_ROUNDS):
                if round_:
                    time.sleep(0.05 * 2**round_)  # DynamoDB asks for a backoff before the retry
                page = self.table.client.batch_get_item(RequestItems=pending)
                for raw in page.get("Responses", {}).get(self.table.name, []):
                    record = _record(raw)
                    found[record.scope] = record
                pending = dict(page.get("UnprocessedKeys") or {})
                if not pending:
                    break
            else:
                raise UnreadRecords(f"DynamoDB left {len(pending[self.table.name]['Keys'])} identity records unread")
        return found

    def put(self, record: IdentityRecord) -> None:
        self.table.client.put_item(
            TableName=self.table.name,
            Item={
                **_raw_key(record.scope),
                "scope": {"S": record.scope},
                "owner": {"S": record.owner},
                "profile": {"S": record.profile},
                "made_at": {"N": repr(round(record.made_at, 3))},
            },
        )

    def delete(self, scope: str) -> None:
        self.table.client.delete_item(TableName=self.table.name, Key=_raw_key(scope))


def _raw_key(scope: str) -> dict[str, Any]:
    return {name: {"S": value} for name, value in keys.identity_key(scope).items()}


def _record(raw: dict[str, Any]) -> IdentityRecord:
    return IdentityRecord(
        scope=str(raw["scope"]["S"]),
        owner=str(raw.get("owner", {}).get("S", "")),
        profile=str(raw["profile"]["S"]),
        made_at=float(raw["made_at"]["N"]),
    )
