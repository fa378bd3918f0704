"""The api's router: an API Gateway REST proxy event in, one route's function called with its
validated parameters, a proxy response out.

It does the part of Powertools' `APIGatewayRestResolver(enable_validation=True)` this api uses, the
same way: routes matched by method and path in the order they were declared (trailing slashes
ignored), path, query and header parameters and the JSON body validated by pydantic against the
function's annotations (errors collected into one RequestValidationError whose locations start with
"path", "query", "header" or "body"), the answer validated and serialized by its `Reply[Model]`
annotation, exceptions answered by the handler registered for the nearest class. The OpenAPI document
is made from the same declarations (fleetkeeper.api.openapi).

Why not Powertools' resolver: importing it runs `aws_lambda_powertools.event_handler`'s package
init, which imports every resolver Powertools has (AppSync's bring asyncio, all the event data
classes come along), and its OpenAPI layer: together about 0.4 of a bare `import boto3`, paid by
every cold start of the api for resolvers it never uses (docs/PERFORMANCE.md, cold start).

A route's signature is read, and its validators built, on the first request that reaches it: the
import stays cheap and an invocation builds its own route's only.
"""

from __future__ import annotations

import base64
import inspect
import json
import re
import typing
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pydantic.fields import FieldInfo

JSON = "application/json"
Location = Literal["path", "query", "header"]
BodyT = TypeVar("BodyT")
_Function = TypeVar("_Function", bound="Callable[..., Any]")

# A path parameter takes what Powertools' `<name>` takes: one segment of RFC 3986's characters
# (a name that is not the service pattern is refused by its validation, not by the match).
_SEGMENT = r"[-._~()'!*:@,;=+&$%<> \[\]{}|^\w]+"
_PARAMETER = re.compile(r"<(\w+)>")


class RequestValidationError(Exception):
    """The request's parameters or body do not validate: pydantic's errors, each `loc` starting with
    where it was found ("path", "query", "header", "body")."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(errors)} validation error(s)")
        self._errors = errors

    def errors(self) -> list[dict[str, Any]]:
        return self._errors


class UnsupportedContentType(Exception):
    """A route that takes a body was sent a Content-Type other than JSON."""

    def __init__(self, content_type: str) -> None:
        super().__init__(f"unsupported content type {content_type!r}")
        self.content_type = content_type


def is_json(content_type: str) -> bool:
    """application/json, or a +json media type, whatever its parameters (charset=...)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or media.endswith("+json")


class ResponseValidationError(Exception):
    """A route answered a body its `Reply[Model]` does not describe: fleetkeeper's bug, a 500."""


@dataclass(frozen=True)
class Param:
    """Where a parameter comes from, and its pydantic constraints (Path, Query, Header)."""

    location: Location
    field: FieldInfo
    alias: str | None = None  # the name it is sent as, when not the parameter's


def Path(**constraints: Any) -> Param:
    """A path parameter (`<name>` in the route)."""
    return Param("path", Field(**constraints))


def Query(**constraints: Any) -> Param:
    """A query string parameter."""
    return Param("query", Field(**constraints))


def Header(*, alias: str, **constraints: Any) -> Param:
    """A request header, by its name (`alias`, matched case-insensitively)."""
    return Param("header", Field(**constraints), alias=alias)


@dataclass
class Reply(Generic[BodyT]):
    """A route's answer. `body` is JSON-serializable, or `str` for JSON text already made; a route
    annotated `-> Reply[Model]` has its body validated and serialized as Model."""

    status_code: int
    body: Any
    headers: dict[str, str] | None = None

    def to_proxy(self) -> dict[str, Any]:
        """API Gateway's proxy response (REST APIs take multi-value headers)."""
        text = self.body if isinstance(self.body, str) else json.dumps(self.body, separators=(",", ":"))
        headers = {"Content-Type": JSON, **(self.headers or {})}
        return {
            "statusCode": self.status_code,
            "body": text,
            "isBase64Encoded": False,
            "multiValueHeaders": {name: [value] for name, value in headers.items()},
        }


def header(event: Mapping[str, Any], name: str) -> str | None:
    """A header of an API Gateway proxy event, by its name in any case (HTTP's names are)."""
    wanted = name.lower()
    for key, value in (event.get("headers") or {}).items():
        if str(key).lower() == wanted:
            return str(value)
    return None


