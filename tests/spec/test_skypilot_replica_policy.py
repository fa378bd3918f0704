"""SkyPilot's replica_policy and load balancing spellings, taken with SkyPilot's meaning (issue 35, Deliver 3):
a target with min_replicas == max_replicas (a fixed count), `num_overprovision`, a target per
accelerator, `instance_aware_least_load`. Each was a 400 before."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.reconciler import autoscale
from fleetkeeper.spec.service import parse_spec


def spec_with(policy: dict[str, Any], **resources: Any) -> dict[str, Any]:
    return {"service": {"readiness_probe": "/", "replica_policy": policy}, "resources": resources, "run": "serve"}


def problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec(data)
    return {d["field"]: d["problem"] for d in caught.value.details}


def test_a_target_with_equal_bounds_is_a_fixed_count() -> None:
    """SkyPilot's autoscaling_policy_str: "Fixed 2 replicas"; its autoscaler clips every target to 2."""
    spec = parse_spec(spec_with({"min_replicas": 2, "max_replicas": 2, "target_qps_per_replica": 1}))
    assert spec.target_replicas == 2 and autoscale.policy_of(spec) is None
    spec = parse_spec(spec_with({"min_replicas": 2, "target_qps_per_replica": 1}))
    assert spec.target_replicas == 2 and autoscale.policy_of(spec) is None


def test_num_overprovision_is_taken() -> None:
    spec = parse_spec(
        spec_with({"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 2, "num_overprovision": 2})
    )
    assert spec.overprovision == 2
    assert spec.to_json_dict()["service"]["replica_policy"]["num_overprovision"] == 2
    assert parse_spec(spec_with({"min_replicas": 1})).overprovision == 0
    assert "num_overprovision" in problems(spec_with({"min_replicas": 1, "num_overprovision": -1})).popitem()[0]


def test_a_target_per_accelerator_is_taken_with_names_as_the_catalogue_spells_them() -> None:
    spec = parse_spec(
        spec_with(
            {"min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": {"a10g:1": 5, "L4": 2}},
            accelerators={"L4:1": None, "A10G:1": None},
        )
    )
    policy = spec.service.replica_policy
    assert policy is not None and policy.target_qps_per_replica == {"A10G": 5.0, "L4": 2.0}
    scaling = autoscale.policy_of(spec)
    assert scaling is not None
    assert (scaling.target_qps_per_replica, scaling.per_accelerator) == (5.0, (("A10G", 5.0), ("L4", 2.0)))


@pytest.mark.parametrize(
    ("targets", "accelerators", "words"),
    [
        ({"A10G": 5}, {"L4:1": None, "A10G:1": None}, "has none for L4 (g6.xlarge"),
        ({"A10": 5}, "A10G:1", "'A10' is not an accelerator AWS has: did you mean A10G?"),
        ({}, "A10G:1", "an empty mapping"),
        ({"A10G": 5, "a10g:1": 3}, "A10G:1", "A10G is given twice"),
        ({"A10G": 0}, "A10G:1", "too small: it must be above 0"),
        ({"A10G": 5}, None, "has none for the stack's default instance type (no accelerator)"),
    ],
)
def test_a_target_per_accelerator_that_misses_a_candidate_is_refused(
    targets: dict[str, float], accelerators: Any, words: str
) -> None:
    resources = {"accelerators": accelerators} if accelerators is not None else {}
    found = problems(spec_with({"min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": targets}, **resources))
    field = "spec.service.replica_policy.target_qps_per_replica"
    assert any(key.startswith(field) for key in found), found
    assert any(words in problem for problem in found.values()), found


def test_instance_aware_least_load_is_taken_as_least_load() -> None:
    data = spec_with({"min_replicas": 1})
    data["service"]["load_balancing_policy"] = "instance_aware_least_load"
    spec = parse_spec(data)
    assert spec.load_balancing_policy == "least_load"
    assert spec.to_json_dict()["service"]["load_balancing_policy"] == "instance_aware_least_load"  # kept as written
