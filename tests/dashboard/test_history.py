"""The dashboard's history (fleetkeeper.dashboard.history): the samples of a service's replica counts,
and the count it wants."""

from __future__ import annotations

from fleetkeeper.dashboard.history import History, desired_replicas
from tests.support.dashboard import NOW, view
from tests.support.specs import hello_spec


def test_the_history_samples_counts_and_starts_again_for_a_new_incarnation() -> None:
    history = History(limit=3)
    history.record(view("u1", (1, "READY"), (1, "READY")), NOW)
    history.record(view("u1", (1, "READY"), (2, "STARTING")), NOW + 2)
    history.record(view("u1", (1, "READY"), (2, "STARTING")), NOW + 2)  # the same moment: kept once
    samples = history.of("web")
    assert [s.by_status for s in samples] == [{"READY": 2}, {"READY": 1, "STARTING": 1}]
    assert samples[1].by_version == {1: 1, 2: 1} and samples[1].target == 2
    for step in range(5):
        history.record(view("u1", (2, "READY")), NOW + 10 + step)
    assert len(history.of("web")) == 3  # bounded
    history.record(view("u2", (1, "PENDING")), NOW + 20)
    assert [s.by_status for s in history.of("web")] == [{"PENDING": 1}]
    history.forget_others(set())
    assert history.of("web") == []


def test_the_desired_replicas_come_from_the_autoscaler_else_the_spec() -> None:
    assert desired_replicas({"autoscaling": {"target_replicas": 3}, "spec": hello_spec(replicas=1)}) == 3
    assert desired_replicas({"autoscaling": None, "spec": hello_spec(replicas=4)}) == 4
    policy = {"service": {"replica_policy": {"min_replicas": 2}}}
    assert desired_replicas({"spec": policy}) == 2
    assert desired_replicas({"spec": {}}) is None
