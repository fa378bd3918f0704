"""Each refusal said once: a create whose `name` and spec `name` are the same wrong value."""

from __future__ import annotations

from fleetkeeper.spec.service import NAME_RULE
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec


def test_a_bad_name_given_in_the_body_and_the_spec_is_refused_once(api: HandlerClient) -> None:
    response = api.post("/v1/services", {"name": "Bad_Name!", "spec": {**hello_spec(), "name": "Bad_Name!"}})
    assert response.status == 400, response.body
    problem = f"'Bad_Name!' is not a service name: use {NAME_RULE} (or give one with --name)"
    assert response.error["message"] == f"invalid request: spec.name: {problem}"
    assert response.error["details"] == [{"field": "spec.name", "problem": problem}]


def test_two_different_bad_names_are_both_refused(api: HandlerClient) -> None:
    response = api.post("/v1/services", {"name": "Bad_One", "spec": {**hello_spec(), "name": "Bad_Two"}})
    assert response.status == 400, response.body
    assert [d["field"] for d in response.error["details"]] == ["name", "spec.name"]
