"""The planner's knobs (`Policy`): thresholds, grace periods and per-run caps; it decides the wait
before a refused launch is tried again (`backoff`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Policy:
    """The reconciler's knobs; the defaults are what the function runs with."""

    # A replica's probe with no verdict (still in flight when its run had no more time, or not made):
    # its initial delay is failed only this long (and the probe's timeout) after it ended, so a probe
    # that may still answer never fails a replica ("never answered", 0 s after provisioning).
    unanswered_grace: timedelta = timedelta(seconds=60)
    # Circuit breaker: this many replica failures of a version that never reached READY fail it.
    breaker_threshold: int = 3
    backoff_base: timedelta = timedelta(seconds=30)
    backoff_max: timedelta = timedelta(minutes=30)
    # A managed instance of no live service is terminated only when older than this: it covers a
    # service created (and its first replica launched) after this run listed the services.
    orphan_grace: timedelta = timedelta(minutes=10)
    # DescribeInstances is eventually consistent: a just-launched instance may be missing for a while.
    lost_instance_grace: timedelta = timedelta(minutes=5)
    # Claims per service per run, so one big service cannot use up a run's time budget.
    max_launches_per_run: int = 50
    # Capacity pools (instance type x subnet) one launch may try in a run before it backs off: enough
    # to go round three zones and on to the next instance type, few enough that a run in which EC2
    # has no capacity anywhere spends a bounded number of RunInstances calls on each replica.
    pools_per_run: int = 4
    # A spot instance is taken back this long after its interruption warning (EC2's two minutes).
    interruption_notice: timedelta = timedelta(minutes=2)
    # How much earlier than strictly needed a warned replica's drain starts: the run that drains it is
    # woken for that moment (a delayed kick, Reconciler.interrupt), and a woken run starts late by a
    # few seconds (the queue's delivery, a Lambda start). The schedule is the backstop.
    warning_margin: timedelta = timedelta(seconds=15)
    # Follow-ups (fleetkeeper.reconciler.followup): how often a service in motion (a replica booting
    # or probing, a drain, an instance going) is looked at again between two scheduled runs, and the
    # least time between two of its follow-ups.
    follow_up_interval: timedelta = timedelta(seconds=10)
    follow_up_min_gap: timedelta = timedelta(seconds=5)

    def backoff(self, attempts: int) -> timedelta:
        """Wait before launch attempt `attempts + 1`, after `attempts` refusals (30 s, 60 s, ... 30 min)."""
        factor: int = 2 ** max(attempts - 1, 0)
        wait: timedelta = min(self.backoff_base * factor, self.backoff_max)
        return wait
