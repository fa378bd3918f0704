"""The api against moto: every route of the table in docs/architecture/api.md, and each of its errors."""

from __future__ import annotations

import json
import random

import pytest

from fleetkeeper.errors import Conflict
from fleetkeeper.model import ServiceStatus
from tests.support.handler_client import HandlerClient
from tests.support.reconciler_world import World, tags
from tests.support.specs import hello_spec


def create(api: HandlerClient, name: str = "web", **spec: object) -> dict[str, object]:
    response = api.post("/v1/services", {"name": name, "spec": hello_spec(**spec)})
    assert response.status == 201, response.body
    return dict(response.body)


def assert_error(response, status: int, code: str | None = None, mentions: str | None = None) -> None:  # type: ignore[no-untyped-def]
    assert response.status == status, response.body
    assert set(response.body) == {"error"}
    error = response.body["error"]
    assert set(error) == {"code", "message", "details"}
    assert isinstance(error["message"], str) and error["message"]
    if code:
        assert error["code"] == code
    if mentions:
        assert mentions in error["message"], error["message"]


# --- POST /v1/services ---------------------------------------------------------------------------


def test_create_returns_the_view_with_version_1(api: HandlerClient) -> None:
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert response.status == 201
    view = response.body
    for field in (
        "name",
        "uid",
        "status",
        "status_message",
        "lifecycle",
        "target_version",
        "latest_version",
        "generation",
        "observed_generation",
        "created_at",
        "updated_at",
        "spec",
        "mode",
    ):
        assert field in view
    # A write answers the service and its target, never the replica list (see test_idempotency).
    assert "replicas" not in view
    assert view["name"] == "web"
    assert view["lifecycle"] == "ACTIVE"
    assert (view["target_version"], view["latest_version"], view["generation"]) == (1, 1, 1)
    assert view["status"] == "NO_REPLICA"
    assert view["spec"]["service"]["replicas"] == 2
    assert api.get("/v1/services/web").body["replicas"] == []
    assert response.headers["ETag"] == '"1"'


def test_create_duplicate_is_409(api: HandlerClient) -> None:
    create(api)
    assert_error(api.post("/v1/services", {"name": "web", "spec": hello_spec()}), 409, "conflict", "already exists")


def test_create_while_deleting_is_409(api: HandlerClient) -> None:
    create(api)
    assert api.delete("/v1/services/web").status == 202
    assert_error(api.post("/v1/services", {"name": "web", "spec": hello_spec()}), 409, "conflict", "being deleted")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Web", "spec": hello_spec()}, "name"),
        ({"name": "a" * 64, "spec": hello_spec()}, "name"),
        ({"name": "web"}, "spec"),
        ({"spec": hello_spec()}, "name"),
        ({"name": "web", "spec": hello_spec(), "colour": "red"}, "colour"),
        ({"name": "web", "spec": hello_spec(file_mounts={"/a": "b"})}, "spec.file_mounts"),
        ({"name": "web", "spec": hello_spec(workdir=".")}, "spec.workdir"),
        ({"name": "web", "spec": hello_spec(resources={"accelerators": "A100:1"})}, "spec.resources"),
        (
            {"name": "web", "spec": hello_spec(service={"readiness_probe": "/h", "replicas": -1})},
            "spec.service.replicas",
        ),
        ({"name": "web", "spec": {**hello_spec(), "run": ""}}, "spec.run"),
        ({"name": "web", "spec": "not a mapping"}, "spec"),
    ],
)
def test_create_invalid_is_400_naming_the_field(api: HandlerClient, body: dict[str, object], field: str) -> None:
    response = api.post("/v1/services", body)
    assert_error(response, 400, "invalid_request", field)
    assert any(d["field"].startswith(field) for d in response.error["details"]), response.error
    assert api.get("/v1/services").body["services"] == []  # nothing written


def test_create_with_invalid_json_is_400(api: HandlerClient) -> None:
    assert_error(api.post("/v1/services", raw="{not json"), 400, "invalid_request", "not valid JSON")


def test_create_with_an_oversized_body_is_413(api: HandlerClient) -> None:
    spec = hello_spec(envs={"BIG": "x" * (70 * 1024)})
    assert_error(api.post("/v1/services", {"name": "web", "spec": spec}), 413, "payload_too_large", "64 KiB")
    assert api.get("/v1/services").body["services"] == []


def test_spec_name_must_match(api: HandlerClient) -> None:
    response = api.post("/v1/services", {"name": "web", "spec": {**hello_spec(), "name": "other"}})
    assert_error(response, 400, "invalid_request", "spec.name")


# --- GET /v1/services ----------------------------------------------------------------------------


