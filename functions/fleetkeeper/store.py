"""The one table: every key, index and condition expression fleetkeeper uses lives in this module.

Layout (DESIGN.md):

    service  PK=SVC#<name>  SK=META                          + list_pk/list_sk (sparse index)
    version  PK=SVC#<name>  SK=V#<uid>#<version:010d>
    replica  PK=SVC#<name>  SK=R#<uid>#<replica_id:010d>

Every child key carries the incarnation uid, so work on an old incarnation (cleanup, a slow
reconciler) can never touch a newer one of the same name. Condition failures are told apart by the
item DynamoDB returns with `ReturnValuesOnConditionCheckFailure`, never by parsing messages.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import secrets
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper.errors import Conflict, InvalidRequest, NotFound, PreconditionFailed
from fleetkeeper.model import (
    Lifecycle,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceState,
    ServiceStatus,
    VersionRecord,
    VersionState,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef

    from fleetkeeper.spec import ServiceSpec

# --- keys -----------------------------------------------------------------------------------------

SERVICE_SK = "META"
SERVICES_INDEX = "services"
LIST_PK_ATTR = "list_pk"
LIST_SK_ATTR = "list_sk"
LIST_PK_VALUE = "SERVICE"
# Versions kept per service, like a Kubernetes Deployment's revisionHistoryLimit: an update prunes
# what falls out of the window (never the target, never a version a replica runs), so neither a
# read of the service nor a reconcile run grows with a long-lived service's history.
VERSION_HISTORY_LIMIT = 50
# Powertools idempotency records share the table under their own partition and expire by TTL.
TTL_ATTR = "expiration"

Item = dict[str, Any]
RawItem = dict[str, "AttributeValueTypeDef"]


def service_pk(name: str) -> str:
    return f"SVC#{name}"


def version_prefix(uid: str) -> str:
    return f"V#{uid}#"


def replica_prefix(uid: str) -> str:
    return f"R#{uid}#"


def version_sk(uid: str, version: int) -> str:
    return f"{version_prefix(uid)}{version:010d}"


def replica_sk(uid: str, replica_id: int) -> str:
    return f"{replica_prefix(uid)}{replica_id:010d}"


def child_prefixes(uid: str) -> tuple[str, str]:
    """The sort-key prefixes of every child item of one incarnation (what cleanup deletes)."""
    return version_prefix(uid), replica_prefix(uid)


def new_uid() -> str:
    return secrets.token_hex(8)


# --- (de)serialisation --------------------------------------------------------------------------
# DynamoDB's attribute-value format for the few types our items hold. boto3's TypeSerializer would
# do the same, but importing it imports all of boto3 (~80 ms of every api cold start).


def _marshal(value: Any) -> Any:
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int | Decimal):
        return {"N": str(value)}
    if value is None:
        return {"NULL": True}
    if isinstance(value, dict):
        return {"M": {str(k): _marshal(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"L": [_marshal(v) for v in value]}
    raise TypeError(f"cannot store {type(value).__name__} in DynamoDB (floats go in JSON text)")


def _unmarshal(value: Mapping[str, Any]) -> Any:
    (kind, data), *_ = value.items()
    if kind == "S":
        return data
    if kind == "N":
        number = Decimal(data)
        return int(number) if number == number.to_integral_value() else number
    if kind == "BOOL":
        return bool(data)
    if kind == "NULL":
        return None
    if kind == "M":
        return {k: _unmarshal(v) for k, v in data.items()}
    if kind == "L":
        return [_unmarshal(v) for v in data]
    raise TypeError(f"unexpected DynamoDB type {kind!r}")


def to_raw(item: Mapping[str, Any]) -> RawItem:
    return {k: _marshal(v) for k, v in item.items() if v is not None}


def from_raw(raw: Mapping[str, Any]) -> Item:
    return {k: _unmarshal(v) for k, v in raw.items()}


def _values(**values: Any) -> dict[str, AttributeValueTypeDef]:
    return {f":{k}": _marshal(v) for k, v in values.items()}


def service_item(record: ServiceRecord) -> Item:
    return {
        "PK": service_pk(record.name),
        "SK": SERVICE_SK,
        LIST_PK_ATTR: LIST_PK_VALUE,
        LIST_SK_ATTR: record.name,
        "kind": "service",
        "name": record.name,
        "uid": record.uid,
        "generation": record.generation,
        "lifecycle": record.lifecycle.value,
        "target_version": record.target_version,
        "latest_version": record.latest_version,
        "status": record.status.value,
        "status_message": record.status_message,
        "observed_generation": record.observed_generation,
        "replica_seq": record.replica_seq,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def service_from_item(item: Mapping[str, Any]) -> ServiceRecord:
    return ServiceRecord(
        name=str(item["name"]),
        uid=str(item["uid"]),
        generation=int(item["generation"]),
        lifecycle=Lifecycle(item["lifecycle"]),
        target_version=int(item["target_version"]),
        latest_version=int(item["latest_version"]),
        status=ServiceStatus(item["status"]),
        status_message=str(item.get("status_message", "")),
        observed_generation=int(item.get("observed_generation", 0)),
        created_at=str(item["created_at"]),
        updated_at=str(item["updated_at"]),
        replica_seq=int(item.get("replica_seq", 0)),
    )


def version_item(record: VersionRecord) -> Item:
    return {
        "PK": service_pk(record.name),
        "SK": version_sk(record.uid, record.version),
        "kind": "version",
        "name": record.name,
        "uid": record.uid,
        "version": record.version,
        # Stored as JSON text: specs hold floats, which DynamoDB's number type would turn into Decimals.
        "spec": json.dumps(record.spec.to_json_dict(), separators=(",", ":"), sort_keys=True),
        "mode": record.mode,
        "state": record.state.value,
        "state_message": record.state_message,
        "created_at": record.created_at,
    }


def version_from_item(item: Mapping[str, Any]) -> VersionRecord:
    from fleetkeeper.spec import ServiceSpec

    return VersionRecord(
        name=str(item["name"]),
        uid=str(item["uid"]),
        version=int(item["version"]),
        spec=ServiceSpec.model_validate_json(str(item["spec"])),
        mode=str(item["mode"]),
        created_at=str(item["created_at"]),
        state=VersionState(item.get("state", VersionState.NEW.value)),
        state_message=str(item.get("state_message", "")),
    )


def replica_item(record: ReplicaRecord) -> Item:
    return {
        "PK": service_pk(record.name),
        "SK": replica_sk(record.uid, record.replica_id),
        "kind": "replica",
        "name": record.name,
        "uid": record.uid,
        "replica_id": record.replica_id,
        "version": record.version,
        "status": record.status.value,
        "status_message": record.status_message,
        "failure_code": record.failure_code,
        "cause": record.cause.value if record.cause is not None else None,
        "instance_id": record.instance_id,
        "url": record.url,
        "ready_at": record.ready_at,
        "last_probe_ok_at": record.last_probe_ok_at,
        "probe_failures": record.probe_failures,
        "launch_attempts": record.launch_attempts,
        "next_attempt_at": record.next_attempt_at,
        "launched_at": record.launched_at,
        "rev": record.rev,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def replica_from_item(item: Mapping[str, Any]) -> ReplicaRecord:
    from fleetkeeper.model import FailureCause

    def opt(key: str) -> str | None:
        value = item.get(key)
        return None if value is None else str(value)

    status = ReplicaStatus(item["status"])
    cause = item.get("cause")
    return ReplicaRecord(
        name=str(item["name"]),
        uid=str(item["uid"]),
        replica_id=int(item["replica_id"]),
        version=int(item["version"]),
        status=status,
        status_message=str(item.get("status_message", "")),
        failure_code=opt("failure_code"),
        # Items written before causes were recorded: what their status implies, else UNRECORDED.
        cause=FailureCause(cause) if cause is not None else FailureCause.of_unrecorded(status),
        instance_id=opt("instance_id"),
        url=opt("url"),
        ready_at=opt("ready_at"),
        last_probe_ok_at=opt("last_probe_ok_at"),
        probe_failures=int(item.get("probe_failures", 0)),
        launch_attempts=int(item.get("launch_attempts", 0)),
        next_attempt_at=opt("next_attempt_at"),
        launched_at=opt("launched_at"),
        rev=int(item.get("rev", 0)),
        created_at=str(item["created_at"]),
        updated_at=str(item["updated_at"]),
    )


def state_from_items(items: list[Item]) -> ServiceState | None:
    """Assemble a service from its partition's items, keeping only the current incarnation's children."""
    meta = next((i for i in items if i["SK"] == SERVICE_SK), None)
    if meta is None:
        return None
    service = service_from_item(meta)
    versions: dict[int, VersionRecord] = {}
    replicas: dict[int, ReplicaRecord] = {}
    vprefix, rprefix = child_prefixes(service.uid)
    for item in items:
        sk = str(item["SK"])
        if sk.startswith(vprefix):
            version = version_from_item(item)
            versions[version.version] = version
        elif sk.startswith(rprefix):
            replica = replica_from_item(item)
            replicas[replica.replica_id] = replica
    return ServiceState(service=service, versions=versions, replicas=replicas)


# The sparse index's one partition: every service item, and nothing else.
_SERVICES_QUERY: dict[str, Any] = {
    "IndexName": SERVICES_INDEX,
    "KeyConditionExpression": f"{LIST_PK_ATTR} = :lpk",
    "ExpressionAttributeValues": _values(lpk=LIST_PK_VALUE),
}


# --- pagination tokens ----------------------------------------------------------------------------


def encode_token(last_key: Mapping[str, Any] | None) -> str | None:
    if not last_key:
        return None
    return base64.urlsafe_b64encode(json.dumps(from_raw(last_key), sort_keys=True).encode()).decode()


def decode_token(token: str) -> RawItem:
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
    except (ValueError, binascii.Error, UnicodeError) as exc:
        raise InvalidRequest(
            "next_token is not a token this API issued; pass back `next_token` from the previous page as is",
            details=[{"field": "next_token", "problem": "malformed"}],
        ) from exc
    expected = {"PK", "SK", LIST_PK_ATTR, LIST_SK_ATTR}
    if not isinstance(key, dict) or set(key) != expected or not all(isinstance(v, str) for v in key.values()):
        raise InvalidRequest(
            "next_token is not a token this API issued; pass back `next_token` from the previous page as is",
            details=[{"field": "next_token", "problem": "unknown token"}],
        )
    return to_raw(key)


# --- condition failures ---------------------------------------------------------------------------


def _cancellation_reasons(exc: ClientError) -> list[dict[str, Any]]:
    reasons: list[dict[str, Any]] = exc.response.get("CancellationReasons", [])  # type: ignore[assignment]
    return reasons


def _is(exc: ClientError, code: str) -> bool:
    return exc.response.get("Error", {}).get("Code") == code


def _failed_item(reason: Mapping[str, Any]) -> Item | None:
    """The item as it was when its condition failed (None when it did not exist)."""
    raw = reason.get("Item")
    return from_raw(raw) if raw else None


def _explain_service_condition(
    name: str, current: Item | None, *, expected_uid: str, expected_generation: int | None
) -> Exception:
    if current is None or current.get("uid") != expected_uid:
        if current is None:
            return NotFound(f"service {name!r} does not exist")
        return Conflict(f"service {name!r} was deleted and re-created while this request ran; retry it")
    if current.get("lifecycle") == Lifecycle.DELETING.value:
        return Conflict(f"service {name!r} is being deleted; wait for it to go, then create it again")
    if expected_generation is not None and int(current["generation"]) != expected_generation:
        return PreconditionFailed(
            f"service {name!r} is at generation {int(current['generation'])}, not {expected_generation} "
            "(If-Match); fetch it again and retry with the current generation"
        )
    # Same uid, ACTIVE, generation as asked: someone else moved latest_version; the caller may retry.
    return _Raced(name)


class _Raced(Conflict):
    def __init__(self, name: str) -> None:
        super().__init__(f"service {name!r} was changed by another request at the same time; retry")


Raced = _Raced


# --- the store ------------------------------------------------------------------------------------


class Store:
    """Data access for services, versions and replicas. One instance per table."""

    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client = client

    @property
    def client(self) -> DynamoDBClient:
        if self._client is None:
            from fleetkeeper import aws

            self._client = aws.dynamodb()
        return self._client

    # -- reads --

    def _query_pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        while True:
            page = self.client.query(TableName=self.table_name, **kwargs)
            yield dict(page)
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last

    def load(self, name: str) -> ServiceState | None:
        """The service with its versions and replicas: one Query (paginated past 1 MB)."""
        items: list[Item] = []
        for page in self._query_pages(
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues=_values(pk=service_pk(name)),
            ConsistentRead=True,
        ):
            items.extend(from_raw(raw) for raw in page["Items"])
        return state_from_items(items)

    def require(self, name: str) -> ServiceState:
        state = self.load(name)
        if state is None:
            raise NotFound(f"service {name!r} does not exist")
        return state

    def list_services(self, *, limit: int, next_token: str | None = None) -> tuple[list[ServiceRecord], str | None]:
        """A page of service items from the sparse index (never version or replica items)."""
        kwargs: dict[str, Any] = {**_SERVICES_QUERY, "Limit": limit}
        if next_token:
            kwargs["ExclusiveStartKey"] = decode_token(next_token)
        page = self.client.query(TableName=self.table_name, **kwargs)
        services = [service_from_item(from_raw(raw)) for raw in page["Items"]]
        return services, encode_token(page.get("LastEvaluatedKey"))

    def iter_services(self) -> Iterator[ServiceRecord]:
        """Every service item, page by page through the sparse index."""
        for page in self._query_pages(**_SERVICES_QUERY):
            for raw in page["Items"]:
                yield service_from_item(from_raw(raw))

    # -- writes from the api --

    def create_service(self, name: str, spec: ServiceSpec, mode: str, now: str) -> ServiceState:
        """Service item + version 1 in ONE transaction: neither can exist without the other."""
        uid = new_uid()
        service = ServiceRecord(
            name=name,
            uid=uid,
            generation=1,
            lifecycle=Lifecycle.ACTIVE,
            target_version=1,
            latest_version=1,
            status=ServiceStatus.NO_REPLICA,
            status_message=f"waiting for the reconciler to launch {spec.target_replicas} replica(s)",
            observed_generation=0,
            created_at=now,
            updated_at=now,
        )
        version = VersionRecord(name=name, uid=uid, version=1, spec=spec, mode=mode, created_at=now)
        try:
            self.client.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self.table_name,
                            "Item": to_raw(service_item(service)),
                            "ConditionExpression": "attribute_not_exists(PK)",
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                    {
                        "Put": {
                            "TableName": self.table_name,
                            "Item": to_raw(version_item(version)),
                            "ConditionExpression": "attribute_not_exists(PK)",
                        }
                    },
                ]
            )
        except ClientError as exc:
            if not _is(exc, "TransactionCanceledException"):
                raise
            reasons = _cancellation_reasons(exc)
            existing = _failed_item(reasons[0]) if reasons else None
            if existing is not None and existing.get("lifecycle") == Lifecycle.DELETING.value:
                raise Conflict(f"service {name!r} is still being deleted; create it again once it is gone") from exc
            if reasons and reasons[0].get("Code") == "ConditionalCheckFailed":
                raise Conflict(f"service {name!r} already exists; use PUT /v1/services/{name} to update it") from exc
            if len(reasons) > 1 and reasons[1].get("Code") == "ConditionalCheckFailed":
                # A version item under a fresh random uid already exists: astronomically unlikely,
                # and nothing was written; the client can simply retry.
                raise Conflict(f"could not create {name!r} (incarnation id collision); retry the request") from exc
            raise
        return ServiceState(service=service, versions={1: version})

    def add_version(
        self,
        state: ServiceState,
        spec: ServiceSpec,
        mode: str,
        now: str,
        *,
        expected_generation: int | None,
    ) -> ServiceState:
        """Version n+1 and the service's move to it, in ONE transaction conditioned on what we read."""
        current = state.service
        new_version = current.latest_version + 1
        version = VersionRecord(
            name=current.name, uid=current.uid, version=new_version, spec=spec, mode=mode, created_at=now
        )
        pruned = prunable_versions(state, new_version)
        condition = "uid = :uid AND lifecycle = :active AND latest_version = :latest"
        values = _values(
            uid=current.uid,
            active=Lifecycle.ACTIVE.value,
            latest=current.latest_version,
            one=1,
            new=new_version,
            now=now,
        )
        if expected_generation is not None:
            condition += " AND generation = :expected"
            values.update(_values(expected=expected_generation))
        try:
            self._transact_on_service(
                current,
                expected_generation,
                update_expression=(
                    "SET target_version = :new, latest_version = :new, "
                    "generation = generation + :one, updated_at = :now"
                ),
                condition=condition,
                values=values,
                other={
                    "Put": {
                        "TableName": self.table_name,
                        "Item": to_raw(version_item(version)),
                        "ConditionExpression": "attribute_not_exists(PK)",
                    }
                },
                also=[self._delete_version(current, n) for n in pruned],
            )
        except _MissingChild as exc:
            # Version n+1 already exists: another writer added it between our read and our write.
            raise Raced(current.name) from exc
        service = replace(
            current,
            target_version=new_version,
            latest_version=new_version,
            generation=current.generation + 1,
            updated_at=now,
        )
        kept = {n: v for n, v in state.versions.items() if n not in pruned}
        return replace(state, service=service, versions={**kept, new_version: version})

    def _delete_version(self, service: ServiceRecord, version: int) -> TransactWriteItemTypeDef:
        key = {"PK": service_pk(service.name), "SK": version_sk(service.uid, version)}
        return {"Delete": {"TableName": self.table_name, "Key": to_raw(key)}}

    def set_target(
        self, state: ServiceState, version: int, now: str, *, expected_generation: int | None
    ) -> ServiceState:
        """Roll the target back (or forward) to an existing version: ONE transaction that checks it exists."""
        current = state.service
        condition = "uid = :uid AND lifecycle = :active AND generation = :generation"
        values = _values(
            uid=current.uid,
            active=Lifecycle.ACTIVE.value,
            generation=current.generation if expected_generation is None else expected_generation,
            one=1,
            target=version,
            now=now,
        )
        try:
            self._transact_on_service(
                current,
                expected_generation,
                update_expression="SET target_version = :target, generation = generation + :one, updated_at = :now",
                condition=condition,
                values=values,
                other={
                    "ConditionCheck": {
                        "TableName": self.table_name,
                        "Key": to_raw({"PK": service_pk(current.name), "SK": version_sk(current.uid, version)}),
                        "ConditionExpression": "attribute_exists(PK)",
                    }
                },
            )
        except _MissingChild as exc:
            raise NotFound(
                f"service {current.name!r} has no version {version} (latest is {current.latest_version}; "
                f"the newest {VERSION_HISTORY_LIMIT} are kept)"
            ) from exc
        service = replace(current, target_version=version, generation=current.generation + 1, updated_at=now)
        return replace(state, service=service)

    def _transact_on_service(
        self,
        current: ServiceRecord,
        expected_generation: int | None,
        *,
        update_expression: str,
        condition: str,
        values: dict[str, AttributeValueTypeDef],
        other: TransactWriteItemTypeDef,
        also: Sequence[TransactWriteItemTypeDef] = (),
    ) -> None:
        """ONE transaction: a conditional update of the service item, `other` on a child item (its
        condition failing is _MissingChild), and unconditional `also` items."""
        update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self.table_name,
                "Key": to_raw({"PK": service_pk(current.name), "SK": SERVICE_SK}),
                "UpdateExpression": update_expression,
                "ConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        try:
            self.client.transact_write_items(TransactItems=[update, other, *also])
        except ClientError as exc:
            if not _is(exc, "TransactionCanceledException"):
                raise
            reasons = _cancellation_reasons(exc)
            if reasons and reasons[0].get("Code") == "ConditionalCheckFailed":
                raise _explain_service_condition(
                    current.name,
                    _failed_item(reasons[0]),
                    expected_uid=current.uid,
                    expected_generation=expected_generation,
                ) from exc
            if len(reasons) > 1 and reasons[1].get("Code") == "ConditionalCheckFailed":
                raise _MissingChild from exc
            raise

    def mark_deleting(self, state: ServiceState, now: str) -> ServiceState:
        """Lifecycle DELETING, generation+1. Deleting a service that is already going changes nothing."""
        current = state.service
        if current.lifecycle is Lifecycle.DELETING:
            return state
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key=to_raw({"PK": service_pk(current.name), "SK": SERVICE_SK}),
                UpdateExpression=(
                    "SET lifecycle = :deleting, generation = generation + :one, #status = :shutting, "
                    "status_message = :message, updated_at = :now"
                ),
                ConditionExpression="uid = :uid AND lifecycle = :active",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues=_values(
                    deleting=Lifecycle.DELETING.value,
                    active=Lifecycle.ACTIVE.value,
                    one=1,
                    shutting=ServiceStatus.SHUTTING_DOWN.value,
                    message="deleting: terminating every replica",
                    now=now,
                    uid=current.uid,
                ),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if not _is(exc, "ConditionalCheckFailedException"):
                raise
            raw: dict[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment]
            existing = from_raw(raw) if raw else None
            if existing is None:
                raise NotFound(f"service {current.name!r} does not exist") from exc
            if existing.get("uid") != current.uid:
                raise Conflict(
                    f"service {current.name!r} was re-created while this request ran; retry to delete the new one"
                ) from exc
            return replace(state, service=service_from_item(existing))  # already DELETING: harmless
        service = replace(
            current,
            lifecycle=Lifecycle.DELETING,
            generation=current.generation + 1,
            status=ServiceStatus.SHUTTING_DOWN,
            status_message="deleting: terminating every replica",
            updated_at=now,
        )
        return replace(state, service=service)