@dataclass(frozen=True)
class Request:
    """The request being answered, as the route functions read it."""

    event: Mapping[str, Any]
    lambda_context: Any

    @property
    def http_method(self) -> str:
        return str(self.event.get("httpMethod") or "").upper()

    @property
    def path(self) -> str:
        return str(self.event.get("path") or "/")

    def header(self, name: str) -> str | None:
        """A request header's value, by its name in any case."""
        return header(self.event, name)

    @cached_property
    def decoded_body(self) -> str | None:
        body: str | None = self.event.get("body")
        if self.event.get("isBase64Encoded") and body:
            return base64.b64decode(body.encode()).decode()
        return body

    @cached_property
    def json_body(self) -> Any:
        """The body parsed as JSON; None without a body. json.JSONDecodeError if it is not JSON."""
        return json.loads(self.decoded_body) if self.decoded_body else None


@dataclass(frozen=True)
class Parameter:
    """A route function's parameter as the router reads it (and the OpenAPI document shows it)."""

    name: str
    location: Location
    key: str  # the path's group, the query's name, the header's name lower-cased
    title: str  # the name it is sent as, as written (If-Match)
    adapter: TypeAdapter[Any]
    required: bool
    default: Any
    annotation: Any  # Annotated[type, FieldInfo]: what the OpenAPI document describes


@dataclass(frozen=True)
class _Signature:
    parameters: tuple[Parameter, ...]
    body: tuple[str, type[BaseModel]] | None
    reply: TypeAdapter[Any] | None


@dataclass
class Route:
    method: str
    rule: str  # as declared: /v1/services/<name>
    function: Callable[..., Any]
    responses: dict[int, dict[str, Any]]
    include_in_schema: bool

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """The path's match: each `<name>` a named group of one segment, trailing slashes ignored."""
        return re.compile("^" + _PARAMETER.sub(lambda m: f"(?P<{m[1]}>{_SEGMENT})", self.rule) + "/*$")

    @property
    def path(self) -> str:
        """The route as OpenAPI and API Gateway write it: /v1/services/{name}."""
        return _PARAMETER.sub(r"{\1}", self.rule)

    @cached_property
    def signature(self) -> _Signature:
        """The function's parameters, body and reply, read from its annotations (on first use)."""
        hints = typing.get_type_hints(self.function, include_extras=True)
        parameters: list[Parameter] = []
        body: tuple[str, type[BaseModel]] | None = None
        for name, declared in inspect.signature(self.function).parameters.items():
            hint = hints[name]
            marker = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Param)), None)
            if marker is None:
                if not (isinstance(hint, type) and issubclass(hint, BaseModel)):
                    raise TypeError(f"{self.function.__name__}: parameter {name!r} is neither a Param nor a body model")
                body = (name, hint)
                continue
            annotation: Any = Annotated[(typing.get_args(hint)[0], marker.field)]
            required = declared.default is inspect.Parameter.empty
            sent_as = marker.alias or name
            key = sent_as.lower() if marker.location == "header" else sent_as
            default = None if required else declared.default
            parameters.append(
                Parameter(name, marker.location, key, sent_as, TypeAdapter(annotation), required, default, annotation)
            )
        order = {"path": 0, "query": 1, "header": 2}
        parameters.sort(key=lambda p: order[p.location])
        returned = hints.get("return")
        reply_model = typing.get_args(returned)[0] if typing.get_origin(returned) is Reply else Any
        reply = None if reply_model is Any else TypeAdapter(reply_model)
        return _Signature(tuple(parameters), body, reply)


_current: ContextVar[Request] = ContextVar("fleetkeeper_api_request")


