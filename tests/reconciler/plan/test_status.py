"""Table tests of plan/status.py: the service's status and its message (`service_status`), and when a
run writes it (`status_changed`).

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

import pytest

from fleetkeeper.model import ReplicaRecord, ServiceStatus, VersionState
from fleetkeeper.reconciler.plan import plan, service_status, status_changed
from tests.support.builders import NEW, NOW, OK, READY, C, S, instance, refusal, replica, spec, state, status, version


def test_status_is_recorded_when_the_generation_moves() -> None:
    current = state(
        [replica(0), replica(1)],
        [version(1, READY)],
        status=ServiceStatus.READY,
        message="2/2 ready",
        generation=2,
        observed=1,
    )
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        status(ServiceStatus.READY, "2/2 ready", 2)
    ]


def test_status_message_names_the_failing_replica() -> None:
    waiting = refusal(2, "InsufficientInstanceCapacity", "no capacity in us-east-1a", C.ENVIRONMENT, retry_in=30)
    current = state([replica(0), replica(1), waiting], [version(1, READY, spec=spec(3))])
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        status(
            ServiceStatus.READY,
            "2/3 ready; replica 2 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity in us-east-1a",
        )
    ]


def test_the_status_of_records_as_they_are_after_refusals_names_the_refusal() -> None:
    """What the shell records when AWS refused launches `plan` expected to go through: the status of
    the records as they now are (one launched, one refused), not a re-plan."""
    current = state([], seq=2)
    now_records = [
        replica(0, S.PROVISIONING),
        refusal(1, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=30),
    ]
    assert service_status(current, now_records, {1: NEW}, set()) == status(
        ServiceStatus.REPLICA_INIT,
        "0/2 ready; replica 0 PROVISIONING; replica 1 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity",
    )


@pytest.mark.parametrize(
    ("records", "versions", "with_instance", "expected"),
    [
        ([], {1: NEW}, set(), (ServiceStatus.NO_REPLICA, "0/2 ready")),
        # An old replica on its way out counts as left while its instance lives.
        (
            [replica(0, S.SHUTTING_DOWN), replica(1, v=2), replica(2, v=2)],
            {1: READY, 2: READY},
            {0, 1, 2},
            (ServiceStatus.UPDATING, "updating to version 2 (rolling): 2/2 new ready, 1 old replica(s) left"),
        ),
        (
            [replica(0, S.SHUTTING_DOWN), replica(1, v=2), replica(2, v=2)],
            {1: READY, 2: READY},
            {1, 2},
            (ServiceStatus.READY, "2/2 ready"),
        ),
    ],
    ids=["nothing", "old instance still up", "old instance gone"],
)
def test_service_status(
    records: list[ReplicaRecord],
    versions: dict[int, VersionState],
    with_instance: set[int],
    expected: tuple[ServiceStatus, str],
) -> None:
    current = state(records, [version(n, s) for n, s in sorted(versions.items())], target=max(versions))
    assert service_status(current, records, versions, with_instance) == status(*expected)


def test_the_status_of_a_service_whose_target_version_is_missing() -> None:
    assert service_status(state([], target=2), [], {1: NEW}, set()) == status(
        ServiceStatus.FAILED,
        "the target version is missing; no earlier version was ever READY: "
        "launching stopped until the service is updated",
    )


def test_a_status_is_only_written_when_it_changed() -> None:
    current = state([], status=ServiceStatus.READY, message="2/2 ready", generation=3, observed=3)
    assert not status_changed(current, status(ServiceStatus.READY, "2/2 ready", 3))
    assert status_changed(current, status(ServiceStatus.READY, "2/2 ready", 4))
    assert status_changed(current, status(ServiceStatus.READY, "1/2 ready", 3))
    assert status_changed(current, status(ServiceStatus.UPDATING, "2/2 ready", 3))


def test_status_after_rollback_says_why() -> None:
    failed = version(2, VersionState.FAILED, state_message="version 2 failed: 3 replica failures")
    current = state([replica(0), replica(1)], [version(1, READY), failed], target=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        status(ServiceStatus.READY, "2/2 ready; rolled back to version 1: version 2 failed: 3 replica failures")
    ]
