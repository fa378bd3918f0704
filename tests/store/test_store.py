"""The store's invariants: atomic create/update, conditions told apart, incarnations kept apart."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws
from fleetkeeper.model import ServiceState, to_iso, utcnow
from fleetkeeper.spec.service import ServiceSpec, parse_spec
from fleetkeeper.store import keys
from fleetkeeper.store.codec import from_raw, to_raw
from fleetkeeper.store.commands import VERSION_HISTORY_LIMIT, CommandStore
from fleetkeeper.store.errors import (
    GenerationMismatch,
    MalformedPageToken,
    ServiceExists,
    ServiceMissing,
    UidCollision,
    VersionMissing,
)
from fleetkeeper.store.table import Table
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetkeeper.api.services import ServiceCommands


def all_items(table: str) -> list[dict[str, Any]]:
    pages = aws.dynamodb().get_paginator("scan").paginate(TableName=table)
    return [from_raw(raw) for page in pages for raw in page["Items"]]


def store_of(table: str) -> CommandStore:
    return CommandStore(Table(table))


def create(db: CommandStore, name: str, spec: ServiceSpec, now: str = "2026-01-01T00:00:00.000Z") -> ServiceState:
    return db.create_service(name, spec, "rolling", now, status_message="created by a test")


def count_calls(operation: str) -> Counter[str]:
    """Count the DynamoDB API calls fleetkeeper's client makes from now on."""
    calls: Counter[str] = Counter()
    aws.dynamodb().meta.events.register("before-call.dynamodb.*", lambda model, **_: calls.update([model.name]))
    return calls


def test_create_writes_service_and_version_in_one_transaction(table: str) -> None:
    calls = count_calls("*")
    state = create(store_of(table), "web", parse_spec(hello_spec()), to_iso(utcnow()))
    assert calls == Counter({"TransactWriteItems": 1})
    uid = state.service.uid
    keys = {(i["PK"], i["SK"]) for i in all_items(table) if not i["SK"].startswith("E#")}
    assert keys == {("SVC#web", "META"), ("SVC#web", f"V#{uid}#0000000001")}
    # ... and its `Created` event, in the same transaction.
    assert [i["reason"] for i in all_items(table) if i["SK"].startswith(f"E#{uid}#")] == ["Created"]


def test_create_over_an_existing_service_leaves_nothing_written(table: str) -> None:
    db = store_of(table)
    create(db, "web", parse_spec(hello_spec()))
    before = all_items(table)
    with pytest.raises(ServiceExists) as refused:
        create(db, "web", parse_spec(hello_spec(envs={"X": "1"})), "2026-01-01T00:00:01.000Z")
    assert (refused.value.name, refused.value.deleting) == ("web", False)
    assert all_items(table) == before  # no stray version 1 of a second uid


def test_create_over_a_deleting_service_says_so(table: str) -> None:
    db = store_of(table)
    create(db, "web", parse_spec(hello_spec()))
    db.mark_deleting(db.require("web"), "2026-01-01T00:00:01.000Z", status_message="going")
    with pytest.raises(ServiceExists) as refused:
        create(db, "web", parse_spec(hello_spec()), "2026-01-01T00:00:02.000Z")
    assert refused.value.deleting is True


