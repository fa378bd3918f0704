"""`access`, `versions` and `events`: what the API says of one service, shown or (access) changed."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fleetkeeper.cli import render
from fleetkeeper.cli.http import ApiError, UsageError
from fleetkeeper.cli.waiting import EXIT_OK

if TYPE_CHECKING:
    from fleetkeeper.cli.invocation import Cli


def access(cli: Cli) -> int:
    """Show the service's owner and grants; with --add/--remove, change the grants first."""
    if cli.args.read_only and not cli.args.add:
        raise UsageError("--read-only applies to --add PRINCIPAL: name the principal to grant read access")
    if not cli.args.add and not cli.args.remove:
        view = cli.client.request("GET", f"/v1/services/{cli.name}").body
        shown = {"name": view["name"], "owner": view["owner"], "access": view["access"]}
        if cli.structured:
            cli.emit(shown)
        else:
            cli.print(render.access_detail(shown))
        return EXIT_OK
    mode = "read" if cli.args.read_only else "write"
    body = {"add": [{"principal": p, "mode": mode} for p in cli.args.add], "remove": cli.args.remove}
    view = cli.client.request("POST", f"/v1/services/{cli.name}/access", body).body
    if cli.structured:
        cli.emit(view)
    else:
        cli.note(f"{cli.args.name}: access {'changed' if view['changed'] else 'unchanged: it was so already'}")
        cli.print(render.access_detail(view))
    return EXIT_OK


def versions(cli: Cli) -> int:
    versions = cli.all_versions()
    if cli.structured:
        cli.emit(versions)
    else:
        cli.print(render.versions_table(versions))
    return EXIT_OK


def events(cli: Cli) -> int:
    """The service's newest events; with --follow, then each new or repeated one as it comes."""
    events = cli.recent_events(limit=100)
    if cli.structured and not cli.args.follow:
        cli.emit({"events": events})
        return EXIT_OK
    if not cli.args.follow:
        cli.print(render.events_table(events))
        return EXIT_OK
    seen: dict[tuple[Any, ...], int] = {}
    while True:
        for event in reversed(events):  # oldest first
            key = (event["first_seen"], event["reason"], event.get("replica_id"), event["message"])
            if seen.get(key) != event["count"]:
                seen[key] = event["count"]
                if cli.structured:
                    cli.emit_item(event, streaming=True)
                else:
                    cli.print(render.event_line(event))
        cli.out.flush()
        time.sleep(2.0)
        try:
            events = cli.recent_events(limit=20)
        except ApiError as exc:
            if exc.status == 404:
                cli.note(f"{cli.args.name} is gone (deleted)")
                return EXIT_OK
            raise
