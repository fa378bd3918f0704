"""Human output of the CLI (tables). JSON output is the API's own objects, see docs/CLI.md."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fleetkeeper.cli.waiting import readiness, without_count


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in [headers, *rows]]
    return "\n".join(lines)


def services_table(services: list[dict[str, Any]]) -> str:
    if not services:
        return "no services"
    rows = [
        [
            s["name"],
            s["status"],
            f"v{s['target_version']}",
            s.get("lifecycle", ""),
            s.get("endpoint") or "-",
            s.get("status_message", ""),
        ]
        for s in services
    ]
    return table(["NAME", "STATUS", "VERSION", "LIFECYCLE", "ENDPOINT", "MESSAGE"], rows)


def service_detail(view: dict[str, Any]) -> str:
    target = int(view["target_version"])
    # One count, made from the replicas listed below (the status message's own count is dropped).
    message = without_count(view.get("status_message", ""))
    head = [
        f"{view['name']}  {view['status']}  v{target} of {view['latest_version']}  "
        f"({readiness(view, target)}, {view.get('mode') or 'rolling'})",
        f"  endpoint: {view.get('endpoint') or '-'}",
        *access_lines(view),
        *([f"  {message}"] if message else []),
    ]
    scaling = autoscaling_line(view.get("autoscaling"))
    if scaling:
        head.insert(2, scaling)
    head.extend(placement_lines(view.get("placement")))
    if int(view.get("observed_generation", 0)) < int(view.get("generation", 0)):
        head.append(
            f"  (that status is of generation {view.get('observed_generation')}; the reconciler has not acted on "
            f"generation {view.get('generation')} yet)"
        )
    replicas = view.get("replicas", [])
    if not replicas:
        return "\n".join([*head, "  no replicas"])
    rows = [
        [
            str(r["replica_id"]),
            f"v{r['version']}",
            r["status"],
            r.get("url") or "-",
            r.get("instance_id") or "-",
            _resources(r),
            r.get("endpoint_state") or "-",
            r.get("status_message", ""),
        ]
        for r in replicas
    ]
    body = table(["REPLICA", "VERSION", "STATUS", "URL", "INSTANCE", "RESOURCES", "ENDPOINT", "MESSAGE"], rows)
    return "\n".join([*head, "", body])


def access_lines(view: dict[str, Any]) -> list[str]:
    """`  owner: ARN` and `  access: ARN (write), ARN (read)`: who the service answers to besides
    the stack's administrators."""
    owner = view.get("owner") or "- (created before owners: administrators only)"
    grants = ", ".join(f"{g['principal']} ({g['mode']})" for g in view.get("access") or []) or "-"
    return [f"  owner: {owner}", f"  access: {grants}"]


def access_detail(view: dict[str, Any]) -> str:
    """`fleetkeeper access NAME`: the owner, then one line a grant."""
    lines = [f"{view['name']}", f"  owner: {view.get('owner') or '- (created before owners: administrators only)'}"]
    grants = view.get("access") or []
    lines += [f"  {g['mode']:<5}  {g['principal']}" for g in grants] or ["  no other principals"]
    lines.append("  (and the stack's administrators)")
    return "\n".join(lines)


def _resources(replica: dict[str, Any]) -> str:
    """`t3.micro [spot]` (SkyPilot's marker for spot), `m6i.large`, or the market alone before launch."""
    market = replica.get("market") or "on-demand"
    spot = " [spot]" if market == "spot" else ""
    kind = replica.get("instance_type")
    return f"{kind}{spot}" if kind else ("[spot]" if spot else "on-demand")


def placement_lines(placement: dict[str, Any] | None) -> list[str]:
    """E.g. "  instance types: g6.xlarge (launched), g5.xlarge" and a line per note."""
    if placement is None:
        return []
    types = placement.get("instance_types") or []
    shown = f"{types[0]} (launched), {', '.join(types[1:])}".rstrip(", ") if types else "the stack's default"
    return [f"  instance types: {shown}", *(f"  note: {note}" for note in placement.get("notes") or [])]


