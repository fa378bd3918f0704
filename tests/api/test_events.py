"""The sample API Gateway events in events/ drive the handler as API Gateway would, in route order."""

from __future__ import annotations

import json

from fleetkeeper.api.handler import lambda_handler
from tests import REPO_ROOT
from tests.support.handler_client import FakeContext

EVENTS = REPO_ROOT / "events"
# A service's life, one event per route, with the status each must produce.
SEQUENCE = [
    ("api_create_service", 201),
    ("api_create_service", 201),  # the same Idempotency-Key: the first result again
    ("api_list_services", 200),
    ("api_get_service", 200),
    ("api_update_service", 200),
    ("api_update_service", 412),  # If-Match 1 is stale now
    ("api_list_versions", 200),
    ("api_rollback_service", 200),
    ("api_change_access", 200),
    ("api_openapi", 200),
    ("api_delete_service", 202),
]


def test_every_route_has_an_event() -> None:
    assert {name for name, _ in SEQUENCE} == {p.stem for p in EVENTS.glob("api_*.json")}


def test_the_events_replay_a_service_life(table: str) -> None:
    for name, status in SEQUENCE:
        event = json.loads((EVENTS / f"{name}.json").read_text())
        response = lambda_handler(event, FakeContext())
        assert response["statusCode"] == status, (name, response["body"])
        json.loads(response["body"])
