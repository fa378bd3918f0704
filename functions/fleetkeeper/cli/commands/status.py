"""`status`: one service (its replicas and newest events) or every service, once or --watch; --endpoint."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleetkeeper.cli import render
from fleetkeeper.cli.http import ApiError, UsageError
from fleetkeeper.cli.waiting import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from fleetkeeper.cli.invocation import Cli

# The newest events `status NAME` shows under the service.
STATUS_EVENTS = 5


def status(cli: Cli) -> int:
    if cli.args.endpoint:
        return _endpoint(cli)
    if not cli.args.watch:
        _status_once(cli)
        return EXIT_OK
    # --watch: as `kubectl get -w` / `watch`: refresh every --interval seconds until Ctrl-C
    # (or --count refreshes). On a terminal the screen is redrawn; elsewhere each one is appended.
    shown = 0
    try:
        while True:
            if shown and cli.out.isatty() and not cli.structured:
                cli.out.write("\x1b[H\x1b[2J")
            elif shown and not cli.structured:
                cli.print("")
            try:
                _status_once(cli, watching=True)
            except ApiError as exc:
                if exc.status == 404 and shown:
                    cli.note(f"{cli.args.name} is gone")
                    return EXIT_OK
                raise
            cli.out.flush()
            shown += 1
            if cli.args.count is not None and shown >= cli.args.count:
                return EXIT_OK
            time.sleep(cli.args.interval)
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C is how a watch ends


def _status_once(cli: Cli, *, watching: bool = False) -> None:
    if cli.args.name:
        view = cli.client.request("GET", f"/v1/services/{cli.name}").body
        if cli.structured:
            cli.emit_item(view, watching)
            return
        events = cli.recent_events(limit=STATUS_EVENTS)
        more = f"Events (`fleetkeeper events {cli.args.name}` for more):"
        cli.print(f"{render.service_detail(view)}\n\n{more}\n{render.events_table(events)}")
        return
    services = cli.all_services()
    if cli.args.detail:
        # --all / -v (SkyPilot's `sky serve status --all`): every service as `status NAME` shows it.
        views = [view for s in services if (view := cli.service_if_there(str(s["name"]))) is not None]
        if cli.structured:
            cli.emit_item({"services": views}, watching)
        else:
            cli.print("\n\n".join(render.service_detail(v) for v in views) if views else "no services")
        return
    if cli.structured:
        cli.emit_item({"services": services}, watching)
    else:
        cli.print(render.services_table(services))


def _endpoint(cli: Cli) -> int:
    """`status NAME --endpoint`: the URL alone (as `sky serve status --endpoint`), for scripts."""
    if not cli.args.name:
        raise UsageError("--endpoint needs the service's NAME")
    if cli.args.watch:
        raise UsageError("--endpoint prints one URL: it does not take --watch")
    view = cli.client.request("GET", f"/v1/services/{cli.name}").body
    endpoint = view.get("endpoint")
    if cli.structured:
        cli.emit({"name": view["name"], "endpoint": endpoint})
    elif endpoint:
        cli.print(str(endpoint))
    if not endpoint:
        cli.note(f"{cli.args.name} has no endpoint yet ({view['status']}: {view.get('status_message') or '-'})")
        return EXIT_FAILED
    return EXIT_OK
