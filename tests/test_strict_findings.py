"""Client input that AWS refuses but moto accepts: on the strict-AWS layer the api answers 500.

Invariant 8 (DESIGN.md): nothing a client sends yields a 5xx, judged by AWS's rules. Each case
below is a 500 on the strict layer today (DynamoDB's ValidationException escapes the api) and a
4xx on moto. Marked xfail(strict=True): when the api is fixed they pass, and the marker must go.
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import ApiClient, hello_spec
from tests.strict_aws import StrictAws

THIRTY_NINE_DIGITS = "9" * 39


def _token(key: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, sort_keys=True).encode()).decode().rstrip("=")


@pytest.fixture
def service(strict_aws: StrictAws, api: ApiClient) -> ApiClient:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.post("/v1/services", {"name": "web2", "spec": hello_spec()}).status == 201
    return api


@pytest.mark.xfail(
    strict=True, raises=AssertionError, reason="If-Match becomes a DynamoDB number: over 38 digits DynamoDB refuses it"
)
def test_an_if_match_of_39_digits_is_a_4xx(service: ApiClient) -> None:
    response = service.put("/v1/services/web", {"spec": hello_spec()}, headers={"If-Match": THIRTY_NINE_DIGITS})
    assert response.status < 500, response.body


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="the rollback version is bounded below only; over 38 digits DynamoDB refuses it",
)
def test_a_rollback_to_a_39_digit_version_is_a_4xx(service: ApiClient) -> None:
    response = service.post("/v1/services/web/rollback", {"version": int(THIRTY_NINE_DIGITS)})
    assert response.status < 500, response.body


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="decode_token checks the key's shape, not that list_pk is the index partition",
)
def test_a_next_token_of_another_index_partition_is_a_4xx(service: ApiClient) -> None:
    token = _token({"PK": "SVC#web", "SK": "META", "list_pk": "OTHER", "list_sk": "web"})
    response = service.get(f"/v1/services?limit=1&next_token={token}")
    assert response.status < 500, response.body
