"""Table tests of plan/delete.py: a DELETING service drains every replica, terminates every instance,
then deletes its item.

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

from fleetkeeper.model import Lifecycle, ServiceStatus
from fleetkeeper.reconciler.driver import InstanceState
from fleetkeeper.reconciler.plan import DeleteService, plan
from tests.support.builders import (
    NOW,
    OK,
    READY,
    C,
    S,
    drained,
    instance,
    refusal,
    replica,
    state,
    status,
    terminate,
    version,
)


def test_delete_drains_every_replica_and_terminates_every_instance() -> None:
    stray = instance(7, instance_id="i-stray")
    r0, r1 = replica(0), replica(1)
    current = state([r0, r1], lifecycle=Lifecycle.DELETING, seq=9)
    assert plan(current, [instance(0), instance(1), stray], {0: OK}, NOW) == [
        drained(r0, "service is being deleted"),
        drained(r1, "service is being deleted"),
        terminate(
            ("i-0", "replica 0: service is being deleted"),
            ("i-1", "replica 1: service is being deleted"),
            ("i-stray", "replica 7 no longer exists"),
        ),
        status(ServiceStatus.SHUTTING_DOWN, "deleting: terminating 3 instance(s)"),
    ]


def test_delete_terminates_a_live_instance_no_replica_item_owns_yet() -> None:
    # Claimed by a concurrent run after this one read the service (id at replica_seq): an ACTIVE
    # service leaves it alone, a DELETING one terminates it with everything else.
    gone = replica(0, S.SHUTTING_DOWN)
    newer = instance(1, instance_id="i-newer")
    current = state([gone], lifecycle=Lifecycle.DELETING, status=ServiceStatus.SHUTTING_DOWN)
    assert plan(current, [newer], {}, NOW) == [
        terminate(("i-newer", "service is being deleted")),
        status(ServiceStatus.SHUTTING_DOWN, "deleting: terminating 1 instance(s)"),
    ]


def test_delete_clears_the_failure_facts_of_a_failed_replica_it_drains() -> None:
    refused_one = refusal(0, "InvalidAMIID.NotFound", "x", C.VERSION, retry_in=30)
    current = state([refused_one], lifecycle=Lifecycle.DELETING)
    assert plan(current, [], {}, NOW) == [drained(refused_one, "service is being deleted"), DeleteService()]


def test_delete_removes_the_service_item_once_no_instance_remains() -> None:
    gone = instance(0, InstanceState.TERMINATED)
    current = state([replica(0, S.SHUTTING_DOWN)], lifecycle=Lifecycle.DELETING)
    assert plan(current, [gone], {}, NOW) == [DeleteService()]


def test_a_deleting_service_is_taken_down_without_its_target_version() -> None:
    r0 = replica(0)
    current = state([r0], [version(1, READY)], target=2, lifecycle=Lifecycle.DELETING)
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        drained(r0, "service is being deleted"),
        terminate(("i-0", "replica 0: service is being deleted")),
        status(ServiceStatus.SHUTTING_DOWN, "deleting: terminating 1 instance(s)"),
    ]
