"""Service events (issue 16): they appear with the change they report, fold, expire, and page.

Through the reconciler shell on the strict-AWS layer (the `world` fixture), the api handler (every
answer checked against the OpenAPI document), and the store with a clock for TTL: DynamoDB's TTL
deletes late (moto not at all), so reads must skip what has expired.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws
from fleetkeeper.model import ReplicaRecord, ReplicaStatus, from_iso
from fleetkeeper.service_events import EVENT_TTL_SECONDS, EVENTS_KEPT, Event, EventType, replica_changed
from fleetkeeper.store.codec import from_raw
from fleetkeeper.store.commands import CommandStore
from fleetkeeper.store.events import EventReads, EventSequence, event_update
from fleetkeeper.store.table import Table
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.handler_client import HandlerClient
    from tests.support.reconciler_world import World


def _events(world: World, name: str = "svc") -> list[dict[str, Any]]:
    records, _ = world.commands.events_page(name, limit=EVENTS_KEPT, next_token=None)
    return [
        {"reason": r.event.reason, "count": r.count, "replica_id": r.event.replica_id, "type": r.event.type.value}
        for r in records
    ]


def _by_time(world: World) -> list[set[str]]:
    records, _ = world.commands.events_page("svc", limit=EVENTS_KEPT, next_token=None)
    groups: dict[str, set[str]] = {}
    for record in records:
        groups.setdefault(record.last_seen, set()).add(record.event.reason)
    return [groups[moment] for moment in sorted(groups, reverse=True)]


def _reasons(world: World) -> list[str]:
    return [e["reason"] for e in _events(world)]


def test_a_service_life_reports_its_events_newest_first_and_a_steady_run_writes_none(
    strict_aws: StrictAws, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="fleetkeeper.reconciler.apply")
    world.create(replicas=1)
    world.converge()
    # Each recorded status is one structured line: the dashboard's ready-vs-target table.
    recorded = [r for r in caplog.records if r.getMessage() == "status recorded"]
    assert [(r.fleetkeeper_service, r.status, r.ready_replicas, r.target_replicas) for r in recorded] == [  # type: ignore[attr-defined]
        ("svc", "REPLICA_INIT", 0, 1),
        ("svc", "READY", 1, 1),
    ]
    # Newest first: the service became READY last, it was created first (the events of one run
    # share its time, in no particular order).
    assert _by_time(world) == [
        {"ServiceReady", "VersionReady", "ReplicaReady"},
        {"Created", "Claimed", "Launched", "ServiceReplicaInit"},
    ]
    mark = world.log.mark()
    world.run()
    assert world.log.mutations(mark) == []  # steady: no write, hence no event
    assert len(_events(world)) == 7

    world.update(replicas=1, envs={"V": "2"})
    world.converge()
    assert _by_time(world) == [
        {"ServiceReady", "Terminated"},  # the old replica's item goes once its instance is gone
        {"ReplicaReady", "VersionReady", "Terminating"},
        {"Updated", "Claimed", "Launched", "ServiceUpdating"},
        {"ReplicaReady", "VersionReady"},
        {"Created", "Claimed", "Launched", "ServiceReplicaInit"},
    ]
    # "1/1 ready" again: the same event, folded (count 2, seen first at the first READY).
    [ready] = [e for e in _events(world) if e["reason"] == "ServiceReady"]
    assert ready["count"] == 2


def test_the_events_of_one_run_read_in_the_order_they_happened(strict_aws: StrictAws, world: World) -> None:
    """A run stamps all its writes with its one `now`: `seq` orders them (issue 36: they printed in the
    arbitrary order of their fold keys), across the run's writes and within one transaction."""
    world.create(replicas=1)
    world.converge()
    assert _reasons(world) == [  # newest first
        "ServiceReady",
        "VersionReady",
        "ReplicaReady",
        "ServiceReplicaInit",
        "Launched",
        "Claimed",
        "Created",
    ]
    world.update(replicas=1, envs={"V": "2"})
    world.converge()
    # All of it: the update's runs as the shell wrote them (the old replica's drain, then the new
    # one's READY), then the create's.
    assert _reasons(world) == [
        "ServiceReady",  # the create's ServiceReady folded into this one (the same fold key, the same day)
        "Terminated",
        "VersionReady",
        "ReplicaReady",
        "Terminating",
        "ServiceUpdating",
        "Launched",
        "Claimed",
        "Updated",
        "VersionReady",
        "ReplicaReady",
        "ServiceReplicaInit",
        "Launched",
        "Claimed",
        "Created",
    ]


