"""Idempotency-Key on POST and PUT: replays return the first result; faults are never cached."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.store.commands import CommandStore
from tests.store.test_store import all_items
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec


def test_a_replayed_create_returns_the_first_result(api: HandlerClient) -> None:
    body = {"name": "web", "spec": hello_spec()}
    first = api.post("/v1/services", body, headers={"Idempotency-Key": "k-1"})
    again = api.post("/v1/services", body, headers={"Idempotency-Key": "k-1"})
    assert (first.status, again.status) == (201, 201)
    assert again.body == first.body
    assert again.headers["ETag"] == first.headers["ETag"]
    # Without the key the same request is a plain duplicate.
    assert api.post("/v1/services", body).status == 409


def test_a_replayed_update_adds_one_version(api: HandlerClient) -> None:
    api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    body = {"spec": hello_spec(envs={"V": "2"})}
    first = api.put("/v1/services/web", body, headers={"Idempotency-Key": "deploy-42"})
    again = api.put("/v1/services/web", body, headers={"Idempotency-Key": "deploy-42"})
    assert (first.status, again.status) == (200, 200)
    assert again.body["target_version"] == 2
    assert [v["version"] for v in api.get("/v1/services/web/versions").body["versions"]] == [1, 2]


def test_the_same_key_with_another_body_is_refused(api: HandlerClient) -> None:
    api.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers={"Idempotency-Key": "k"})
    response = api.post("/v1/services", {"name": "api", "spec": hello_spec()}, headers={"Idempotency-Key": "k"})
    assert response.status == 422
    assert response.error["code"] == "idempotency_key_reused"
    assert api.get("/v1/services/api").status == 404


def test_requests_without_a_key_write_only_service_items(api: HandlerClient, table: str) -> None:
    api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    api.put("/v1/services/web", {"spec": hello_spec()})
    assert {item["PK"] for item in all_items(table)} == {"SVC#web"}


def test_keyed_requests_keep_their_own_expiring_records(api: HandlerClient, table: str) -> None:
    api.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers={"Idempotency-Key": "k"})
    records = [item for item in all_items(table) if not item["PK"].startswith("SVC#")]
    assert len(records) == 1
    assert records[0]["PK"].startswith("IDEMPOTENCY#")
    assert int(records[0]["expiration"]) > 0  # the table's TTL attribute


def test_a_transient_fault_is_not_cached(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    real = CommandStore.create_service
    calls = {"n": 0}

    def flaky(self: CommandStore, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ClientError({"Error": {"Code": "InternalServerError", "Message": "boom"}}, "TransactWriteItems")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CommandStore, "create_service", flaky)
    body = {"name": "web", "spec": hello_spec()}
    assert api.post("/v1/services", body, headers={"Idempotency-Key": "k"}).status == 500
    retried = api.post("/v1/services", body, headers={"Idempotency-Key": "k"})
    assert retried.status == 201, retried.body


def test_a_domain_error_is_not_cached_either(api: HandlerClient) -> None:
    body = {"spec": hello_spec()}
    assert api.put("/v1/services/web", body, headers={"Idempotency-Key": "k"}).status == 404
    api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert api.put("/v1/services/web", body, headers={"Idempotency-Key": "k"}).status == 200


def test_an_empty_key_is_400(api: HandlerClient) -> None:
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec()}, headers={"Idempotency-Key": " "})
    assert response.status == 400
    assert "Idempotency-Key" in response.error["message"]
