"""The api Lambda handler: parse the request, call one service command, shape the response.

The router (fleetkeeper.api.routing) validates bodies, path, query and header parameters against
their declarations (the same declarations make the OpenAPI document). Domain errors become HTTP
errors in one place (`_domain_error`); validation errors are turned into 400s that name the offending
field. Every error body is `{"error": {"code", "message", "details"}}`.

The commands are built per invocation from the settings the invocation reads: nothing of one
invocation's configuration (a table, a client of another AWS endpoint) outlives it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import zlib
from contextvars import ContextVar
from typing import TYPE_CHECKING, Annotated, Any

from aws_lambda_powertools import Logger

from fleetkeeper.api.models import (
    MAX_CLIENT_INTEGER,
    AccessChangeRequest,
    AccessView,
    CreateServiceRequest,
    ErrorBody,
    EventList,
    MetricsView,
    ReplicaTerminating,
    RollbackRequest,
    ServiceList,
    ServiceView,
    ServiceWritten,
    UpdateServiceRequest,
    VersionList,
    WorkdirUpload,
    WorkdirUploadRequest,
    access_view,
    event_view,
    metrics_view,
    service_view,
    summary,
    target_view,
    version_view,
)
from fleetkeeper.api.routing import (
    Header,
    Path,
    Query,
    Reply,
    Request,
    RequestValidationError,
    Router,
    UnsupportedContentType,
    header,
    is_json,
)
from fleetkeeper.errors import FleetkeeperError, Forbidden, InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from fleetkeeper.owners.access import Caller, grant
from fleetkeeper.owners.principals import PrincipalError, canonical_caller
from fleetkeeper.replicas.workdirs import MAX_WORKDIR_BYTES
from fleetkeeper.service_events import EVENTS_KEPT
from fleetkeeper.settings import Settings
from fleetkeeper.spec.service import NAME_PATTERN, NAME_RULE, describe_validation_errors

# Not imported here: the commands and what they are built from (fleetkeeper.api.services, the store, the
# kick, the secret store, the request HMAC, the workdir store). A request refused before any route
# (no identity, a body too large or not JSON) needs none of them; build_commands imports them.
if TYPE_CHECKING:
    from collections.abc import Callable

    from aws_lambda_powertools.utilities.typing import LambdaContext

    from fleetkeeper.api.services import ServiceCommands, Written
    from fleetkeeper.model import ServiceState

# A response as the OpenAPI document declares it: description, headers, content {media: {"model": M}}.
OpenAPIResponse = dict[str, Any]
MAX_BODY_BYTES = 64 * 1024
# GET .../metrics reads at most a day back (a day of one-minute buckets: one CloudWatch query).
MAX_METRICS_MINUTES = 24 * 60
# A page of GET .../versions. A version's spec comes from a body of at most 64 KiB and is answered
# as ASCII JSON, where one 4-byte character becomes a 12-byte surrogate-pair escape: at most ~3x,
# 192 KiB a version, so a page of 20 stays under 4 MB, well within Lambda's 6 MB response.
MAX_VERSIONS_PAGE = 20
DEFAULT_VERSIONS_PAGE = 10
DEFAULT_EVENTS_PAGE = 20
_ERROR_CONTENT: dict[str, Any] = {"application/json": {"model": ErrorBody}}
_ETAG_HEADER: dict[str, Any] = {
    "ETag": {"description": 'the service\'s generation as an HTTP entity tag, e.g. "7"', "schema": {"type": "string"}}
}
_UNAVAILABLE: OpenAPIResponse = {
    "description": "DynamoDB was busy (a concurrent write, throttling); nothing was written: retry after Retry-After",
    "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
    "content": _ERROR_CONTENT,
}
_BAD: OpenAPIResponse = {"description": "invalid request: the message names each field", "content": _ERROR_CONTENT}
_MISSING: OpenAPIResponse = {"description": "no such service", "content": _ERROR_CONTENT}
_CONFLICT: OpenAPIResponse = {"description": "conflict", "content": _ERROR_CONTENT}
_FORBIDDEN: OpenAPIResponse = {
    "description": "the caller may read the service but not change it (the message names the access missing: "
    "write access to service NAME), or the request carries no IAM identity",
    "content": _ERROR_CONTENT,
}
_NO_IDENTITY: OpenAPIResponse = {
    "description": "the request carries no IAM identity fleetkeeper recognizes",
    "content": _ERROR_CONTENT,
}
# Answered before any route: a body over 64 KiB, a body that is not JSON.
_BODY_ERRORS: dict[int, OpenAPIResponse] = {
    413: {"description": "the body is over 64 KiB", "content": _ERROR_CONTENT},
    415: {"description": "the body is not application/json", "content": _ERROR_CONTENT},
}
_ERRORS: dict[int, OpenAPIResponse] = {400: _BAD, 403: _FORBIDDEN, 404: _MISSING, 409: _CONFLICT, 503: _UNAVAILABLE}
# A service the caller may not read answers 404, exactly as an unknown name does.
_READ_ERRORS: dict[int, OpenAPIResponse] = {400: _BAD, 403: _NO_IDENTITY, 404: _MISSING, 503: _UNAVAILABLE}
_STALE: OpenAPIResponse = {"description": "If-Match names another generation", "content": _ERROR_CONTENT}
_KEY_REUSED: OpenAPIResponse = {
    "description": "this Idempotency-Key was used for another request",
    "content": _ERROR_CONTENT,
}

# Path and header parameters. A name that does not match is refused by the router's validation and
# answered by `_validation_error` with the api's own words for it.
ServiceNameParam = Annotated[str, Path(pattern=NAME_PATTERN, description="the service's name")]
IfMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-Match",
        description='the generation (ETag) the write expects, e.g. 7 or "7"; absent or * for any',
    ),
]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="1 to 255 characters; a replay within 24 h returns the first response",
    ),
]

logger = Logger()
app = Router()


def build_commands(settings: Settings, caller: Caller) -> ServiceCommands:
    """The commands of one invocation, acting as `caller`: cheap (the clients are cached in fleetkeeper.aws)."""
    # Imported on the first invocation that reaches a route, not with the module (see the imports above).
    from fleetkeeper.api.request_hmac import RequestHmac
    from fleetkeeper.api.services import ServiceCommands, rate_reader
    from fleetkeeper.kick import ReconcilerKick
    from fleetkeeper.replicas.secrets import SecretStore
    from fleetkeeper.replicas.workdirs import store_from_settings
    from fleetkeeper.store.commands import CommandStore
    from fleetkeeper.store.table import Table

    return ServiceCommands(
        store=CommandStore(Table(settings.table_name)),
        kick=ReconcilerKick.from_settings(settings),
        secrets=SecretStore.from_settings(settings),
        workdirs=store_from_settings(settings),
        region=settings.region,
        caller=caller,
        fingerprint=RequestHmac.from_settings(settings),
        request_rates=rate_reader(),
        metric_period_seconds=settings.metric_window_seconds,
        simulated_accelerators=settings.driver == "process",
    )


def caller_of(event: dict[str, Any], settings: Settings) -> Caller:
    """Who the request acts as: the canonical principal of the identity API Gateway authenticated
    (`requestContext.identity.userArn`; with AWS_IAM auth every request that reaches the function
    has one), and whether it is one of the stack's administrators. Forbidden without one."""
    identity = (event.get("requestContext") or {}).get("identity") or {}
    user_arn = identity.get("userArn")
    if not isinstance(user_arn, str) or not user_arn:
        raise Forbidden(
            "the request carries no IAM identity: call the API signed with AWS Signature Version 4 "
            "(API Gateway's AWS_IAM auth), as the fleetkeeper CLI does",
            details=[{"field": "identity", "problem": "missing"}],
        )
    try:
        principal = canonical_caller(user_arn)
    except PrincipalError as exc:
        raise Forbidden(str(exc), details=[{"field": "identity", "problem": "not a recognized principal"}]) from exc
    return Caller.of(principal, settings.admin_principals)


