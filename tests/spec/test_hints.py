"""The refusals a SkyPilot user meets first, pinned word for word: what is wrong, and what to do."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec.service import parse_spec


def problems(spec: dict[str, Any]) -> list[dict[str, str]]:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec({"run": "serve", **spec})
    return list(caught.value.details)


def service(**fields: Any) -> dict[str, Any]:
    return {"service": {"readiness_probe": "/health", **fields}}


def test_an_initial_replica_count_says_what_sets_it_not_a_similar_field() -> None:
    assert problems(service(replica_policy={"min_replicas": 1, "max_replicas": 3, "init_replicas": 2})) == [
        {
            "field": "spec.service.replica_policy.init_replicas",
            "problem": "unsupported field: a service starts with its replica count: `service.replicas`, or "
            "`service.replica_policy.min_replicas` when it autoscales (the autoscaler moves from there); there is "
            "no separate initial count",
        }
    ]


@pytest.mark.parametrize(
    ("fields", "field", "instead"),
    [
        ({"spot_policy": "EagerFailover"}, "spec.service.spot_policy", "set `resources.use_spot: true`"),
        (
            {"replica_policy": {"min_replicas": 1, "spot_policy": "x"}},
            "spec.service.replica_policy.spot_policy",
            "service.replica_policy.base_ondemand_fallback_replicas or dynamic_ondemand_fallback",
        ),
        ({"spot_zones": ["us-east-1a"]}, "spec.service.spot_zones", "the ReplicaSubnetIds parameter"),
        ({"auth_key": "k"}, "spec.service.auth_key", "(`secrets: {API_KEY: null}` and --secret API_KEY)"),
    ],
)
def test_refused_skypilot_fields_say_what_to_do_instead(fields: dict[str, Any], field: str, instead: str) -> None:
    [problem] = problems(service(**fields))
    assert problem["field"] == field
    assert problem["problem"].startswith("unsupported field: ") and instead in problem["problem"]


def test_the_auth_key_refusal_whole() -> None:
    assert problems(service(auth_key="k"))[0]["problem"] == (
        "unsupported field: an endpoint has no key of its own: check one in your app, given as a secret "
        "(`secrets: {API_KEY: null}` and --secret API_KEY); the fleetkeeper API itself is signed with your AWS "
        "credentials (SigV4)"
    )


@pytest.mark.parametrize(
    ("policy_field", "meant"),
    [
        ("min_replica", "min_replicas"),
        ("max_replicsa", "max_replicas"),
        ("target_qps_per_replca", "target_qps_per_replica"),
    ],
)
def test_a_slip_of_the_keyboard_gets_did_you_mean(policy_field: str, meant: str) -> None:
    [problem] = problems(service(replica_policy={"min_replicas": 1, "max_replicas": 2, policy_field: 1}))
    assert problem["problem"] == f"unknown field; did you mean `{meant}`?"


def test_another_word_gets_no_suggestion() -> None:
    [problem] = problems(service(replica_policy={"min_replicas": 1, "minimum_replicas": 2}))
    assert problem["problem"] == "unknown field; fleetkeeper does not support it"


@pytest.mark.parametrize(
    ("fields", "field", "problem"),
    [
        ({"replicas": "two"}, "spec.service.replicas", "'two' is not a whole number"),
        ({"ports": "http"}, "spec.service.ports", "'http' is not a whole number"),
        (
            {"readiness_probe": {"path": "/", "initial_delay_seconds": -1}},
            "spec.service.readiness_probe.initial_delay_seconds",
            "-1 is too small: at least 0",
        ),
        (
            {"readiness_probe": 5},
            "spec.service.readiness_probe",
            "5 is not a mapping: give `key: value` lines under it",
        ),
    ],
)
def test_type_and_range_errors_are_said_in_the_specs_words(fields: dict[str, Any], field: str, problem: str) -> None:
    assert problems(service(**fields)) == [{"field": field, "problem": problem}]
