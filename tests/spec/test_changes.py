"""Which version changes a running replica sees (fleetkeeper.spec.changes): the split between updates
that replace replicas and those that take effect on them in place."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleetkeeper.spec.changes import SERVICE, TOP_LEVEL, replica_visible
from fleetkeeper.spec.service import ServiceSection, ServiceSpec
from tests.support.specs import hello_spec

DIGEST = "sha256:" + "a" * 64


def _spec(change: dict[str, Any] | None = None) -> ServiceSpec:
    data = hello_spec(envs={"A": "1"}, setup="echo hi", workdir={"digest": DIGEST})
    data["service"] = {"readiness_probe": {"path": "/health"}, "replicas": 2, "ports": 8080}
    for dotted, value in (change or {}).items():
        *path, last = dotted.split(".")
        here = data
        for part in path:
            here = here.setdefault(part, {})
        here[last] = value
    return ServiceSpec.model_validate(copy.deepcopy(data))


def test_every_field_of_the_spec_is_classified() -> None:
    # A new spec field must be put in TOP_LEVEL or SERVICE: replaced, or kept in place.
    assert set(TOP_LEVEL) == set(ServiceSpec.model_fields)
    assert set(SERVICE) == set(ServiceSection.model_fields)


IN_PLACE = {
    "replicas": {"service.replicas": 3},
    "probe path": {"service.readiness_probe": {"path": "/ready"}},
    "probe timing": {
        "service.readiness_probe": {"path": "/health", "initial_delay_seconds": 30, "timeout_seconds": 40}
    },
    "probe post_data": {"service.readiness_probe": {"path": "/health", "post_data": '{"a": 1}'}},
    "autoscaling": {
        "service.replicas": None,
        "service.replica_policy": {"min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": 5},
    },
    "update policy": {"update": {"mode": "blue_green"}},
    "drain": {"service.drain_seconds": 120},
    "load balancing": {"service.load_balancing_policy": "round_robin"},
    "the same port spelled another way": {"service.ports": "8080"},
    "the same port given in resources": {"service.ports": None, "resources.ports": 8080},
    "the default port written out": {"service.ports": None},
}
ROLLS = {
    "run": {"run": "python3 app.py"},
    "setup": {"setup": "pip install x"},
    "envs": {"envs": {"A": "2"}},
    "secret names": {"secrets": {"TOKEN": "t"}},
    "workdir": {"workdir": {"digest": "sha256:" + "b" * 64}},
    "instance type": {"resources.instance_type": "t3.small"},
    "image": {"resources.image_id": "ami-0123456789abcdef0"},
    "disk": {"resources.disk_size": 64},
    "spot": {"resources.use_spot": True},
    "the replica's port": {"service.ports": 9090},
    "the port from resources": {"service.ports": None, "resources.ports": 9090},
}


@pytest.mark.parametrize("change", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_a_change_a_replica_does_not_run_is_in_place(change: dict[str, Any]) -> None:
    assert not replica_visible(_spec(), _spec(change))
    assert not replica_visible(_spec(change), _spec())  # a rollback follows the same rule


@pytest.mark.parametrize("change", ROLLS.values(), ids=ROLLS.keys())
def test_a_change_a_replica_runs_rolls(change: dict[str, Any]) -> None:
    assert replica_visible(_spec(), _spec(change))
    assert replica_visible(_spec(change), _spec())


def test_new_secret_values_roll_even_with_the_same_names() -> None:
    assert not replica_visible(_spec(), _spec())
    assert replica_visible(_spec(), _spec(), same_secrets=False)