class Router:
    """Routes, their exception handlers, and the request being answered."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        self._handlers: dict[type[BaseException], Callable[[Any], Reply[Any]]] = {}
        self._not_found: Callable[[Request], Reply[Any]] | None = None

    # -- declaring --

    def route(
        self, method: str, rule: str, *, responses: dict[int, Any] | None = None, include_in_schema: bool = True
    ) -> Callable[[_Function], _Function]:
        def register(function: _Function) -> _Function:
            self.routes.append(
                Route(method, rule.rstrip("/") or "/", function, dict(responses or {}), include_in_schema)
            )
            return function

        return register

    def get(self, rule: str, **options: Any) -> Callable[[_Function], _Function]:
        return self.route("GET", rule, **options)

    def post(self, rule: str, **options: Any) -> Callable[[_Function], _Function]:
        return self.route("POST", rule, **options)

    def put(self, rule: str, **options: Any) -> Callable[[_Function], _Function]:
        return self.route("PUT", rule, **options)

    def delete(self, rule: str, **options: Any) -> Callable[[_Function], _Function]:
        return self.route("DELETE", rule, **options)

    def exception_handler(self, kind: type[BaseException]) -> Callable[[_Function], _Function]:
        def register(function: _Function) -> _Function:
            self._handlers[kind] = function
            return function

        return register

    def not_found(self, function: Callable[[Request], Reply[Any]]) -> Callable[[Request], Reply[Any]]:
        self._not_found = function
        return function

    # -- answering --

    @property
    def current_request(self) -> Request:
        return _current.get()

    def resolve(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        """Answer one API Gateway REST proxy event."""
        request = Request(event, context)
        token = _current.set(request)
        try:
            return self._answer(request).to_proxy()
        finally:
            _current.reset(token)

    def _answer(self, request: Request) -> Reply[Any]:
        try:
            for route in self.routes:
                match = route.pattern.match(request.path) if route.method == request.http_method else None
                if match is not None:
                    return self._call(route, request, match.groupdict())
            if self._not_found is None:
                return Reply(404, {"message": "Not found"})
            return self._not_found(request)
        except Exception as exc:
            handler = next((self._handlers[k] for k in type(exc).__mro__ if k in self._handlers), None)
            if handler is None:
                raise
            return handler(exc)

    def _call(self, route: Route, request: Request, path: dict[str, str]) -> Reply[Any]:
        signature = route.signature
        values: dict[str, Any] = {}
        errors: list[dict[str, Any]] = []
        sources: dict[str, Mapping[str, Any]] = {
            "path": path,
            "query": _query(request.event),
            "header": _headers(request.event),
        }
        for parameter in signature.parameters:
            raw = sources[parameter.location].get(parameter.key)
            loc = (parameter.location, parameter.key)
            if raw is None:
                if parameter.required:
                    errors.append(_missing(loc))
                else:
                    values[parameter.name] = parameter.default
                continue
            values[parameter.name] = _validated(parameter.adapter, raw, loc, errors)
        if signature.body is not None:
            name, model = signature.body
            content_type = request.header("Content-Type")
            if content_type and not is_json(content_type):
                raise UnsupportedContentType(content_type)
            body = _json_body(request)
            if body is None:
                errors.append(_missing(("body",)))
            else:
                try:
                    values[name] = model.model_validate(body)
                except ValidationError as exc:
                    errors.extend(_located(exc, ("body",)))
        if errors:
            raise RequestValidationError(errors)
        reply: Reply[Any] = route.function(**values)
        if signature.reply is not None and not isinstance(reply.body, str):
            try:
                valid = signature.reply.validate_python(reply.body)
            except ValidationError as exc:
                raise ResponseValidationError(f"{route.method} {route.rule}: {exc}") from exc
            reply.body = signature.reply.dump_python(valid, mode="json", by_alias=True)
        return reply


def _missing(loc: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "missing", "loc": loc, "msg": "Field required", "input": None}


def _validated(adapter: TypeAdapter[Any], raw: Any, loc: tuple[str, ...], errors: list[dict[str, Any]]) -> Any:
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        errors.extend(_located(exc, loc))
        return None


def _located(exc: ValidationError, loc: tuple[str, ...]) -> list[dict[str, Any]]:
    """pydantic's errors, each `loc` prefixed with where the value was found."""
    return [{**error, "loc": loc + tuple(error["loc"])} for error in exc.errors(include_url=False)]


def _json_body(request: Request) -> Any:
    try:
        return request.json_body
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": exc.msg}}]) from exc


def _one_value(values: list[Any] | Any) -> Any:
    """A parameter sent once is its value; sent more than once, the list (which a scalar refuses)."""
    if isinstance(values, list) and len(values) == 1:
        return values[0]
    return values


def _query(event: Mapping[str, Any]) -> dict[str, Any]:
    single: dict[str, Any] = event.get("queryStringParameters") or {}
    multi: dict[str, Any] = event.get("multiValueQueryStringParameters") or {}
    return {name: _one_value(value) for name, value in {**single, **multi}.items()}


def _headers(event: Mapping[str, Any]) -> dict[str, Any]:
    source = event.get("multiValueHeaders") or event.get("headers") or {}
    return {str(name).lower(): _one_value(value) for name, value in source.items()}
