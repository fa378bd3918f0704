"""The service page's two plots, drawn on the server as SVG: no plotting library, no script.

Two small time-series charts do not earn a JavaScript library (the smallest usable ones are tens of
KB, to vendor and keep current) or a Python one (matplotlib is tens of MB): a polyline, a stack of
polygons and a few axis labels are a hundred lines here, render with the page, obey the strict
Content-Security-Policy (presentation attributes and CSS classes, no inline style) and are tested as
text. Each plot carries its data as a `data-series` attribute (JSON) for tests and for anyone who
wants the numbers.

Pure: `now` is an argument.
"""

from __future__ import annotations

import json
from html import escape
from typing import TYPE_CHECKING, Any

from fleetkeeper.dashboard.history import ordered_statuses
from fleetkeeper.model import from_iso

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetkeeper.dashboard.history import Sample

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 12, 28
# The shortest stretch a plot shows: a rollout of a minute, seen as soon as the dashboard starts, is not
# a sliver at the edge of half an hour.
MIN_SPAN_SECONDS = 120.0
# Events worth a marker on the replicas plot: what moves replicas.
MARKED_REASONS = frozenset({"Created", "Updated", "RolledBack", "Scaled", "BreakerTripped", "VersionReady"})


def _x(at: float, start: float, end: float) -> float:
    span = max(end - start, 1.0)
    return LEFT + (min(max(at, start), end) - start) / span * (WIDTH - LEFT - RIGHT)


def _y(value: float, top: float) -> float:
    return HEIGHT - BOTTOM - (value / top if top > 0 else 0) * (HEIGHT - TOP - BOTTOM)


