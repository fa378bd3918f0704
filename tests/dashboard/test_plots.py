"""The dashboard's plots (fleetkeeper.dashboard.plots): the series they draw and the words they show
without data."""

from __future__ import annotations

import json
import re
from html import unescape

from fleetkeeper.dashboard.history import History
from fleetkeeper.dashboard.plots import rate_plot, replicas_plot
from tests.support.dashboard import NOW, to_iso_at, view


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
