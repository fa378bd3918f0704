"""The api Lambda handler: parse the request, call one service command, shape the response.

The router (fleetkeeper.api.routing) validates bodies, path, query and header parameters against
their declarations (fleetkeeper.api.parameters; the same declarations, with the responses of
fleetkeeper.api.responses, make the OpenAPI document). Domain errors become HTTP errors in one place
(fleetkeeper.api.error_replies); a body no route should see is refused before any
(fleetkeeper.api.refusals). Every error body is `{"error": {"code", "message", "details"}}`.

The commands are built per invocation (fleetkeeper.api.invocation): nothing of one invocation's
configuration outlives it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

from aws_lambda_powertools import Logger

from fleetkeeper.api.error_replies import (
    domain_error,
    no_route,
    summarise,
    unsupported_content_type,
    validation_error,
)
from fleetkeeper.api.invocation import acting_with, build_commands, caller_of, commands
from fleetkeeper.api.models import (
    AccessChangeRequest,
    AccessView,
    CreateServiceRequest,
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
    summary,
    version_view,
)
from fleetkeeper.api.parameters import (
    IdempotencyKeyHeader,
    IfMatchHeader,
    ReplicaIdParam,
    ServiceNameParam,
    expected_generation,
    idempotency_key_of,
)
from fleetkeeper.api.refusals import error_response, refuse_body
from fleetkeeper.api.replay import replayable
from fleetkeeper.api.replies import etag, json_reply, state_view, with_etag, written_reply
from fleetkeeper.api.responses import (
    BAD,
    BODY_ERRORS,
    CONFLICT,
    ERRORS,
    FORBIDDEN,
    KEY_REUSED,
    NO_IDENTITY,
    READ_ERRORS,
    STALE,
    UNAVAILABLE,
    success,
)
from fleetkeeper.api.routing import Query, Reply, RequestValidationError, Router, UnsupportedContentType
from fleetkeeper.errors import FleetkeeperError, Forbidden, InvalidRequest
from fleetkeeper.owners.access import grant
from fleetkeeper.owners.principals import PrincipalError
from fleetkeeper.replicas.workdirs import MAX_WORKDIR_BYTES
from fleetkeeper.service_events import EVENTS_KEPT
from fleetkeeper.settings import Settings
from fleetkeeper.spec.service import describe_validation_errors

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

# GET .../metrics reads at most a day back (a day of one-minute buckets: one CloudWatch query).
MAX_METRICS_MINUTES = 24 * 60
# A page of GET .../versions. A version's spec comes from a body of at most 64 KiB and is answered
# as ASCII JSON, where one 4-byte character becomes a 12-byte surrogate-pair escape: at most ~3x,
# 192 KiB a version, so a page of 20 stays under 4 MB, well within Lambda's 6 MB response.
MAX_VERSIONS_PAGE = 20
DEFAULT_VERSIONS_PAGE = 10
DEFAULT_EVENTS_PAGE = 20

logger = Logger()
app = Router()


# --- routes -----------------------------------------------------------------------------------------


@app.post(
    "/v1/services",
    responses={
        201: success("created", ServiceWritten),
        400: BAD,
        403: NO_IDENTITY,
        409: CONFLICT,
        503: UNAVAILABLE,
        **BODY_ERRORS,
        422: KEY_REUSED,
    },
)
def create_service(
    request: CreateServiceRequest, idempotency_key: IdempotencyKeyHeader = None
) -> Reply[ServiceWritten]:
    from fleetkeeper.api.services import Written  # build_commands imported it already

    return replayable(
        commands(),
        app.current_request.lambda_context,
        "create",
        request.name,
        app.current_request.json_body,  # what a replay must match: the request as sent
        lambda: Written(commands().create(request.name, request.spec)),
        key=idempotency_key_of(idempotency_key),
        status=201,
        secret_values=request.spec.secret_values(),
    )


@app.post(
    "/v1/workdirs",
    responses={
        200: success("where to upload, or that no upload is needed", WorkdirUpload, etag_header=False),
        400: BAD,
        403: NO_IDENTITY,
        503: UNAVAILABLE,
        **BODY_ERRORS,
    },
)
def workdir_upload(request: WorkdirUploadRequest) -> Reply[WorkdirUpload]:
    """Where a packed workdir goes: a presigned upload, or null when the store has it already."""
    upload = commands().workdir_upload(request.digest, request.size, request.service)
    return json_reply(
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
        200: success(
            "a page of the services the caller may read (it may hold fewer than `limit`, even none, while "
            "`next_token` is set: follow it until null)",
            ServiceList,
            etag_header=False,
        ),
        400: BAD,
        403: NO_IDENTITY,
        503: UNAVAILABLE,
    },
)
def list_services(
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Reply[ServiceList]:
    services, token = commands().list_page(limit=limit, next_token=next_token)
    return json_reply(200, {"services": [summary(s) for s in services], "next_token": token})


@app.get("/v1/services/<name>", responses={200: success("the service", ServiceView), **READ_ERRORS})
def get_service(name: ServiceNameParam) -> Reply[ServiceView]:
    this = commands()
    return with_etag(200, this.get(name), this)


@app.put(
    "/v1/services/<name>",
    responses={
        200: success(
            "updated: a new version; or, with `changed` false, the spec is the target's already", ServiceWritten
        ),
        **ERRORS,
        **BODY_ERRORS,
        412: STALE,
        422: KEY_REUSED,
    },
)
def update_service(
    name: ServiceNameParam,
    request: UpdateServiceRequest,
    if_match: IfMatchHeader = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Reply[ServiceWritten]:
    expected = expected_generation(if_match)
    return replayable(
        commands(),
        app.current_request.lambda_context,
        "update",
        name,
        {"body": app.current_request.json_body, "if_match": expected},
        lambda: commands().update(name, request.spec, mode=request.mode, expected_generation=expected),
        key=idempotency_key_of(idempotency_key),
        status=200,
        secret_values=request.spec.secret_values(),
    )


@app.get(
    "/v1/services/<name>/versions",
    responses={200: success("a page of versions", VersionList), **READ_ERRORS},
)
def list_versions(
    name: ServiceNameParam,
    limit: Annotated[int, Query(ge=1, le=MAX_VERSIONS_PAGE)] = DEFAULT_VERSIONS_PAGE,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Reply[VersionList]:
    service, versions, token = commands().versions_page(name, limit=limit, next_token=next_token)
    return json_reply(
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
    responses={200: success("a page of events, newest first", EventList, etag_header=False), **READ_ERRORS},
)
def list_events(
    name: ServiceNameParam,
    limit: Annotated[int, Query(ge=1, le=EVENTS_KEPT)] = DEFAULT_EVENTS_PAGE,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Reply[EventList]:
    events, token = commands().events_page(name, limit=limit, next_token=next_token)
    return json_reply(200, {"events": [event_view(e) for e in events], "next_token": token})


@app.get(
    "/v1/services/<name>/metrics",
    responses={
        200: success(
            "the endpoint's request rate over time, against the replicas' target (for a dashboard's plot)",
            MetricsView,
            etag_header=False,
        ),
        **READ_ERRORS,
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
    return json_reply(200, metrics_view(state, points, commands_now.metric_period_seconds))


@app.post(
    "/v1/services/<name>/rollback",
    responses={
        200: success("rolled back (or, with `changed` false, at that version already)", ServiceWritten),
        **ERRORS,
        **BODY_ERRORS,
        412: STALE,
    },
)
def rollback_service(name: ServiceNameParam, if_match: IfMatchHeader = None) -> Reply[ServiceWritten]:
    # The body is optional (POST with none rolls back to the previous version): read here, so an empty
    # body is not a validation error; openapi_document._as_answered documents it.
    request = _optional_body(RollbackRequest)
    expected = expected_generation(if_match)
    state = commands().rollback(name, request.version, expected_generation=expected)
    return written_reply(200, state)


@app.delete(
    "/v1/services/<name>",
    responses={202: success("deleting (status SHUTTING_DOWN)", ServiceWritten), **READ_ERRORS, 403: FORBIDDEN},
)
def delete_service(name: ServiceNameParam) -> Reply[ServiceWritten]:
    return written_reply(202, commands().delete(name))


@app.delete(
    "/v1/services/<name>/replicas/<replica_id>",
    responses={
        202: success(
            "the replica is drained, terminated and replaced; `changed` false: asked for or leaving already",
            ReplicaTerminating,
        ),
        **ERRORS,
    },
)
def terminate_replica(name: ServiceNameParam, replica_id: ReplicaIdParam) -> Reply[ReplicaTerminating]:
    """Terminate one replica (SkyPilot's `sky serve down NAME --replica-id N`): the reconciler drains it,
    terminates its instance and launches its replacement. Needs write access to the service."""
    this = commands()
    state, changed = this.terminate_replica(name, replica_id)
    return json_reply(202, {**state_view(state, this), "changed": changed}, {"ETag": etag(state.service.generation)})


@app.post(
    "/v1/services/<name>/access",
    responses={
        200: success(
            "who may access the service now; `changed` false: it named these grants already",
            AccessView,
            etag_header=False,
        ),
        **ERRORS,
        **BODY_ERRORS,
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
        raise InvalidRequest(summarise(details), details=details)
    service, changed = commands().change_access(name, add, remove)
    return json_reply(200, {**access_view(service), "changed": changed})


def openapi_json() -> str:
    """The OpenAPI 3 document of this api (also checked in as docs/openapi.json)."""
    from fleetkeeper.api.openapi_document import openapi_json as document_of

    return document_of(app)


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
        raise InvalidRequest(summarise(details), details=details) from exc


# --- errors: answered as fleetkeeper.api.error_replies says -------------------------------------------

app.exception_handler(FleetkeeperError)(domain_error)
app.exception_handler(RequestValidationError)(validation_error)
app.exception_handler(UnsupportedContentType)(unsupported_content_type)
app.not_found(no_route)


@app.exception_handler(Exception)
def _unexpected(exc: Exception) -> Reply[Any]:
    logger.exception("unhandled error")
    body = {"error": {"code": "internal_error", "message": "internal error; it has been logged", "details": []}}
    return json_reply(500, body)


# --- entry point --------------------------------------------------------------------------------------


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    refused = refuse_body(event)
    if refused is not None:
        return refused
    # Settings are read once per invocation, and the commands built from them live as long as it.
    settings = Settings.from_env(os.environ)
    try:
        caller = caller_of(event, settings)
    except Forbidden as no_identity:
        return error_response(no_identity)
    with acting_with(build_commands(settings, caller)):
        return app.resolve(event, context)
