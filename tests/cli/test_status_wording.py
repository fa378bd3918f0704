"""What `fleetkeeper status` says, read as a person reads it (issue 36): never more ready than wanted,
the overprovisioned replicas counted in what is wanted, and simulated GPUs said to be simulated."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.api.models import simulated_notes
from fleetkeeper.cli.waiting import desired_replicas, readiness, without_count
from fleetkeeper.model import ready_of
from fleetkeeper.spec.service import parse_spec
from tests.support.specs import hello_spec


@pytest.mark.parametrize(
    ("ready", "wanted", "text"),
    [
        (0, 2, "0/2 ready"),
        (2, 2, "2/2 ready"),
        # A scale-down's surplus is READY until it is drained: not "2/1 ready".
        (2, 1, "1/1 ready, 1 more being removed"),
        (3, 0, "0/0 ready, 3 more being removed"),
    ],
)
def test_ready_is_never_more_than_wanted(ready: int, wanted: int, text: str) -> None:
    assert ready_of(ready, wanted) == text


def test_the_cli_drops_the_reconcilers_count_in_either_form() -> None:
    assert without_count("1/1 ready, 1 more being removed; replica 2 SHUTTING_DOWN") == "replica 2 SHUTTING_DOWN"
    assert without_count("2/2 ready") == ""


def _view(policy: dict[str, Any], ready: int, autoscaled: int | None = None) -> dict[str, Any]:
    spec = hello_spec(service={"readiness_probe": "/health", "ports": 8080, **policy})
    scaling = None if autoscaled is None else {"target_replicas": autoscaled}
    replicas = [{"replica_id": i, "version": 1, "status": "READY"} for i in range(ready)]
    return {"spec": spec, "autoscaling": scaling, "replicas": replicas}


@pytest.mark.parametrize(
    ("policy", "autoscaled", "ready", "wanted", "text"),
    [
        ({"replicas": 2}, None, 2, 2, "2/2 ready"),
        # num_overprovision runs that many more: 1 + 1 READY is 2/2, not "2/1 ready".
        ({"replica_policy": {"min_replicas": 1, "num_overprovision": 1}}, None, 2, 2, "2/2 ready"),
        (
            {
                "replica_policy": {
                    "min_replicas": 1,
                    "max_replicas": 3,
                    "target_qps_per_replica": 2,
                    "num_overprovision": 1,
                }
            },
            2,
            3,
            3,
            "3/3 ready",
        ),
        ({"replicas": 1}, None, 2, 1, "1/1 ready, 1 more being removed"),
    ],
)
def test_readiness_counts_what_the_reconciler_wants(
    policy: dict[str, Any], autoscaled: int | None, ready: int, wanted: int, text: str
) -> None:
    view = _view(policy, ready, autoscaled)
    assert desired_replicas(view) == wanted
    assert readiness(view, 1) == text


def test_a_gpu_spec_in_embedded_mode_says_its_gpus_are_simulated() -> None:
    gpu = parse_spec(hello_spec(resources={"accelerators": "L4:1"}))
    assert simulated_notes(gpu) == [
        "embedded mode: GPUs simulated: the replica runs on this machine's CPU with "
        "SKYPILOT_NUM_GPUS_PER_NODE=1, and no GPU is used"
    ]
    assert simulated_notes(parse_spec(hello_spec())) == []  # t3.micro: nothing to simulate
