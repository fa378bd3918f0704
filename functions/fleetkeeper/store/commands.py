"""The api's store: reads of services, and the writes of target state (create, add a version,
move the target, mark deleting).

Each write is ONE conditional DynamoDB call, conditioned on what the caller read. A refused write
raises a typed fact (fleetkeeper.store.errors) read from the item DynamoDB returns with the
failure; how to phrase it for a person is the caller's (fleetkeeper.api.services).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from fleetkeeper import service_events
from fleetkeeper.model import Lifecycle, ReplicaRecord, ServiceRecord, ServiceState, ServiceStatus, VersionRecord
from fleetkeeper.store import keys
from fleetkeeper.store.codec import (
    Item,
    access_item,
    expression_values,
    service_from_item,
    service_item,
    to_raw,
    version_item,
)
from fleetkeeper.store.errors import (
    Contention,
    Deleting,
    GenerationMismatch,
    Raced,
    Recreated,
    ServiceExists,
    ServiceMissing,
    StoreError,
    UidCollision,
    VersionMissing,
)
from fleetkeeper.store.events import EventReads, EventSequence, event_update
from fleetkeeper.store.reads import ServiceReads
from fleetkeeper.store.table import (
    TRANSACT_ITEM_LIMIT,
    cancellation_reasons,
    condition_failed,
    item_as_it_was,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef

    from fleetkeeper.choices import UpdateMode
    from fleetkeeper.model import AccessGrant
    from fleetkeeper.service_events import Event, EventRecord
    from fleetkeeper.spec.service import ServiceSpec
    from fleetkeeper.store.table import Table

# Versions kept per service, like a Kubernetes Deployment's revisionHistoryLimit: an update prunes
# what falls out of the window (never the target, never a version a replica runs), so neither a
# read of the service nor a reconcile run grows with a long-lived service's history.
VERSION_HISTORY_LIMIT = 50
# Consistent Queries a read of one service makes before a torn read (service item without its
# target version) is reported as Contention.
TORN_READ_ATTEMPTS = 3
# An update's transaction: the service update, the new version, its event, and the prunes that fit.
_PRUNES_PER_UPDATE = TRANSACT_ITEM_LIMIT - 3


class CommandStore:
    """Services as the api reads and writes them. One instance per table."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._reads = ServiceReads(table)
        self._sequence = EventSequence()  # orders the events this store writes at one `now`

    # -- reads --

    def load(self, name: str) -> ServiceState | None:
        """The whole service, never without its target version (invariant 1, reading side).

        A Query is only read-committed against TransactWriteItems: while a create or an update is
        in flight it can return the new service item without the new version item it was written
        with. Such a read is simply read again, up to `TORN_READ_ATTEMPTS` consistent Queries in
        all; then Contention (a 503 the client retries). Chosen over a TransactGetItems of service
        + target version: the Query is needed anyway (replicas, versions), the tear lasts only as
        long as a transaction is in flight (milliseconds), so the common case stays ONE Query and a
        torn one costs one more; a TransactGetItems would add a call and its own conflicts
        (TransactionCanceledException against an ongoing write) to every read that tore.
        (The other tear order, the old service item beside the new version, is a consistent view
        of the state before the write: the new version is just not targeted yet.)
        """
        for _ in range(TORN_READ_ATTEMPTS):
            state = self._reads.load(name)
            if state is None or state.target is not None:
                return state
        raise Contention("torn read: the service's target version stayed invisible")

    def require(self, name: str) -> ServiceState:
        state = self.load(name)
        if state is None:
            raise ServiceMissing(name)
        return state

    def service(self, name: str) -> ServiceRecord:
        """The service item alone (consistent GetItem)."""
        service = self._reads.service(name)
        if service is None:
            raise ServiceMissing(name)
        return service

    def versions_page(
        self, service: ServiceRecord, *, limit: int, next_token: str | None
    ) -> tuple[list[VersionRecord], str | None]:
        return self._reads.versions_page(service, limit=limit, next_token=next_token)

    def events_page(
        self, service: ServiceRecord, *, limit: int, next_token: str | None, now_epoch: int
    ) -> tuple[list[EventRecord], str | None]:
        return EventReads(self.table).page(service, limit=limit, next_token=next_token, now_epoch=now_epoch)

    def list_services(
        self,
        *,
        limit: int,
        next_token: str | None = None,
        visible: Callable[[ServiceRecord], bool] | None = None,
    ) -> tuple[list[ServiceRecord], str | None]:
        return self._reads.list_page(limit=limit, next_token=next_token, visible=visible)

    def iter_services(self) -> Iterator[ServiceRecord]:
        return self._reads.iter_services()

    # -- writes --

    def create_service(
        self,
        name: str,
        spec: ServiceSpec,
        mode: UpdateMode,
        now: str,
        *,
        status_message: str,
        uid: str | None = None,
        secrets_ref: str | None = None,
        owner: str = "",
    ) -> ServiceState:
        """Service item + version 1 in ONE transaction: neither can exist without the other.

        `uid`: the new incarnation's id when the caller chose it (it stored the version's secrets and
        workdir under it first); a fresh one otherwise."""
        uid = uid or keys.new_uid()
        service = ServiceRecord(
            name=name,
            uid=uid,
            generation=1,
            lifecycle=Lifecycle.ACTIVE,
            target_version=1,
            latest_version=1,
            status=ServiceStatus.NO_REPLICA,
            status_message=status_message,
            observed_generation=0,
            created_at=now,
            updated_at=now,
            owner=owner,
        )
        version = VersionRecord(
            name=name, uid=uid, version=1, spec=spec, mode=mode, created_at=now, secrets_ref=secrets_ref
        )
        try:
            self.table.client.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self.table.name,
                            "Item": to_raw(service_item(service)),
                            "ConditionExpression": "attribute_not_exists(PK)",
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                    {
                        "Put": {
                            "TableName": self.table.name,
                            "Item": to_raw(version_item(version)),
                            "ConditionExpression": "attribute_not_exists(PK)",
                        }
                    },
                    event_update(self.table.name, name, uid, service_events.created(1), now, self._sequence.next()),
                ]
            )
        except ClientError as exc:
            reasons = cancellation_reasons(exc)
            if condition_failed(reasons, 0):
                existing = item_as_it_was(reasons[0].get("Item"))
                deleting = existing is not None and existing.get("lifecycle") == Lifecycle.DELETING.value
                raise ServiceExists(name, deleting=deleting, existing=_service_or_none(existing)) from exc
            if condition_failed(reasons, 1):
                # A version item under a fresh random uid already exists: astronomically unlikely,
                # and nothing was written; the client can simply retry.
                raise UidCollision(name) from exc
            raise
        return ServiceState(service=service, versions={1: version})

    def add_version(
        self,
        state: ServiceState,
        spec: ServiceSpec,
        mode: UpdateMode,
        now: str,
        *,
        expected_generation: int | None,
        secrets_ref: str | None = None,
    ) -> ServiceState:
        """Version n+1 and the service's move to it, in ONE transaction conditioned on what we read."""
        current = state.service
        new_version = current.latest_version + 1
        version = VersionRecord(
            name=current.name,
            uid=current.uid,
            version=new_version,
            spec=spec,
            mode=mode,
            created_at=now,
            secrets_ref=secrets_ref,
        )
        pruned = prunable_versions(state, new_version)
        condition = "uid = :uid AND lifecycle = :active AND latest_version = :latest"
        values = expression_values(
            uid=current.uid,
            active=Lifecycle.ACTIVE.value,
            latest=current.latest_version,
            one=1,
            new=new_version,
            now=now,
        )
        if expected_generation is not None:
            condition += " AND generation = :expected"
            values.update(expression_values(expected=expected_generation))
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
                        "TableName": self.table.name,
                        "Item": to_raw(version_item(version)),
                        "ConditionExpression": "attribute_not_exists(PK)",
                    }
                },
                also=[
                    event_update(
                        self.table.name,
                        current.name,
                        current.uid,
                        service_events.updated(new_version, mode),
                        now,
                        self._sequence.next(),
                    ),
                    *(self._delete_version(current, n) for n in pruned),
                ],
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

    def set_target(
        self, state: ServiceState, version: int, now: str, *, expected_generation: int | None
    ) -> ServiceState:
        """Roll the target back (or forward) to an existing version: ONE transaction that checks it exists."""
        current = state.service
        condition = "uid = :uid AND lifecycle = :active AND generation = :generation"
        values = expression_values(
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
                        "TableName": self.table.name,
                        "Key": to_raw(keys.version_key(current.name, current.uid, version)),
                        "ConditionExpression": "attribute_exists(PK)",
                    }
                },
                also=[
                    event_update(
                        self.table.name,
                        current.name,
                        current.uid,
                        service_events.rolled_back(version, current.target_version),
                        now,
                        self._sequence.next(),
                    )
                ],
            )
        except _MissingChild as exc:
            raise VersionMissing(current.name, version, current.latest_version) from exc
        service = replace(current, target_version=version, generation=current.generation + 1, updated_at=now)
        return replace(state, service=service)

    def request_termination(self, service: ServiceRecord, record: ReplicaRecord, now: str, *, by: str) -> ReplicaRecord:
        """Ask the reconciler to terminate one replica (it replaces it as any other): the replica item's
        `terminate_requested_at`, its revision moved, with a `TerminationRequested` event, in ONE
        transaction conditioned on the revision read (a reconciler write in between is Raced: read
        again) and on the incarnation being ACTIVE."""
        written = replace(record, terminate_requested_at=now, rev=record.rev + 1)
        update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self.table.name,
                "Key": to_raw(keys.replica_key(record.name, record.uid, record.replica_id)),
                "UpdateExpression": "SET terminate_requested_at = :now, rev = :next",
                "ConditionExpression": "rev = :rev",
                "ExpressionAttributeValues": expression_values(now=now, next=record.rev + 1, rev=record.rev),
            }
        }
        active: TransactWriteItemTypeDef = {
            "ConditionCheck": {
                "TableName": self.table.name,
                "Key": to_raw(keys.service_key(service.name)),
                "ConditionExpression": "uid = :uid AND lifecycle = :active",
                "ExpressionAttributeValues": expression_values(uid=service.uid, active=Lifecycle.ACTIVE.value),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        event = service_events.termination_requested(record.replica_id, by)
        try:
            self.table.client.transact_write_items(
                TransactItems=[
                    update,
                    active,
                    event_update(self.table.name, service.name, service.uid, event, now, self._sequence.next()),
                ]
            )
        except ClientError as exc:
            reasons = cancellation_reasons(exc)
            if condition_failed(reasons, 1):
                raise _why_the_service_refused(
                    service.name,
                    item_as_it_was(reasons[1].get("Item")),
                    expected_uid=service.uid,
                    expected_generation=None,
                ) from exc
            if condition_failed(reasons, 0):
                raise Raced(service.name) from exc
            raise
        return written

    def mark_deleting(self, state: ServiceState, now: str, *, status_message: str) -> ServiceState:
        """Lifecycle DELETING, generation+1. Deleting a service that is already going changes nothing."""
        current = state.service
        if current.lifecycle is Lifecycle.DELETING:
            return state
        update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self.table.name,
                "Key": to_raw(keys.service_key(current.name)),
                "UpdateExpression": (
                    "SET lifecycle = :deleting, generation = generation + :one, #status = :shutting, "
                    "status_message = :message, updated_at = :now"
                ),
                "ConditionExpression": "uid = :uid AND lifecycle = :active",
                "ExpressionAttributeNames": {"#status": "status"},
                "ExpressionAttributeValues": expression_values(
                    deleting=Lifecycle.DELETING.value,
                    active=Lifecycle.ACTIVE.value,
                    one=1,
                    shutting=ServiceStatus.SHUTTING_DOWN.value,
                    message=status_message,
                    now=now,
                    uid=current.uid,
                ),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        try:
            # ONE transaction: the service item and its `Deleting` event.
            self.table.client.transact_write_items(
                TransactItems=[
                    update,
                    event_update(
                        self.table.name,
                        current.name,
                        current.uid,
                        service_events.deleting(),
                        now,
                        self._sequence.next(),
                    ),
                ]
            )
        except ClientError as exc:
            reasons = cancellation_reasons(exc)
            if not condition_failed(reasons, 0):
                raise
            existing = item_as_it_was(reasons[0].get("Item"))
            if existing is None:
                raise ServiceMissing(current.name) from exc
            if existing.get("uid") != current.uid:
                raise Recreated(current.name) from exc
            return replace(state, service=service_from_item(existing))  # already DELETING: harmless
        service = replace(
            current,
            lifecycle=Lifecycle.DELETING,
            generation=current.generation + 1,
            status=ServiceStatus.SHUTTING_DOWN,
            status_message=status_message,
            updated_at=now,
        )
        return replace(state, service=service)

    def set_access(
        self, service: ServiceRecord, access: tuple[AccessGrant, ...], now: str, *, event: Event
    ) -> ServiceRecord:
        """The service's grants replaced, with `event` reporting it: ONE transaction, conditioned on
        the incarnation, its being ACTIVE and the grants' revision that was read (a concurrent change
        of them is Raced). The generation is not moved: grants are not the spec the reconciler acts on.
        """
        rev = service.access_rev
        condition = "uid = :uid AND lifecycle = :active AND " + (
            "access_rev = :rev" if rev else "(attribute_not_exists(access_rev) OR access_rev = :rev)"
        )
        update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self.table.name,
                "Key": to_raw(keys.service_key(service.name)),
                "UpdateExpression": "SET #access = :access, access_rev = :next",
                "ConditionExpression": condition,
                "ExpressionAttributeNames": {"#access": "access"},
                "ExpressionAttributeValues": expression_values(
                    access=access_item(access), next=rev + 1, rev=rev, uid=service.uid, active=Lifecycle.ACTIVE.value
                ),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        try:
            self.table.client.transact_write_items(
                TransactItems=[
                    update,
                    event_update(self.table.name, service.name, service.uid, event, now, self._sequence.next()),
                ]
            )
        except ClientError as exc:
            reasons = cancellation_reasons(exc)
            if condition_failed(reasons, 0):
                raise _why_the_service_refused(
                    service.name,
                    item_as_it_was(reasons[0].get("Item")),
                    expected_uid=service.uid,
                    expected_generation=None,
                ) from exc
            raise
        return replace(service, access=access, access_rev=rev + 1)

    # -- one transaction on the service item --

    def _delete_version(self, service: ServiceRecord, version: int) -> TransactWriteItemTypeDef:
        key = keys.version_key(service.name, service.uid, version)
        return {"Delete": {"TableName": self.table.name, "Key": to_raw(key)}}

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
                "TableName": self.table.name,
                "Key": to_raw(keys.service_key(current.name)),
                "UpdateExpression": update_expression,
                "ConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        try:
            self.table.client.transact_write_items(TransactItems=[update, other, *also])
        except ClientError as exc:
            reasons = cancellation_reasons(exc)
            if condition_failed(reasons, 0):
                raise _why_the_service_refused(
                    current.name,
                    item_as_it_was(reasons[0].get("Item")),
                    expected_uid=current.uid,
                    expected_generation=expected_generation,
                ) from exc
            if condition_failed(reasons, 1):
                raise _MissingChild from exc
            raise


def prunable_versions(state: ServiceState, new_version: int) -> list[int]:
    """Versions that fall out of the history window when `new_version` is added, as many as fit in
    the update's transaction; the rest go with the next updates."""
    in_use = {state.service.target_version} | {r.version for r in state.replicas.values()}
    oldest_kept = new_version - VERSION_HISTORY_LIMIT + 1
    return sorted(n for n in state.versions if n < oldest_kept and n not in in_use)[:_PRUNES_PER_UPDATE]


def _why_the_service_refused(
    name: str, current: Item | None, *, expected_uid: str, expected_generation: int | None
) -> StoreError:
    """The fact behind a failed condition on the service item, from the item as it was."""
    if current is None:
        return ServiceMissing(name)
    if current.get("uid") != expected_uid:
        return Recreated(name)
    if current.get("lifecycle") == Lifecycle.DELETING.value:
        return Deleting(name)
    if expected_generation is not None and int(current["generation"]) != expected_generation:
        return GenerationMismatch(name, current=int(current["generation"]), expected=expected_generation)
    # Same uid, ACTIVE, generation as asked: someone else moved latest_version; the caller may retry.
    return Raced(name)


def _service_or_none(item: Item | None) -> ServiceRecord | None:
    try:
        return service_from_item(item) if item is not None else None
    except (KeyError, ValueError, TypeError):
        return None  # an item of another schema: the caller is told the name is taken, no more


class _MissingChild(Exception):
    """A transaction's ConditionCheck on a child item failed: the item does not exist."""
