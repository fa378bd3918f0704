"""Table tests of plan/replicas.py: which replicas run and which go. Claims and launches that fill the
gap (capped per run, retries included), finished items deleted once their instance is gone, scaling
down, and an old version replaced rolling or blue-green.

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from fleetkeeper.model import ServiceStatus, VersionState
from fleetkeeper.reconciler.driver import InstanceState
from fleetkeeper.reconciler.plan import (
    DeleteReplica,
    Launch,
    Policy,
    RecordStatus,
    Terminate,
    plan,
)
from tests.support.builders import (
    DOWN,
    NOW,
    OK,
    READY,
    C,
    S,
    ago,
    drained,
    instance,
    launches,
    mark_ready,
    moved,
    refusal,
    replica,
    rolling_state,
    spec,
    state,
    status,
    terminate,
    version,
)

# --- claims and launches --------------------------------------------------------------------------


def test_new_service_claims_its_replicas_and_launches_them() -> None:
    assert plan(state([]), [], {}, NOW) == [
        *launches(1, 0, 1),
        status(ServiceStatus.REPLICA_INIT, "0/2 ready; replica 0 PENDING; replica 1 PENDING"),
    ]


def test_claims_continue_the_replica_sequence_never_reusing_ids() -> None:
    assert plan(state([], seq=7), [], {}, NOW) == [
        *launches(1, 7, 8),
        status(ServiceStatus.REPLICA_INIT, "0/2 ready; replica 7 PENDING; replica 8 PENDING"),
    ]


def test_launches_per_run_are_capped() -> None:
    current = state([], [version(1, spec=spec(replicas=80))])
    assert plan(current, [], {}, NOW, Policy(max_launches_per_run=50)) == [
        *launches(1, *range(50)),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/80 ready; replica 0 PENDING; replica 1 PENDING; replica 2 PENDING; and 47 more",
        ),
    ]


def test_launches_go_past_replicas_that_need_none() -> None:
    waiting = refusal(1, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=5)
    due_now = refusal(2, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=0)
    current = state([replica(0), waiting, due_now, replica(3, S.PENDING)], [version(1, READY, spec=spec(4))])
    text = "FAILED_PROVISION: InsufficientInstanceCapacity: no capacity"
    assert plan(current, [instance(0)], {0: OK}, NOW) == [
        Launch(2, fresh=False),
        Launch(3, fresh=False),
        status(ServiceStatus.READY, f"1/4 ready; replica 1 {text}; replica 2 {text}; replica 3 PENDING"),
    ]


def test_retries_count_toward_the_launch_cap() -> None:
    due = refusal(0, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT)
    current = state([due], [version(1, spec=spec(3))])
    assert plan(current, [], {}, NOW, Policy(max_launches_per_run=2)) == [
        Launch(0, fresh=False),
        *launches(1, 1),
        status(
            ServiceStatus.REPLICA_INIT,
            "0/3 ready; replica 0 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity; replica 1 PENDING",
        ),
    ]


def test_a_pending_replica_left_by_a_crashed_run_is_launched_again_at_once() -> None:
    assert plan(state([replica(0, S.PENDING), replica(1)]), [instance(1)], {1: OK}, NOW) == [
        mark_ready(1),
        Launch(0, fresh=False),
        status(ServiceStatus.READY, "1/2 ready; replica 0 PENDING"),
    ]


def test_a_refused_launch_waits_for_its_backoff() -> None:
    waiting = refusal(0, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, retry_in=5)
    current = state([waiting, replica(1)])
    expected_status = status(
        ServiceStatus.READY, "1/2 ready; replica 0 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity"
    )
    assert plan(current, [instance(1)], {1: OK}, NOW) == [mark_ready(1), expected_status]
    later = NOW + timedelta(seconds=6)
    assert plan(current, [instance(1)], {1: OK}, later) == [mark_ready(1), Launch(0, fresh=False), expected_status]


# --- leaving replicas: their item goes once their instance is gone --------------------------------


def test_a_leaving_replica_whose_instance_is_gone_is_deleted() -> None:
    leaving = replica(0, S.SHUTTING_DOWN)
    actions = plan(state([leaving, replica(1), replica(2)]), [instance(1), instance(2)], {1: OK, 2: OK}, NOW)
    assert actions == [mark_ready(1), DeleteReplica(leaving), status(ServiceStatus.READY, "2/2 ready")]


def test_a_leaving_replica_never_recorded_as_launched_waits_for_a_late_instance() -> None:
    """Found by the simulation (seed 1595159725, 400 steps): a run launched replica 0 and lost the
    write that records it; replica 0 was then chosen for removal; DescribeInstances did not show its
    instance yet, and deleting the item left that instance running past the surge bound. The item
    stays for `lost_instance_grace` after its last write: a late instance is matched by its tag and
    terminated first; after the grace, with none shown, the item goes."""
    others = [replica(1), replica(2)]
    seen = [instance(1), instance(2)]
    probes = {1: OK, 2: OK}
    fresh = replace(replica(0, S.SHUTTING_DOWN, instance_id=None, launched_at=None), updated_at=ago(60))
    assert plan(state([fresh, *others]), seen, probes, NOW) == [
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    late = instance(0)
    assert plan(state([fresh, *others]), [late, *seen], probes, NOW) == [
        mark_ready(1),
        Terminate((("i-0", "replica 0: SHUTTING_DOWN"),)),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    old = replace(fresh, updated_at=ago(Policy().lost_instance_grace.total_seconds() + 1))
    assert plan(state([old, *others]), seen, probes, NOW) == [
        mark_ready(1),
        DeleteReplica(old),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_leaving_replica_whose_recorded_instance_is_not_listed_yet_waits_for_it() -> None:
    """From the simulation (seed 1282648386, 400 steps, surge-bound): replica 0's launch was recorded,
    but DescribeInstances did not list its instance yet when the replica was chosen for removal (a
    scale-down here); the next run deleted the item, and the instance, listed a little later, ran on
    with no replica, past the surge bound.
    While the describe answer lacks the recorded instance altogether, the item stays (for at most
    `lost_instance_grace` after the launch): the instance is terminated once listed. An instance
    listed as terminated is gone: the item goes at once, as it does once the grace is over."""
    others = [replica(1), replica(2)]
    seen = [instance(1), instance(2)]
    probes = {1: OK, 2: OK}
    hidden = replica(0, S.PROVISIONING, launched_at=ago(60))
    chosen = drained(hidden, "scaling down to 2")
    assert plan(state([hidden, *others]), seen, probes, NOW) == [
        chosen,
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    leaving = chosen.after
    assert plan(state([leaving, *others]), seen, probes, NOW) == [
        mark_ready(1),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    assert plan(state([leaving, *others]), [instance(0, launched_at=ago(60)), *seen], probes, NOW) == [
        mark_ready(1),
        terminate(("i-0", "replica 0: SHUTTING_DOWN")),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    gone = instance(0, InstanceState.TERMINATED, launched_at=ago(60))
    assert plan(state([leaving, *others]), [gone, *seen], probes, NOW) == [
        mark_ready(1),
        DeleteReplica(leaving),
        status(ServiceStatus.READY, "2/2 ready"),
    ]
    old = replace(leaving, launched_at=ago(Policy().lost_instance_grace.total_seconds() + 1))
    assert plan(state([old, *others]), seen, probes, NOW) == [
        mark_ready(1),
        DeleteReplica(old),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_a_shut_down_replica_of_an_undecided_target_is_deleted_once_its_instance_is_gone() -> None:
    leaving = replica(0, S.SHUTTING_DOWN)
    starting = replica(1, S.STARTING, launched_at=ago(60))
    current = state([leaving, starting], [version(1, spec=spec(1))])
    assert plan(current, [instance(1)], {}, NOW) == [
        DeleteReplica(leaving),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 1 STARTING"),
    ]


# --- scaling down ---------------------------------------------------------------------------------


def test_scale_down_drains_not_ready_then_newest_first() -> None:
    r0, r1, r2 = replica(0), replica(1), replica(2, S.STARTING, launched_at=ago(60))
    current = state([r0, r1, r2], [version(1, spec=spec(1))])
    assert plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK}, NOW) == [
        drained(r1, "scaling down to 1"),
        drained(r2, "scaling down to 1"),
        mark_ready(1),
        terminate(("i-1", "replica 1: scaling down to 1"), ("i-2", "replica 2: scaling down to 1")),
        status(ServiceStatus.READY, "1/1 ready"),
    ]


def test_scale_down_launches_nothing_more_and_drains_unlaunched_claims() -> None:
    ready = [replica(i, ready_at=ago(100)) for i in range(4)]
    current = state(ready, [version(1, READY, spec=spec(3))])
    assert plan(current, [instance(i) for i in range(4)], dict.fromkeys(range(4), OK), NOW) == [
        drained(ready[3], "scaling down to 3"),
        terminate(("i-3", "replica 3: scaling down to 3")),
        status(ServiceStatus.READY, "3/3 ready"),
    ]
    claimed = [replica(i, S.PENDING) for i in range(3)]
    current = state(claimed, [version(1, spec=spec(1))])
    assert plan(current, [], {}, NOW) == [
        drained(claimed[1], "scaling down to 1"),
        drained(claimed[2], "scaling down to 1"),
        Launch(0, fresh=False),
        status(ServiceStatus.REPLICA_INIT, "0/1 ready; replica 0 PENDING"),
    ]


# --- updates: rolling and blue-green --------------------------------------------------------------


ROLLED = "replaced by version 2 (rolling)"


def test_rolling_surges_first_then_retires_old_as_new_become_ready() -> None:
    # step 1: two old ready -> one new (surge 1), nothing removed (max_unavailable 0)
    r0, r1 = replica(0), replica(1)
    current = rolling_state([], [r0, r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING",
        ),
    ]
    # step 2: the new one is ready -> one old goes, one more new comes. The draining replica's record
    # (no longer READY) is written before its instance is terminated.
    r2 = replica(2, v=2)
    current = rolling_state([r2], [r0, r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(0), instance(1), instance(2)], {0: OK, 1: OK, 2: OK}, NOW) == [
        drained(r0, ROLLED),
        mark_ready(2),
        terminate(("i-0", f"replica 0: {ROLLED}")),
        *launches(2, 3),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 1/2 new ready, 2 old replica(s) left; replica 3 PENDING",
        ),
    ]
    # step 3: the second new is still starting -> nothing may go
    r3 = replica(3, S.STARTING, v=2, launched_at=ago(60))
    current = rolling_state([r2, r3], [r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(1), instance(2), instance(3)], {1: OK, 2: OK, 3: DOWN}, NOW) == [
        moved(r3, status_message="not ready yet: probe GET /health → connection refused"),
        mark_ready(2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 1/2 new ready, 1 old replica(s) left; "
            "replica 3 STARTING: not ready yet: probe GET /health → connection refused",
        ),
    ]
    # step 4: both new ready -> the last old goes
    current = rolling_state([r2, replica(3, v=2)], [r1], max_surge=1, max_unavailable=0)
    assert plan(current, [instance(1), instance(2), instance(3)], {1: OK, 2: OK, 3: OK}, NOW) == [
        drained(r1, ROLLED),
        mark_ready(2),
        terminate(("i-1", f"replica 1: {ROLLED}")),
        status(ServiceStatus.UPDATING, "updating to version 2 (rolling): 2/2 new ready, 1 old replica(s) left"),
    ]


def test_rolling_with_unavailability_and_no_surge_removes_before_adding() -> None:
    r0 = replica(0)
    current = rolling_state([], [r0, replica(1)], max_surge=0, max_unavailable=1)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        drained(r0, ROLLED),
        terminate(("i-0", f"replica 0: {ROLLED}")),
        *launches(2, 2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING",
        ),
    ]


def test_blue_green_launches_all_new_and_keeps_old_until_all_new_are_ready() -> None:
    r0, r1 = replica(0), replica(1)
    current = rolling_state([], [r0, r1], mode="blue_green")
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        *launches(2, 2, 3),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (blue_green): 0/2 new ready, 2 old replica(s) left; "
            "replica 2 PENDING; replica 3 PENDING",
        ),
    ]
    r2, r3 = replica(2, v=2), replica(3, S.STARTING, v=2, launched_at=ago(60))
    current = rolling_state([r2, r3], [r0, r1], mode="blue_green")
    insts = [instance(i) for i in range(4)]
    assert plan(current, insts, {0: OK, 1: OK, 2: OK, 3: DOWN}, NOW) == [
        moved(r3, status_message="not ready yet: probe GET /health → connection refused"),
        mark_ready(2),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (blue_green): 1/2 new ready, 2 old replica(s) left; "
            "replica 3 STARTING: not ready yet: probe GET /health → connection refused",
        ),
    ]
    current = rolling_state([r2, replica(3, v=2)], [r0, r1], mode="blue_green")
    replaced = "replaced by version 2 (blue_green)"
    assert plan(current, insts, dict.fromkeys(range(4), OK), NOW) == [
        drained(r0, replaced),
        drained(r1, replaced),
        mark_ready(2),
        terminate(("i-0", f"replica 0: {replaced}"), ("i-1", f"replica 1: {replaced}")),
        status(ServiceStatus.UPDATING, "updating to version 2 (blue_green): 2/2 new ready, 2 old replica(s) left"),
    ]


def test_an_update_finishes_ready_when_old_instances_are_gone() -> None:
    leaving = replica(1, S.SHUTTING_DOWN)
    current = rolling_state([replica(2, v=2), replica(3, v=2)], [leaving])
    assert plan(current, [instance(2), instance(3)], {2: OK, 3: OK}, NOW) == [
        mark_ready(2),
        DeleteReplica(leaving),
        status(ServiceStatus.READY, "2/2 ready"),
    ]


def test_an_update_drops_the_old_versions_refused_launches_and_drains_its_not_ready_replicas() -> None:
    old_refusal = refusal(0, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT)
    starting = replica(1, S.STARTING, launched_at=ago(60))
    current = rolling_state([replica(2, v=2), replica(3, v=2)], [old_refusal, starting])
    insts = [instance(1), instance(2), instance(3)]
    assert plan(current, insts, {1: DOWN, 2: OK, 3: OK}, NOW) == [
        drained(starting, ROLLED),
        mark_ready(2),
        terminate(("i-1", f"replica 1: {ROLLED}")),
        DeleteReplica(old_refusal),
        status(ServiceStatus.UPDATING, "updating to version 2 (rolling): 2/2 new ready, 1 old replica(s) left"),
    ]


def test_a_failed_target_drains_the_old_replicas_that_serve_nothing_and_keeps_the_rest() -> None:
    failed = version(2, VersionState.FAILED, state_message="version 2 failed: 3 replica failures")
    starting = replica(0, S.STARTING, launched_at=ago(60))
    current = state([starting], [version(1), failed], target=2)
    assert plan(current, [instance(0)], {}, NOW) == [
        drained(starting, "replaced by version 2 (rolling)"),
        terminate(("i-0", "replica 0: replaced by version 2 (rolling)")),
        status(
            ServiceStatus.FAILED,
            "version 2 failed: 3 replica failures; no earlier version was ever READY: "
            "launching stopped until the service is updated",
        ),
    ]


def test_rolling_with_unavailability_of_every_replica_replaces_them_all_at_once() -> None:
    r0, r1 = replica(0), replica(1)
    current = rolling_state([], [r0, r1], max_surge=0, max_unavailable=2)
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        drained(r0, ROLLED),
        drained(r1, ROLLED),
        terminate(("i-0", f"replica 0: {ROLLED}"), ("i-1", f"replica 1: {ROLLED}")),
        *launches(2, 2, 3),
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING; "
            "replica 3 PENDING",
        ),
    ]


def test_rolling_surge_counts_the_new_replicas_already_launched() -> None:
    old = [replica(i) for i in range(3)]
    starting = replica(3, S.STARTING, v=2, launched_at=ago(60))
    versions = [version(1, READY), version(2, spec=spec(3, max_surge=1, max_unavailable=0))]
    current = state([*old, starting], versions, target=2)
    insts = [instance(i) for i in range(4)]
    assert plan(current, insts, {0: OK, 1: OK, 2: OK}, NOW) == [
        status(
            ServiceStatus.UPDATING,
            "updating to version 2 (rolling): 0/3 new ready, 3 old replica(s) left; replica 3 STARTING",
        ),
    ]


# Guards a regression found by review (commit 5faa8d0): a target the breaker had FAILED tore down the
# replicas that still served.
def test_a_failed_target_never_tears_down_what_still_serves() -> None:
    # v1 READY, v2 FAILED by the breaker, v3 READY on 2 replicas; then the target points at v2.
    current = state(
        [replica(0, v=3), replica(1, v=3)],
        [
            version(1, VersionState.READY),
            version(2, VersionState.FAILED, state_message="version 2 failed"),
            version(3, VersionState.READY),
        ],
        target=2,
        status=ServiceStatus.READY,
    )
    assert plan(current, [instance(0, version=3), instance(1, version=3)], {0: OK, 1: OK}, NOW) == [
        RecordStatus(
            ServiceStatus.FAILED,
            "version 2 failed: launching stopped; update the service or roll back to a READY version",
            1,
        )
    ]