def test_create_whose_version_item_exists_writes_no_service(table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other half of atomicity: if the version Put fails, the service Put is undone too."""
    monkeypatch.setattr(keys, "new_uid", lambda: "fixeduid")
    aws.dynamodb().put_item(TableName=table, Item=to_raw({"PK": "SVC#web", "SK": keys.version_sk("fixeduid", 1)}))
    with pytest.raises(UidCollision):
        create(store_of(table), "web", parse_spec(hello_spec()))
    assert [i["SK"] for i in all_items(table)] == [keys.version_sk("fixeduid", 1)]


def test_update_is_one_transaction_and_a_failed_condition_writes_nothing(table: str) -> None:
    db = store_of(table)
    create(db, "web", parse_spec(hello_spec()))
    state = db.require("web")
    calls = count_calls("*")
    db.add_version(state, parse_spec(hello_spec()), "rolling", "2026-01-01T00:00:01.000Z", expected_generation=1)
    assert calls == Counter({"TransactWriteItems": 1})
    before = all_items(table)
    with pytest.raises(GenerationMismatch) as refused:
        db.add_version(
            db.require("web"), parse_spec(hello_spec()), "rolling", "2026-01-01T00:00:02.000Z", expected_generation=1
        )
    assert (refused.value.name, refused.value.current, refused.value.expected) == ("web", 2, 1)
    assert all_items(table) == before


def test_update_of_a_service_deleted_underneath_is_not_found(table: str) -> None:
    db = store_of(table)
    create(db, "web", parse_spec(hello_spec()))
    state = db.require("web")
    aws.dynamodb().delete_item(TableName=table, Key=to_raw({"PK": "SVC#web", "SK": "META"}))
    with pytest.raises(ServiceMissing):
        db.add_version(state, parse_spec(hello_spec()), "rolling", "2026-01-01T00:00:01.000Z", expected_generation=None)
    assert [i["SK"] for i in all_items(table) if not i["SK"].startswith("E#")] == [
        keys.version_sk(state.service.uid, 1)
    ]


def test_a_rollback_to_a_version_that_is_gone_names_it_and_writes_nothing(table: str) -> None:
    db = store_of(table)
    create(db, "web", parse_spec(hello_spec()))
    before = all_items(table)
    with pytest.raises(VersionMissing) as refused:
        db.set_target(db.require("web"), 7, "2026-01-01T00:00:01.000Z", expected_generation=None)
    assert (refused.value.name, refused.value.version, refused.value.latest) == ("web", 7, 1)
    assert all_items(table) == before


@pytest.mark.parametrize(("token", "problem"), [("garbage!!", "malformed"), ("e30", "unknown token")])
def test_a_page_token_the_store_did_not_issue_is_refused(table: str, token: str, problem: str) -> None:
    with pytest.raises(MalformedPageToken) as refused:
        store_of(table).list_services(limit=10, next_token=token)
    assert refused.value.problem == problem


def test_get_is_one_query(table: str) -> None:
    db = store_of(table)
    create(db, "web", parse_spec(hello_spec()))
    calls = count_calls("*")
    db.load("web")
    assert calls == Counter({"Query": 1})


def test_recreated_name_shows_only_the_new_incarnation(api: HandlerClient, table: str) -> None:
    """Old version/replica items (cleanup not run yet) never leak into the new service."""
    old = api.post("/v1/services", {"name": "web", "spec": hello_spec()}).body
    for i in range(3):
        api.put("/v1/services/web", {"spec": hello_spec(envs={"OLD": str(i)})})
    aws.dynamodb().put_item(
        TableName=table,
        Item=to_raw(
            {
                "PK": "SVC#web",
                "SK": keys.replica_sk(old["uid"], 1),
                "kind": "replica",
                "name": "web",
                "uid": old["uid"],
                "replica_id": 1,
                "version": 1,
                "status": "READY",
                "created_at": "t",
                "updated_at": "t",
            }
        ),
    )
    # The reconciler removes the service item at the end of SHUTTING_DOWN; cleanup has not run yet.
    aws.dynamodb().delete_item(TableName=table, Key=to_raw({"PK": "SVC#web", "SK": "META"}))
    new = api.post("/v1/services", {"name": "web", "spec": hello_spec(envs={"NEW": "1"})})
    assert new.status == 201
    assert new.body["uid"] != old["uid"]
    view = api.get("/v1/services/web").body
    assert view["replicas"] == []
    assert view["spec"]["envs"] == {"NEW": "1"}
    versions = api.get("/v1/services/web/versions").body["versions"]
    assert [v["version"] for v in versions] == [1]
    assert versions[0]["spec"]["envs"] == {"NEW": "1"}


def test_list_never_reads_version_or_replica_items(api: HandlerClient, table: str) -> None:
    for name in ("a", "b"):
        api.post("/v1/services", {"name": name, "spec": hello_spec()})
        api.put(f"/v1/services/{name}", {"spec": hello_spec()})
    seen: list[dict[str, Any]] = []
    aws.dynamodb().meta.events.register(
        "provide-client-params.dynamodb.Query", lambda params, **_: seen.append(dict(params))
    )
    services, token = store_of(table).list_services(limit=10)
    assert [s.name for s in services] == ["a", "b"] and token is None
    assert [p.get("IndexName") for p in seen] == ["services"]


# --- concurrency ---------------------------------------------------------------------------------


def _status_of(write: Callable[[], object], success: int) -> int:
    """The HTTP status the api answers a command with: `success`, or the domain error's status."""
    from fleetkeeper.errors import FleetkeeperError

    try:
        write()
    except FleetkeeperError as exc:
        return exc.status
    return success


def _own_commands() -> ServiceCommands:
    """One invocation's commands, as one Lambda environment has them. Concurrent writers are not
    sent through the handler from threads: Powertools' resolver keeps the current request (and its
    route) on the module's `app`, which the threads of one process share (Lambda never runs two
    events in one environment at once); that made these tests fail now and then under load."""
    import os

    from fleetkeeper.api.handler import build_commands
    from fleetkeeper.owners.access import Caller
    from fleetkeeper.owners.principals import canonical_caller
    from fleetkeeper.settings import Settings
    from tests.support.handler_client import TEST_CALLER

    return build_commands(Settings.from_env(os.environ), Caller(canonical_caller(TEST_CALLER)))


def test_twenty_concurrent_creates_of_one_name_yield_one_201(api: HandlerClient, atomic_dynamodb: None) -> None:
    barrier = threading.Barrier(20)

    def attempt(_: int) -> int:
        commands, spec = _own_commands(), parse_spec(hello_spec())
        barrier.wait()
        return _status_of(lambda: commands.create("web", spec), 201)

    with ThreadPoolExecutor(20) as pool:
        statuses = Counter(pool.map(attempt, range(20)))
    assert statuses == Counter({201: 1, 409: 19})
    assert api.get("/v1/services/web/versions").body["versions"][0]["version"] == 1


def test_ten_concurrent_updates_with_the_same_if_match_yield_one_success(
    api: HandlerClient, atomic_dynamodb: None
) -> None:
    api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    barrier = threading.Barrier(10)

    def attempt(i: int) -> int:
        commands, spec = _own_commands(), parse_spec(hello_spec(envs={"WRITER": str(i)}))
        barrier.wait()
        return _status_of(lambda: commands.update("web", spec, mode=None, expected_generation=1), 200)

    with ThreadPoolExecutor(10) as pool:
        statuses = Counter(pool.map(attempt, range(10)))
    assert statuses == Counter({200: 1, 412: 9})
    view = api.get("/v1/services/web").body
    assert (view["latest_version"], view["generation"]) == (2, 2)


def test_concurrent_updates_without_if_match_all_land_as_distinct_versions(
    api: HandlerClient, atomic_dynamodb: None
) -> None:
    """Four writers at once, each with its own invocation's commands (`_own_commands`)."""
    api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    barrier = threading.Barrier(4)

    def attempt(i: int) -> bool:
        commands = _own_commands()
        spec = parse_spec(hello_spec(envs={"W": str(i)}))
        barrier.wait()
        return commands.update("web", spec, mode=None, expected_generation=None).changed

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(attempt, range(4))) == [True] * 4
    versions = api.get("/v1/services/web/versions").body["versions"]
    assert [v["version"] for v in versions] == [1, 2, 3, 4, 5]
    assert sorted(v["spec"]["envs"]["W"] for v in versions[1:]) == ["0", "1", "2", "3"]