def prunable_versions(state: ServiceState, new_version: int) -> list[int]:
    """Versions that fall out of the history window when `new_version` is added (a transaction
    holds 100 items: the service update and the new version leave room for 98 deletes)."""
    in_use = {state.service.target_version} | {r.version for r in state.replicas.values()}
    oldest_kept = new_version - VERSION_HISTORY_LIMIT + 1
    return sorted(n for n in state.versions if n < oldest_kept and n not in in_use)[:98]


class _MissingChild(Exception):
    """A transaction's ConditionCheck on a child item failed: the item does not exist."""


# === cleanup: deleting one removed incarnation's children ===================================
#
# The cleanup function (fleetkeeper/cleanup) deletes the version and replica items of an incarnation
# whose service item was removed. Both operations address children ONLY through the uid's sort-key
# prefixes (`V#<uid>#`, `R#<uid>#`), so a newer incarnation of the same name (another uid) is out of
# reach by construction. Retries, backoff and the time budget are the caller's (cleanup/logic.py).

BATCH_WRITE_LIMIT = 25  # DynamoDB's ceiling on the requests of one BatchWriteItem call


class ChildKeys:
    """Reads and deletes the child items of one incarnation: (name, uid)."""

    def __init__(self, store: Store, name: str, uid: str) -> None:
        if not name or not uid:
            raise ValueError("cleanup needs both the service name and the incarnation uid")
        self.store = store
        self.pk = service_pk(name)
        self.prefixes = child_prefixes(uid)

    def keys(self) -> Iterator[RawItem]:
        """Every remaining child key (versions, then replicas), page by page, keys only.

        Lazy: a caller that deletes while iterating only asks for the next page when it needs it,
        and items it already deleted lie behind the page cursor.
        """
        for prefix in self.prefixes:
            for page in self.store._query_pages(
                KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
                ExpressionAttributeValues=_values(pk=self.pk, prefix=prefix),
                ProjectionExpression="PK, SK",
                ConsistentRead=True,
            ):
                yield from page["Items"]

    def owns(self, key: Mapping[str, Any]) -> bool:
        """True for a key of this incarnation: a last guard before anything is deleted."""
        sk = key.get("SK", {}).get("S", "")
        return key.get("PK", {}).get("S") == self.pk and any(sk.startswith(p) for p in self.prefixes)

    def delete(self, keys: list[RawItem]) -> list[RawItem]:
        """ONE BatchWriteItem of up to 25 deletes; returns the keys DynamoDB left unprocessed.

        Deleting an item that is already gone succeeds, so a repeated chunk is harmless.
        """
        if not 0 < len(keys) <= BATCH_WRITE_LIMIT:
            raise ValueError(f"a delete batch holds 1..{BATCH_WRITE_LIMIT} keys, got {len(keys)}")
        foreign = [k for k in keys if not self.owns(k)]
        if foreign:
            raise ValueError(f"refusing to delete keys of another incarnation: {foreign[:3]}")
        response = self.store.client.batch_write_item(
            RequestItems={self.store.table_name: [{"DeleteRequest": {"Key": key}} for key in keys]}
        )
        unprocessed = response.get("UnprocessedItems", {}).get(self.store.table_name, [])
        return [dict(request["DeleteRequest"]["Key"]) for request in unprocessed if "DeleteRequest" in request]


