"""A validated string is validated whole: `re.match` with `$` accepts a trailing newline ("web\\n"
matches `^[a-z][a-z0-9-]*$`), so every whole-string check uses `re.fullmatch`."""

from __future__ import annotations

import pytest

from fleetkeeper.spec.service import ServiceSpec
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec


def _assert_400_naming(api: HandlerClient, body: dict[str, object], field: str) -> None:
    response = api.post("/v1/services", body)
    assert response.status == 400, response.body
    assert response.error["code"] == "invalid_request"
    assert field in response.error["message"], response.error
    assert any(d["field"].startswith(field) for d in response.error["details"]), response.error
    assert api.get("/v1/services").body["services"] == []  # nothing written


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "web\n", "spec": hello_spec()}, "name"),
        ({"name": "web", "spec": {**hello_spec(), "name": "web\n"}}, "spec.name"),
        ({"name": "web", "spec": hello_spec(envs={"A\n": "x"})}, "spec.envs"),
        ({"name": "web", "spec": hello_spec(secrets={"TOKEN\n": "x"})}, "spec.secrets"),
        ({"name": "web", "spec": hello_spec(resources={"region": "us-east-1\n"})}, "spec.resources.region"),
        ({"name": "web", "spec": hello_spec(resources={"image_id": "ami-0123456789abcdef0\n"})}, "spec.resources"),
    ],
)
def test_a_trailing_newline_is_refused_naming_the_field(
    api: HandlerClient, body: dict[str, object], field: str
) -> None:
    _assert_400_naming(api, body, field)


def test_a_name_with_a_trailing_newline_in_the_path_is_400(api: HandlerClient) -> None:
    response = api.get("/v1/services/web%0A")
    assert response.status == 400, response.body
    assert "name" in response.error["message"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({**hello_spec(), "name": "web\n"}, "is not a service name"),
        (hello_spec(envs={"A\n": "x"}), "is not a valid shell name"),
        (hello_spec(secrets={"A\n": "x"}), "is not a valid shell name"),
        (hello_spec(workdir={"digest": "sha256:" + "0" * 64 + "\n"}), "sha256"),
        (hello_spec(resources={"region": "us-east-1\n"}), "is not an AWS region name"),
    ],
)
def test_the_spec_validators_refuse_a_trailing_newline(spec: dict[str, object], says: str) -> None:
    """The model's own validators (what the CLI runs before sending, and the stored-spec reader)."""
    with pytest.raises(ValueError, match=says):
        ServiceSpec.model_validate(spec)