def autoscaling_line(scaling: dict[str, Any] | None, now: datetime | None = None) -> str | None:
    """E.g. "  autoscaling: 1 replica(s) (1-3, 2 req/s each); 7.9 req/s (60s window, read 12s ago); scaling
    up to 3 in 2m: ...". The rate is the reading behind the current recommendation (later readings
    within 10% of it change nothing, so its age can be minutes): its window and age say what it is.
    A change is named only while one is pending; waking only for a service at zero."""
    if not scaling:
        return None
    parts = [
        f"{scaling['target_replicas']} replica(s) ({scaling['min_replicas']}-{scaling['max_replicas']}, "
        f"{scaling['target_qps_per_replica']:g} req/s each)"
    ]
    rate = scaling.get("request_rate")
    if rate is None:
        parts.append("no reading yet")
    else:
        window = scaling.get("request_rate_window_seconds")
        at = scaling.get("request_rate_at")
        notes = [
            f"{window}s window" if window else None,
            f"read {_ago(at, now or datetime.now(UTC))} ago" if at else None,
        ]
        shown = ", ".join(n for n in notes if n)
        parts.append(f"{rate_text(rate)} req/s" + (f" ({shown})" if shown else ""))
    pending = scaling.get("pending")
    if pending:
        parts.append(pending["message"])
    if scaling.get("waking"):
        if scaling["target_replicas"] == 0:
            parts.append("at zero: a request gets 503 + Retry-After and wakes it")
        else:
            parts.append("no replica ready yet: requests get 503 + Retry-After until one is")
    return "  autoscaling: " + "; ".join(parts)


def rate_text(rate: float) -> str:
    """A request rate as the autoscaler's messages print it: one decimal, without a trailing `.0`."""
    text = f"{rate:.1f}".removesuffix(".0")
    return "0" if text == "-0" else text


def versions_table(versions: dict[str, Any]) -> str:
    target = versions["target_version"]
    rows = [
        [
            ("* " if v["version"] == target else "  ") + f"v{v['version']}",
            v["state"],
            v["mode"],
            v["created_at"],
            v.get("state_message", ""),
        ]
        for v in versions["versions"]
    ]
    return table(["VERSION", "STATE", "MODE", "CREATED", "MESSAGE"], rows)


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def as_json_line(value: Any) -> str:
    """One JSON document on one line: a stream of them (--follow, --watch) is read line by line."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def as_yaml(value: Any) -> str:
    import yaml

    return str(yaml.safe_dump(value, sort_keys=True, default_flow_style=False, allow_unicode=True)).rstrip("\n")


def structured(value: Any, output: str) -> str:
    """-o json or -o yaml: the same object either way."""
    return as_yaml(value) if output == "yaml" else as_json(value)


def _ago(event_time: str, now: datetime) -> str:
    try:
        seconds = int((now - datetime.fromisoformat(event_time)).total_seconds())
    except ValueError:
        return event_time
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def events_table(events: list[dict[str, Any]], now: datetime | None = None) -> str:
    """Events oldest first (the newest last, next to the prompt), as `kubectl get events` lists them."""
    if not events:
        return "no events"
    moment = now or datetime.now(UTC)
    rows = [
        [
            _ago(e["time"], moment),
            e["type"],
            e["reason"],
            "-" if e.get("replica_id") is None else str(e["replica_id"]),
            str(e["count"]) if e["count"] > 1 else "",
            e["message"],
        ]
        for e in reversed(events)
    ]
    return table(["LAST SEEN", "TYPE", "REASON", "REPLICA", "COUNT", "MESSAGE"], rows)


def event_line(event: dict[str, Any]) -> str:
    """One event for `events --follow`: its time, and what it says."""
    replica = "" if event.get("replica_id") is None else f" replica {event['replica_id']}"
    count = f" (x{event['count']})" if event["count"] > 1 else ""
    return f"{event['time']}  {event['type']:<7}  {event['reason']}{replica}: {event['message']}{count}"