def test_a_flapping_replica_folds_its_repeats(strict_aws: StrictAws, world: World) -> None:
    world.create(replicas=1)
    world.converge()
    for status in (500, 200, 500, 200):
        world.server.status = status
        world.run()
    folded = {(e["reason"], e["replica_id"]): e for e in _events(world)}
    assert folded["ReplicaNotReady", 0]["count"] == 2
    assert folded["ReplicaNotReady", 0]["type"] == "Warning"
    assert folded["ReplicaReady", 0]["count"] == 3
    records, _ = world.commands.events_page("svc", limit=EVENTS_KEPT, next_token=None)
    ready = next(r for r in records if r.event.reason == "ReplicaReady")
    assert from_iso(ready.first_seen) < from_iso(ready.last_seen)


def test_refused_launches_fold_into_one_warning_with_the_typed_code(world: World) -> None:
    from botocore.exceptions import ClientError

    def no_capacity(**_: Any) -> None:
        raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no capacity"}}, "RunInstances")

    events = aws.ec2().meta.events
    events.register("before-parameter-build.ec2.RunInstances", no_capacity)
    try:
        world.create(replicas=1)
        for _ in range(4):  # 61 s apart: past the 30 s and 60 s backoffs
            world.run()
    finally:
        events.unregister("before-parameter-build.ec2.RunInstances", no_capacity)
    records, _ = world.commands.events_page("svc", limit=EVENTS_KEPT, next_token=None)
    [refused] = [r for r in records if r.event.reason == "LaunchRefused"]
    assert refused.count >= 2
    assert refused.event.type is EventType.WARNING
    assert refused.event.code == "InsufficientInstanceCapacity"
    assert refused.event.replica_id == 0


def test_the_events_route_pages_newest_first_and_refuses_what_it_did_not_issue(api: HandlerClient) -> None:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    spec = hello_spec(envs={"X": "1"})
    assert api.put("/v1/services/web", {"spec": spec}).status == 200
    assert api.post("/v1/services/web/rollback").status == 200

    first = api.get("/v1/services/web/events?limit=2")
    assert first.status == 200
    assert [e["reason"] for e in first.body["events"]] == ["RolledBack", "Updated"]
    assert first.body["events"][0]["version"] == 1 and first.body["events"][0]["type"] == "Normal"
    assert first.body["events"][0]["count"] == 1
    assert first.body["events"][0]["time"] == first.body["events"][0]["first_seen"]
    rest = api.get(f"/v1/services/web/events?limit=2&next_token={first.body['next_token']}")
    assert [e["reason"] for e in rest.body["events"]] == ["Created"]
    assert rest.body["next_token"] is None

    bad = api.get("/v1/services/web/events?next_token=bm90LWEtdG9rZW4")
    assert bad.status == 400
    assert "next_token" in bad.error["message"]
    assert api.get("/v1/services/nope/events").status == 404
    assert api.get("/v1/services/web/events?limit=101").status == 400

    assert api.delete("/v1/services/web").status == 202
    assert api.get("/v1/services/web/events?limit=1").body["events"][0]["reason"] == "Deleting"


def _write(table: str, uid: str, event: Event, now: str) -> None:
    aws.dynamodb().transact_write_items(
        TransactItems=[event_update(table, "web", uid, event, now, EventSequence().next())]
    )


