"""`down`: delete services (or, with --replica-id, one replica of one), and --wait until they are gone."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fleetkeeper.cli.http import ApiError, UsageError
from fleetkeeper.cli.invocation import EXIT_USAGE, quote
from fleetkeeper.cli.waiting import EXIT_OK, Goal, Progress, wait_for

if TYPE_CHECKING:
    from fleetkeeper.cli.invocation import Cli


def down(cli: Cli) -> int:
    """Delete each NAME (or, with --all, every service); with --wait, until each is gone.

    Every name is tried even when one fails; the exit code is the worst: 2 if the API refused one
    (a missing service), else 1 if a wait failed, else 0."""
    if cli.args.replica_id is not None:
        return _down_replica(cli)
    names = _down_names(cli)
    if not names:
        cli.said("no services to delete", {})
        if cli.structured:
            cli.emit({"services": []})
        return EXIT_OK
    deleted: list[dict[str, Any]] = []
    code = EXIT_OK
    for name in names:
        try:
            view = cli.client.request("DELETE", f"/v1/services/{quote(name)}").body
        except ApiError as exc:
            if exc.status == 429 or exc.status >= 500:
                raise
            cli.note(exc.message)
            code = EXIT_USAGE
            continue
        cli.said(f"deleting {name}: {view['status']}", view)
        deleted.append(view)
    started = time.monotonic()
    if cli.args.wait:
        for view in deleted:
            goal = Goal(view["name"], view["uid"], int(view["generation"]), None)
            left = max(1.0, cli.args.timeout - (time.monotonic() - started))
            outcome = wait_for(cli.client, goal, timeout=left, progress=Progress(cli.err))
            finished = cli.finish(outcome.code, outcome.message)
            code = code if code == EXIT_USAGE else max(code, finished)
    if cli.structured:
        # One NAME: its view, as before several could be given; several or --all: a list of them.
        single = len(cli.args.names) == 1 and not cli.args.all
        if not single:
            cli.emit({"services": deleted})
        elif deleted:
            cli.emit(deleted[0])
    return code


def _down_replica(cli: Cli) -> int:
    """`down NAME --replica-id N` (SkyPilot's `sky serve down NAME --replica-id N`): one replica goes,
    and the reconciler replaces it."""
    if cli.args.all or len(cli.args.names) != 1:
        raise UsageError("--replica-id N terminates a replica of one service: give its NAME (and not --all)")
    if cli.args.wait:
        raise UsageError(
            "--wait waits for deleted services; to watch the replica go and its replacement come, "
            f"run `fleetkeeper status {cli.args.names[0]} --watch`"
        )
    name, replica = cli.args.names[0], cli.args.replica_id
    view = cli.client.request("DELETE", f"/v1/services/{quote(name)}/replicas/{replica}").body
    if view.get("changed") is False:
        cli.said(f"replica {replica} of {name} is already going; the reconciler replaces it", view)
    else:
        cli.said(f"terminating replica {replica} of {name}: the reconciler drains it and replaces it", view)
    if cli.structured:
        cli.emit(view)
    return EXIT_OK


def _down_names(cli: Cli) -> list[str]:
    if cli.args.all and cli.args.names:
        raise UsageError("give service names or --all, not both")
    if not cli.args.all:
        if not cli.args.names:
            raise UsageError("which service? give one or more names, or --all")
        return list(dict.fromkeys(cli.args.names))
    names = [str(s["name"]) for s in cli.all_services() if s.get("lifecycle") != "DELETING"]
    if names and not cli.args.yes:
        shown = ", ".join(names)
        if not cli.stdin.isatty():
            raise UsageError(
                f"down --all would delete {len(names)} service(s) ({shown}); "
                "pass -y (--yes) to confirm: there is no terminal to ask"
            )
        cli.err.write(f"Delete {len(names)} service(s): {shown}? [y/N] ")
        cli.err.flush()
        if cli.stdin.readline().strip().lower() not in ("y", "yes"):
            cli.note("nothing deleted")
            return []
    return names
