"""The api Lambda handler: parse the request, call one service command, shape the response.

Domain errors become HTTP errors in one place (`_domain_error`); Powertools' validation errors are
turned into 400s that name the offending field. Every error body is
`{"error": {"code", "message", "details"}}`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from typing import TYPE_CHECKING, Annotated, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Query

from fleetkeeper.api.kick import kick_reconciler
from fleetkeeper.api.models import (
    NAME_PATTERN,
    CreateServiceRequest,
    ErrorBody,
    RollbackRequest,
    ServiceList,
    ServiceView,
    UpdateServiceRequest,
    VersionList,
    service_view,
    summary,
    version_view,
)
from fleetkeeper.errors import FleetkeeperError, InvalidRequest, PayloadTooLarge
from fleetkeeper.services import ServiceCommands
from fleetkeeper.spec import describe_validation_errors
from fleetkeeper.store import Store

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from fleetkeeper.model import ServiceState

MAX_BODY_BYTES = 64 * 1024
_NAME = re.compile(NAME_PATTERN)
# Typed loosely: Powertools' OpenAPIResponse TypedDict does not describe `{"model": ...}` content.
_ERRORS: dict[int, Any] = {
    400: {"description": "invalid request", "content": {"application/json": {"model": ErrorBody}}},
    404: {"description": "no such service", "content": {"application/json": {"model": ErrorBody}}},
    409: {"description": "conflict", "content": {"application/json": {"model": ErrorBody}}},
}

logger = Logger()
app = APIGatewayRestResolver(enable_validation=True)


def _with_errors(responses: dict[int, Any]) -> dict[int, Any]:
    return {**responses, **_ERRORS}


class _Commands:
    """The commands for this process's table, created on first use (never at import)."""

    instance: ServiceCommands | None = None

    @classmethod
    def get(cls) -> ServiceCommands:
        table = os.environ.get("TABLE_NAME")
        if not table:
            raise RuntimeError("TABLE_NAME is not set: the api function needs its table")
        if cls.instance is None or cls.instance.store.table_name != table:
            cls.instance = ServiceCommands(store=Store(table), kick=kick_reconciler)
        return cls.instance


def commands() -> ServiceCommands:
    return _Commands.get()


# --- helpers ---------------------------------------------------------------------------------------


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=body, headers=headers
    )


def _with_etag(status: int, state: ServiceState) -> Response[Any]:
    return _json(status, service_view(state), {"ETag": str(state.service.generation)})


def _valid_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidRequest(
            f"service name {name!r} is invalid: use 1-63 lower-case letters, digits and dashes, starting "
            "with a letter",
            details=[{"field": "name", "problem": f"must match {NAME_PATTERN}"}],
        )
    return name


def _if_match() -> int | None:
    raw = app.current_event.get_header_value("If-Match")
    if raw is None or raw.strip() in {"", "*"}:
        return None
    text = raw.strip().removeprefix("W/").strip('"')
    if not text.isdigit():
        raise InvalidRequest(
            f'If-Match must be the service\'s generation as a number (e.g. 7 or "7"), got {raw!r}',
            details=[{"field": "If-Match", "problem": "not a generation number"}],
        )
    return int(text)


def _idempotency_key() -> str | None:
    key = app.current_event.get_header_value("Idempotency-Key")
    if key is None:
        return None
    key = key.strip()
    if not 1 <= len(key) <= 255:
        raise InvalidRequest(
            "Idempotency-Key must be 1 to 255 characters",
            details=[{"field": "Idempotency-Key", "problem": "empty or too long"}],
        )
    return key


def _replayable(operation: str, name: str, body: Any, execute: Any, *, status: int) -> Response[Any]:
    """Run a write command (once per Idempotency-Key) and answer with the service view."""

    def run() -> dict[str, Any]:
        state: ServiceState = execute()
        return {"view": service_view(state), "generation": state.service.generation}

    result = commands().idempotently(
        _idempotency_key(), {"operation": operation, "name": name, "body": body}, run
    )
    return _json(status, result["view"], {"ETag": str(result["generation"])})


# --- routes -----------------------------------------------------------------------------------------


@app.post(
    "/v1/services",
    responses=_with_errors(
        {201: {"description": "created", "content": {"application/json": {"model": ServiceView}}}}
    ),
)
def create_service(request: CreateServiceRequest) -> Response[ServiceView]:
    body = app.current_event.json_body
    return _replayable(
        "create",
        request.name,
        body,
        lambda: commands().create(request.name, body["spec"]),
        status=201,
    )


