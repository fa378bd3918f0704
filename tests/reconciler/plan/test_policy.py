"""Table tests of plan/policy.py: the wait before a refused launch is tried again."""

from __future__ import annotations

from fleetkeeper.reconciler.plan import Policy


def test_backoff_is_exponential_and_capped() -> None:
    policy = Policy()
    assert [policy.backoff(n).total_seconds() for n in (1, 2, 3)] == [30, 60, 120]
    assert policy.backoff(30) == policy.backoff_max