def partition_uids(store: Store, name: str) -> tuple[str | None, dict[str, int]]:
    """The live incarnation's uid (None when its service item is gone) and child counts per uid.

    Read-only, for an operator (cleanup/manual.py): a Query is not isolated from a concurrent
    create's transaction, so what it shows is a hint for a person, never a reason for code to delete.
    """
    live: str | None = None
    counts: dict[str, int] = {}
    for page in store._query_pages(
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues=_values(pk=service_pk(name)),
        ProjectionExpression="SK, uid",
        ConsistentRead=True,
    ):
        for item in map(from_raw, page["Items"]):
            if item["SK"] == SERVICE_SK:
                live = str(item["uid"])
            elif "uid" in item:
                counts[str(item["uid"])] = counts.get(str(item["uid"]), 0) + 1
    return live, counts


# --- reconciler -----------------------------------------------------------------------------------
# The reconciler's writes. Each is conditioned on what the run observed, so a run acting on stale
# observations (another run got there first, the user changed the service) writes nothing and
# raises Superseded; the next run re-observes.

# A TransactWriteItems holds at most 100 items: the service update plus 99 replica puts.
_CLAIM_CHUNK = 99


class Superseded(Exception):
    """A reconciler write found its item changed since the run observed it."""


@contextlib.contextmanager
def _superseded_unless_condition_holds(what: str) -> Iterator[None]:
    """A reconciler write whose condition failed lost to another writer: Superseded, not an error."""
    try:
        yield
    except ClientError as exc:
        if _is(exc, "ConditionalCheckFailedException"):
            raise Superseded(what) from exc
        raise


