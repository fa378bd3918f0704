"""Table tests of plan/launches.py: the record the shell writes after a launch, `refused` (its code,
whose fault it is, the backoff) or `launched`, each a function of `now` only.

Expected records are built from the input record with `replace`, never read back from the output
(the builders: tests/support/builders.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from fleetkeeper.model import FailureCause, ReplicaRecord, to_iso
from fleetkeeper.reconciler.plan import Policy, TripBreaker, launched, plan, refused
from tests.support.builders import NOW, STAMP, C, S, refusal, replica, state


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        # Capacity and placement: the next attempt may land elsewhere (another subnet).
        ("InsufficientInstanceCapacity", C.ENVIRONMENT),
        ("Unsupported", C.ENVIRONMENT),
        ("InsufficientFreeAddressesInSubnet", C.ENVIRONMENT),
        # Account limits and EC2 having a moment.
        ("VcpuLimitExceeded", C.ENVIRONMENT),
        ("RequestLimitExceeded", C.ENVIRONMENT),
        # The process driver's own: the laptop, not the version.
        ("NoFreePort", C.ENVIRONMENT),
        # The version's: its image, its parameters, its permissions.
        ("InvalidAMIID.NotFound", C.VERSION),
        ("InvalidParameterValue", C.VERSION),
        ("UnauthorizedOperation", C.VERSION),
    ],
)
def test_a_refusal_records_its_code_whose_fault_it_is_and_the_backoff(code: str, cause: FailureCause) -> None:
    pending = replica(3, S.PENDING)
    assert refused(pending, code, "what AWS said", NOW, Policy()) == replace(
        pending,
        status=S.FAILED_PROVISION,
        status_message=f"{code}: what AWS said",
        failure_code=code,
        cause=cause,
        launch_attempts=1,
        refused_runs=1,
        version_refusals=1 if cause is C.VERSION else 0,
        next_attempt_at=to_iso(NOW + timedelta(seconds=30)),
        updated_at=STAMP,
    )


def test_each_refusal_doubles_the_backoff_and_the_latest_code_decides() -> None:
    before = refusal(3, "InsufficientInstanceCapacity", "no capacity", C.ENVIRONMENT, attempts=2)
    assert refused(before, "InvalidAMIID.NotFound", "no such image", NOW, Policy()) == replace(
        before,
        status_message="InvalidAMIID.NotFound: no such image",
        failure_code="InvalidAMIID.NotFound",
        cause=C.VERSION,
        launch_attempts=3,
        refused_runs=3,
        version_refusals=1,
        next_attempt_at=to_iso(NOW + timedelta(seconds=120)),
        updated_at=STAMP,
    )


def test_capacity_refusals_of_a_walk_never_count_toward_the_breaker_only_the_versions_do() -> None:
    """Three pools refused for capacity, then one refusal that is the version's: the breaker counts 1."""
    pending = replica(3, S.PENDING)
    walked = refused(pending, "InvalidParameterValue", "bad", NOW, Policy(), tried=4)
    assert (walked.launch_attempts, walked.version_refusals, walked.cause) == (4, 1, C.VERSION)
    again = refused(walked, "InsufficientInstanceCapacity", "none", NOW, Policy(), tried=2)
    assert (again.launch_attempts, again.version_refusals, again.cause) == (6, 1, C.ENVIRONMENT)
    # Two replicas refused like that: 2 failures, under the threshold of 3: no breaker trip.
    current = state([replace(walked, replica_id=0), replace(walked, replica_id=1)])
    assert not [a for a in plan(current, [], {}, NOW) if isinstance(a, TripBreaker)]


def test_a_run_that_walked_pools_counts_each_attempt_but_backs_off_once() -> None:
    """Four pools refused in one run: four attempts (the next run starts at the fifth pool, with its
    own token), and one refused run: the backoff after the first run is still 30 s."""
    pending = replica(3, S.PENDING)
    assert refused(pending, "InsufficientInstanceCapacity", "none", NOW, Policy(), tried=4) == replace(
        pending,
        status=S.FAILED_PROVISION,
        status_message="InsufficientInstanceCapacity: none",
        failure_code="InsufficientInstanceCapacity",
        cause=C.ENVIRONMENT,
        launch_attempts=4,
        refused_runs=1,
        next_attempt_at=to_iso(NOW + timedelta(seconds=30)),
        updated_at=STAMP,
    )
    assert launched(pending, "i-1", NOW, instance_type="c6i.large", tried=2) == replace(
        pending,
        instance_id="i-1",
        instance_type="c6i.large",
        status=S.PROVISIONING,
        launch_attempts=2,
        launched_at=STAMP,
        updated_at=STAMP,
    )


@pytest.mark.parametrize(
    "before",
    [replica(3, S.PENDING), refusal(3, "InvalidAMIID.NotFound", "no such image", C.VERSION, attempts=2)],
    ids=["claimed", "refused before"],
)
def test_a_launch_records_the_instance_and_clears_the_failure(before: ReplicaRecord) -> None:
    assert launched(before, "i-new", NOW) == replace(
        before,
        instance_id="i-new",
        status=S.PROVISIONING,
        status_message="",
        failure_code=None,
        cause=None,
        launched_at=STAMP,
        next_attempt_at=None,
        updated_at=STAMP,
    )


def test_refused_and_launched_depend_on_now_not_on_the_wall_clock() -> None:
    pending = replica(0, S.PENDING)
    with time_machine.travel(datetime(1999, 1, 1, tzinfo=UTC), tick=False):
        first = (refused(pending, "Unsupported", "x", NOW, Policy()), launched(pending, "i-1", NOW))
    with time_machine.travel(datetime(2087, 1, 1, tzinfo=UTC), tick=False):
        second = (refused(pending, "Unsupported", "x", NOW, Policy()), launched(pending, "i-1", NOW))
    assert first == second
