"""DELETE /v1/services/{name}/replicas/{replica_id} (`fleetkeeper down NAME --replica-id N`): the
replica's termination recorded with its event, once; write access as the other service-mutating
routes; an unknown replica or a bad id a 4xx that says what is wrong."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fleetkeeper.model import ReplicaStatus
from fleetkeeper.store.commands import CommandStore
from fleetkeeper.store.runs import ReconcilerStore
from fleetkeeper.store.table import Table
from tests.api.test_owners import TEAM_A, TEAM_B, create, grant, session
from tests.support import TABLE

if TYPE_CHECKING:
    from tests.support.handler_client import HandlerClient


def with_replicas(name: str, *statuses: ReplicaStatus) -> None:
    """The service's replicas as the reconciler would have claimed and moved them."""
    store = ReconcilerStore(Table(TABLE))
    state = CommandStore(Table(TABLE)).require(name)
    ids = tuple(range(len(statuses)))
    store.claim_replicas(state.service, state.service.target_version, ids, "2026-01-01T00:00:00.000Z")
    for replica_id, status in zip(ids, statuses, strict=True):
        claimed = CommandStore(Table(TABLE)).require(name).replicas[replica_id]
        store.put_replica(claimed, replace(claimed, status=status, instance_id=f"i-{replica_id}"))


def test_a_termination_is_recorded_once_with_its_event(api: HandlerClient) -> None:
    create(api)
    with_replicas("web", ReplicaStatus.READY, ReplicaStatus.READY)
    answer = api.delete("/v1/services/web/replicas/1")
    assert answer.status == 202, answer.body
    assert answer.body["changed"] is True
    replicas = {r["replica_id"]: r for r in answer.body["replicas"]}
    assert replicas[1]["terminate_requested_at"] is not None and replicas[0]["terminate_requested_at"] is None
    assert api.get("/v1/services/web").body["replicas"][1]["terminate_requested_at"] is not None
    again = api.delete("/v1/services/web/replicas/1")
    assert (again.status, again.body["changed"]) == (202, False)
    events = [e for e in api.get("/v1/services/web/events").body["events"] if e["reason"] == "TerminationRequested"]
    assert len(events) == 1 and events[0]["replica_id"] == 1
    assert "requested by" in events[0]["message"]


def test_a_replica_already_leaving_is_left_as_it_is(api: HandlerClient) -> None:
    create(api)
    with_replicas("web", ReplicaStatus.SHUTTING_DOWN)
    answer = api.delete("/v1/services/web/replicas/0")
    assert (answer.status, answer.body["changed"]) == (202, False)


def test_an_unknown_replica_or_service_is_a_404_that_says_what_there_is(api: HandlerClient) -> None:
    create(api)
    with_replicas("web", ReplicaStatus.READY)
    answer = api.delete("/v1/services/web/replicas/5")
    assert answer.status == 404
    assert answer.body["error"]["message"] == (
        "service 'web' has no replica 5 (its replicas: 0); see `fleetkeeper status web`"
    )
    assert api.delete("/v1/services/nope/replicas/0").status == 404


def test_a_replica_id_that_is_not_a_number_is_a_400_naming_it(api: HandlerClient) -> None:
    create(api)
    answer = api.delete("/v1/services/web/replicas/one")
    assert answer.status == 400, answer.body
    assert "replica_id" in str(answer.body["error"]["details"])
    assert api.delete("/v1/services/web/replicas/-1").status == 400


def test_it_needs_write_access_as_an_update_does(api: HandlerClient) -> None:
    owner = api.as_(session(TEAM_A))
    create(owner)
    with_replicas("web", ReplicaStatus.READY)
    stranger = api.as_(session(TEAM_B))
    assert stranger.delete("/v1/services/web/replicas/0").status == 404  # may not even read it
    assert grant(owner, "web", TEAM_B, "read").status == 200
    refused = stranger.delete("/v1/services/web/replicas/0")
    assert refused.status == 403 and "needs write access to service web" in refused.body["error"]["message"]
    assert refused.body["error"]["message"].count("terminating one of its replicas") == 1
    assert owner.delete("/v1/services/web/replicas/0").status == 202


def test_a_service_being_deleted_refuses_it(api: HandlerClient) -> None:
    create(api)
    with_replicas("web", ReplicaStatus.READY)
    assert api.delete("/v1/services/web").status == 202
    answer = api.delete("/v1/services/web/replicas/0")
    assert answer.status == 409 and "being deleted" in answer.body["error"]["message"]