# This invocation's commands, set by `lambda_handler` around each resolve. A context variable
# (as the router's current request is): tests call the handler from many threads at once.
_commands: ContextVar[ServiceCommands] = ContextVar("fleetkeeper_api_commands")


def commands() -> ServiceCommands:
    """This invocation's commands."""
    return _commands.get()


# --- helpers ---------------------------------------------------------------------------------------


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply[Any]:
    return Reply(status, body, headers)


def etag(generation: int) -> str:
    """A generation as HTTP's entity tag: a quoted string (RFC 9110, 8.8.3)."""
    return f'"{generation}"'


def _with_etag(status: int, state: ServiceState) -> Reply[Any]:
    return _json(status, _service_view(state), {"ETag": etag(state.service.generation)})


def _service_view(state: ServiceState) -> dict[str, Any]:
    this = commands()
    return service_view(
        state, rate_window_seconds=this.metric_period_seconds, simulated_accelerators=this.simulated_accelerators
    )


def _written(status: int, written: Written) -> Reply[Any]:
    """A write's answer: the service and its target, without replicas, and whether it changed."""
    return _json(status, written_view(written), {"ETag": etag(written.state.service.generation)})


def written_view(written: Written) -> dict[str, Any]:
    return {**target_view(written.state), "changed": written.changed}