# --- version history -----------------------------------------------------------------------------


def test_updates_keep_the_newest_versions_and_never_prune_what_is_in_use(api: HandlerClient, table: str) -> None:
    api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    # A replica still runs version 2 (say, mid-rollout): its version must survive the pruning.
    state = store_of(table).require("web")
    aws.dynamodb().put_item(
        TableName=table,
        Item=to_raw(
            {
                "PK": "SVC#web",
                "SK": keys.replica_sk(state.service.uid, 0),
                "kind": "replica",
                "name": "web",
                "uid": state.service.uid,
                "replica_id": 0,
                "version": 2,
                "status": "READY",
                "created_at": "t",
                "updated_at": "t",
            }
        ),
    )
    calls = count_calls("*")
    for i in range(VERSION_HISTORY_LIMIT + 5):
        assert api.put("/v1/services/web", {"spec": hello_spec(envs={"N": str(i)})}).status == 200
    latest = VERSION_HISTORY_LIMIT + 6
    assert calls["TransactWriteItems"] == VERSION_HISTORY_LIMIT + 5  # still one write per update
    kept = [v["version"] for v in api.all_versions("web")]
    assert kept == [2, *range(latest - VERSION_HISTORY_LIMIT + 1, latest + 1)]
    gone = api.post("/v1/services/web/rollback", {"version": 1})
    assert gone.status == 404 and f"newest {VERSION_HISTORY_LIMIT} are kept" in gone.body["error"]["message"]
    assert api.post("/v1/services/web/rollback", {"version": 2}).status == 200


def test_the_version_being_served_survives_pruning_after_a_rollback(api: HandlerClient) -> None:
    api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    for i in range(VERSION_HISTORY_LIMIT - 1):  # latest = the limit: version 1 is still kept
        api.put("/v1/services/web", {"spec": hello_spec(envs={"N": str(i)})})
    assert api.post("/v1/services/web/rollback", {"version": 1}).status == 200
    # This update pushes version 1 out of the window, but it is the target being served (and
    # rolled away from only by this very update): it stays.
    latest = api.put("/v1/services/web", {"spec": hello_spec(envs={"N": "new"})}).body["latest_version"]
    versions = [v["version"] for v in api.all_versions("web")]
    assert versions[0] == 1
    assert versions[1:] == list(range(latest - VERSION_HISTORY_LIMIT + 1, latest + 1))
