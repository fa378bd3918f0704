"""The dashboard's HTML, rendered on the server: every value from the API is escaped here.

Pages are whole documents; the parts that refresh on their own (the services table, a service's
state, plots, events and log tail) are also served alone as fragments, which the page's script
fetches and puts in place (static/dashboard.js). Without the script every page still works: it is
current as of its load, sorting and filtering are links and a GET form, actions are forms with a
confirmation page. Pure: `now` (epoch seconds) is an argument.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from fleetkeeper.dashboard.history import desired_replicas
from fleetkeeper.model import from_iso

if TYPE_CHECKING:
    from collections.abc import Sequence

SORT_KEYS = ("name", "status", "ready", "version", "rate", "age")
LOG_LINES = 200


@dataclass(frozen=True)
class Frame:
    """What every page shows around its content."""

    target: str  # "embedded mode (http://127.0.0.1:8470)" or "stack NAME (https://...)"
    allow_actions: bool
    refresh_seconds: float


def e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def page(frame: Frame, title: str, body: str) -> str:
    mode = (
        '<span class="mode actions">actions allowed</span>'
        if frame.allow_actions
        else '<span class="mode read-only">read-only</span>'
    )
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · fleetkeeper</title>"
        '<link rel="stylesheet" href="/static/dashboard.css">'
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        '<script src="/static/dashboard.js" defer></script></head>'
        f'<body data-refresh-seconds="{frame.refresh_seconds:g}">'
        '<header><a class="brand" href="/">fleetkeeper</a>'
        f'<span class="target">{e(frame.target)}</span>{mode}'
        '<button type="button" id="pause" class="pause" hidden>pause refresh</button>'
        '<span id="refreshed" class="refreshed"></span></header>'
        f"<main>{body}</main></body></html>\n"
    )


def message_page(frame: Frame, title: str, words: str, back: str = "/") -> str:
    return page(
        frame,
        title,
        f'<section class="message"><h1>{e(title)}</h1><p>{e(words)}</p><p><a href="{e(back)}">back</a></p></section>',
    )


# --- ages, rates --------------------------------------------------------------------------------------


def age(iso: str | None, now: float) -> str:
    if not iso:
        return "—"
    seconds = max(0, int(now - from_iso(iso).timestamp()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def latest_rate(metrics: dict[str, Any] | None, now: float) -> float | None:
    """The newest bucket's rate if it is recent (two periods), else None: no reading."""
    if not metrics or not metrics.get("request_rate"):
        return None
    point = metrics["request_rate"][-1]
    period = float(metrics.get("period_seconds") or 60)
    if now - from_iso(str(point["at"])).timestamp() > 3 * period:
        return 0.0
    return float(point["rate"])


def _rate_text(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:.2f} req/s"


def _badge(status: str) -> str:
    return f'<span class="badge s-{e(status)}">{e(status)}</span>'


# --- the services -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    status: str
    message: str
    ready: int
    replicas: int
    target: int | None
    version: int
    versions_running: tuple[int, ...]
    endpoint: str | None
    rate: float | None
    created_at: str
    lifecycle: str

    @classmethod
    def of(cls, summary: dict[str, Any], view: dict[str, Any] | None, rate: float | None) -> Row:
        replicas = (view or {}).get("replicas") or []
        return cls(
            name=str(summary["name"]),
            status=str(summary["status"]),
            message=str(summary.get("status_message") or ""),
            ready=sum(1 for r in replicas if r["status"] == "READY"),
            replicas=len(replicas),
            target=desired_replicas(view) if view else None,
            version=int(summary["target_version"]),
            versions_running=tuple(sorted({int(r["version"]) for r in replicas})),
            endpoint=summary.get("endpoint"),
            rate=rate,
            created_at=str(summary["created_at"]),
            lifecycle=str(summary.get("lifecycle") or ""),
        )

    def matches(self, words: str) -> bool:
        text = " ".join([self.name, self.status, self.message, self.endpoint or "", self.lifecycle]).lower()
        return all(word in text for word in words.lower().split())


