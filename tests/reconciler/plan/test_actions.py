"""Table tests of plan/actions.py: what the actions themselves say."""

from __future__ import annotations

from fleetkeeper.reconciler.plan import TripBreaker


def test_the_breakers_rollback_says_why_in_the_planners_words() -> None:
    trip = TripBreaker(2, "version 2 failed: 3 replica failures", rollback_to=1)
    assert trip.status_message == "rolling back to version 1: version 2 failed: 3 replica failures"
