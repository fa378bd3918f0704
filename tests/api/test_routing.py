"""The api's router on its own: matching, where a parameter is read from, the errors' locations, the
answer's validation, exception handlers. The api's behaviour through it is the rest of tests/api."""

from __future__ import annotations

import json
import threading
import time
from typing import Annotated, Any

import pytest
from pydantic import BaseModel

from fleetkeeper.api.routing import (
    Header,
    Path,
    Query,
    Reply,
    Request,
    RequestValidationError,
    ResponseValidationError,
    Router,
    UnsupportedContentType,
)
from fleetkeeper.aws.apigw import rest_event


class Thing(BaseModel):
    size: int


class ThingView(BaseModel):
    name: str
    size: int


def make_router() -> Router:
    router = Router()

    @router.get("/things/<name>")
    def get_thing(
        name: Annotated[str, Path(pattern="^[a-z]+$")],
        limit: Annotated[int, Query(ge=1, le=10)] = 5,
        tag: Annotated[str | None, Header(alias="X-Tag")] = None,
    ) -> Reply[ThingView]:
        return Reply(200, {"name": name, "size": limit, "tag": tag}, {"X-Tag": str(tag)})

    @router.post("/things/<name>/")
    def put_thing(name: Annotated[str, Path()], thing: Thing) -> Reply[ThingView]:
        return Reply(201, ThingView(name=name, size=thing.size))

    @router.get("/broken")
    def broken() -> Reply[ThingView]:
        return Reply(200, {"name": "x"})  # no size: not what it declares

    @router.get("/who")
    def who(n: Annotated[str, Query()]) -> Reply[Any]:
        time.sleep(0.001)  # let the other threads' requests interleave with this one
        return Reply(200, {"asked": n, "current": router.current_request.event["queryStringParameters"]["n"]})

    @router.exception_handler(RequestValidationError)
    def invalid(exc: RequestValidationError) -> Reply[Any]:
        return Reply(400, {"errors": [{"loc": list(e["loc"]), "type": e["type"]} for e in exc.errors()]})

    @router.exception_handler(LookupError)
    def lookup(exc: LookupError) -> Reply[Any]:
        return Reply(404, {"lookup": type(exc).__name__})

    @router.not_found
    def no_route(request: Request) -> Reply[Any]:
        return Reply(404, {"no_route": f"{request.http_method} {request.path}"})

    return router


def answer(router: Router, method: str, target: str, **kwargs: Any) -> tuple[int, dict[str, list[str]], Any]:
    response = router.resolve(rest_event(method, target, **kwargs), None)
    return response["statusCode"], response["multiValueHeaders"], json.loads(response["body"])


def test_a_route_is_matched_by_method_and_path_with_trailing_slashes_ignored() -> None:
    router = make_router()
    assert answer(router, "GET", "/things/box")[2] == {"name": "box", "size": 5}
    assert answer(router, "GET", "/things/box//")[0] == 200
    assert answer(router, "POST", "/things/box", body='{"size": 3}')[0] == 201  # declared with its slash
    assert answer(router, "DELETE", "/things/box")[2] == {"no_route": "DELETE /things/box"}
    assert answer(router, "GET", "/things/box/more")[2] == {"no_route": "GET /things/box/more"}


def test_parameters_are_read_from_their_place_and_validated_as_declared() -> None:
    router = make_router()
    status, headers, body = answer(router, "GET", "/things/box?limit=7", headers={"x-tag": "blue"})
    # The answer is its declared model's dump: the undeclared `tag` is not in it; headers are kept.
    assert (status, body, headers["X-Tag"], headers["Content-Type"]) == (
        200,
        {"name": "box", "size": 7},
        ["blue"],
        ["application/json"],
    )


def test_every_invalid_place_is_reported_at_once_each_with_its_location() -> None:
    router = make_router()
    status, _, body = answer(router, "GET", "/things/BOX?limit=0&limit=3")
    assert status == 400
    # The name breaks its pattern; a query parameter sent twice is a list, which an int refuses.
    assert body["errors"] == [
        {"loc": ["path", "name"], "type": "string_pattern_mismatch"},
        {"loc": ["query", "limit"], "type": "int_type"},
    ]


def test_a_body_is_validated_by_its_model_with_body_first_in_the_location() -> None:
    router = make_router()
    assert answer(router, "POST", "/things/box", body='{"size": "big"}')[2]["errors"] == [
        {"loc": ["body", "size"], "type": "int_parsing"}
    ]
    assert answer(router, "POST", "/things/box")[2]["errors"] == [{"loc": ["body"], "type": "missing"}]
    assert answer(router, "POST", "/things/box", body="null")[2]["errors"] == [{"loc": ["body"], "type": "missing"}]
    assert answer(router, "POST", "/things/box", body="[1]")[2]["errors"] == [{"loc": ["body"], "type": "model_type"}]
    assert answer(router, "POST", "/things/box", body="{")[2]["errors"] == [
        {"loc": ["body", 1], "type": "json_invalid"}
    ]


def test_a_body_route_sent_another_content_type_raises_unsupported_content_type() -> None:
    router = make_router()
    with pytest.raises(UnsupportedContentType, match="text/plain"):
        answer(router, "POST", "/things/box", headers={"Content-Type": "text/plain"})
    for media in ("application/json; charset=utf-8", "application/merge-patch+json"):
        assert answer(router, "POST", "/things/box", body='{"size": 1}', headers={"content-type": media})[0] == 201


def test_an_answer_its_model_does_not_describe_is_an_error_not_a_reply() -> None:
    with pytest.raises(ResponseValidationError, match="GET /broken"):
        answer(make_router(), "GET", "/broken")


def test_an_exception_is_answered_by_the_handler_of_its_nearest_class() -> None:
    router = make_router()

    @router.get("/missing")
    def missing() -> Reply[Any]:
        raise KeyError("x")

    assert answer(router, "GET", "/missing")[2] == {"lookup": "KeyError"}


def test_the_current_request_is_each_threads_own() -> None:
    router = make_router()
    seen: dict[str, Any] = {}

    def ask(name: str) -> None:
        for _ in range(50):
            body = answer(router, "GET", f"/who?n={name}")[2]
            if body != {"asked": name, "current": name}:
                seen[name] = body
        seen.setdefault(name, "ok")

    threads = [threading.Thread(target=ask, args=(str(n),)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {str(n): "ok" for n in range(4)}
    with pytest.raises(LookupError):  # no request outside resolve
        router.current_request  # noqa: B018


def test_a_routes_signature_is_read_on_its_first_request_not_when_declared() -> None:
    router = make_router()
    assert all("signature" not in route.__dict__ for route in router.routes)
    answer(router, "GET", "/things/box")
    assert ["signature" in route.__dict__ for route in router.routes] == [True, False, False, False]