def test_events_expire_on_read_before_ttl_deletes_them_and_only_the_newest_are_kept(
    api: HandlerClient, table: str
) -> None:
    uid = api.post("/v1/services", {"name": "web", "spec": hello_spec()}).body["uid"]
    service = CommandStore(Table(table)).service("web")
    reads = EventReads(Table(table))
    base = "2026-01-01T00:00:00.000Z"
    t0 = int(from_iso(base).timestamp())
    for n in range(EVENTS_KEPT + 5):
        _write(table, uid, Event("Probe", f"event {n}"), f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}.000Z")
    kept = reads.newest(service, now_epoch=t0)
    assert len(kept) == EVENTS_KEPT
    # The newest first (the service's Created, written now), then the probes: the 6 oldest left out.
    assert kept[0].event.reason == "Created"
    assert [r.event.message for r in kept[1:]] == [f"event {n}" for n in range(EVENTS_KEPT + 4, 5, -1)]

    # Past their TTL the items are still in the table (TTL deletes late; moto never): reads skip them.
    later = t0 + EVENT_TTL_SECONDS + 3600
    raw = aws.dynamodb().scan(TableName=table)["Items"]
    assert sum(1 for i in raw if from_raw(i)["SK"].startswith(f"E#{uid}#")) >= EVENTS_KEPT + 5
    assert [r for r in reads.newest(service, now_epoch=later) if r.event.reason == "Probe"] == []
    # An event seen again the same day folds, and moves its expiry with it.
    _write(table, uid, Event("Probe", "event 3"), "2026-01-01T05:00:00.000Z")
    [again] = [r for r in reads.newest(service, now_epoch=later) if r.event.reason == "Probe"]
    assert (again.count, again.first_seen) == (2, "2026-01-01T00:00:03.000Z")
    assert again.expires_at == int(from_iso("2026-01-01T05:00:00.000Z").timestamp()) + EVENT_TTL_SECONDS


def test_repeats_fold_within_a_day_and_a_read_stops_at_the_day_that_fills_the_newest(
    api: HandlerClient, table: str
) -> None:
    uid = api.post("/v1/services", {"name": "web", "spec": hello_spec()}).body["uid"]
    service = CommandStore(Table(table)).service("web")
    reads = EventReads(Table(table))
    t0 = int(from_iso("2026-01-01T00:00:00.000Z").timestamp())
    _write(table, uid, Event("Probe", "flapping"), "2026-01-01T10:00:00.000Z")
    _write(table, uid, Event("Probe", "flapping"), "2026-01-01T11:00:00.000Z")
    _write(table, uid, Event("Probe", "flapping"), "2026-01-02T09:00:00.000Z")  # another day: a new item
    flapping = [(r.count, r.first_seen) for r in reads.newest(service, t0) if r.event.message == "flapping"]
    assert flapping == [(1, "2026-01-02T09:00:00.000Z"), (2, "2026-01-01T10:00:00.000Z")]

    for n in range(EVENTS_KEPT):
        _write(table, uid, Event("Busy", f"busy {n}"), f"2026-01-03T00:{n // 60:02d}:{n % 60:02d}.000Z")
    newest = [r for r in reads.newest(service, t0) if r.event.reason != "Created"]
    assert len(newest) == EVENTS_KEPT - 1 and {r.event.reason for r in newest} == {"Busy"}


@pytest.mark.parametrize(
    ("before", "after", "reasons"),
    [
        ({"status": ReplicaStatus.PENDING}, {"status": ReplicaStatus.PROVISIONING, "instance_id": "i-1"}, ["Launched"]),
        ({"status": ReplicaStatus.STARTING}, {"status": ReplicaStatus.READY}, ["ReplicaReady"]),
        ({"status": ReplicaStatus.READY}, {"status": ReplicaStatus.READY, "probe_failures": 0}, []),
        ({"status": ReplicaStatus.READY}, {"status": ReplicaStatus.READY, "version": 2}, ["UpdatedInPlace"]),
        (
            {"status": ReplicaStatus.FAILED_PROVISION, "launch_attempts": 1, "status_message": "X: y"},
            {"status": ReplicaStatus.FAILED_PROVISION, "launch_attempts": 2, "status_message": "X: y"},
            ["LaunchRefused"],
        ),
        (
            {"status": ReplicaStatus.FAILED_PROVISION, "launch_attempts": 1, "status_message": "X: y"},
            {"status": ReplicaStatus.FAILED_PROVISION, "launch_attempts": 1, "status_message": "X: y"},
            [],  # a revision bump before the retry reports nothing
        ),
        ({"status": ReplicaStatus.READY}, {"status": ReplicaStatus.PREEMPTED}, ["Preempted"]),
    ],
)
def test_which_replica_writes_are_events(before: dict[str, Any], after: dict[str, Any], reasons: list[str]) -> None:
    base = ReplicaRecord(
        name="web", uid="u", replica_id=3, version=1, status=ReplicaStatus.PENDING, created_at="", updated_at=""
    )
    old = replace(base, **before)
    new = replace(old, **after)
    assert [e.reason for e in replica_changed(old, new)] == reasons
