"""The reconciler's conditional writes: a run acting on stale observations writes nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetkeeper.model import FailureCause, ReplicaRecord, ReplicaStatus, ServiceState, ServiceStatus, VersionState
from fleetkeeper.service_events import claimed
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.codec import from_raw, replica_from_item, replica_item, to_raw
from fleetkeeper.store.commands import CommandStore
from fleetkeeper.store.errors import Superseded
from fleetkeeper.store.runs import ReconcilerStore
from fleetkeeper.store.table import TRANSACT_ITEM_LIMIT, Table
from tests.support.specs import hello_spec

NOW = "2026-01-01T00:00:00.000Z"


@pytest.fixture
def store(table: str) -> ReconcilerStore:
    return ReconcilerStore(Table(table))


@pytest.fixture
def api_store(table: str) -> CommandStore:
    """The api's writes, which move the service under the reconciler."""
    return CommandStore(Table(table))


def _create(api_store: CommandStore, name: str = "svc") -> None:
    spec = ServiceSpec.model_validate(hello_spec())
    api_store.create_service(name, spec, "rolling", NOW, status_message="created")


def _state(store: ReconcilerStore, name: str = "svc") -> ServiceState:
    state = store.load(name)
    assert state is not None
    return state


def test_the_reconciler_store_has_no_api_writes(store: ReconcilerStore) -> None:
    for write in ("create_service", "add_version", "set_target", "mark_deleting"):
        assert not hasattr(store, write)


def test_claim_bumps_the_sequence_and_puts_pending_items_in_one_transaction(
    store: ReconcilerStore, api_store: CommandStore
) -> None:
    _create(api_store)
    seen = _state(store).service
    claimed = store.claim_replicas(seen, 1, [0, 1], NOW)
    state = _state(store)
    assert state.service.replica_seq == 2
    assert sorted(state.replicas) == [0, 1] and {r.status for r in claimed} == {ReplicaStatus.PENDING}
    # A second run that read the service before the first claim loses, and writes nothing.
    with pytest.raises(Superseded):
        store.claim_replicas(seen, 1, [0, 1], NOW)
    assert sorted(_state(store).replicas) == [0, 1]


def test_claims_past_one_transaction_are_chunked(store: ReconcilerStore, api_store: CommandStore) -> None:
    _create(api_store)
    sizes: list[int] = []
    store.table.client.meta.events.register(
        "provide-client-params.dynamodb.TransactWriteItems",
        lambda params, **_: sizes.append(len(params["TransactItems"])),
    )
    store.claim_replicas(_state(store).service, 1, list(range(120)), NOW, lambda ids: [claimed(1, list(ids))])
    state = _state(store)
    assert state.service.replica_seq == 120 and len(state.replicas) == 120
    # Each transaction: the service update, the puts, and the event of its claims.
    assert sizes == [TRANSACT_ITEM_LIMIT, 1 + 120 - (TRANSACT_ITEM_LIMIT - 2) + 1]


def test_a_stale_replica_write_is_refused(store: ReconcilerStore, api_store: CommandStore) -> None:
    _create(api_store)
    [record] = store.claim_replicas(_state(store).service, 1, [0], NOW)
    newer = store.put_replica(record, replace(record, status=ReplicaStatus.PROVISIONING, instance_id="i-1"))
    assert newer.rev == 1
    with pytest.raises(Superseded):  # another run, still holding rev 0
        store.put_replica(record, replace(record, status=ReplicaStatus.FAILED_PROVISION))
    with pytest.raises(Superseded):
        store.delete_replica(record)
    assert _state(store).replicas[0].status is ReplicaStatus.PROVISIONING


def test_a_status_for_an_older_generation_is_never_recorded(store: ReconcilerStore, api_store: CommandStore) -> None:
    _create(api_store)
    seen = _state(store).service
    api_store.mark_deleting(_state(store), NOW, status_message="deleting")  # generation moves on
    with pytest.raises(Superseded):
        store.record_status(seen, ServiceStatus.READY, "2/2 ready", seen.generation)
    assert _state(store).service.status is ServiceStatus.SHUTTING_DOWN