def sort_rows(rows: Sequence[Row], key: str, descending: bool) -> list[Row]:
    keys: dict[str, Any] = {
        "name": lambda r: r.name,
        "status": lambda r: (r.status, r.name),
        "ready": lambda r: (r.ready - (r.target or 0), r.name),
        "version": lambda r: (r.version, r.name),
        "rate": lambda r: (r.rate if r.rate is not None else -1.0, r.name),
        "age": lambda r: (r.created_at, r.name),
    }
    return sorted(rows, key=keys.get(key, keys["name"]), reverse=descending)


def services_query(sort: str, descending: bool, words: str) -> str:
    query = {"sort": sort, "order": "desc" if descending else "asc"}
    if words:
        query["q"] = words
    return urlencode(query)


def services_page(frame: Frame, table: str, sort: str, descending: bool, words: str) -> str:
    query = services_query(sort, descending, words)
    body = (
        '<section><div class="toolbar"><h1>Services</h1>'
        '<form method="get" action="/" class="filter" role="search">'
        f'<input type="hidden" name="sort" value="{e(sort)}">'
        f'<input type="hidden" name="order" value="{"desc" if descending else "asc"}">'
        f'<input type="search" id="filter" name="q" value="{e(words)}" placeholder="filter: name, status, endpoint" '
        'aria-label="filter services" autocomplete="off"><button type="submit">filter</button></form></div>'
        f'<div id="services" data-fragment="/fragments/services?{e(query)}">{table}</div></section>'
    )
    return page(frame, "services", body)


def services_table(
    rows: Sequence[Row], sort: str, descending: bool, words: str, now: float, problem: str | None
) -> str:
    shown = sort_rows([r for r in rows if r.matches(words)], sort, descending)
    head = []
    for key, label in (
        ("name", "name"),
        ("status", "status"),
        ("ready", "ready / target"),
        ("version", "version"),
        (None, "endpoint"),
        ("rate", "request rate"),
        ("age", "age"),
    ):
        if key is None:
            head.append(f"<th>{label}</th>")
            continue
        flip = not descending if key == sort else key in ("rate", "age")
        arrow = (" ▼" if descending else " ▲") if key == sort else ""
        link = "/?" + services_query(key, flip, words)
        head.append(f'<th><a href="{e(link)}" data-sort="{key}">{label}{arrow}</a></th>')
    lines = []
    for row in shown:
        running = row.versions_running
        version = (
            f"v{row.version}"
            if running in ((), (row.version,))
            else f"v{row.version} ({', '.join(f'v{v}' for v in running)} running)"
        )
        target = "?" if row.target is None else str(row.target)
        short = row.ready < (row.target or 0)
        endpoint = (
            f'<a href="{e(row.endpoint)}" rel="noreferrer noopener" target="_blank">{e(row.endpoint)}</a>'
            if row.endpoint
            else "—"
        )
        lines.append(
            f'<tr class="service" data-name="{e(row.name)}" data-status="{e(row.status)}">'
            f'<td><a href="/services/{quote(row.name)}">{e(row.name)}</a></td>'
            f'<td>{_badge(row.status)}<div class="why">{e(row.message)}</div></td>'
            f'<td class="num{" short" if short else ""}">{row.ready} / {e(target)}</td>'
            f"<td>{e(version)}</td><td>{endpoint}</td>"
            f'<td class="num">{e(_rate_text(row.rate))}</td><td class="num">{e(age(row.created_at, now))}</td></tr>'
        )
    if not lines:
        empty = "no service matches the filter" if rows else "no services yet (fleetkeeper up SPEC.yaml)"
        lines.append(f'<tr><td colspan="7" class="empty">{e(empty)}</td></tr>')
    warning = f'<p class="problem">{e(problem)}</p>' if problem else ""
    summary = f'<p class="count">{len(shown)} of {len(rows)} service(s)</p>'
    return (
        f'{warning}<table class="services"><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(lines)}</tbody></table>{summary}"
    )


# --- one service --------------------------------------------------------------------------------------