def _invalid_name(name: object) -> InvalidRequest:
    return InvalidRequest(
        f"service name {name!r} is invalid: use {NAME_RULE}",
        details=[{"field": "name", "problem": f"not {NAME_RULE}"}],
    )


_MAX_CLIENT_DIGITS = len(str(MAX_CLIENT_INTEGER))


def _expected_generation(raw: str | None) -> int | None:
    """If-Match as a generation number; None for any generation.

    ASCII digits only (str.isdigit() also takes "¹" and "٣", which int() refuses or reads as
    another digit), at most MAX_CLIENT_INTEGER: checked by length before int() ever sees it, so
    neither Python's 4,300-digit limit nor DynamoDB's 38 digits can turn it into a 500.
    """
    if raw is None or raw.strip() in {"", "*"}:
        return None
    text = raw.strip().removeprefix("W/").strip('"')
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    if not (text.isascii() and text.isdigit()):
        raise InvalidRequest(
            f'If-Match must be the service\'s generation as a number (e.g. 7 or "7"), got {shown!r}',
            details=[{"field": "If-Match", "problem": "not a generation number"}],
        )
    if len(text.lstrip("0")) > _MAX_CLIENT_DIGITS or int(text) > MAX_CLIENT_INTEGER:
        raise InvalidRequest(
            f"If-Match must be a generation of at most {MAX_CLIENT_INTEGER}, got {shown!r}",
            details=[{"field": "If-Match", "problem": f"greater than {MAX_CLIENT_INTEGER}"}],
        )
    return int(text)


def _idempotency_key(raw: str | None) -> str | None:
    if raw is None:
        return None
    key = raw.strip()
    if not 1 <= len(key) <= 255:
        raise InvalidRequest(
            "Idempotency-Key must be 1 to 255 characters",
            details=[{"field": "Idempotency-Key", "problem": "empty or too long"}],
        )
    return key


def _without_secret_values(body: Any) -> Any:
    """A request body as an Idempotency-Key record may keep it (hashed): secret values replaced by
    null (they count through their HMAC, `_replayable`); the values themselves never reach a stored item."""
    if isinstance(body, dict) and isinstance(body.get("body"), dict):  # an update's {"body", "if_match"}
        return {**body, "body": _without_secret_values(body["body"])}
    spec = body.get("spec") if isinstance(body, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("secrets"), dict):
        return body
    secrets: dict[str, Any] = spec["secrets"]
    return {**body, "spec": {**spec, "secrets": dict.fromkeys(secrets)}}