class ReconcilerStore(Store):
    """Store plus the reconciler's conditional writes."""

    def claim_replicas(
        self, service: ServiceRecord, version: int, replica_ids: Sequence[int], now: str
    ) -> list[ReplicaRecord]:
        """Claim new replica ids: bump replica_seq n -> n+k and put k PENDING items, in ONE transaction.

        Conditioned on (uid, ACTIVE, replica_seq = n): of two runs claiming at once, one wins; the
        other's transaction is cancelled (Superseded) and it launches nothing.
        """
        claimed: list[ReplicaRecord] = []
        seen = service.replica_seq
        ids = list(replica_ids)
        if ids != list(range(seen, seen + len(ids))):
            raise ValueError(f"replica ids must continue replica_seq {seen}: {ids}")
        for start in range(0, len(ids), _CLAIM_CHUNK):
            chunk = ids[start : start + _CLAIM_CHUNK]
            records = [ReplicaRecord.pending(service, replica_id, version, now) for replica_id in chunk]
            items: list[TransactWriteItemTypeDef] = [
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": to_raw({"PK": service_pk(service.name), "SK": SERVICE_SK}),
                        "UpdateExpression": "SET replica_seq = :next",
                        "ConditionExpression": "uid = :uid AND lifecycle = :active AND replica_seq = :seen",
                        "ExpressionAttributeValues": _values(
                            next=seen + len(chunk), uid=service.uid, active=Lifecycle.ACTIVE.value, seen=seen
                        ),
                    }
                }
            ]
            items.extend(
                {
                    "Put": {
                        "TableName": self.table_name,
                        "Item": to_raw(replica_item(record)),
                        "ConditionExpression": "attribute_not_exists(PK)",
                    }
                }
                for record in records
            )
            self._transact_or_superseded(items)
            claimed.extend(records)
            seen += len(chunk)
        return claimed

    def put_replica(self, before: ReplicaRecord, after: ReplicaRecord) -> ReplicaRecord:
        """Replace a replica item if it is still at `before.rev`; returns the record as written."""
        written = replace(after, rev=before.rev + 1)
        with _superseded_unless_condition_holds(f"replica {before.replica_id} of {before.name} changed"):
            self.client.put_item(
                TableName=self.table_name,
                Item=to_raw(replica_item(written)),
                ConditionExpression="rev = :rev",
                ExpressionAttributeValues=_values(rev=before.rev),
            )
        return written

    def delete_replica(self, record: ReplicaRecord) -> None:
        with _superseded_unless_condition_holds(f"replica {record.replica_id} of {record.name} changed"):
            self.client.delete_item(
                TableName=self.table_name,
                Key=to_raw({"PK": service_pk(record.name), "SK": replica_sk(record.uid, record.replica_id)}),
                ConditionExpression="rev = :rev",
                ExpressionAttributeValues=_values(rev=record.rev),
            )

    def mark_version(
        self, service: ServiceRecord, version: int, expected: VersionState, state: VersionState, message: str
    ) -> None:
        self._transact_or_superseded([self._version_state_update(service, version, expected, state, message)])

    def trip_breaker(self, service: ServiceRecord, version: int, message: str, rollback_to: int | None) -> None:
        """Version FAILED and (when there is a good version) the target rolled back, in ONE transaction."""
        items = [self._version_state_update(service, version, VersionState.NEW, VersionState.FAILED, message)]
        if rollback_to is not None:
            items.append(
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": to_raw({"PK": service_pk(service.name), "SK": SERVICE_SK}),
                        # generation moves: a client's If-Match taken before the rollback must fail.
                        # The message says why at once (a CLI waiting on the update reports it); the
                        # next run derives the full status.
                        "UpdateExpression": (
                            "SET target_version = :good, generation = generation + :one, status_message = :why"
                        ),
                        "ConditionExpression": (
                            "uid = :uid AND lifecycle = :active AND target_version = :failed "
                            "AND generation = :generation"
                        ),
                        "ExpressionAttributeValues": _values(
                            good=rollback_to,
                            why=f"rolling back to version {rollback_to}: {message}",
                            one=1,
                            uid=service.uid,
                            active=Lifecycle.ACTIVE.value,
                            failed=version,
                            generation=service.generation,
                        ),
                    }
                }
            )
        self._transact_or_superseded(items)

    def record_status(
        self, service: ServiceRecord, status: ServiceStatus, message: str, observed_generation: int
    ) -> None:
        """Status of the generation the run acted on; skipped (Superseded) if the service moved since."""
        with _superseded_unless_condition_holds(f"service {service.name} changed"):
            self.client.update_item(
                TableName=self.table_name,
                Key=to_raw({"PK": service_pk(service.name), "SK": SERVICE_SK}),
                UpdateExpression=("SET #status = :status, status_message = :message, observed_generation = :observed"),
                ConditionExpression="uid = :uid AND generation = :generation",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues=_values(
                    status=status.value,
                    message=message,
                    observed=observed_generation,
                    uid=service.uid,
                    generation=service.generation,
                ),
            )

    def delete_service(self, service: ServiceRecord) -> None:
        """The last step of a delete: the DELETING item of this incarnation goes (cleanup takes the rest)."""
        with _superseded_unless_condition_holds(f"service {service.name} changed"):
            self.client.delete_item(
                TableName=self.table_name,
                Key=to_raw({"PK": service_pk(service.name), "SK": SERVICE_SK}),
                ConditionExpression="lifecycle = :deleting AND uid = :uid",
                ExpressionAttributeValues=_values(deleting=Lifecycle.DELETING.value, uid=service.uid),
            )

    def _version_state_update(
        self, service: ServiceRecord, version: int, expected: VersionState, state: VersionState, message: str
    ) -> TransactWriteItemTypeDef:
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": to_raw({"PK": service_pk(service.name), "SK": version_sk(service.uid, version)}),
                "UpdateExpression": "SET #state = :state, state_message = :message",
                "ConditionExpression": "attribute_exists(PK) AND #state = :expected",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": _values(state=state.value, message=message, expected=expected.value),
            }
        }

    def _transact_or_superseded(self, items: list[TransactWriteItemTypeDef]) -> None:
        try:
            self.client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            reasons = _cancellation_reasons(exc) if _is(exc, "TransactionCanceledException") else []
            if any(reason.get("Code") == "ConditionalCheckFailed" for reason in reasons):
                raise Superseded("a claim or version change lost to a concurrent writer") from exc
            raise
