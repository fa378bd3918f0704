"""`logs`: the replicas' logs, from the embedded mode's files or the stack's CloudWatch Logs group;
printed, followed, or (--sync-down) written to files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetkeeper.cli import cloudlogs
from fleetkeeper.cli.http import ApiError, UsageError
from fleetkeeper.cli.invocation import quote
from fleetkeeper.cli.terminal import printable
from fleetkeeper.cli.waiting import EXIT_OK

if TYPE_CHECKING:
    from fleetkeeper.cli.invocation import Cli

# `fleetkeeper logs NAME` of a service that is not READY also shows this many of the replicas it no
# longer has (the newest): those that failed are why, and they are replaced at once.
RECENTLY_ENDED_LOGS = 3


def _recently_ended(found: dict[int, str], current: set[int], view: dict[str, Any]) -> set[int]:
    """The newest replicas (ids only grow) the service no longer has, when it is not READY."""
    if view.get("status") == "READY":
        return set()
    return set(sorted(rid for rid in found if rid not in current)[-RECENTLY_ENDED_LOGS:])


def logs(cli: Cli) -> int:
    if cli.args.replica_option is not None:
        if cli.args.replica is not None and cli.args.replica != cli.args.replica_option:
            raise UsageError("give the replica once: REPLICA or --replica N")
        cli.args.replica = cli.args.replica_option
    if cli.args.to is not None and not cli.args.sync_down:
        raise UsageError("--to DIR is where --sync-down writes: add --sync-down")
    if cli.args.sync_down:
        return _sync_down(cli)
    if not cli.client.embedded:
        return _cloud_logs(cli)
    # Log files can outlive their service (or never have been its own): a missing service is
    # the API's 404, exit 2, as for `status`.
    view = cli.client.request("GET", f"/v1/services/{cli.name}").body
    base = f"/_local/logs/{cli.name}"
    # This incarnation's logs only: a service deleted and created again under its name starts afresh.
    incarnation = f"uid={quote(str(view['uid']))}"
    offsets: dict[int, int] = {}
    headed: int | None = None
    first = [incarnation]
    if cli.args.tail is not None:
        first.append(f"tail={cli.args.tail}")
    if cli.args.since is not None:
        first.append(f"since={int(time.time()) - cli.args.since}")
    while True:
        wanted, others = _logs_wanted(cli, f"{base}?{incarnation}", view)
        current = {int(r["replica_id"]) for r in view.get("replicas", [])}
        if not wanted and not offsets:
            more = f"; --all shows {others} of replicas no longer in it" if others else ""
            cli.note(f"no logs of {cli.args.name}'s current replicas yet{more}")
        for replica_id, path in wanted:
            query = [incarnation, f"offset={offsets[replica_id]}"] if replica_id in offsets else first
            answer = cli.client.request("GET", f"{base}/{replica_id}?{'&'.join(query)}", raw=True)
            offsets[replica_id] = int(answer.headers.get("X-Log-Size", offsets.get(replica_id, 0)))
            text = answer.body
            if not text:
                continue
            if cli.args.replica is None and headed != replica_id:
                ended = "" if replica_id in current else ", no longer in the service"
                cli.out.write(f"==> replica {replica_id}{ended} ({path}) <==\n")
                headed = replica_id
            # The replica's output as its service wrote it: nothing a terminal would obey.
            text = printable(text, keep_newlines=True)
            cli.out.write(text if text.endswith("\n") else text + "\n")
        cli.out.flush()
        if not cli.args.follow:
            return EXIT_OK
        time.sleep(0.5)
        try:
            view = cli.client.request("GET", f"/v1/services/{cli.name}").body
        except ApiError as exc:
            if exc.status == 404:
                cli.note(f"{cli.args.name} is gone")
                return EXIT_OK
            raise


def _sync_down(cli: Cli) -> int:
    """`logs NAME --sync-down` (SkyPilot's `sky serve logs --sync-down`): each replica's log, as it is
    now, to `replica-<id>.log` in --to DIR (default ./fleetkeeper-logs/NAME-<UTC time>)."""
    if cli.args.follow:
        raise UsageError("--sync-down writes the logs as they are now: it does not take --follow")
    view = cli.client.request("GET", f"/v1/services/{cli.name}").body
    logs = _embedded_logs(cli, view) if cli.client.embedded else _cloud_replica_logs(cli, view)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    folder = cli.args.to if cli.args.to is not None else Path("fleetkeeper-logs") / f"{cli.args.name}-{stamp}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for replica_id, text in logs:
            (folder / f"replica-{replica_id}.log").write_text(printable(text, keep_newlines=True), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the logs to {folder}: {exc.strerror or exc}") from exc
    if not logs:
        cli.note(f"no logs of {cli.args.name}'s replicas yet; nothing written to {folder}")
    else:
        ids = ", ".join(str(replica_id) for replica_id, _ in logs)
        cli.print(f"synced down the logs of {cli.args.name}'s replica(s) {ids} to {folder}")
    return EXIT_OK


def _embedded_logs(cli: Cli, view: dict[str, Any]) -> list[tuple[int, str]]:
    base = f"/_local/logs/{cli.name}"
    incarnation = f"uid={quote(str(view['uid']))}"
    query = [incarnation]
    if cli.args.tail is not None:
        query.append(f"tail={cli.args.tail}")
    if cli.args.since is not None:
        query.append(f"since={int(time.time()) - cli.args.since}")
    wanted, _ = _logs_wanted(cli, f"{base}?{incarnation}", view)
    return [
        (rid, str(cli.client.request("GET", f"{base}/{rid}?{'&'.join(query)}", raw=True).body)) for rid, _ in wanted
    ]


def _cloud_replica_logs(cli: Cli, view: dict[str, Any]) -> list[tuple[int, str]]:
    """On AWS: each replica's stream (the one asked for, else the service's current replicas)."""
    import io

    group = cloudlogs.log_group(cli.args.log_group, cli.args.stack)
    ids = [cli.args.replica] if cli.args.replica is not None else [int(r["replica_id"]) for r in view["replicas"]]
    client = cloudlogs.logs_client()
    found: list[tuple[int, str]] = []
    for replica_id in ids:
        out = io.StringIO()
        cloudlogs.print_logs(
            client,
            group,
            str(view["name"]),
            str(view["uid"]),
            replica=replica_id,
            since_seconds=cli.args.since,
            follow=False,
            out=out,
            still_there=lambda: True,
            owner=str(view.get("owner") or ""),
        )
        if out.getvalue():
            found.append((replica_id, out.getvalue()))
    return found


def _cloud_logs(cli: Cli) -> int:
    """On AWS: the replicas' streams in the stack's log group, read with the caller's credentials."""
    group = cloudlogs.log_group(cli.args.log_group, cli.args.stack)
    view = cli.client.request("GET", f"/v1/services/{cli.name}").body

    def still_there() -> bool:
        try:
            cli.client.request("GET", f"/v1/services/{cli.name}")
        except ApiError as exc:
            if exc.status == 404:
                cli.note(f"{cli.args.name} is gone")
                return False
            raise
        return True

    printed = cloudlogs.print_logs(
        cloudlogs.logs_client(),
        group,
        str(view["name"]),
        str(view["uid"]),
        replica=cli.args.replica,
        since_seconds=cli.args.since,
        follow=cli.args.follow,
        out=cli.out,
        still_there=still_there,
        # Its streams are under its owner's scope (the view names the owner once ownership exists).
        owner=str(view.get("owner") or ""),
    )
    if not printed and not cli.args.follow:
        cli.note(f"no log lines of {cli.args.name} in {group} yet")
    return EXIT_OK


def _logs_wanted(cli: Cli, base: str, view: dict[str, Any]) -> tuple[list[tuple[int, str]], int]:
    """(replica id, path) of the logs to print (one replica, the service's current ones, or --all),
    and how many logs are left out."""
    found = {int(e["replica_id"]): str(e["path"]) for e in cli.client.request("GET", base).body["logs"]}
    if cli.args.replica is not None:
        if cli.args.replica not in found:
            name = cli.args.name
            replica = cli.args.replica
            raise UsageError(f"no log for replica {replica} of {name}; see `fleetkeeper logs {name} --all`")
        return [(cli.args.replica, found[cli.args.replica])], 0
    current = {int(r["replica_id"]) for r in view.get("replicas", [])}
    shown = set(found) if cli.args.all else current | _recently_ended(found, current, view)
    wanted = [(rid, path) for rid, path in sorted(found.items()) if rid in shown]
    return wanted, len(found) - len(wanted)