def test_breaker_fails_the_version_and_rolls_back_in_one_transaction(
    store: ReconcilerStore, api_store: CommandStore
) -> None:
    _create(api_store)
    state = _state(store)
    store.mark_version(state.service, 1, VersionState.NEW, VersionState.READY, "")
    assert state.target is not None
    state = api_store.add_version(state, state.target.spec, "rolling", NOW, expected_generation=None)
    why = "rolling back to version 1: version 2 failed: 3 replica failures"
    store.trip_breaker(state.service, 2, "version 2 failed: 3 replica failures", 1, status_message=why)
    after = _state(store)
    assert after.service.target_version == 1 and after.service.generation == state.service.generation + 1
    assert after.versions[2].state is VersionState.FAILED
    # Says why in the same write, so a client watching the update sees it at once.
    assert after.versions[2].state_message == "version 2 failed: 3 replica failures"
    assert after.service.status_message == why
    with pytest.raises(Superseded):  # a second run tripping the same breaker changes nothing
        store.trip_breaker(state.service, 2, "again", 1, status_message="rolling back again")


def test_only_a_deleting_service_of_the_same_incarnation_is_deleted(
    store: ReconcilerStore, api_store: CommandStore
) -> None:
    _create(api_store)
    active = _state(store).service
    with pytest.raises(Superseded):
        store.delete_service(active)
    api_store.mark_deleting(_state(store), NOW, status_message="deleting")
    store.delete_service(active)
    assert store.load("svc") is None


def test_a_replicas_failure_facts_are_stored_and_read_back(store: ReconcilerStore, api_store: CommandStore) -> None:
    _create(api_store)
    [record] = store.claim_replicas(_state(store).service, 1, [0], NOW)
    failed = replace(
        record,
        status=ReplicaStatus.PREEMPTED,
        status_message="instance i-1 is terminated: spot instance reclaimed by AWS",
        failure_code="Server.SpotInstanceTermination",
        cause=FailureCause.SPOT_RECLAIM,
    )
    written = store.put_replica(record, failed)
    assert _state(store).replicas[0] == written
    table = store.table
    raw = from_raw(table.client.get_item(TableName=table.name, Key=to_raw(_replica_key(record)))["Item"])
    assert (raw["failure_code"], raw["cause"]) == ("Server.SpotInstanceTermination", "SPOT_RECLAIM")


def test_a_healthy_replica_item_holds_no_failure_attributes(store: ReconcilerStore, api_store: CommandStore) -> None:
    """Absent, not null: a steady state's items (and what reading them costs) are as before."""
    _create(api_store)
    [record] = store.claim_replicas(_state(store).service, 1, [0], NOW)
    assert "failure_code" not in to_raw(replica_item(record)) and "cause" not in to_raw(replica_item(record))


@pytest.mark.parametrize(
    ("status", "cause"),
    [
        (ReplicaStatus.READY, None),
        (ReplicaStatus.SHUTTING_DOWN, None),
        (ReplicaStatus.FAILED_PROBING, FailureCause.VERSION),
        (ReplicaStatus.FAILED_INITIAL_DELAY, FailureCause.VERSION),
        (ReplicaStatus.FAILED_PROVISION, FailureCause.UNRECORDED),
        (ReplicaStatus.PREEMPTED, FailureCause.UNRECORDED),
    ],
)
def test_an_item_stored_before_failure_facts_reads_with_the_cause_its_status_implies(
    status: ReplicaStatus, cause: FailureCause | None
) -> None:
    record = ReplicaRecord(name="svc", uid="u", replica_id=0, version=1, status=status, created_at=NOW, updated_at=NOW)
    old_item = {k: v for k, v in replica_item(record).items() if k not in ("failure_code", "cause")}
    assert replica_from_item(old_item) == replace(record, cause=cause)


def _replica_key(record: ReplicaRecord) -> dict[str, str]:
    item = replica_item(record)
    return {"PK": item["PK"], "SK": item["SK"]}
