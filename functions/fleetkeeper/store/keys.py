"""The table's keys: where each item lives, and the sparse index that lists services.

    service  PK=SVC#<name>  SK=META                          + list_pk/list_sk (sparse index)
    version  PK=SVC#<name>  SK=V#<uid>#<version:010d>
    replica  PK=SVC#<name>  SK=R#<uid>#<replica_id:010d>
    event    PK=SVC#<name>  SK=E#<uid>#<day>#<fold key>       + expiration (TTL)
    identity PK=IDENTITY#<owner scope>  SK=IDENTITY           an owner's replica role, made by the dispatcher

Every child key carries the incarnation uid, so work on an old incarnation (cleanup, a slow
reconciler) can never touch a newer one of the same name. The trailing `#` of each prefix keeps
uid `abc` from matching `abcd`. Pure: no client, no I/O.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

SERVICE_SK = "META"
SERVICES_INDEX = "services"
LIST_PK_ATTR = "list_pk"
LIST_SK_ATTR = "list_sk"
LIST_PK_VALUE = "SERVICE"
# Powertools idempotency records (store/idempotency.py) share the table under their own partition
# and expire by TTL.
IDEMPOTENCY_PARTITION = "IDEMPOTENCY#api"
TTL_ATTR = "expiration"
# An owner's replica identity (fleetkeeper.replicas.identity): recorded by the dispatcher once IAM has
# made it, read by the reconciler before it launches with it. Not a service item (no SVC# prefix, no
# META sort key), so neither the index nor the cleanup's stream filter ever sees one.
IDENTITY_PK_PREFIX = "IDENTITY#"
IDENTITY_SK = "IDENTITY"


def service_pk(name: str) -> str:
    return f"SVC#{name}"


def service_key(name: str) -> dict[str, str]:
    """The primary key of a service item (as plain strings; `codec.to_raw` makes it DynamoDB's)."""
    return {"PK": service_pk(name), "SK": SERVICE_SK}


def is_service_key(key: Mapping[str, Any]) -> bool:
    """True for the (plain, not DynamoDB-typed) key of a service item, as a stream record carries it."""
    return key.get("SK") == SERVICE_SK and str(key.get("PK", "")).startswith(service_pk(""))


def version_prefix(uid: str) -> str:
    return f"V#{uid}#"


def replica_prefix(uid: str) -> str:
    return f"R#{uid}#"


def event_prefix(uid: str) -> str:
    return f"E#{uid}#"


# Events sort before the service item ("E#" < "META" < "R#" < "V#"): a read of the whole service that
# starts at META (`SK >= META`) never reads them, so a reconcile run's Query does not grow with them.
WHOLE_SERVICE_FROM = SERVICE_SK


def version_sk(uid: str, version: int) -> str:
    return f"{version_prefix(uid)}{version:010d}"


def replica_sk(uid: str, replica_id: int) -> str:
    return f"{replica_prefix(uid)}{replica_id:010d}"


def version_key(name: str, uid: str, version: int) -> dict[str, str]:
    return {"PK": service_pk(name), "SK": version_sk(uid, version)}


def replica_key(name: str, uid: str, replica_id: int) -> dict[str, str]:
    return {"PK": service_pk(name), "SK": replica_sk(uid, replica_id)}


def event_sk(uid: str, day: str, fold_key: str) -> str:
    """An event's key: its UTC day (YYYY-MM-DD) first, so a Query newest-first reads the newest days
    and may stop there; repeats fold within a day (as Kubernetes folds within a window)."""
    return f"{event_prefix(uid)}{day}#{fold_key}"


def event_key(name: str, uid: str, day: str, fold_key: str) -> dict[str, str]:
    return {"PK": service_pk(name), "SK": event_sk(uid, day, fold_key)}


def child_prefixes(uid: str) -> tuple[str, str, str]:
    """The sort-key prefixes of every child item of one incarnation (what cleanup deletes):
    versions, replicas, events."""
    return version_prefix(uid), replica_prefix(uid), event_prefix(uid)


def identity_key(scope: str) -> dict[str, str]:
    """The item recording the replica identity of the owner whose scope this is."""
    return {"PK": f"{IDENTITY_PK_PREFIX}{scope}", "SK": IDENTITY_SK}


def new_uid() -> str:
    """A fresh incarnation id: a service re-created under an old name gets a new one."""
    return secrets.token_hex(8)