def test_list_pages_through_every_service(api: HandlerClient) -> None:
    names = [f"svc-{i:02d}" for i in range(7)]
    for name in names:
        create(api, name)
    seen: list[str] = []
    token = None
    for _ in range(10):
        path = "/v1/services?limit=3" + (f"&next_token={token}" if token else "")
        response = api.get(path)
        assert response.status == 200
        assert len(response.body["services"]) <= 3
        seen += [s["name"] for s in response.body["services"]]
        token = response.body["next_token"]
        if token is None:
            break
    assert seen == names


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=ten", "next_token=garbage!!", "next_token=e30"])
def test_list_with_bad_parameters_is_400(api: HandlerClient, query: str) -> None:
    assert_error(api.get(f"/v1/services?{query}"), 400, "invalid_request")


# --- GET /v1/services/{name} ---------------------------------------------------------------------


def test_get_returns_the_view(api: HandlerClient) -> None:
    created = create(api)
    response = api.get("/v1/services/web")
    assert response.status == 200
    assert response.body["uid"] == created["uid"]
    assert response.body["replicas"] == []
    assert response.headers["ETag"] == '"1"'


def test_get_missing_is_404(api: HandlerClient) -> None:
    assert_error(api.get("/v1/services/nope"), 404, "not_found", "nope")


def test_get_with_an_invalid_name_is_400(api: HandlerClient) -> None:
    assert_error(api.get("/v1/services/Not_A_Name"), 400, "invalid_request", "name")


# --- PUT /v1/services/{name} ---------------------------------------------------------------------


def test_update_adds_a_version_and_moves_the_target(api: HandlerClient) -> None:
    create(api)
    response = api.put("/v1/services/web", {"spec": hello_spec(envs={"V": 2}), "mode": "blue_green"})
    assert response.status == 200, response.body
    assert (response.body["target_version"], response.body["latest_version"]) == (2, 2)
    assert response.body["generation"] == 2
    assert response.body["mode"] == "blue_green"
    assert response.body["spec"]["envs"] == {"V": "2"}
    assert response.headers["ETag"] == '"2"'


@pytest.mark.parametrize("if_match", ["1", '"1"', 'W/"1"'])
def test_update_with_the_current_generation_succeeds(api: HandlerClient, if_match: str) -> None:
    create(api)
    response = api.put("/v1/services/web", {"spec": hello_spec()}, headers={"If-Match": if_match})
    assert response.status == 200, response.body


def test_update_with_a_stale_generation_is_412(api: HandlerClient) -> None:
    create(api)
    assert api.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}).status == 200
    response = api.put("/v1/services/web", {"spec": hello_spec(envs={"V": "3"})}, headers={"If-Match": "1"})
    assert_error(response, 412, "precondition_failed", "generation 2")
    assert api.get("/v1/services/web").body["latest_version"] == 2


def test_update_with_a_malformed_if_match_is_400(api: HandlerClient) -> None:
    create(api)
    assert_error(api.put("/v1/services/web", {"spec": hello_spec()}, headers={"If-Match": "abc"}), 400)


def test_update_missing_is_404(api: HandlerClient) -> None:
    assert_error(api.put("/v1/services/nope", {"spec": hello_spec()}), 404, "not_found")


def test_update_while_deleting_is_409(api: HandlerClient) -> None:
    create(api)
    api.delete("/v1/services/web")
    assert_error(api.put("/v1/services/web", {"spec": hello_spec()}), 409, "conflict", "being deleted")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"spec": hello_spec(), "mode": "canary"}, "mode"),
        (
            {"spec": hello_spec(update={"mode": "rolling", "max_surge": 0, "max_unavailable": 0})},
            "spec.update",
        ),
        ({}, "spec"),
    ],
)
def test_update_invalid_is_400(api: HandlerClient, body: dict[str, object], field: str) -> None:
    create(api)
    assert_error(api.put("/v1/services/web", body), 400, "invalid_request", field)
    assert api.get("/v1/services/web").body["latest_version"] == 1


# --- versions and rollback -----------------------------------------------------------------------


def test_versions_lists_every_version_in_order(api: HandlerClient) -> None:
    create(api)
    api.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})})
    response = api.get("/v1/services/web/versions")
    assert response.status == 200
    assert [v["version"] for v in response.body["versions"]] == [1, 2]
    assert response.body["versions"][1]["spec"]["envs"] == {"V": "2"}
    assert response.body["target_version"] == 2


def test_versions_of_a_missing_service_is_404(api: HandlerClient) -> None:
    assert_error(api.get("/v1/services/nope/versions"), 404, "not_found")


def test_rollback_defaults_to_the_version_before_the_target(api: HandlerClient) -> None:
    create(api)
    api.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})})
    response = api.post("/v1/services/web/rollback")
    assert response.status == 200, response.body
    assert (response.body["target_version"], response.body["latest_version"]) == (1, 2)
    assert response.body["generation"] == 3


def test_rollback_to_a_given_version(api: HandlerClient) -> None:
    create(api)
    for i in (2, 3):
        api.put("/v1/services/web", {"spec": hello_spec(envs={"V": str(i)})})
    response = api.post("/v1/services/web/rollback", {"version": 1})
    assert response.status == 200
    assert response.body["target_version"] == 1
    assert response.body["spec"]["envs"] == {}


