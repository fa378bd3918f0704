"""Every api response the suite receives, checked against the OpenAPI document (docs/openapi.json).

tests/support/handler_client.py's HandlerClient calls `check` on each answer: for an operation the
document declares, the status must be one it lists for that operation, the body must validate against
that status's schema, and the headers it documents (ETag, Retry-After) must be there. A 5xx other than the
documented 503 is the suite's deliberate fault injection; it must still be the api's error body.
Answers to undeclared routes (the api's `no_route` 404) are not the document's to describe.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from tests import REPO_ROOT

DOCUMENT = REPO_ROOT / "docs" / "openapi.json"


@functools.cache
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DOCUMENT.read_text())
    return loaded


@functools.cache
def _routes() -> list[tuple[re.Pattern[str], str]]:
    routes = []
    for template in document()["paths"]:
        pattern = re.escape(template).replace(r"\{name\}", "[^/]+")
        routes.append((re.compile(f"^{pattern}$"), template))
    return routes


def operation(method: str, path: str) -> dict[str, Any] | None:
    bare = path.split("?", 1)[0]
    for pattern, template in _routes():
        if pattern.match(bare):
            found: dict[str, Any] | None = document()["paths"][template].get(method.lower())
            return found
    return None


@functools.cache
def _validator(schema_json: str) -> Any:
    """A validator per response schema, built once (the suite checks thousands of answers)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator({**json.loads(schema_json), "components": document()["components"]})


class Nonconforming(AssertionError):
    pass


def check(method: str, path: str, status: int, headers: dict[str, str], body: Any) -> None:
    op = operation(method, path)
    if op is None:
        return
    where = f"{method} {path} -> {status}"
    responses = op["responses"]
    declared = responses.get(str(status))
    if declared is None:
        if status >= 500:
            declared = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        else:
            raise Nonconforming(f"{where}: status not in the document ({sorted(responses)}): {body}")
    for header in declared.get("headers", {}):
        if not any(h.lower() == header.lower() for h in headers):
            raise Nonconforming(f"{where}: documented header {header} missing")
    schema = declared.get("content", {}).get("application/json", {}).get("schema")
    if schema is not None:
        errors = sorted(_validator(json.dumps(schema, sort_keys=True)).iter_errors(body), key=str)
        if errors:
            raise Nonconforming(
                f"{where}: body does not match the document: {errors[0].message} at {list(errors[0].path)}"
            )
