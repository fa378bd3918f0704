"""How errors are answered: one place turns each into the api's error body.

Every error body is `{"error": {"code", "message", "details"}}`. Domain errors (fleetkeeper.errors)
carry their status and body; the router's validation errors become 400s that name each offending
field. fleetkeeper.api.handler registers these with its router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetkeeper.api.parameters import invalid_name
from fleetkeeper.api.replies import json_reply
from fleetkeeper.errors import InvalidRequest, UnsupportedMediaType
from fleetkeeper.spec.service import describe_validation_errors

if TYPE_CHECKING:
    from fleetkeeper.api.routing import Reply, Request, RequestValidationError, UnsupportedContentType
    from fleetkeeper.errors import FleetkeeperError


def summarise(details: list[dict[str, str]]) -> str:
    """A refusal's message: each field and its problem, in one line."""
    return "invalid request: " + "; ".join(f"{d['field']}: {d['problem']}" for d in details)


def domain_error(exc: FleetkeeperError) -> Reply[Any]:
    return json_reply(exc.status, exc.to_body(), exc.headers() or None)


def _is_the_name(error: Any) -> bool:
    return tuple(error.get("loc", ()))[:2] == ("path", "name")


def _said_twice(error: Any, errors: list[Any]) -> bool:
    """A create's `name` refused for the very value its spec's `name` gives: the spec's refusal says it
    (with where to give another), once."""
    if tuple(error.get("loc", ()))[:2] != ("body", "name"):
        return False
    return any(
        tuple(e.get("loc", ()))[:3] == ("body", "spec", "name") and e.get("input") == error.get("input") for e in errors
    )


def validation_error(exc: RequestValidationError) -> Reply[Any]:
    errors = list(exc.errors())
    errors = [e for e in errors if not _said_twice(e, errors)]
    others = [e for e in errors if not _is_the_name(e)]
    if not others:
        # Only the service name is wrong: the api's own message for it (what the name must look like).
        return json_reply(400, invalid_name(errors[0].get("input")).to_body())
    # Other problems (a body's) are reported first, as before the name was a declared parameter.
    details = describe_validation_errors(others)
    return json_reply(400, InvalidRequest(summarise(details), details=details).to_body())


def not_json(content_type: str | None) -> UnsupportedMediaType:
    return UnsupportedMediaType(
        f"request bodies must be JSON: send Content-Type: application/json (got {content_type or 'none'!r})",
        details=[{"field": "Content-Type", "problem": "not application/json"}],
    )


def unsupported_content_type(exc: UnsupportedContentType) -> Reply[Any]:
    return domain_error(not_json(exc.content_type))


def no_route(request: Request) -> Reply[Any]:
    message = f"no route for {request.http_method} {request.path}; see GET /v1/openapi.json"
    return json_reply(404, {"error": {"code": "no_route", "message": message, "details": []}})