def _replayable(
    operation: str,
    name: str,
    body: Any,
    execute: Callable[[], Written],
    *,
    key: str | None,
    status: int,
    secret_values: dict[str, str],
) -> Reply[Any]:
    """Run a write command (once per Idempotency-Key) and answer with the service view."""

    def run() -> dict[str, Any]:
        # What Powertools keeps as the record's result, and what a replay answers: the write's view
        # without replicas (so the record never grows with the replica count), as its JSON text
        # compressed. Text, because Powertools stores a cached dict with sorted keys, and a replay of
        # that would not be the first answer byte for byte; compressed, because Powertools stores it
        # with ASCII escapes, where a spec of 64 KiB of 4-byte characters would take 229 KB of the
        # 400 KB item (12 bytes per character, and every backslash doubled).
        written = execute()
        return {"view_z": _pack(written_view(written)), "generation": written.state.service.generation}

    request: dict[str, Any] = {"operation": operation, "name": name, "body": _without_secret_values(body)}
    if key is not None:
        # The same key with other secret values is another request: the values count, as their HMAC.
        request["secrets_hmac"] = commands().fingerprint_of_secrets(secret_values)
    result = commands().idempotently(key, request, run, app.current_request.lambda_context)
    # The first answer and a replay both answer the cached text parsed back: the same dict, keys
    # in the same order, so the router serializes them to the same bytes.
    return _json(status, _unpack(result["view_z"]), {"ETag": etag(int(result["generation"]))})


def _pack(view: dict[str, Any]) -> str:
    text = json.dumps(view, separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(zlib.compress(text.encode(), level=6)).decode()


def _unpack(packed: str) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(packed)))


# --- routes -----------------------------------------------------------------------------------------


def _success(description: str, model: Any, *, etag_header: bool = True) -> OpenAPIResponse:
    response: OpenAPIResponse = {"description": description, "content": {"application/json": {"model": model}}}
    if etag_header:
        response["headers"] = _ETAG_HEADER
    return response


@app.post(
    "/v1/services",
    responses={
        201: _success("created", ServiceWritten),
        400: _BAD,
        403: _NO_IDENTITY,
        409: _CONFLICT,
        503: _UNAVAILABLE,
        **_BODY_ERRORS,
        422: _KEY_REUSED,
    },
)
def create_service(
    request: CreateServiceRequest, idempotency_key: IdempotencyKeyHeader = None
) -> Reply[ServiceWritten]:
    from fleetkeeper.api.services import Written  # build_commands imported it already

    return _replayable(
        "create",
        request.name,
        app.current_request.json_body,  # what a replay must match: the request as sent
        lambda: Written(commands().create(request.name, request.spec)),
        key=_idempotency_key(idempotency_key),
        status=201,
        secret_values=request.spec.secret_values(),
    )


@app.post(
    "/v1/workdirs",
    responses={
        200: _success("where to upload, or that no upload is needed", WorkdirUpload, etag_header=False),
        400: _BAD,
        403: _NO_IDENTITY,
        503: _UNAVAILABLE,
        **_BODY_ERRORS,
    },
)
def workdir_upload(request: WorkdirUploadRequest) -> Reply[WorkdirUpload]:
    """Where a packed workdir goes: a presigned upload, or null when the store has it already."""
    upload = commands().workdir_upload(request.digest, request.size, request.service)
    return _json(
        200,
        {
            "digest": request.digest,
            "upload": None
            if upload is None
            else {"url": upload.url, "method": upload.method, "headers": upload.headers},
            "max_bytes": MAX_WORKDIR_BYTES,
        },
    )