@app.get("/v1/services", responses={400: _ERRORS[400]})
def list_services(
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Response[ServiceList]:
    services, token = commands().list(limit=limit, next_token=next_token)
    return _json(200, {"services": [summary(s) for s in services], "next_token": token})


@app.get("/v1/services/<name>", responses={404: _ERRORS[404], 400: _ERRORS[400]})
def get_service(name: str) -> Response[ServiceView]:
    return _with_etag(200, commands().get(_valid_name(name)))


@app.put(
    "/v1/services/<name>", responses=_with_errors({412: {"description": "If-Match generation mismatch"}})
)
def update_service(name: str, request: UpdateServiceRequest) -> Response[ServiceView]:
    _valid_name(name)
    body = app.current_event.json_body
    expected = _if_match()
    return _replayable(
        "update",
        name,
        {"body": body, "if_match": expected},
        lambda: commands().update(name, body["spec"], mode=request.mode, expected_generation=expected),
        status=200,
    )


@app.get("/v1/services/<name>/versions", responses={404: _ERRORS[404], 400: _ERRORS[400]})
def list_versions(name: str) -> Response[VersionList]:
    state = commands().get(_valid_name(name))
    versions = [version_view(state.versions[v]) for v in sorted(state.versions)]
    return _json(
        200,
        {"name": name, "target_version": state.service.target_version, "versions": versions},
        {"ETag": str(state.service.generation)},
    )


@app.post(
    "/v1/services/<name>/rollback",
    responses=_with_errors({412: {"description": "If-Match generation mismatch"}}),
)
def rollback_service(name: str) -> Response[ServiceView]:
    _valid_name(name)
    request = _optional_body(RollbackRequest)
    expected = _if_match()
    state = commands().rollback(name, request.version, expected_generation=expected)
    return _with_etag(200, state)


@app.delete("/v1/services/<name>", responses={404: _ERRORS[404], 400: _ERRORS[400]})
def delete_service(name: str) -> Response[ServiceView]:
    return _with_etag(202, commands().delete(_valid_name(name)))


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi_document() -> Response[Any]:
    document = app.get_openapi_json_schema(
        title="fleetkeeper",
        version="1",
        description="Create, update, roll back and delete services; every route needs AWS_IAM (SigV4).",
    )
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=document)


def _optional_body(model: type[RollbackRequest]) -> RollbackRequest:
    """A body that may be absent (rollback): validated like the others when present."""
    from pydantic import ValidationError

    raw = app.current_event.body
    if raw is None or not raw.strip():
        return model()
    try:
        return model.model_validate_json(app.current_event.decoded_body or "")
    except ValidationError as exc:
        details = describe_validation_errors(exc.errors(include_url=False))
        raise InvalidRequest(_summarise(details), details=details) from exc


# --- errors -------------------------------------------------------------------------------------------


def _summarise(details: list[dict[str, str]]) -> str:
    return "invalid request: " + "; ".join(f"{d['field']}: {d['problem']}" for d in details)


def _domain_error(exc: FleetkeeperError) -> Response[Any]:
    return _json(exc.status, exc.to_body())


def _validation_error(exc: RequestValidationError) -> Response[Any]:
    details = describe_validation_errors(list(exc.errors()))
    return _json(400, InvalidRequest(_summarise(details), details=details).to_body())


@app.not_found
def _no_route(_exc: Exception) -> Response[Any]:
    event = app.current_event
    message = f"no route for {event.http_method} {event.path}; see GET /v1/openapi.json"
    return _json(404, {"error": {"code": "no_route", "message": message, "details": []}})


def _unexpected(exc: Exception) -> Response[Any]:
    logger.exception("unhandled error")
    body = {
        "error": {"code": "internal_error", "message": "internal error; it has been logged", "details": []}
    }
    return _json(500, body)


# Registered by call, not as decorators: Powertools' exception_handler is untyped.
app.exception_handler(FleetkeeperError)(_domain_error)
app.exception_handler(RequestValidationError)(_validation_error)
app.exception_handler(Exception)(_unexpected)


# --- entry point --------------------------------------------------------------------------------------


def _oversized(event: dict[str, Any]) -> dict[str, Any] | None:
    """The 413 response for a body over 64 KiB (decoded), before any parsing is spent on it."""
    body = event.get("body") or ""
    size = len(body.encode())
    if event.get("isBase64Encoded"):
        try:
            size = len(base64.b64decode(body, validate=False))
        except (binascii.Error, ValueError):
            size = len(body)
    if size <= MAX_BODY_BYTES:
        return None
    error = PayloadTooLarge(f"request body is {size} bytes; the limit is {MAX_BODY_BYTES} (64 KiB)")
    return {
        "statusCode": error.status,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": json.dumps(error.to_body()),
        "isBase64Encoded": False,
    }


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return _oversized(event) or app.resolve(event, context)
