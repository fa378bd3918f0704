"""The wake target's one write (fleetkeeper/store/wake.py) and its recorder (fleetkeeper/wake/target.py),
on the strict layer's DynamoDB: one write and one kick per service per WAKE_COALESCE_SECONDS, however
many processes answer; nothing written, and no item made, for a service that is gone or going; the
api's writes leave the demand alone; the reconciler reads it with the service.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from fleetkeeper.api.services import ServiceCommands
from fleetkeeper.model import to_iso
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.commands import CommandStore
from fleetkeeper.store.table import Table
from fleetkeeper.store.wake import record_demand
from fleetkeeper.wake import demand as wake
from fleetkeeper.wake.target import DemandRecorder
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def commands(table: str) -> tuple[CommandStore, ServiceCommands]:
    store = CommandStore(Table(table))
    return store, ServiceCommands(store, now=lambda: to_iso(T0))


def test_demand_is_written_once_per_window_whatever_the_number_of_writers(strict_aws: StrictAws, table: str) -> None:
    store, api = commands(table)
    api.create("svc", ServiceSpec.model_validate(hello_spec()))
    kicks: list[str] = []
    clock = [T0]
    # Two Lambda instances (each with its own memo) answering the same burst.
    first = DemandRecorder(Table(table), kicks.append, now=lambda: clock[0], monotonic=lambda: clock[0].timestamp())
    second = DemandRecorder(Table(table), kicks.append, now=lambda: clock[0], monotonic=lambda: clock[0].timestamp())
    assert first("svc") is True
    assert second("svc") is False  # the table's condition: coalesced with the first
    assert first("svc") is False  # the memo: not even a request to the table
    assert kicks == ["svc"]
    state = store.load("svc")
    assert state is not None and state.service.wake_at == to_iso(T0)

    # A window later: written again (the demand stays current while clients keep asking).
    clock[0] = T0 + timedelta(seconds=wake.WAKE_COALESCE_SECONDS + 1)
    assert second("svc") is True
    assert kicks == ["svc", "svc"]
    state = store.load("svc")
    assert state is not None and state.service.wake_at == to_iso(clock[0])


def test_no_demand_is_written_for_a_service_that_is_gone_or_going(strict_aws: StrictAws, table: str) -> None:
    store, api = commands(table)
    assert record_demand(Table(table), "nobody", T0) is False
    assert store.load("nobody") is None  # no item made
    api.create("svc", ServiceSpec.model_validate(hello_spec()))
    api.delete("svc")
    assert record_demand(Table(table), "svc", T0) is False
    state = store.load("svc")
    assert state is not None and state.service.wake_at is None


def test_the_apis_writes_leave_the_demand_alone(strict_aws: StrictAws, table: str) -> None:
    store, api = commands(table)
    api.create("svc", ServiceSpec.model_validate(hello_spec()))
    assert record_demand(Table(table), "svc", T0) is True
    api.update("svc", ServiceSpec.model_validate(hello_spec(envs={"X": "1"})), mode=None, expected_generation=None)
    state = store.load("svc")
    assert state is not None and state.service.wake_at == to_iso(T0) and state.service.generation == 2
