"""template.yaml and the api handler agree: every route the handler serves is an IAM-authorised Api event."""

from __future__ import annotations

from fleetkeeper.api.handler import app
from fleetkeeper.apigw import ROUTES
from fleetkeeper.template import create_table_kwargs, load_template, resource


def handler_routes() -> set[tuple[str, str]]:
    return {
        (route.method, route.path.replace("<name>", "{name}")) for route in app._static_routes + app._dynamic_routes
    }


def template_routes() -> set[tuple[str, str]]:
    events = resource(load_template(), "ApiFunction")["Properties"]["Events"]
    return {(e["Properties"]["Method"].upper(), e["Properties"]["Path"]) for e in events.values()}


def test_every_handler_route_is_declared_in_the_template_and_back() -> None:
    assert handler_routes() == template_routes()


def test_the_local_event_builder_knows_every_route() -> None:
    assert {path for _, path in template_routes()} == {resource_path for resource_path, _ in ROUTES}


def test_api_uses_iam_auth_and_no_invoke_role() -> None:
    auth = resource(load_template(), "Api")["Properties"]["Auth"]
    assert auth["DefaultAuthorizer"] == "AWS_IAM"
    assert auth["InvokeRole"] == "NONE"


def test_table_declares_keys_sparse_index_stream_and_ttl() -> None:
    template = load_template()
    kwargs = create_table_kwargs(template, "t")
    assert [k["AttributeName"] for k in kwargs["KeySchema"]] == ["PK", "SK"]
    assert [i["IndexName"] for i in kwargs["GlobalSecondaryIndexes"]] == ["services"]
    assert kwargs["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    props = resource(template, "Table")["Properties"]
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}
    assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert props["SSESpecification"]["SSEEnabled"] is True


def test_the_checked_in_openapi_document_matches_the_code() -> None:
    import json
    from pathlib import Path

    from fleetkeeper.api.handler import openapi_json

    checked_in = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"
    assert json.loads(checked_in.read_text()) == json.loads(openapi_json()), (
        "docs/openapi.json is stale: run `make openapi` and commit it"
    )
