"""The dashboard's backend (fleetkeeper.dashboard.backend): the spec a scale action sends."""

from __future__ import annotations

import pytest

from fleetkeeper.dashboard.backend import ActionRefused, scaled_spec
from tests.support.specs import hello_spec


def test_scaling_rewrites_only_a_fixed_count() -> None:
    assert scaled_spec(hello_spec(replicas=2), 5)["service"]["replicas"] == 5
    policy = {
        **hello_spec(),
        "service": {"readiness_probe": "/", "replica_policy": {"min_replicas": 1, "max_replicas": 1}},
    }
    assert scaled_spec(policy, 3)["service"]["replica_policy"] == {"min_replicas": 3, "max_replicas": 3}
    scaled = {
        **hello_spec(),
        "service": {"replica_policy": {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1}},
    }
    with pytest.raises(ActionRefused, match="autoscales"):
        scaled_spec(scaled, 2)
    with pytest.raises(ActionRefused, match="secrets \\(HF_TOKEN\\)"):
        scaled_spec({**hello_spec(), "secrets": {"HF_TOKEN": None}}, 2)
