"""The responses the routes declare: what the OpenAPI document says each route may answer.

A response is declared as the document writes it (description, headers, content), with pydantic
models where the document has their schema: `{media: {"model": M}}`. The routes in
fleetkeeper.api.handler pick theirs from here, so each refusal is described once.
"""

from __future__ import annotations

from typing import Any

from fleetkeeper.api.models import ErrorBody

# A response as the OpenAPI document declares it: description, headers, content {media: {"model": M}}.
OpenAPIResponse = dict[str, Any]

ERROR_CONTENT: dict[str, Any] = {"application/json": {"model": ErrorBody}}
ETAG_HEADER: dict[str, Any] = {
    "ETag": {"description": 'the service\'s generation as an HTTP entity tag, e.g. "7"', "schema": {"type": "string"}}
}
UNAVAILABLE: OpenAPIResponse = {
    "description": "DynamoDB was busy (a concurrent write, throttling); nothing was written: retry after Retry-After",
    "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
    "content": ERROR_CONTENT,
}
BAD: OpenAPIResponse = {"description": "invalid request: the message names each field", "content": ERROR_CONTENT}
MISSING: OpenAPIResponse = {"description": "no such service", "content": ERROR_CONTENT}
CONFLICT: OpenAPIResponse = {"description": "conflict", "content": ERROR_CONTENT}
FORBIDDEN: OpenAPIResponse = {
    "description": "the caller may read the service but not change it (the message names the access missing: "
    "write access to service NAME), or the request carries no IAM identity",
    "content": ERROR_CONTENT,
}
NO_IDENTITY: OpenAPIResponse = {
    "description": "the request carries no IAM identity fleetkeeper recognizes",
    "content": ERROR_CONTENT,
}
# Answered before any route (fleetkeeper.api.refusals): a body over 64 KiB, a body that is not JSON.
BODY_ERRORS: dict[int, OpenAPIResponse] = {
    413: {"description": "the body is over 64 KiB", "content": ERROR_CONTENT},
    415: {"description": "the body is not application/json", "content": ERROR_CONTENT},
}
ERRORS: dict[int, OpenAPIResponse] = {400: BAD, 403: FORBIDDEN, 404: MISSING, 409: CONFLICT, 503: UNAVAILABLE}
# A service the caller may not read answers 404, exactly as an unknown name does.
READ_ERRORS: dict[int, OpenAPIResponse] = {400: BAD, 403: NO_IDENTITY, 404: MISSING, 503: UNAVAILABLE}
STALE: OpenAPIResponse = {"description": "If-Match names another generation", "content": ERROR_CONTENT}
KEY_REUSED: OpenAPIResponse = {
    "description": "this Idempotency-Key was used for another request",
    "content": ERROR_CONTENT,
}


def success(description: str, model: Any, *, etag_header: bool = True) -> OpenAPIResponse:
    """A route's success answer: `model` as JSON, with the service's ETag unless `etag_header` is False."""
    response: OpenAPIResponse = {"description": description, "content": {"application/json": {"model": model}}}
    if etag_header:
        response["headers"] = ETAG_HEADER
    return response