def service_page(
    frame: Frame,
    view: dict[str, Any],
    state: str,
    plots: str,
    events: str,
    versions: list[dict[str, Any]],
    csrf: str | None,
    notice: str | None,
) -> str:
    name = str(view["name"])
    base = f"/fragments/services/{quote(name)}"
    replicas = view.get("replicas") or []
    options = "".join(
        f'<option value="{int(r["replica_id"])}">'
        f"replica {int(r['replica_id'])} (v{int(r['version'])}, {e(r['status'])})</option>"
        for r in replicas
    )
    first = int(replicas[0]["replica_id"]) if replicas else None
    logs = (
        '<section class="logs"><h2>Log tail</h2>'
        f'<form method="get" action="/services/{quote(name)}/logs" class="log-pick">'
        '<select name="replica" id="log-replica" aria-label="replica" '
        f'data-fragment-base="{e(base)}/logs">{options}</select>'
        '<button type="submit">show</button></form>'
        + (
            f'<pre id="log" class="log" data-fragment="{e(base)}/logs?replica={first}">loading…</pre>'
            if first is not None
            else '<p class="empty">no replicas</p>'
        )
        + "</section>"
    )
    notice_html = f'<p class="notice" role="status">{e(notice)}</p>' if notice else ""
    body = (
        f'<nav class="crumbs"><a href="/">services</a> / {e(name)}</nav>{notice_html}'
        f'<div id="state" data-fragment="{e(base)}/state">{state}</div>'
        '<section class="plots"><h2>Traffic and replicas</h2>'
        f'<div id="plots" data-fragment="{e(base)}/plots">{plots}</div></section>'
        + actions_section(frame, view, versions, csrf)
        + versions_section(name, versions, int(view["target_version"]))
        + '<section class="events"><h2>Events</h2>'
        + f'<div id="events" data-fragment="{e(base)}/events">{events}</div></section>'
        + logs
    )
    return page(frame, name, body)


