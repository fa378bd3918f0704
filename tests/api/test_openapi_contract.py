"""The OpenAPI document is a valid OpenAPI 3 document, complete, and true to what the api answers
(each answer of the suite is checked against it: tests/support/openapi_conformance.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.handler_client import HandlerClient
from tests.support.openapi_conformance import Nonconforming, check, document
from tests.support.specs import hello_spec


def test_the_document_is_valid_openapi() -> None:
    from openapi_spec_validator import validate

    validate(document())


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), p, op) for p, methods in document()["paths"].items() for m, op in methods.items()]


@pytest.mark.parametrize(("method", "path", "op"), operations(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_operation_documents_its_success_and_no_422_it_never_answers(
    method: str, path: str, op: dict[str, Any]
) -> None:
    responses = op["responses"]
    successes = [s for s in responses if s.startswith("2")]
    assert successes, f"{method} {path} documents no success"
    for status in successes:
        assert "content" in responses[status], f"{method} {path} {status} has no schema"
    # Validation errors are 400s with the api's error body; 422 only for a reused Idempotency-Key.
    if "422" in responses:
        assert "Idempotency-Key" in responses["422"]["description"]
        assert any(p["name"].lower() == "idempotency-key" for p in op.get("parameters", []))
    for status, response in responses.items():
        if status[0] in "45":
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    # Any request with a body is measured and typed before a route sees it.
    assert {"413", "415"} <= set(responses)
    if "if-match" in {p["name"].lower() for p in op.get("parameters", [])}:
        assert "412" in responses


def test_rollback_documents_its_optional_body() -> None:
    body = document()["paths"]["/v1/services/{name}/rollback"]["post"]["requestBody"]
    assert body["required"] is False
    schema = document()["components"]["schemas"]["RollbackRequest"]
    assert set(schema["properties"]) == {"version"}


def test_an_answer_that_is_not_the_documents_is_caught() -> None:
    with pytest.raises(Nonconforming, match="status not in the document"):
        check("DELETE", "/v1/services/web", 418, {}, {})
    with pytest.raises(Nonconforming, match="documented header ETag missing"):
        check("GET", "/v1/services/web", 200, {}, {})
    with pytest.raises(Nonconforming, match="body does not match"):
        check("GET", "/v1/services", 200, {}, {"services": "not a list", "next_token": None})


def test_writes_answer_with_a_quoted_etag_and_whether_they_changed_anything(api: HandlerClient) -> None:
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert (created.headers["ETag"], created.body["changed"]) == ('"1"', True)
    assert api.put("/v1/services/web", {"spec": hello_spec()}, headers={"If-Match": '"1"'}).body["changed"] is False
    view = api.get("/v1/services/web").body
    assert view["reconciled"] is False  # no reconciler has acted on generation 1 yet
    assert "changed" not in view
