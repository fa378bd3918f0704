"""Client input that AWS refuses but moto accepts: on the strict-AWS layer each was a 500.

Invariant 8 (docs/architecture/invariants.md): nothing a client sends yields a 5xx, judged by AWS's rules. Each case
below was a 500 on the strict layer (DynamoDB's ValidationException escaped the api) and a 4xx on
moto; the api now refuses each before DynamoDB sees it, with a 400 naming the field.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.strict_aws import StrictAws
from tests.support.handler_client import HandlerClient, HttpResult
from tests.support.specs import hello_spec

THIRTY_NINE_DIGITS = "9" * 39


def _token(key: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, sort_keys=True).encode()).decode().rstrip("=")


@pytest.fixture
def service(strict_aws: StrictAws, api: HandlerClient) -> HandlerClient:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.post("/v1/services", {"name": "web2", "spec": hello_spec()}).status == 201
    return api


def _refused(response: HttpResult, field: str) -> None:
    assert response.status == 400, response.body
    assert field in [d["field"] for d in response.error["details"]], response.body


@pytest.mark.parametrize("if_match", [THIRTY_NINE_DIGITS, "9" * 5000, "¹", "٣", "1" + "0" * 9 + "1", "-1", "0x1f"])
def test_an_if_match_that_is_not_a_bounded_ascii_number_is_a_400_naming_the_header(
    service: HandlerClient, if_match: str
) -> None:
    _refused(service.put("/v1/services/web", {"spec": hello_spec()}, headers={"If-Match": if_match}), "If-Match")
    _refused(service.post("/v1/services/web/rollback", headers={"If-Match": if_match}), "If-Match")
    assert service.get("/v1/services/web").body["generation"] == 1  # nothing written


def test_an_if_match_within_bounds_still_reaches_the_store(service: HandlerClient) -> None:
    response = service.put("/v1/services/web", {"spec": hello_spec()}, headers={"If-Match": '"000000001"'})
    assert response.status == 200, response.body
    response = service.put("/v1/services/web", {"spec": hello_spec()}, headers={"If-Match": "1000000000"})
    assert response.status == 412, response.body


@pytest.mark.parametrize("version", [int(THIRTY_NINE_DIGITS), 10**9 + 1])
def test_a_rollback_to_an_unbounded_version_is_a_400_naming_it(service: HandlerClient, version: int) -> None:
    _refused(service.post("/v1/services/web/rollback", {"version": version}), "version")


def test_a_rollback_version_of_5000_digits_is_a_400(service: HandlerClient) -> None:
    response = service.call("POST", "/v1/services/web/rollback", raw='{"version": ' + "9" * 5000 + "}")
    assert response.status == 400, response.body


@pytest.mark.parametrize("query", ["limit=" + THIRTY_NINE_DIGITS, "limit=" + "9" * 5000, "limit=101"])
@pytest.mark.parametrize("path", ["/v1/services", "/v1/services/web/versions"])
def test_an_unbounded_limit_is_a_400_naming_it(service: HandlerClient, path: str, query: str) -> None:
    response = service.get(f"{path}?{query}")
    assert response.status == 400, response.body
    assert "limit" in json.dumps(response.body["error"]["details"])


def test_json_nested_100000_deep_is_a_4xx_not_a_recursion_error(service: HandlerClient) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert service.call("POST", "/v1/services", raw=deep).status == 413  # over 64 KiB: never parsed
    within = "[" * 30_000 + "]" * 30_000  # under 64 KiB, far deeper than the parser's stack
    for method, path in [("POST", "/v1/services"), ("PUT", "/v1/services/web"), ("POST", "/v1/services/web/rollback")]:
        _refused(service.call(method, path, raw=within), "body")
    nested = {"name": "web3", "spec": {**hello_spec(), "envs": json.loads("[" * 500 + "]" * 500)}}
    assert service.call("POST", "/v1/services", raw=json.dumps(nested)).status == 400


@pytest.mark.parametrize("path", ["/v1/services", "/v1/services/web/versions"])
def test_a_next_token_nested_deeply_is_a_400(service: HandlerClient, path: str) -> None:
    token = base64.urlsafe_b64encode(b"[" * 1500).decode()
    _refused(service.get(f"{path}?next_token={token}"), "next_token")


@pytest.mark.parametrize(
    "key",
    [
        {"PK": "SVC#web", "SK": "META", "list_pk": "OTHER", "list_sk": "web"},  # another index partition
        {"PK": "SVC#web", "SK": "META", "list_pk": "SERVICE", "list_sk": ""},  # empty strings
        {"PK": "", "SK": "", "list_pk": "SERVICE", "list_sk": ""},
        {"PK": "SVC#web", "SK": "META", "list_pk": "SERVICE", "list_sk": 7},  # wrong types
        {"PK": "SVC#web", "SK": ["META"], "list_pk": "SERVICE", "list_sk": "web"},
        {"PK": "SVC#web", "SK": "META", "list_pk": "SERVICE"},  # missing key
        {"PK": "SVC#web", "SK": "META", "list_pk": "SERVICE", "list_sk": "web", "x": "y"},  # extra key
        {"PK": "SVC#web", "SK": "V#x#0000000001", "list_pk": "SERVICE", "list_sk": "web"},  # not META
        {"PK": "SVC#web2", "SK": "META", "list_pk": "SERVICE", "list_sk": "web"},  # PK is not the name's
    ],
)
def test_a_forged_services_next_token_is_a_400(service: HandlerClient, key: dict[str, object]) -> None:
    _refused(service.get(f"/v1/services?limit=1&next_token={_token(key)}"), "next_token")


def test_a_next_token_the_api_issued_still_pages(service: HandlerClient) -> None:
    first = service.get("/v1/services?limit=1").body
    second = service.get(f"/v1/services?limit=1&next_token={first['next_token']}").body
    assert [s["name"] for s in first["services"] + second["services"]] == ["web", "web2"]


@pytest.mark.parametrize(
    "key",
    [
        {"PK": "SVC#web2", "SK": "V#{uid}#0000000001"},  # another service's versions
        {"PK": "SVC#web", "SK": "V#0123456789abcdef#0000000001"},  # another incarnation's
        {"PK": "SVC#web", "SK": "R#{uid}#0000000001"},  # a replica key
        {"PK": "SVC#web", "SK": "META"},
        {"PK": "SVC#web", "SK": ""},
        {"PK": "SVC#web", "SK": "V#{uid}#0000000001", "list_pk": "SERVICE"},
        {"PK": "SVC#web"},
    ],
)
def test_a_forged_versions_next_token_is_a_400(service: HandlerClient, key: dict[str, str]) -> None:
    uid = service.get("/v1/services/web").body["uid"]
    forged = {k: v.replace("{uid}", uid) for k, v in key.items()}
    _refused(service.get(f"/v1/services/web/versions?limit=1&next_token={_token(forged)}"), "next_token")