def state_fragment(view: dict[str, Any], now: float) -> str:
    name = str(view["name"])
    replicas = view.get("replicas") or []
    ready = sum(1 for r in replicas if r["status"] == "READY")
    target = desired_replicas(view)
    endpoint = view.get("endpoint")
    scaling = view.get("autoscaling")
    scaling_text = ""
    if isinstance(scaling, dict):
        rate = scaling.get("request_rate")
        pending = (scaling.get("pending") or {}).get("message")
        scaling_text = (
            f"<dt>autoscaling</dt><dd>{e(scaling['min_replicas'])} to {e(scaling['max_replicas'])} replicas, "
            f"{e(scaling['target_qps_per_replica'])} req/s each; last rate {e(_rate_text(rate))}"
            + (f"; {e(pending)}" if pending else "; steady")
            + "</dd>"
        )
    rows = []
    for r in replicas:
        reason = str(r.get("status_message") or "")
        typed = " · ".join(str(x) for x in (r.get("failure_code"), r.get("cause")) if x)
        interruption = r.get("interruption")
        if isinstance(interruption, dict):
            typed = " · ".join(x for x in (typed, f"{interruption['kind']} at {interruption['at']}") if x)
        url = r.get("url")
        url_html = (
            f'<a href="{e(url)}" rel="noreferrer noopener" target="_blank">{e(url)}</a>'
            if url and str(url).startswith("http://127.0.0.1")
            else e(url or "—")
        )
        rows.append(
            f'<tr class="replica" data-replica="{int(r["replica_id"])}" data-status="{e(r["status"])}" '
            f'data-version="{int(r["version"])}">'
            f'<td class="num">{int(r["replica_id"])}</td><td>v{int(r["version"])}</td>'
            f'<td>{_badge(str(r["status"]))}<div class="why">{e(reason)}</div>'
            + (f'<div class="typed">{e(typed)}</div>' if typed else "")
            + f"</td><td>{e(r.get('endpoint_state') or '—')}</td><td>{e(r.get('instance_type') or '—')}</td>"
            f"<td>{e(r.get('market'))}</td><td>{e(r.get('instance_id') or '—')}</td>"
            f'<td class="num">{e(age(r.get("created_at"), now))}</td><td>{url_html}</td></tr>'
        )
    if not rows:
        rows.append('<tr><td colspan="9" class="empty">no replicas</td></tr>')
    endpoint_html = (
        f'<a href="{e(endpoint)}" rel="noreferrer noopener" target="_blank">{e(endpoint)}</a>' if endpoint else "—"
    )
    return (
        f'<section class="summary"><h1>{e(name)} {_badge(str(view["status"]))}</h1>'
        f'<p class="why">{e(view.get("status_message"))}</p><dl>'
        f'<dt>replicas</dt><dd><span id="ready-count">{ready}</span> ready / '
        f"{e('?' if target is None else target)} target</dd>"
        f"<dt>version</dt><dd>v{int(view['target_version'])} (latest v{int(view['latest_version'])}, "
        f"mode {e(view.get('mode'))})</dd>"
        f"<dt>endpoint</dt><dd>{endpoint_html}</dd>"
        f"<dt>owner</dt><dd>{e(view.get('owner') or '—')}</dd>"
        f"<dt>age</dt><dd>{e(age(view.get('created_at'), now))}</dd>"
        f"<dt>generation</dt><dd>{int(view['generation'])}"
        f"{'' if view.get('reconciled') else ' (the reconciler has not acted on it yet)'}</dd>"
        f"{scaling_text}</dl></section>"
        '<section class="replicas"><h2>Replicas</h2><table class="replicas"><thead><tr>'
        "<th>id</th><th>version</th><th>status and reason</th><th>endpoint</th><th>instance type</th>"
        "<th>market</th><th>instance</th><th>age</th><th>URL</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def events_fragment(events: Sequence[dict[str, Any]], now: float) -> str:
    if not events:
        return '<p class="empty">no events</p>'
    items = []
    for event in events:
        about = " ".join(
            part
            for part in (
                f"replica {event['replica_id']}" if event.get("replica_id") is not None else "",
                f"v{event['version']}" if event.get("version") is not None else "",
                str(event.get("code") or ""),
            )
            if part
        )
        count = f' <span class="count">x{int(event["count"])}</span>' if int(event.get("count") or 1) > 1 else ""
        items.append(
            f'<li class="event {e(str(event["type"]).lower())}" data-reason="{e(event["reason"])}">'
            f'<time datetime="{e(event["time"])}" title="{e(event["time"])}">'
            f"{e(age(str(event['time']), now))} ago</time>"
            f'<span class="reason">{e(event["reason"])}</span>{count}'
            f'<span class="about">{e(about)}</span><span class="text">{e(event["message"])}</span></li>'
        )
    return f'<ol class="timeline">{"".join(items)}</ol>'


def versions_section(name: str, versions: Sequence[dict[str, Any]], target: int) -> str:
    rows = []
    for v in reversed(versions):
        number = int(v["version"])
        current = ' <span class="current">current</span>' if number == target else ""
        rows.append(
            f'<tr data-version="{number}"><td>v{number}{current}</td><td>{e(v.get("state"))}</td>'
            f"<td>{e(v.get('mode'))}</td><td>{e(v.get('created_at'))}</td><td>{e(v.get('state_message'))}</td></tr>"
        )
    numbers = [int(v["version"]) for v in versions]
    older = numbers[-2] if len(numbers) > 1 else (numbers[0] if numbers else 1)
    newer = numbers[-1] if numbers else 1
    diff_form = (
        f'<form method="get" action="/services/{quote(name)}/diff" class="diff-pick">'
        f'compare <select name="from" aria-label="from version">{_options(numbers, older)}</select>'
        f' with <select name="to" aria-label="to version">{_options(numbers, newer)}</select>'
        ' <button type="submit">show changes</button></form>'
        if len(numbers) > 1
        else ""
    )
    return (
        '<section class="versions"><h2>Versions</h2>'
        '<table class="versions"><thead><tr><th>version</th><th>state</th><th>mode</th><th>created</th>'
        "<th>note</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>{diff_form}</section>"
    )


def _options(numbers: Sequence[int], selected: int) -> str:
    return "".join(
        f'<option value="{n}"{" selected" if n == selected else ""}>v{n}</option>' for n in reversed(numbers)
    )


def diff_page(frame: Frame, name: str, older: dict[str, Any], newer: dict[str, Any]) -> str:
    a, b = int(older["version"]), int(newer["version"])
    before = json.dumps(older["spec"], indent=2, sort_keys=True).splitlines()
    after = json.dumps(newer["spec"], indent=2, sort_keys=True).splitlines()
    lines = list(difflib.unified_diff(before, after, f"v{a}", f"v{b}", lineterm="", n=3))
    if not lines:
        shown = '<p class="empty">the two specs are the same</p>'
    else:
        css = {"+": "add", "-": "del", "@": "hunk"}
        shown = (
            '<pre class="diff">'
            + "\n".join(f'<span class="{css.get(line[:1], "ctx")}">{e(line)}</span>' for line in lines)
            + "</pre>"
        )
    body = (
        f'<nav class="crumbs"><a href="/">services</a> / <a href="/services/{quote(name)}">{e(name)}</a>'
        f" / v{a} → v{b}</nav>"
        f"<section><h1>{e(name)}: what changed from v{a} to v{b}</h1>{shown}</section>"
    )
    return page(frame, f"{name} v{a}→v{b}", body)


def log_fragment(text: str) -> str:
    return e(text) if text else "(no output yet)"


# --- actions ------------------------------------------------------------------------------------------


def actions_section(frame: Frame, view: dict[str, Any], versions: Sequence[dict[str, Any]], csrf: str | None) -> str:
    name = str(view["name"])
    if not frame.allow_actions or csrf is None:
        return (
            '<section class="actions read-only"><h2>Actions</h2><p>This dashboard is read-only: start it with '
            "<code>--allow-actions</code> to roll back, scale or terminate a replica from here.</p></section>"
        )
    generation = int(view["generation"])
    target = int(view["target_version"])
    earlier = [int(v["version"]) for v in versions if int(v["version"]) != target]
    hidden = (
        f'<input type="hidden" name="csrf" value="{e(csrf)}">'
        f'<input type="hidden" name="generation" value="{generation}">'
    )
    forms = []
    if earlier:
        picks = "".join(f'<option value="{n}">v{n}</option>' for n in reversed(earlier))
        forms.append(
            f'<form method="post" action="/services/{quote(name)}/rollback" class="action" id="rollback-form">{hidden}'
            f'roll back to <select name="version" aria-label="version">{picks}</select> '
            '<button type="submit">roll back…</button></form>'
        )
    fixed = not isinstance(view.get("autoscaling"), dict)
    if fixed:
        current = desired_replicas(view) or 0
        forms.append(
            f'<form method="post" action="/services/{quote(name)}/scale" class="action" id="scale-form">{hidden}'
            '<label>scale to <input type="number" name="replicas" min="0" max="1000" '
            f'value="{current}" aria-label="replicas"> replicas</label> '
            '<button type="submit">scale…</button></form>'
        )
    forms.append(_terminate_forms(name, str(view["uid"]), view.get("replicas") or [], csrf))
    return f'<section class="actions"><h2>Actions</h2>{"".join(forms)}</section>'


def _terminate_forms(name: str, uid: str, replicas: Sequence[dict[str, Any]], csrf: str) -> str:
    """A button per replica not asked for already: it goes, and the reconciler replaces it."""
    hidden = f'<input type="hidden" name="csrf" value="{e(csrf)}"><input type="hidden" name="uid" value="{e(uid)}">'
    buttons = "".join(
        f'<form method="post" action="/services/{quote(name)}/terminate" class="action terminate-form" '
        f'data-replica="{int(r["replica_id"])}">{hidden}'
        f'<input type="hidden" name="replica" value="{int(r["replica_id"])}">'
        f'<button type="submit">terminate replica {int(r["replica_id"])}…</button></form>'
        for r in replicas
        if r.get("terminate_requested_at") is None
    )
    if not buttons:
        return ""
    return f'<div class="terminate">terminate one replica (the reconciler replaces it): {buttons}</div>'


def confirm_page(frame: Frame, name: str, action: str, question: str, fields: dict[str, str], csrf: str) -> str:
    hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in fields.items())
    body = (
        f'<section class="confirm"><h1>{e(question)}</h1>'
        f'<form method="post" action="/services/{quote(name)}/{e(action)}" id="confirm-form">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}"><input type="hidden" name="confirmed" value="yes">{hidden}'
        f'<button type="submit" id="confirm" class="danger">yes, {e(action)}</button> '
        f'<a href="/services/{quote(name)}" id="cancel">cancel</a></form></section>'
    )
    return page(frame, f"confirm {action}", body)
