"""Replicas by status over time: what the dashboard saw of each service, one sample per refresh.

The stack keeps each replica's current record, not a history of counts; its events say when things
happened (a version rolled out, a replica failed) but are folded and capped at 100 a service. So the
replicas-by-status plot is drawn from the samples this process takes while it runs (every refresh,
the views it fetched anyway), with the events of the same stretch marked on it: a rollout or a
scale-out shows as it happens, and what happened before the dashboard started is on the events'
timeline. Pure: no clock of its own (`at` is an argument), no I/O.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

# Two hours of samples at the embedded mode's 2 s refresh; eight at a stack's 10 s.
MAX_SAMPLES = 3600
# The order statuses are stacked in, from serving to gone (others, if the API adds any, after).
STATUS_ORDER = (
    "READY",
    "NOT_READY",
    "STARTING",
    "PROVISIONING",
    "PENDING",
    "SHUTTING_DOWN",
    "PREEMPTED",
    "FAILED_PROVISION",
    "FAILED_INITIAL_DELAY",
    "FAILED_PROBING",
    "FAILED",
)


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    by_status: dict[str, int]
    by_version: dict[int, int]
    target: int | None  # the replicas the service should run (None: not known from the view)
    target_version: int


def sample_of(view: dict[str, Any], at: float) -> Sample:
    """The counts of one GET /v1/services/NAME view."""
    replicas = view.get("replicas") or []
    statuses = Counter(str(r["status"]) for r in replicas)
    versions = Counter(int(r["version"]) for r in replicas)
    return Sample(at, dict(statuses), dict(versions), desired_replicas(view), int(view.get("target_version") or 0))


def desired_replicas(view: dict[str, Any]) -> int | None:
    """The replicas the view's service should run: the autoscaler's target, else the spec's count."""
    scaling = view.get("autoscaling")
    if isinstance(scaling, dict) and scaling.get("target_replicas") is not None:
        return int(scaling["target_replicas"])
    section = (view.get("spec") or {}).get("service") or {}
    if section.get("replicas") is not None:
        return int(section["replicas"])
    policy = section.get("replica_policy")
    if isinstance(policy, dict) and policy.get("min_replicas") is not None:
        return int(policy["min_replicas"])
    return None


def ordered_statuses(samples: list[Sample]) -> list[str]:
    seen = {status for sample in samples for status in sample.by_status}
    known = [s for s in STATUS_ORDER if s in seen]
    return known + sorted(seen - set(STATUS_ORDER))


class History:
    """The samples of every service this dashboard has shown, newest last, bounded per service."""

    def __init__(self, limit: int = MAX_SAMPLES) -> None:
        self._limit = limit
        self._samples: dict[str, deque[Sample]] = {}
        self._uids: dict[str, str] = {}

    def record(self, view: dict[str, Any], at: float) -> None:
        name, uid = str(view["name"]), str(view.get("uid", ""))
        if self._uids.get(name) != uid:  # deleted and created again: another service's history
            self._samples[name] = deque(maxlen=self._limit)
            self._uids[name] = uid
        samples = self._samples[name]
        sample = sample_of(view, at)
        if samples and samples[-1].at >= at:
            return
        samples.append(sample)

    def of(self, name: str, since: float | None = None) -> list[Sample]:
        samples = list(self._samples.get(name, ()))
        return samples if since is None else [s for s in samples if s.at >= since]

    def forget_others(self, names: set[str]) -> None:
        """Drop the history of services that are gone."""
        for name in list(self._samples):
            if name not in names:
                del self._samples[name]
                self._uids.pop(name, None)
