"""Table tests of plan/in_place.py: updates that keep replicas. A READY replica takes the target in
place when the change touches nothing it runs; any other is replaced.

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleetkeeper.model import ServiceStatus, VersionRecord, VersionState
from fleetkeeper.reconciler.plan import RecordReplica, plan
from fleetkeeper.spec.service import ServiceSpec
from tests.support.builders import (
    DOWN,
    NOW,
    OK,
    READY,
    S,
    ago,
    drained,
    instance,
    launches,
    mark_ready,
    moved,
    replica,
    spec,
    state,
    status,
    terminate,
    version,
)
from tests.support.specs import hello_spec


def _two_versions(v2_spec: ServiceSpec, *, in_place: bool = True, **v2: Any) -> list[VersionRecord]:
    return [version(1, READY), version(2, spec=v2_spec, in_place=in_place, **v2)]


def _probe_spec(path: str, replicas: int = 2) -> ServiceSpec:
    data = hello_spec()
    data["service"] = {"replicas": replicas, "readiness_probe": {"path": path, "initial_delay_seconds": 600}}
    return ServiceSpec.model_validate(data)


def test_a_change_of_count_and_probe_only_takes_effect_on_the_ready_replicas_in_place() -> None:
    # replicas 2 -> 3 and a new probe path: the two READY replicas take version 2 (one write each), no
    # termination; one more replica is claimed for the count, and version 2 is READY at once.
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], _two_versions(_probe_spec("/ready", replicas=3)), target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        moved(r0, version=2),
        moved(r1, version=2),
        mark_ready(2),
        *launches(2, 2),
        status(ServiceStatus.READY, "2/3 ready; replica 2 PENDING"),
    ]


def test_a_change_only_in_the_service_section_launches_and_terminates_nothing() -> None:
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], _two_versions(_probe_spec("/ready")), target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        moved(r0, version=2),
        moved(r1, version=2),
        mark_ready(2),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_change_a_replica_runs_still_rolls() -> None:
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], _two_versions(_probe_spec("/ready"), in_place=False), target=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING",
        ),
    ]


def test_new_secret_values_roll_even_when_the_spec_is_the_same() -> None:
    r0 = replica(0)
    versions = [version(1, READY, secrets_ref="a"), version(2, spec=spec(1), in_place=True, secrets_ref="b")]
    current = state([r0], versions, target=2)
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        *launches(2, 1),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/1 new ready, 1 old replica(s) left; replica 1 PENDING",
        ),
    ]


def test_only_ready_replicas_are_kept_in_place_the_others_are_replaced() -> None:
    ready, sick = replica(0), replica(1, S.NOT_READY, probe_failures=1, failing_since=ago(20))
    current = state([ready, sick], _two_versions(_probe_spec("/ready")), target=2)
    rolled = "replaced by version 2 (rolling)"
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: DOWN}, NOW) == [
        moved(ready, version=2),
        RecordReplica(sick, drained(replace(sick, probe_failures=2), rolled).after),
        mark_ready(2),
        terminate(("i-1", f"replica 1: {rolled}")),
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 1/2 new ready, 1 old replica(s) left; replica 2 PENDING",
        ),
    ]


def test_a_rollback_to_a_version_that_runs_the_same_is_in_place_too() -> None:
    # Version 2 (READY, a new probe path) rolled back to version 1: the replicas take 1 back in place.
    r0 = replica(0, v=2)
    versions = [version(1, READY, spec=spec(1)), version(2, READY, spec=_probe_spec("/ready", 1), in_place=True)]
    current = state([r0], versions, target=1)
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        moved(r0, version=1),
        status(ServiceStatus.READY, "1/1 ready"),
    ]


def test_a_failed_target_takes_no_replica_over() -> None:
    r0 = replica(0)
    versions = [version(1, READY), version(2, VersionState.FAILED, spec=_probe_spec("/ready"), in_place=True)]
    current = state([r0], versions, target=2, status=ServiceStatus.FAILED, message="x")
    actions = plan(current, [instance(0)], {0: OK}, NOW)
    assert [a for a in actions if isinstance(a, RecordReplica)] == []


def test_a_replica_kept_in_place_is_steady_afterwards() -> None:
    # Once recorded, nothing more is written: the steady state costs reads only (invariant 6).
    r0, r1 = replica(0, v=2), replica(1, v=2)
    versions = [version(1, READY), version(2, READY, spec=_probe_spec("/ready"), in_place=True)]
    current = state([r0, r1], versions, target=2, status=ServiceStatus.READY, message="2/2 ready", observed=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == []
