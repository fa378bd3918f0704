"""The reconciler's store: the reads a run needs and its conditional writes.

Each write is conditioned on what the run observed, so a run acting on stale observations (another
run got there first, the user changed the service) writes nothing and raises Superseded; the next
run re-observes. It has none of the api's writes: a reconcile run never creates, updates or marks
a service deleting.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from fleetkeeper.model import Lifecycle, Market, ReplicaRecord, VersionState
from fleetkeeper.store import keys
from fleetkeeper.store.codec import (
    autoscaler_item,
    endpoint_item,
    expression_values,
    from_raw,
    replica_item,
    to_raw,
)
from fleetkeeper.store.errors import Superseded
from fleetkeeper.store.events import EventSequence, event_updates
from fleetkeeper.store.reads import ServiceReads
from fleetkeeper.store.table import TRANSACT_ITEM_LIMIT, cancellation_reasons, error_code

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from mypy_boto3_dynamodb.type_defs import DeleteTypeDef, PutTypeDef, TransactWriteItemTypeDef, UpdateTypeDef

    from fleetkeeper.model import AutoscalerState, EndpointRecord, ServiceRecord, ServiceState, ServiceStatus
    from fleetkeeper.service_events import Event
    from fleetkeeper.store.table import Table


@dataclass(frozen=True)
class Listed:
    """A service as the index lists it: its name, and its uid when the item has a readable one."""

    name: str
    uid: str | None
    # Its owner ("" for an item written before ownership existed): whose replica identity it keeps.
    owner: str = ""


# A claim's transaction: the service's replica_seq update, its event, and as many replica puts as fit.
_CLAIMS_PER_TRANSACTION = TRANSACT_ITEM_LIMIT - 2


class ReconcilerStore:
    """Services as a reconcile run reads them, and the run's writes. One instance per table."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._reads = ServiceReads(table)
        self._sequence = EventSequence()  # orders the events this store writes at one `now`

    # -- reads --

    def load(self, name: str) -> ServiceState | None:
        return self._reads.load(name)

    def iter_services(self) -> Iterator[ServiceRecord]:
        return self._reads.iter_services()

    def list_services(self) -> Iterator[Listed]:
        """Every service the index lists, by name (and uid), without decoding the rest of its item:
        a service item of another schema must not hide every other service from the run."""
        for page in self.table.query_pages(
            IndexName=keys.SERVICES_INDEX,
            KeyConditionExpression=f"{keys.LIST_PK_ATTR} = :lpk",
            ExpressionAttributeValues=expression_values(lpk=keys.LIST_PK_VALUE),
            # Only what is read here: the rest of each item would be parsed for nothing (the read
            # units are the same either way: DynamoDB counts the items it reads, not what it returns).
            ProjectionExpression="#name, #uid, #owner",
            ExpressionAttributeNames={"#name": keys.LIST_SK_ATTR, "#uid": "uid", "#owner": "owner"},
        ):
            for raw in page["Items"]:
                item = from_raw(raw)
                name = item.get(keys.LIST_SK_ATTR)
                uid, owner = item.get("uid"), item.get("owner")
                if isinstance(name, str):
                    yield Listed(
                        name, uid if isinstance(uid, str) and uid else None, owner if isinstance(owner, str) else ""
                    )

    # -- writes --

    def claim_replicas(
        self,
        service: ServiceRecord,
        version: int,
        replica_ids: Sequence[int],
        now: str,
        events: Callable[[Sequence[int]], Sequence[Event]] = lambda _ids: (),
        market_of: Callable[[int], Market] = lambda _id: Market.ON_DEMAND,
    ) -> list[ReplicaRecord]:
        """Claim new replica ids: bump replica_seq n -> n+k and put k PENDING items, in ONE transaction.

        Conditioned on (uid, ACTIVE, replica_seq = n): of two runs claiming at once, one wins; the
        other's transaction is cancelled (Superseded) and it launches nothing. `events(ids)`: the
        events of each transaction's claims, written in it; `market_of(id)`: how each is bought.
        """
        claimed: list[ReplicaRecord] = []
        seen = service.replica_seq
        ids = list(replica_ids)
        if ids != list(range(seen, seen + len(ids))):
            raise ValueError(f"replica ids must continue replica_seq {seen}: {ids}")
        for start in range(0, len(ids), _CLAIMS_PER_TRANSACTION):
            chunk = ids[start : start + _CLAIMS_PER_TRANSACTION]
            records = [
                ReplicaRecord.pending(service, replica_id, version, now, market_of(replica_id)) for replica_id in chunk
            ]
            items: list[TransactWriteItemTypeDef] = [
                {
                    "Update": {
                        "TableName": self.table.name,
                        "Key": to_raw(keys.service_key(service.name)),
                        "UpdateExpression": "SET replica_seq = :next",
                        "ConditionExpression": "uid = :uid AND lifecycle = :active AND replica_seq = :seen",
                        "ExpressionAttributeValues": expression_values(
                            next=seen + len(chunk), uid=service.uid, active=Lifecycle.ACTIVE.value, seen=seen
                        ),
                    }
                }
            ]
            items.extend(
                {
                    "Put": {
                        "TableName": self.table.name,
                        "Item": to_raw(replica_item(record)),
                        "ConditionExpression": "attribute_not_exists(PK)",
                    }
                }
                for record in records
            )
            items.extend(self._events(service, events(chunk), now))
            self._transact_or_superseded(items, f"the replica claims of {service.name}")
            claimed.extend(records)
            seen += len(chunk)
        return claimed

    def put_replica(
        self, before: ReplicaRecord, after: ReplicaRecord, events: Sequence[Event] = (), now: str = ""
    ) -> ReplicaRecord:
        """Replace a replica item if it is still at `before.rev`; returns the record as written.

        With `events`, ONE TransactWriteItems: the put and the events it reports (at `now`);
        without, one PutItem."""
        written = replace(after, rev=before.rev + 1)
        put: PutTypeDef = {
            "TableName": self.table.name,
            "Item": to_raw(replica_item(written)),
            "ConditionExpression": "rev = :rev",
            "ExpressionAttributeValues": expression_values(rev=before.rev),
        }
        self._write({"Put": put}, self._events_of(before, events, now), f"replica {before.replica_id} of {before.name}")
        return written

    def delete_replica(self, record: ReplicaRecord, events: Sequence[Event] = (), now: str = "") -> None:
        delete: DeleteTypeDef = {
            "TableName": self.table.name,
            "Key": to_raw(keys.replica_key(record.name, record.uid, record.replica_id)),
            "ConditionExpression": "rev = :rev",
            "ExpressionAttributeValues": expression_values(rev=record.rev),
        }
        self._write(
            {"Delete": delete}, self._events_of(record, events, now), f"replica {record.replica_id} of {record.name}"
        )

    def mark_version(
        self,
        service: ServiceRecord,
        version: int,
        expected: VersionState,
        state: VersionState,
        message: str,
        events: Sequence[Event] = (),
        now: str = "",
    ) -> None:
        self._transact_or_superseded(
            [
                self._version_state_update(service, version, expected, state, message),
                *self._events(service, events, now),
            ],
            f"version {version} of {service.name}",
        )

    def trip_breaker(
        self,
        service: ServiceRecord,
        version: int,
        message: str,
        rollback_to: int | None,
        *,
        status_message: str,
        events: Sequence[Event] = (),
        now: str = "",
    ) -> None:
        """Version FAILED and (when there is a good version) the target rolled back, in ONE transaction.

        `message` is the version's state message; `status_message` the service's, written with the
        rollback (unused without one).
        """
        items = [self._version_state_update(service, version, VersionState.NEW, VersionState.FAILED, message)]
        if rollback_to is not None:
            items.append(
                {
                    "Update": {
                        "TableName": self.table.name,
                        "Key": to_raw(keys.service_key(service.name)),
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
                        "ExpressionAttributeValues": expression_values(
                            good=rollback_to,
                            why=status_message,
                            one=1,
                            uid=service.uid,
                            active=Lifecycle.ACTIVE.value,
                            failed=version,
                            generation=service.generation,
                        ),
                    }
                }
            )
        items.extend(self._events(service, events, now))
        self._transact_or_superseded(items, f"version {version} of {service.name}")

    def record_status(
        self,
        service: ServiceRecord,
        status: ServiceStatus,
        message: str,
        observed_generation: int,
        events: Sequence[Event] = (),
        now: str = "",
    ) -> None:
        """Status of the generation the run acted on; skipped (Superseded) if the service moved since.

        With `events` (the status moved to another value), ONE TransactWriteItems with them."""
        update: UpdateTypeDef = {
            "TableName": self.table.name,
            "Key": to_raw(keys.service_key(service.name)),
            "UpdateExpression": "SET #status = :status, status_message = :message, observed_generation = :observed",
            "ConditionExpression": "uid = :uid AND generation = :generation",
            "ExpressionAttributeNames": {"#status": "status"},
            "ExpressionAttributeValues": expression_values(
                status=status.value,
                message=message,
                observed=observed_generation,
                uid=service.uid,
                generation=service.generation,
            ),
        }
        self._write({"Update": update}, self._events(service, events, now), f"service {service.name}")

    def record_endpoint(self, service: ServiceRecord, endpoint: EndpointRecord) -> None:
        """The service's endpoint, as the balancer just made it. Conditioned on the incarnation being
        ACTIVE: a deleted (or re-created) service's item must not get an endpoint back. The api's
        writes never touch the attribute, so it outlives updates."""
        with _superseded_unless_condition_holds(f"service {service.name} changed"):
            self.table.client.update_item(
                TableName=self.table.name,
                Key=to_raw(keys.service_key(service.name)),
                UpdateExpression="SET #endpoint = :endpoint",
                ConditionExpression="uid = :uid AND lifecycle = :active",
                ExpressionAttributeNames={"#endpoint": "endpoint"},
                ExpressionAttributeValues=expression_values(
                    endpoint=endpoint_item(endpoint), uid=service.uid, active=Lifecycle.ACTIVE.value
                ),
            )

    def record_autoscaler(
        self,
        service: ServiceRecord,
        before: AutoscalerState | None,
        after: AutoscalerState | None,
        events: Sequence[Event] = (),
        now: str = "",
    ) -> AutoscalerState | None:
        """The service's autoscaler state, if it is still `before` (its revision; absent for None), on
        this ACTIVE incarnation; returns what was written (`rev` one up), None when removed. Of two
        runs deciding at once only the first write lands; the other raises Superseded. The api's
        writes never touch the attribute, so the autoscaled target outlives updates.

        With `events` (the target moved), ONE TransactWriteItems with them."""
        if before is None:
            condition = "uid = :uid AND lifecycle = :active AND attribute_not_exists(autoscaler)"
            values = expression_values(uid=service.uid, active=Lifecycle.ACTIVE.value)
        else:
            condition = "uid = :uid AND lifecycle = :active AND autoscaler.rev = :rev"
            values = expression_values(uid=service.uid, active=Lifecycle.ACTIVE.value, rev=before.rev)
        written = replace(after, rev=(before.rev if before is not None else 0) + 1) if after is not None else None
        if written is None:
            update = "REMOVE autoscaler"
        else:
            update = "SET autoscaler = :autoscaler"
            values.update(expression_values(autoscaler=autoscaler_item(written)))
        request: UpdateTypeDef = {
            "TableName": self.table.name,
            "Key": to_raw(keys.service_key(service.name)),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values,
        }
        self._write(
            {"Update": request}, self._events(service, events, now), f"the autoscaler of service {service.name}"
        )
        return written

    def record_followup(self, service: ServiceRecord, seen: int | None, due: int) -> None:
        """The service's pending follow-up is now the one due at `due` (epoch seconds), if the item
        still holds `seen` (the one this run read; None: none ever). Of two runs asking for a
        follow-up at once only one write lands (the other raises Superseded and sends nothing), so
        a service has one live follow-up. The api's writes never touch the attribute."""
        if seen is None:
            condition = "uid = :uid AND attribute_not_exists(followup_at)"
            values = expression_values(uid=service.uid, due=due)
        else:
            condition = "uid = :uid AND followup_at = :seen"
            values = expression_values(uid=service.uid, due=due, seen=seen)
        with _superseded_unless_condition_holds(f"the follow-up of service {service.name} changed"):
            self.table.client.update_item(
                TableName=self.table.name,
                Key=to_raw(keys.service_key(service.name)),
                UpdateExpression="SET followup_at = :due",
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )

    def delete_service(self, service: ServiceRecord) -> None:
        """The last step of a delete: the DELETING item of this incarnation goes (cleanup takes the
        rest, its events included: a `Deleted` event would go with them, so none is written)."""
        with _superseded_unless_condition_holds(f"service {service.name} changed"):
            self.table.client.delete_item(
                TableName=self.table.name,
                Key=to_raw(keys.service_key(service.name)),
                ConditionExpression="lifecycle = :deleting AND uid = :uid",
                ExpressionAttributeValues=expression_values(deleting=Lifecycle.DELETING.value, uid=service.uid),
            )

    def _events(self, service: ServiceRecord, events: Sequence[Event], now: str) -> list[TransactWriteItemTypeDef]:
        return event_updates(self.table.name, service.name, service.uid, events, now, self._sequence)

    def _events_of(self, record: ReplicaRecord, events: Sequence[Event], now: str) -> list[TransactWriteItemTypeDef]:
        return event_updates(self.table.name, record.name, record.uid, events, now or record.updated_at, self._sequence)

    def _version_state_update(
        self, service: ServiceRecord, version: int, expected: VersionState, state: VersionState, message: str
    ) -> TransactWriteItemTypeDef:
        return {
            "Update": {
                "TableName": self.table.name,
                "Key": to_raw(keys.version_key(service.name, service.uid, version)),
                "UpdateExpression": "SET #state = :state, state_message = :message",
                "ConditionExpression": "attribute_exists(PK) AND #state = :expected",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": expression_values(
                    state=state.value, message=message, expected=expected.value
                ),
            }
        }

    def _write(self, write: TransactWriteItemTypeDef, events: list[TransactWriteItemTypeDef], what: str) -> None:
        """One conditioned write of `what`: alone (PutItem, UpdateItem or DeleteItem), or with the
        events it reports in ONE TransactWriteItems, so an event exists exactly when its change
        does. Superseded when its condition fails (another writer got there first)."""
        if events:
            self._transact_or_superseded([write, *events], what)
            return
        client = self.table.client
        with _superseded_unless_condition_holds(f"{what} changed"):
            if "Put" in write:
                client.put_item(**write["Put"])
            elif "Update" in write:
                client.update_item(**write["Update"])
            elif "Delete" in write:
                client.delete_item(**write["Delete"])
            else:
                raise ValueError(f"not a single write: {sorted(write)}")

    def _transact_or_superseded(self, items: list[TransactWriteItemTypeDef], what: str) -> None:
        try:
            self.table.client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if any(reason.get("Code") == "ConditionalCheckFailed" for reason in cancellation_reasons(exc)):
                raise Superseded(f"{what} changed: lost to a concurrent writer") from exc
            raise


@contextlib.contextmanager
def _superseded_unless_condition_holds(what: str) -> Iterator[None]:
    """A reconciler write whose condition failed lost to another writer: Superseded, not an error."""
    try:
        yield
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            raise Superseded(what) from exc
        raise