def _nice_top(value: float) -> float:
    """An axis top at or above `value`: 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 <= value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale  # pragma: no cover


def _clock(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")


def stretch(samples: Sequence[Sample], now: float, window: float) -> float:
    """Where a plot starts: `window` back, or from the first sample if the dashboard has seen less."""
    first = samples[0].at if samples else now
    return max(now - window, min(first, now - MIN_SPAN_SECONDS))


def _frame(kind: str, label: str, series: Any, top: float, start: float, end: float, body: list[str]) -> str:
    ticks = []
    for fraction in (0.0, 0.5, 1.0):
        y = _y(top * fraction, top)
        shown = f"{top * fraction:g}"
        ticks.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        ticks.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{shown}</text>')
    for at, anchor in ((start, "start"), ((start + end) / 2, "middle"), (end, "end")):
        x = _x(at, start, end)
        ticks.append(f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">{_clock(at)}</text>')
    data = escape(json.dumps(series, separators=(",", ":")), quote=True)
    return (
        f'<svg class="plot plot-{kind}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(label)}" '
        f'data-series="{data}" xmlns="http://www.w3.org/2000/svg"><title>{escape(label)}</title>'
        + "".join(ticks)
        + "".join(body)
        + "</svg>"
    )


def replicas_plot(samples: Sequence[Sample], events: Sequence[dict[str, Any]], now: float, window: float) -> str:
    """Replicas by status over the last `window` seconds, stacked, with the target as a dashed line
    and the events that move replicas as marked lines."""
    start, end = stretch(samples, now, window), now
    shown = [s for s in samples if s.at >= start]
    statuses = ordered_statuses(shown)
    totals = [sum(s.by_status.values()) for s in shown]
    targets = [s.target for s in shown if s.target is not None]
    top = _nice_top(max([*totals, *targets, 1]))
    body: list[str] = []
    if shown:
        below = [0.0] * len(shown)
        for status in statuses:
            above = [b + s.by_status.get(status, 0) for b, s in zip(below, shown, strict=True)]
            xs = [_x(s.at, start, end) for s in shown]
            if len(shown) == 1:  # one sample: a sliver, so it shows
                xs = [xs[0] - 2, xs[0] + 2]
                upper, lower = [above[0]] * 2, [below[0]] * 2
            else:
                upper, lower = above, below
            points = [f"{x:.1f},{_y(v, top):.1f}" for x, v in zip(xs, upper, strict=True)]
            points += [f"{x:.1f},{_y(v, top):.1f}" for x, v in reversed(list(zip(xs, lower, strict=True)))]
            body.append(
                f'<polygon class="area s-{escape(status)}" points="{" ".join(points)}">'
                f"<title>{escape(status)}</title></polygon>"
            )
            below = above
        target_points = [f"{_x(s.at, start, end):.1f},{_y(s.target, top):.1f}" for s in shown if s.target is not None]
        if target_points:
            body.append(f'<polyline class="target" points="{" ".join(target_points)}"><title>target</title></polyline>')
    marks = []
    for event in events:
        if event.get("reason") not in MARKED_REASONS:
            continue
        at = from_iso(str(event["first_seen"])).timestamp()
        if not start <= at <= end:
            continue
        x = _x(at, start, end)
        words = f"{event['reason']}: {event.get('message', '')}"
        body.append(
            f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}">'
            f"<title>{escape(words)}</title></line>"
        )
        marks.append({"at": round(at, 3), "reason": event["reason"]})
    body.extend(_legend([*statuses, "target"]))
    series = {
        "statuses": statuses,
        "samples": [
            {"at": round(s.at, 3), "by_status": s.by_status, "by_version": {str(k): v for k, v in s.by_version.items()}}
            for s in shown
        ],
        "marks": marks,
    }
    if not shown:
        body.append(_empty("no samples yet: this plot fills while the dashboard runs"))
    return _frame("replicas", "replicas by status", series, top, start, end, body)


def rate_plot(metrics: dict[str, Any] | None, samples: Sequence[Sample], now: float, window: float) -> str:
    """Requests a second through the endpoint, against what the replicas are sized for (the
    autoscaler's target_qps_per_replica times its target, as it changed while sampled)."""
    start, end = stretch(samples, now, window), now
    points = []
    for point in (metrics or {}).get("request_rate", []):
        at = from_iso(str(point["at"])).timestamp()
        if at >= start - float((metrics or {}).get("period_seconds", 60)):
            points.append((at, float(point["rate"])))
    per_replica = (metrics or {}).get("target_qps_per_replica")
    capacity: list[tuple[float, float]] = []
    if per_replica is not None:
        capacity = [(s.at, s.target * float(per_replica)) for s in samples if s.at >= start and s.target is not None]
        capacity.append((now, float((metrics or {}).get("target_replicas") or 0) * float(per_replica)))
    top = _nice_top(max([r for _, r in points] + [c for _, c in capacity] + [1.0]))
    body: list[str] = []
    if capacity:
        line = " ".join(f"{_x(a, start, end):.1f},{_y(v, top):.1f}" for a, v in capacity)
        body.append(f'<polyline class="target" points="{line}"><title>autoscaler target</title></polyline>')
    if points:
        line = " ".join(f"{_x(a, start, end):.1f},{_y(r, top):.1f}" for a, r in points)
        body.append(f'<polyline class="rate" points="{line}"><title>request rate</title></polyline>')
        for at, rate in points:
            body.append(
                f'<circle class="rate" cx="{_x(at, start, end):.1f}" cy="{_y(rate, top):.1f}" r="2.5">'
                f"<title>{_clock(at)}: {rate:g} req/s</title></circle>"
            )
    body.extend(_legend(["request rate", *(["autoscaler target"] if per_replica is not None else [])]))
    if not points:
        why = "no requests counted in this stretch" if metrics and metrics.get("period_seconds") else "no endpoint yet"
        body.append(_empty(why))
    series = {
        "request_rate": [{"at": a, "rate": r} for a, r in points],
        "capacity": [{"at": round(a, 3), "rate": v} for a, v in capacity],
    }
    return _frame("rate", "request rate (req/s) against the autoscaler's target", series, top, start, end, body)


def _legend(names: list[str]) -> list[str]:
    items = []
    x = LEFT + 4.0
    for name in names:
        css = (
            "target" if name in ("target", "autoscaler target") else ("rate" if name == "request rate" else f"s-{name}")
        )
        items.append(f'<rect class="key {escape(css)}" x="{x}" y="{TOP}" width="10" height="10"/>')
        items.append(f'<text class="key-label" x="{x + 14}" y="{TOP + 9}">{escape(name)}</text>')
        x += 30 + 7.5 * len(name)
    return items


def _empty(words: str) -> str:
    return f'<text class="empty" x="{WIDTH / 2:.0f}" y="{HEIGHT / 2:.0f}" text-anchor="middle">{escape(words)}</text>'
