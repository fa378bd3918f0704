"""Whole-plan tests of the pure planner (`fleetkeeper.reconciler.plan.plan`): a steady service plans
nothing, and a plan is a function of its inputs only (purity: it leaves them as they were and
reads no clock). Each of the planner's modules has its own table tests beside this file
(test_<module>.py).

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest
import time_machine

from fleetkeeper.model import Lifecycle, ServiceState, ServiceStatus
from fleetkeeper.reconciler.driver import Instance
from fleetkeeper.reconciler.plan import ProbeResult, RecordReplica, plan
from tests.support.builders import DOWN, NOW, OK, READY, S, ago, instance, replica, rolling_state, state, version


def test_steady_state_plans_nothing() -> None:
    ready = [replica(0, ready_at=ago(100)), replica(1, ready_at=ago(100))]
    current = state(ready, [version(1, READY)], status=ServiceStatus.READY, message="2/2 ready", observed=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == []


def _scenarios() -> dict[str, tuple[ServiceState, list[Instance], dict[int, ProbeResult]]]:
    """Inputs that between them take most of the planner's paths, each one planning record writes."""
    r0, r1 = replica(0), replica(1)
    return {
        "rolling step": (
            rolling_state([replica(2, v=2)], [r0, r1], max_surge=1, max_unavailable=0),
            [instance(0), instance(1), instance(2)],
            {0: OK, 1: OK, 2: OK},
        ),
        "failures and replacement": (
            state([replica(0, S.NOT_READY, probe_failures=2), r1, replica(2, S.PENDING)]),
            [instance(0, tags={"k": "v"}), instance(1)],
            {0: DOWN, 1: OK},
        ),
        "breaker": (
            state([replica(i, S.FAILED_PROBING) for i in range(2)] + [replica(2, S.STARTING, launched_at=ago(700))]),
            [instance(2)],
            {2: DOWN},
        ),
        "delete": (
            state([r0, replica(1, S.FAILED_PROBING)], lifecycle=Lifecycle.DELETING, seq=5),
            [instance(0), instance(1), instance(4, instance_id="i-stray")],
            {0: OK},
        ),
    }


SCENARIOS = _scenarios()


def _read_only(
    current: ServiceState, instances: list[Instance], probes: dict[int, ProbeResult]
) -> tuple[Any, Any, Any]:
    """The same inputs behind read-only views: a planner that wrote into them would raise."""
    frozen = replace(
        current,
        versions=MappingProxyType(current.versions),
        replicas=MappingProxyType(current.replicas),
    )
    return frozen, tuple(replace(i, tags=MappingProxyType(i.tags)) for i in instances), MappingProxyType(probes)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_plan_leaves_its_inputs_as_they_were(name: str) -> None:
    inputs = SCENARIOS[name]
    before = copy.deepcopy(inputs)
    actions = plan(*_read_only(*inputs), NOW)
    assert actions, "a scenario that plans nothing proves nothing"
    assert inputs == before
    assert actions == plan(*before, NOW)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_plan_depends_on_now_not_on_the_wall_clock(name: str) -> None:
    """The same inputs planned at two far-apart wall-clock times give the same actions."""
    with time_machine.travel(datetime(1999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC), tick=False):
        first = plan(*SCENARIOS[name], NOW)
    with time_machine.travel(datetime(2087, 7, 4, 6, 30, 1, 1_000, tzinfo=UTC), tick=False):
        second = plan(*SCENARIOS[name], NOW)
    assert any(isinstance(action, RecordReplica) for action in first)
    assert first == second