def test_rollback_to_a_missing_version_is_404_and_writes_nothing(api: HandlerClient) -> None:
    create(api)
    assert_error(api.post("/v1/services/web/rollback", {"version": 9}), 404, "not_found", "no version 9")
    assert api.get("/v1/services/web").body["generation"] == 1


def test_rollback_with_no_earlier_version_is_400(api: HandlerClient) -> None:
    create(api)
    assert_error(api.post("/v1/services/web/rollback"), 400, "invalid_request", "no earlier version")


@pytest.mark.parametrize("body", [{"version": 0}, {"version": "two"}, {"to": 1}, [1]])
def test_rollback_with_a_bad_body_is_400(api: HandlerClient, body: object) -> None:
    create(api)
    assert_error(api.post("/v1/services/web/rollback", body), 400, "invalid_request")


def test_rollback_while_deleting_is_409(api: HandlerClient) -> None:
    create(api)
    api.put("/v1/services/web", {"spec": hello_spec()})
    api.delete("/v1/services/web")
    assert_error(api.post("/v1/services/web/rollback"), 409, "conflict")


def test_rollback_of_a_missing_service_is_404(api: HandlerClient) -> None:
    assert_error(api.post("/v1/services/nope/rollback"), 404, "not_found")


def test_rollback_with_a_stale_if_match_is_412(api: HandlerClient) -> None:
    create(api)
    api.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})})
    assert_error(api.post("/v1/services/web/rollback", headers={"If-Match": "1"}), 412, "precondition_failed")


# --- DELETE --------------------------------------------------------------------------------------


def test_delete_marks_the_service_for_teardown_and_repeats_harmlessly(api: HandlerClient) -> None:
    create(api)
    first = api.delete("/v1/services/web")
    assert first.status == 202
    assert first.body["status"] == "SHUTTING_DOWN"
    assert first.body["lifecycle"] == "DELETING"
    assert first.body["generation"] == 2
    again = api.delete("/v1/services/web")
    assert again.status == 202
    assert again.body["generation"] == 2


def test_delete_missing_is_404(api: HandlerClient) -> None:
    assert_error(api.delete("/v1/services/nope"), 404, "not_found")


# --- misc ----------------------------------------------------------------------------------------


def test_openapi_document_describes_every_route(api: HandlerClient) -> None:
    response = api.get("/v1/openapi.json")
    assert response.status == 200
    document = response.body
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    assert set(paths) >= {
        "/v1/services",
        "/v1/services/{name}",
        "/v1/services/{name}/versions",
        "/v1/services/{name}/rollback",
    }
    assert set(paths["/v1/services/{name}"]) == {"get", "put", "delete"}
    assert "CreateServiceRequest" in json.dumps(document)


def test_unknown_route_is_404_with_the_error_shape(api: HandlerClient) -> None:
    assert_error(api.get("/v2/whatever"), 404, "no_route")


def test_method_not_routed_is_4xx_with_the_error_shape(api: HandlerClient) -> None:
    response = api.call("PATCH", "/v1/services/web", {"spec": hello_spec()})
    assert 400 <= response.status < 500
    assert set(response.body["error"]) == {"code", "message", "details"}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_415(api: HandlerClient, content_type: str) -> None:
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers={"Content-Type": content_type})
    assert_error(response, 415, "unsupported_media_type", "application/json")
    assert api.get("/v1/services/web").status == 404


# Guards a regression found by review (commit 5faa8d0): a rollback could land on a version the breaker had
# FAILED (now a 409; the default skips it).
def test_rollback_skips_and_refuses_versions_the_breaker_failed(world: World) -> None:
    world.create()
    world.converge()
    world.update(envs={"V": "2"})
    current = world.store.require("svc")
    failed = "version 2 failed: 3 replica failures"
    world.reconciler.store.trip_breaker(
        current.service, 2, failed, 1, status_message=f"rolling back to version 1: {failed}"
    )
    world.converge()
    world.update(envs={"V": "3"})
    world.converge()
    commands = world.commands
    with pytest.raises(Conflict, match=r"version 2 .* failed"):
        commands.rollback("svc", 2, expected_generation=None)
    rolled = commands.rollback("svc", None, expected_generation=None)  # the default skips v2
    assert rolled.state.service.target_version == 1
    world.converge()
    after = world.store.require("svc")
    assert after.service.status is ServiceStatus.READY
    assert [i for i in world.instances() if tags(i).get("fleetkeeper:uid") == after.service.uid]


# Guards a regression found by review (commit 5faa8d0): a spec whose user data EC2 would refuse was
# accepted (now a 400).
def test_a_spec_whose_user_data_ec2_would_refuse_is_a_400(api: HandlerClient) -> None:
    rnd = random.Random(7)
    # Two draws: setup and run share their preamble (fleetkeeper.spec.runtime), so the same text in
    # both would be the same bytes twice, which gzip stores once.
    setup, run = ("".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12_000)) for _ in "ab")
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec(setup=f"echo {setup}", run=f"echo {run}")})
    assert response.status == 400, response.body
    assert "user data" in response.error["message"]
    assert api.get("/v1/services/web").status == 404