@app.get(
    "/v1/services",
    responses={
        200: _success(
            "a page of the services the caller may read (it may hold fewer than `limit`, even none, while "
            "`next_token` is set: follow it until null)",
            ServiceList,
            etag_header=False,
        ),
        400: _BAD,
        403: _NO_IDENTITY,
        503: _UNAVAILABLE,
    },
)
def list_services(
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Reply[ServiceList]:
    services, token = commands().list_page(limit=limit, next_token=next_token)
    return _json(200, {"services": [summary(s) for s in services], "next_token": token})


@app.get("/v1/services/<name>", responses={200: _success("the service", ServiceView), **_READ_ERRORS})
def get_service(name: ServiceNameParam) -> Reply[ServiceView]:
    return _with_etag(200, commands().get(name))


@app.put(
    "/v1/services/<name>",
    responses={
        200: _success(
            "updated: a new version; or, with `changed` false, the spec is the target's already", ServiceWritten
        ),
        **_ERRORS,
        **_BODY_ERRORS,
        412: _STALE,
        422: _KEY_REUSED,
    },
)
def update_service(
    name: ServiceNameParam,
    request: UpdateServiceRequest,
    if_match: IfMatchHeader = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Reply[ServiceWritten]:
    expected = _expected_generation(if_match)
    return _replayable(
        "update",
        name,
        {"body": app.current_request.json_body, "if_match": expected},
        lambda: commands().update(name, request.spec, mode=request.mode, expected_generation=expected),
        key=_idempotency_key(idempotency_key),
        status=200,
        secret_values=request.spec.secret_values(),
    )


@app.get(
    "/v1/services/<name>/versions",
    responses={200: _success("a page of versions", VersionList), **_READ_ERRORS},
)
def list_versions(
    name: ServiceNameParam,
    limit: Annotated[int, Query(ge=1, le=MAX_VERSIONS_PAGE)] = DEFAULT_VERSIONS_PAGE,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Reply[VersionList]:
    service, versions, token = commands().versions_page(name, limit=limit, next_token=next_token)
    return _json(
        200,
        {
            "name": name,
            "target_version": service.target_version,
            "versions": [version_view(v) for v in versions],
            "next_token": token,
        },
        {"ETag": etag(service.generation)},
    )


@app.get(
    "/v1/services/<name>/events",
    responses={200: _success("a page of events, newest first", EventList, etag_header=False), **_READ_ERRORS},
)
def list_events(
    name: ServiceNameParam,
    limit: Annotated[int, Query(ge=1, le=EVENTS_KEPT)] = DEFAULT_EVENTS_PAGE,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Reply[EventList]:
    events, token = commands().events_page(name, limit=limit, next_token=next_token)
    return _json(200, {"events": [event_view(e) for e in events], "next_token": token})


@app.get(
    "/v1/services/<name>/metrics",
    responses={
        200: _success(
            "the endpoint's request rate over time, against the replicas' target (for a dashboard's plot)",
            MetricsView,
            etag_header=False,
        ),
        **_READ_ERRORS,
    },
)
def service_metrics(
    name: ServiceNameParam,
    minutes: Annotated[int, Query(ge=1, le=MAX_METRICS_MINUTES, description="how far back to read")] = 30,
) -> Reply[MetricsView]:
    """The request rate through the service's endpoint, bucketed by the autoscaler's window, and what
    the replicas are sized for: read with the caller's read access to the service."""
    commands_now = commands()
    state, points = commands_now.request_rate_series(name, minutes=minutes)
    return _json(200, metrics_view(state, points, commands_now.metric_period_seconds))


@app.post(
    "/v1/services/<name>/rollback",
    responses={
        200: _success("rolled back (or, with `changed` false, at that version already)", ServiceWritten),
        **_ERRORS,
        **_BODY_ERRORS,
        412: _STALE,
    },
)
def rollback_service(name: ServiceNameParam, if_match: IfMatchHeader = None) -> Reply[ServiceWritten]:
    # The body is optional (POST with none rolls back to the previous version): read here, so an empty
    # body is not a validation error; openapi_json() documents it.
    request = _optional_body(RollbackRequest)
    expected = _expected_generation(if_match)
    state = commands().rollback(name, request.version, expected_generation=expected)
    return _written(200, state)


@app.delete(
    "/v1/services/<name>",
    responses={202: _success("deleting (status SHUTTING_DOWN)", ServiceWritten), **_READ_ERRORS, 403: _FORBIDDEN},
)
def delete_service(name: ServiceNameParam) -> Reply[ServiceWritten]:
    return _written(202, commands().delete(name))


ReplicaIdParam = Annotated[
    int, Path(ge=0, le=MAX_CLIENT_INTEGER, description="the replica's id (`fleetkeeper status NAME` lists them)")
]


@app.delete(
    "/v1/services/<name>/replicas/<replica_id>",
    responses={
        202: _success(
            "the replica is drained, terminated and replaced; `changed` false: asked for or leaving already",
            ReplicaTerminating,
        ),
        **_ERRORS,
    },
)
def terminate_replica(name: ServiceNameParam, replica_id: ReplicaIdParam) -> Reply[ReplicaTerminating]:
    """Terminate one replica (SkyPilot's `sky serve down NAME --replica-id N`): the reconciler drains it,
    terminates its instance and launches its replacement. Needs write access to the service."""
    state, changed = commands().terminate_replica(name, replica_id)
    return _json(202, {**_service_view(state), "changed": changed}, {"ETag": etag(state.service.generation)})


@app.post(
    "/v1/services/<name>/access",
    responses={
        200: _success(
            "who may access the service now; `changed` false: it named these grants already",
            AccessView,
            etag_header=False,
        ),
        **_ERRORS,
        **_BODY_ERRORS,
    },
)
def change_access(name: ServiceNameParam, request: AccessChangeRequest) -> Reply[AccessView]:
    """Grant principals read or write access to the service, or revoke it: needs write access to it."""
    details = []
    add = []
    for index, entry in enumerate(request.add):
        try:
            add.append(grant(entry.principal, entry.mode))
        except PrincipalError as exc:
            details.append({"field": f"add[{index}].principal", "problem": str(exc)})
    remove = []
    for index, principal in enumerate(request.remove):
        try:
            remove.append(grant(principal, "read").principal)
        except PrincipalError as exc:
            details.append({"field": f"remove[{index}]", "problem": str(exc)})
    if details:
        raise InvalidRequest(_summarise(details), details=details)
    service, changed = commands().change_access(name, add, remove)
    return _json(200, {**access_view(service), "changed": changed})


def openapi_json() -> str:
    """The OpenAPI 3 document of this api (also checked in as docs/openapi.json)."""
    from fleetkeeper.api.openapi import document

    sigv4 = {
        "type": "apiKey",
        "description": "AWS Signature Version 4 for execute-api (API Gateway AWS_IAM auth)",
        "in": "header",
        "name": "Authorization",
    }
    generated = document(
        app,
        title="fleetkeeper",
        version="1",
        description="Create, update, roll back and delete services; every route needs AWS_IAM (SigV4).",
        security_schemes={"sigv4": sigv4},
        security=[{"sigv4": []}],
    )
    return json.dumps(_as_answered(generated), indent=2)


def _as_answered(document: dict[str, Any]) -> dict[str, Any]:
    """The generated document made true to what the api answers.

    Every request with a body is measured and typed before any route (413, 415). Rollback's body is
    optional, so it is read by the route rather than declared: it is added here. The document itself
    is served by GET /v1/openapi.json.
    """
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    document["paths"]["/v1/openapi.json"] = {
        "get": {
            "summary": "GET /v1/openapi.json",
            "operationId": "openapi_document",
            "responses": {
                "200": {
                    "description": "this document (OpenAPI 3)",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
        }
    }
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for methods in document["paths"].values():
        for operation in methods.values():
            responses = operation.setdefault("responses", {})
            for status, answered in _BODY_ERRORS.items():
                responses.setdefault(str(status), {"description": answered["description"], "content": error})
    rollback = document["paths"]["/v1/services/{name}/rollback"]["post"]
    rollback["requestBody"] = {
        "required": False,
        "description": "optional: without a body (or without `version`) the previous usable version",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RollbackRequest"}}},
    }
    schemas["RollbackRequest"] = RollbackRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    return document


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi_document() -> Reply[Any]:
    return Reply(200, openapi_json())


def _optional_body(model: type[RollbackRequest]) -> RollbackRequest:
    """A body that may be absent (rollback): validated like the others when present."""
    from pydantic import ValidationError

    raw = app.current_request.decoded_body
    if raw is None or not raw.strip():
        return model()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        details = describe_validation_errors(exc.errors(include_url=False))
        raise InvalidRequest(_summarise(details), details=details) from exc


# --- errors -------------------------------------------------------------------------------------------


def _summarise(details: list[dict[str, str]]) -> str:
    return "invalid request: " + "; ".join(f"{d['field']}: {d['problem']}" for d in details)


@app.exception_handler(FleetkeeperError)
def _domain_error(exc: FleetkeeperError) -> Reply[Any]:
    return _json(exc.status, exc.to_body(), exc.headers() or None)


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


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Reply[Any]:
    errors = list(exc.errors())
    errors = [e for e in errors if not _said_twice(e, errors)]
    others = [e for e in errors if not _is_the_name(e)]
    if not others:
        # Only the service name is wrong: the api's own message for it (what the name must look like).
        return _json(400, _invalid_name(errors[0].get("input")).to_body())
    # Other problems (a body's) are reported first, as before the name was a declared parameter.
    details = describe_validation_errors(others)
    return _json(400, InvalidRequest(_summarise(details), details=details).to_body())


def _not_json(content_type: str | None) -> UnsupportedMediaType:
    return UnsupportedMediaType(
        f"request bodies must be JSON: send Content-Type: application/json (got {content_type or 'none'!r})",
        details=[{"field": "Content-Type", "problem": "not application/json"}],
    )


@app.exception_handler(UnsupportedContentType)
def _unsupported_content_type(exc: UnsupportedContentType) -> Reply[Any]:
    return _domain_error(_not_json(exc.content_type))


@app.not_found
def _no_route(request: Request) -> Reply[Any]:
    message = f"no route for {request.http_method} {request.path}; see GET /v1/openapi.json"
    return _json(404, {"error": {"code": "no_route", "message": message, "details": []}})


@app.exception_handler(Exception)
def _unexpected(exc: Exception) -> Reply[Any]:
    logger.exception("unhandled error")
    body = {"error": {"code": "internal_error", "message": "internal error; it has been logged", "details": []}}
    return _json(500, body)


# --- entry point --------------------------------------------------------------------------------------


def _refuse_body(event: dict[str, Any]) -> dict[str, Any] | None:
    """A 415 for a body that is not JSON, 413 over 64 KiB, 400 not UTF-8: before any parsing."""
    raw = (event.get("body") or "").encode()
    if event.get("isBase64Encoded"):
        with contextlib.suppress(binascii.Error, ValueError):  # not base64 after all: measure it as sent
            raw = base64.b64decode(raw, validate=False)
    error: FleetkeeperError | None = None
    content_type = header(event, "Content-Type")
    if raw.strip() and content_type and not is_json(content_type):
        error = _not_json(content_type)
    elif len(raw) > MAX_BODY_BYTES:
        error = PayloadTooLarge(f"request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES} (64 KiB)")
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            error = InvalidRequest(
                "request body is not UTF-8 text; send JSON",
                details=[{"field": "body", "problem": "not UTF-8"}],
            )
        else:
            error = _too_deep(text)
    if error is None:
        return None
    return _error_response(error)


def _error_response(error: FleetkeeperError) -> dict[str, Any]:
    """A refusal answered before any route runs, as a routed one is answered."""
    return _domain_error(error).to_proxy()


def _too_deep(text: str) -> InvalidRequest | None:
    """A 400 for JSON nested deeper than the parser's stack ("[[[[..." within 64 KiB): Python's
    json raises RecursionError for it, which would be let out as a 500. Other invalid JSON is left
    to the router's validation (a 400 naming the body)."""
    if not text.strip():
        return None
    try:
        json.loads(text)
    except RecursionError:
        return InvalidRequest(
            "request body is JSON nested too deeply; a spec needs a few levels",
            details=[{"field": "body", "problem": "nested too deeply"}],
        )
    except ValueError:
        return None
    return None


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    refused = _refuse_body(event)
    if refused is not None:
        return refused
    # Settings are read once per invocation, and the commands built from them live as long as it.
    settings = Settings.from_env(os.environ)
    try:
        caller = caller_of(event, settings)
    except Forbidden as no_identity:
        return _error_response(no_identity)
    token = _commands.set(build_commands(settings, caller))
    try:
        return app.resolve(event, context)
    finally:
        _commands.reset(token)
