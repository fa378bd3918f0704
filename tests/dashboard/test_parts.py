"""The dashboard's pure parts: the gate's codes and tokens, the history, the plots, the scaled spec."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest

from fleetkeeper.dashboard.backend import ActionRefused, scaled_spec
from fleetkeeper.dashboard.gate import Gate
from fleetkeeper.dashboard.history import History, desired_replicas
from fleetkeeper.dashboard.plots import rate_plot, replicas_plot
from fleetkeeper.model import to_iso
from tests.dashboard.conftest import hello

NOW = 1_700_000_000.0


def view(uid: str = "u1", *replicas: tuple[int, str], target: int = 2) -> dict[str, object]:
    return {
        "name": "web",
        "uid": uid,
        "target_version": max((v for v, _ in replicas), default=1),
        "spec": hello(replicas=target),
        "autoscaling": None,
        "replicas": [{"replica_id": n, "version": v, "status": s} for n, (v, s) in enumerate(replicas)],
    }


def test_a_login_code_is_spent_by_its_first_use_and_each_session_has_its_own_csrf_token() -> None:
    gate = Gate("127.0.0.1", 8471)
    code = gate.new_login_code()
    first = gate.log_in(code)
    assert first is not None and gate.log_in(code) is None
    second = gate.log_in(gate.new_login_code())
    assert second is not None and second != first
    assert gate.session_of(first) == first and gate.session_of("forged") is None and gate.session_of(None) is None
    assert gate.csrf_token(first) != gate.csrf_token(second)
    origin = ["http://127.0.0.1:8471"]
    assert gate.refuse_write(first, origin, gate.csrf_token(first)) is None
    assert gate.refuse_write(first, origin, gate.csrf_token(second)) is not None
    assert gate.refuse_write(first, ["http://127.0.0.1:8000"], gate.csrf_token(first)) is not None
    assert gate.refuse_write(first, ["null"], gate.csrf_token(first)) is not None
    assert gate.refuse_write(first, [], gate.csrf_token(first)) is not None
    assert gate.refuse_host(["127.0.0.1:8471"]) is None
    assert gate.refuse_host(["localhost:8471"]) is not None and gate.refuse_host([]) is not None


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
    assert desired_replicas({"autoscaling": {"target_replicas": 3}, "spec": hello(replicas=1)}) == 3
    assert desired_replicas({"autoscaling": None, "spec": hello(replicas=4)}) == 4
    policy = {"service": {"replica_policy": {"min_replicas": 2}}}
    assert desired_replicas({"spec": policy}) == 2
    assert desired_replicas({"spec": {}}) is None


def test_the_replicas_plot_stacks_statuses_and_marks_the_events_that_move_replicas() -> None:
    history = History()
    history.record(view("u1", (1, "READY"), (1, "READY")), NOW - 60)
    history.record(view("u1", (1, "READY"), (1, "READY"), (2, "STARTING")), NOW - 30)
    history.record(view("u1", (2, "READY"), (2, "READY")), NOW)
    events = [
        {"reason": "Updated", "first_seen": to_iso_at(NOW - 40), "message": "updated to version 2 (rolling)"},
        {"reason": "ProbeFailed", "first_seen": to_iso_at(NOW - 35), "message": "not marked"},
        {"reason": "Created", "first_seen": to_iso_at(NOW - 7200), "message": "outside the window"},
    ]
    svg = replicas_plot(history.of("web"), events, NOW, 600)
    series = json.loads(unescape(re.search(r'data-series="([^"]*)"', svg)[1]))  # type: ignore[index]
    assert series["statuses"] == ["READY", "STARTING"]
    assert [s["by_version"] for s in series["samples"]] == [{"1": 2}, {"1": 2, "2": 1}, {"2": 2}]
    assert [m["reason"] for m in series["marks"]] == ["Updated"]
    assert svg.count('class="area s-READY"') == 1 and svg.count('class="area s-STARTING"') == 1
    assert 'class="target"' in svg and "style=" not in svg
    assert "no samples yet" in replicas_plot([], [], NOW, 600)


def to_iso_at(at: float) -> str:
    from datetime import UTC, datetime

    return to_iso(datetime.fromtimestamp(at, UTC))


def test_the_rate_plot_draws_the_rate_against_what_the_target_is_sized_for() -> None:
    history = History()
    history.record({**view("u1", (1, "READY")), "autoscaling": {"target_replicas": 1}}, NOW - 120)
    history.record({**view("u1", (1, "READY"), (1, "READY")), "autoscaling": {"target_replicas": 2}}, NOW - 60)
    metrics = {
        "period_seconds": 60,
        "request_rate": [{"at": to_iso_at(NOW - 180), "rate": 1.5}, {"at": to_iso_at(NOW - 60), "rate": 3.25}],
        "target_replicas": 2,
        "target_qps_per_replica": 2.0,
    }
    svg = rate_plot(metrics, history.of("web"), NOW, 600)
    series = json.loads(unescape(re.search(r'data-series="([^"]*)"', svg)[1]))  # type: ignore[index]
    assert [p["rate"] for p in series["request_rate"]] == [1.5, 3.25]
    assert [c["rate"] for c in series["capacity"]] == [2.0, 4.0, 4.0]
    fixed = rate_plot({**metrics, "target_qps_per_replica": None}, history.of("web"), NOW, 600)
    assert "autoscaler target" not in fixed.split("</title>", 1)[1]
    assert "no endpoint yet" in rate_plot(None, [], NOW, 600)


def test_scaling_rewrites_only_a_fixed_count() -> None:
    assert scaled_spec(hello(replicas=2), 5)["service"]["replicas"] == 5
    policy = {**hello(), "service": {"readiness_probe": "/", "replica_policy": {"min_replicas": 1, "max_replicas": 1}}}
    assert scaled_spec(policy, 3)["service"]["replica_policy"] == {"min_replicas": 3, "max_replicas": 3}
    scaled = {
        **hello(),
        "service": {"replica_policy": {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1}},
    }
    with pytest.raises(ActionRefused, match="autoscales"):
        scaled_spec(scaled, 2)
    with pytest.raises(ActionRefused, match="secrets \\(HF_TOKEN\\)"):
        scaled_spec({**hello(), "secrets": {"HF_TOKEN": None}}, 2)
