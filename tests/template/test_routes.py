"""template.yaml and the api handler agree: every route the handler serves is an Api event of the template
(tests/template/test_api.py checks that each one requires SigV4)."""

from __future__ import annotations

from fleetkeeper.api.handler import app
from fleetkeeper.aws.apigw import ROUTES
from fleetkeeper.local.template import load_template, resource
from tests import REPO_ROOT


def handler_routes() -> set[tuple[str, str]]:
    return {(route.method, route.path) for route in app.routes}


def template_routes() -> set[tuple[str, str]]:
    events = resource(load_template(), "ApiFunction")["Properties"]["Events"]
    return {(e["Properties"]["Method"].upper(), e["Properties"]["Path"]) for e in events.values()}


def test_every_handler_route_is_declared_in_the_template_and_back() -> None:
    assert handler_routes() == template_routes()


def test_the_local_event_builder_knows_every_route() -> None:
    assert {path for _, path in template_routes()} == {resource_path for resource_path, _ in ROUTES}


def test_the_checked_in_openapi_document_matches_the_code() -> None:
    import json

    from fleetkeeper.api.handler import openapi_json

    checked_in = REPO_ROOT / "docs" / "openapi.json"
    assert json.loads(checked_in.read_text()) == json.loads(openapi_json()), (
        "docs/openapi.json is stale: run `make openapi` and commit it"
    )
