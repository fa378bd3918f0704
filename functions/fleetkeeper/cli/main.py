"""`fleetkeeper`: up, update, status, versions, rollback, down, logs, local.

Exit codes (CI relies on them, docs/CLI.md):
  0  success
  1  the service FAILED, was rolled back by the circuit breaker, or --wait timed out; also: the API
     could not be reached, failed (5xx) or kept throttling (429)
  2  bad usage, or a request the API rejected (4xx but 429: a bad spec, a duplicate up, a missing service),
     with the API's message printed as is
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import yaml

from fleetkeeper.cli import cloudlogs, render
from fleetkeeper.cli.cloudlogs import since_seconds
from fleetkeeper.cli.doctor_options import add_arguments as add_doctor_arguments
from fleetkeeper.cli.http import (
    DEFAULT_API_URL,
    ApiClient,
    ApiError,
    Unreachable,
    UsageError,
    local_token,
    resolve_api_url,
)
from fleetkeeper.cli.terminal import printable
from fleetkeeper.cli.waiting import EXIT_FAILED, EXIT_OK, Goal, Progress, wait_for
from fleetkeeper.dashboard.command import add_arguments as add_dashboard_arguments
from fleetkeeper.local.options import add_arguments, options_from, seconds
from fleetkeeper.spec import yaml_errors
from fleetkeeper.spec.skypilot_fields import remote_workdir

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

EXIT_USAGE = 2
DEFAULT_TIMEOUT = 900.0
# -o: the API's objects as JSON or YAML (stdout holds the document only), or tables for people.
STRUCTURED = ("json", "yaml")
DEFAULT_WATCH_INTERVAL = 2.0
# Spec file names that say nothing about the service (`sky serve up task.yaml`): the folder names it.
GENERIC_SPEC_NAMES = frozenset({"task", "service", "serve", "spec", "sky", "skypilot", "config", "fleetkeeper"})
# The newest events `status NAME` shows under the service.
STATUS_EVENTS = 5


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors raise so main() owns every exit (and tests can call it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


# `fleetkeeper logs NAME` of a service that is not READY also shows this many of the replicas it no
# longer has (the newest): those that failed are why, and they are replaced at once.
RECENTLY_ENDED_LOGS = 3


def _recently_ended(found: dict[int, str], current: set[int], view: dict[str, Any]) -> set[int]:
    """The newest replicas (ids only grow) the service no longer has, when it is not READY."""
    if view.get("status") == "READY":
        return set()
    return set(sorted(rid for rid in found if rid not in current)[-RECENTLY_ENDED_LOGS:])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetkeeper")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


_HELP: dict[str, tuple[str, str]] = {
    "up": (
        "Create a service from a spec (a SkyPilot service YAML, plus fleetkeeper's `update:`).",
        "  fleetkeeper up service.yaml --wait\n"
        "  HF_TOKEN=... fleetkeeper up -n llm llm.yaml --env MODEL=mistral --secret HF_TOKEN --wait\n"
        "The spec's `workdir` is packed (.skyignore, else .gitignore, decides what is left out) and uploaded;\n"
        "its replicas start in it. --env and --secret without =VALUE take the value from your environment.",
    ),
    "update": (
        "Roll out a new version of a service. A spec identical to the running one (same files in its\n"
        "workdir, same secret values) changes nothing.",
        "  fleetkeeper update web web.yaml --wait\n"
        "  fleetkeeper update web web.yaml --mode blue_green --env-file prod.env",
    ),
    "status": (
        "Show one service (its replicas), or every service; --endpoint prints a service's URL alone,\n"
        "--watch refreshes until Ctrl-C.",
        "  fleetkeeper status\n  fleetkeeper status web -o json\n  curl $(fleetkeeper status web --endpoint)/\n"
        "  fleetkeeper status --watch\n  fleetkeeper status web --watch --interval 5",
    ),
    "versions": ("List a service's versions, oldest first (* marks the target).", "  fleetkeeper versions web"),
    "rollback": (
        "Go back to an earlier version (default: the newest earlier one that did not fail).",
        "  fleetkeeper rollback web --wait\n  fleetkeeper rollback web --to 3",
    ),
    "down": (
        "Delete services: every replica is terminated, then the service and its history are gone.\n"
        "--all deletes every service (it asks first; -y skips the question, and is needed without a terminal).",
        "  fleetkeeper down web --wait\n  fleetkeeper down web api\n  fleetkeeper down --all -y",
    ),
    "access": (
        "Show or change who may read or change a service, besides its owner (the role that created it)\n"
        "and the stack's administrators. A role is named by its ARN (any path: roles match by name);\n"
        "* matches any characters. Changing access needs write access to the service.",
        "  fleetkeeper access web\n"
        "  fleetkeeper access web --add arn:aws:iam::111122223333:role/team-b-ci --read-only\n"
        "  fleetkeeper access web --add 'arn:aws:iam::111122223333:role/team-b-*'\n"
        "  fleetkeeper access web --remove arn:aws:iam::111122223333:role/team-b-ci",
    ),
    "events": (
        "Show what the control plane decided and saw about a service, oldest first (newest 100 kept;\n"
        "repeats folded with a count): why it is not READY.",
        "  fleetkeeper events web\n  fleetkeeper events web --follow\n  fleetkeeper events web -o json",
    ),
    "logs": (
        "Print the replicas' logs: the service's current replicas (embedded mode: while it is not READY also\n"
        "the 3 newest it no longer has, as a failed one's log says why; --all: every one). On AWS\n"
        "they are read from the stack's CloudWatch Logs group with your own credentials (--stack NAME\n"
        "finds it; else --log-group or $FLEETKEEPER_LOG_GROUP).",
        "  fleetkeeper logs web\n  fleetkeeper logs web --replica 3 --tail 50\n  fleetkeeper logs web --follow\n"
        "  fleetkeeper logs web --stack fleetkeeper --since 10m",
    ),
    "doctor": (
        "Smoke-test a control plane as its user: create a tiny service, reach its endpoint, update it,\n"
        "scale it to zero and wake it, create one as a second owner, delete both and check nothing is\n"
        "left. Each step prints PASS, FAIL or SKIP with its time; exit 1 if any failed (what it made is\n"
        "deleted all the same). On AWS it launches a few short-lived instances of the stack's default type.",
        "  fleetkeeper doctor --stack fleetkeeper\n"
        "  fleetkeeper doctor --stack fleetkeeper --second-owner-role arn:aws:iam::111122223333:role/team-b-ci\n"
        "  fleetkeeper doctor --local",
    ),
    "dashboard": (
        "Serve a web page of your services on 127.0.0.1: status, replicas, versions, events, logs, request\n"
        "rate and replicas over time; with --allow-actions, roll back and scale from it. It calls the API as\n"
        "you (your running `fleetkeeper local`, or --stack's API signed with your AWS credentials): open the\n"
        "one-time link it prints.",
        "  fleetkeeper dashboard\n  fleetkeeper dashboard --stack fleetkeeper --port 8480\n"
        "  fleetkeeper dashboard --allow-actions",
    ),
    "local": (
        "Run the whole control plane on this machine: the API, the reconciler, the cleanup and an in-memory\n"
        "AWS. Replicas are local processes, each in a network namespace of its own where Linux allows it\n"
        "(a fixed port such as 8080 works on every replica), else each with a $PORT of its own.",
        "  fleetkeeper local\n  fleetkeeper local --port 9090 --dir /tmp/fk\n"
        "  fleetkeeper local --metrics-interval 2 -v",
    ),
}


def summary(description: str) -> str:
    """A command's line in the top-level --help: its description's first sentence, whole (the
    descriptions are wrapped for their own --help; a line break is not the end of a sentence)."""
    text = " ".join(description.split())
    end = re.search(r"\.(\s|$)", text)
    return text[: end.start()] if end else text


def _command(commands: Any, name: str, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    description, examples = _HELP[name]
    return commands.add_parser(  # type: ignore[no-any-return]
        name,
        parents=parents,
        help=summary(description),
        description=description,
        epilog=f"examples:\n{examples}",
    )


def _spec_inputs(parser: argparse.ArgumentParser) -> None:
    inputs = parser.add_argument_group("values for the spec (as `sky serve up` takes them)")
    inputs.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="set or override an entry of `envs` (without =VALUE: from your environment); repeatable",
    )
    inputs.add_argument(
        "--env-file",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="NAME=VALUE lines (a dotenv file) for `envs`, before --env; repeatable",
    )
    inputs.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="set a secret (without =VALUE: from your environment): the replicas get it as an environment "
        "variable; it is never stored with the version, shown or logged; repeatable",
    )


def _resource_overrides(parser: argparse.ArgumentParser) -> None:
    """SkyPilot's resource flags of `sky serve up`/`update` (and `sky launch`): applied to the spec's
    `resources` before it is sent (`overridden`)."""
    group = parser.add_argument_group("resource overrides (as `sky serve up` takes them; over the spec's resources)")
    group.add_argument("--cpus", metavar="N[+]", help="vCPUs: 4 (exactly) or 4+ (at least)")
    group.add_argument("--memory", metavar="GB[+]", help="memory in GB: 32 or 32+")
    group.add_argument(
        "--gpus", metavar="NAME[:COUNT]", help="accelerators, e.g. A10G:1 or L4 (`resources.accelerators`)"
    )
    group.add_argument("--instance-type", "-t", metavar="TYPE", help="an EC2 instance type, e.g. g5.xlarge")
    spot = group.add_mutually_exclusive_group()
    spot.add_argument("--use-spot", dest="use_spot", action="store_true", default=None, help="spot instances")
    spot.add_argument("--no-use-spot", dest="use_spot", action="store_false", help="on-demand instances")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    where = common.add_argument_group("where the API is")
    where.add_argument(
        "--api-url", help="the API's base URL (else $FLEETKEEPER_API_URL, --stack, or your running `fleetkeeper local`)"
    )
    where.add_argument("--stack", help="a deployed fleetkeeper stack: use its ApiUrl output")
    where.add_argument(
        "--local",
        action="store_true",
        help="the embedded mode on this machine: your running `fleetkeeper local` (found on its own), else "
        f"{DEFAULT_API_URL} (or --api-url) even without its credential",
    )
    output = _Parser(add_help=False)
    output.add_argument(
        "--output",
        "-o",
        choices=["table", *STRUCTURED],
        default="table",
        help="table (for people), or the API's objects as json or yaml",
    )
    waiting = _Parser(add_help=False)
    waiting.add_argument("--wait", action="store_true", help="wait until the service is READY at the new version")
    waiting.add_argument(
        "--timeout", type=seconds(), default=DEFAULT_TIMEOUT, help="seconds --wait waits (default 900)"
    )
    waiting_gone = _Parser(add_help=False)
    waiting_gone.add_argument("--wait", action="store_true", help="wait until each service is gone")
    waiting_gone.add_argument(
        "--timeout", type=seconds(), default=DEFAULT_TIMEOUT, help="seconds --wait waits, for all of them (default 900)"
    )

    parser = _Parser(
        prog="fleetkeeper",
        description="Drive a fleetkeeper control plane: on AWS (--stack, --api-url) or embedded (`fleetkeeper local`).",
        epilog="examples:\n  fleetkeeper local &\n  fleetkeeper up service.yaml --wait\n  fleetkeeper status",
    )
    parser.add_argument("--version", action="version", version=f"fleetkeeper {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    up = _command(commands, "up", [common, output, waiting])
    up.add_argument("spec", type=Path, metavar="SPEC.yaml")
    up.add_argument("--name", "-n", help="the service's name (replaces the spec's `name`)")
    _spec_inputs(up)
    _resource_overrides(up)

    update = _command(commands, "update", [common, output, waiting])
    update.add_argument("name", metavar="NAME")
    update.add_argument("spec", type=Path, metavar="SPEC.yaml")
    update.add_argument("--mode", choices=["rolling", "blue_green"], help="default: the spec's update.mode")
    _spec_inputs(update)
    _resource_overrides(update)

    status = _command(commands, "status", [common, output])
    status.add_argument("name", nargs="?", metavar="NAME")
    status.add_argument("--endpoint", action="store_true", help="print only NAME's endpoint URL (exit 1 if none yet)")
    status.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    status.add_argument(
        "--interval",
        type=seconds(3600),
        default=DEFAULT_WATCH_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between --watch refreshes (default {DEFAULT_WATCH_INTERVAL:g})",
    )
    status.add_argument("--count", type=_positive, metavar="N", help="stop --watch after N refreshes")
    status.add_argument(
        "--all",
        "-a",
        "--verbose",
        "-v",
        dest="detail",
        action="store_true",
        help="every service in full: its replicas, placement and autoscaler, as `status NAME` shows one",
    )

    versions = _command(commands, "versions", [common, output])
    versions.add_argument("name", metavar="NAME")

    rollback = _command(commands, "rollback", [common, output, waiting])
    rollback.add_argument("name", metavar="NAME")
    rollback.add_argument("--to", type=int, dest="version", metavar="N", help="default: the previous version")

    down = _command(commands, "down", [common, output, waiting_gone])
    down.add_argument("names", nargs="*", metavar="NAME")
    down.add_argument("--all", "-a", action="store_true", help="every service")
    down.add_argument("--yes", "-y", action="store_true", help="do not ask before --all")
    down.add_argument(
        "--replica-id",
        type=_replica_id,
        metavar="N",
        help="terminate replica N of NAME only (the reconciler drains it and launches its replacement)",
    )

    access = _command(commands, "access", [common, output])
    access.add_argument("name", metavar="NAME")
    access.add_argument(
        "--add", action="append", default=[], metavar="PRINCIPAL", help="grant it write access (repeatable)"
    )
    access.add_argument("--read-only", action="store_true", help="grant --add principals read access only")
    access.add_argument("--remove", action="append", default=[], metavar="PRINCIPAL", help="revoke it (repeatable)")

    events = _command(commands, "events", [common, output])
    events.add_argument("name", metavar="NAME")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events until Ctrl-C")

    logs = _command(commands, "logs", [common])
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("replica", nargs="?", type=int, metavar="REPLICA")
    logs.add_argument("--replica", type=int, dest="replica_option", metavar="N", help="one replica's log only")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until Ctrl-C")
    logs.add_argument("--tail", type=_count, metavar="N", help="only the last N lines of each log (embedded mode)")
    logs.add_argument("--all", action="store_true", help="also replicas no longer in the service (replaced, removed)")
    logs.add_argument(
        "--since", type=since_seconds, metavar="DURATION", help="only lines of the last 10m, 2h, 1d... (to the second)"
    )
    logs.add_argument(
        "--log-group", help="on AWS: the stack's replica log group (else $FLEETKEEPER_LOG_GROUP or --stack's output)"
    )
    logs.add_argument(
        "--sync-down",
        action="store_true",
        help="write each replica's log to a file (in --to DIR) instead of printing it, as `sky serve logs --sync-down`",
    )
    logs.add_argument(
        "--to", type=Path, metavar="DIR", help="where --sync-down writes (default: ./fleetkeeper-logs/NAME-<time>)"
    )

    doctor = _command(commands, "doctor", [common])
    add_doctor_arguments(doctor)

    dashboard = _command(commands, "dashboard", [common])
    add_dashboard_arguments(dashboard)

    local = _command(commands, "local", [])
    add_arguments(local)
    return parser


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (a whole number above 0)")
    return int(text)


def derived_name(path: Path) -> str | None:
    """The service name `up` gives a spec without one, from its file: the file's name without its
    extension, or its folder's when the file's is generic (task.yaml, service.yaml...), lower-cased,
    each run of other characters than letters and digits made one dash, at most 63 characters, and
    `svc-` in front when it does not start with a letter. None when nothing is left."""
    stem = path.stem
    if stem.lower() in GENERIC_SPEC_NAMES:
        stem = path.resolve().parent.name
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
    if not name:
        return None
    if not name[0].isalpha():
        name = f"svc-{name}"
    return name[:63].rstrip("-")


def _replica_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise argparse.ArgumentTypeError(f"{text!r} is not a replica id (a whole number; `fleetkeeper status NAME`)")
    return int(text)


def _count(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines")
    return int(text)


class Cli:
    """One invocation: the parsed arguments, the API client, and where output goes."""

    def __init__(
        self,
        args: argparse.Namespace,
        client: ApiClient,
        out: IO[str],
        err: IO[str],
        stdin: IO[str] | None = None,
    ) -> None:
        self.args = args
        self.client = client
        self.out = out
        self.err = err
        self.stdin = stdin if stdin is not None else sys.stdin

    def print(self, text: str) -> None:
        print(text, file=self.out)

    def note(self, text: str) -> None:
        print(text, file=self.err)

    @property
    def name(self) -> str:
        """NAME as one path segment: a name with a slash must reach the API as a bad name, not a route."""
        return _quote(self.args.name)

    @property
    def structured(self) -> bool:
        """-o json or -o yaml: stdout is for the document only (acknowledgements go to stderr)."""
        return getattr(self.args, "output", "table") in STRUCTURED

    def emit(self, value: Any) -> None:
        self.print(render.structured(value, self.args.output))

    # -- commands --------------------------------------------------------------------------------------

    def up(self) -> int:
        spec = load_spec(self.args.spec)
        if self.args.name:
            spec.pop("name", None)  # --name overrides the spec's own name (one spec, many services)
        name = self.args.name or spec.get("name")
        if not name:
            # As `sky serve up` without -n: a name is made up, here from the file's (see derived_name).
            name = derived_name(self.args.spec)
            if name is None:
                raise UsageError(
                    f"{self.args.spec}: no service name can be made from this file's name; "
                    "give one with --name (-n) or a `name:` in the spec"
                )
            self.note(f"no name in {self.args.spec}: the service is {name} (--name NAME chooses another)")
        spec = self._prepared(spec, str(name), existing=False)
        view = self.client.request("POST", "/v1/services", {"name": name, "spec": spec}).body
        self._said(f"created {name} (v{view['target_version']}, {view['status']})", view)
        return self._maybe_wait(view)

    def update(self) -> int:
        body: dict[str, Any] = {"spec": self._prepared(load_spec(self.args.spec), self.args.name, existing=True)}
        if self.args.mode:
            body["mode"] = self.args.mode
        view = self.client.request("PUT", f"/v1/services/{self.name}", body).body
        if view.get("changed") is False:
            self._said(
                f"{self.args.name} is unchanged: v{view['target_version']} already runs this spec "
                "(same files, same values); nothing to roll out",
                view,
            )
        else:
            self._said(f"updating {self.args.name} to v{view['target_version']} ({view.get('mode')})", view)
        return self._maybe_wait(view)

    def _prepared(self, spec: dict[str, Any], name: str, *, existing: bool) -> dict[str, Any]:
        """The spec as the API takes it: --env-file, --env and --secret applied, the workdir packed
        and uploaded (its digest in its place)."""
        spec = apply_values(spec, self.args.env_file, self.args.env, self.args.secret, source=str(self.args.spec))
        spec = overridden(spec, resource_overrides(self.args), source=str(self.args.spec))
        workdir = spec.get("workdir")
        if isinstance(workdir, str) and not remote_workdir(workdir):  # a URL: the API says what to do
            spec["workdir"] = {"digest": self._upload_workdir(Path(workdir), name if existing else None)}
        return spec

    def _upload_workdir(self, directory: Path, service: str | None) -> str:
        from fleetkeeper.cli.workdir import pack

        packed = pack(directory)
        try:
            body: dict[str, Any] = {"digest": packed.digest, "size": packed.size}
            if service is not None:
                body["service"] = service
            answer = self.client.request("POST", "/v1/workdirs", body).body
            upload = answer.get("upload")
            rules = f", {packed.ignore_file} applied" if packed.ignore_file else ""
            if upload is None:
                self.note(f"workdir {directory}: {packed.files} files, already stored ({packed.digest[:19]})")
            else:
                self.client.upload(upload["url"], upload["method"], upload.get("headers") or {}, packed.path)
                self.note(
                    f"workdir {directory}: {packed.files} files, {_size(packed.size)} uploaded{rules} "
                    f"({packed.digest[:19]})"
                )
            return packed.digest
        finally:
            packed.path.unlink(missing_ok=True)

    def rollback(self) -> int:
        body = None if self.args.version is None else {"version": self.args.version}
        view = self.client.request("POST", f"/v1/services/{self.name}/rollback", body).body
        self._said(f"rolling {self.args.name} back to v{view['target_version']}", view)
        return self._maybe_wait(view)

    def down(self) -> int:
        """Delete each NAME (or, with --all, every service); with --wait, until each is gone.

        Every name is tried even when one fails; the exit code is the worst: 2 if the API refused one
        (a missing service), else 1 if a wait failed, else 0."""
        if self.args.replica_id is not None:
            return self._down_replica()
        names = self._down_names()
        if not names:
            self._said("no services to delete", {})
            if self.structured:
                self.emit({"services": []})
            return EXIT_OK
        deleted: list[dict[str, Any]] = []
        code = EXIT_OK
        for name in names:
            try:
                view = self.client.request("DELETE", f"/v1/services/{_quote(name)}").body
            except ApiError as exc:
                if exc.status == 429 or exc.status >= 500:
                    raise
                self.note(exc.message)
                code = EXIT_USAGE
                continue
            self._said(f"deleting {name}: {view['status']}", view)
            deleted.append(view)
        started = time.monotonic()
        if self.args.wait:
            for view in deleted:
                goal = Goal(view["name"], view["uid"], int(view["generation"]), None)
                left = max(1.0, self.args.timeout - (time.monotonic() - started))
                outcome = wait_for(self.client, goal, timeout=left, progress=Progress(self.err))
                finished = self._finish(outcome.code, outcome.message)
                code = code if code == EXIT_USAGE else max(code, finished)
        if self.structured:
            # One NAME: its view, as before several could be given; several or --all: a list of them.
            single = len(self.args.names) == 1 and not self.args.all
            if not single:
                self.emit({"services": deleted})
            elif deleted:
                self.emit(deleted[0])
        return code

    def _down_replica(self) -> int:
        """`down NAME --replica-id N` (SkyPilot's `sky serve down NAME --replica-id N`): one replica goes,
        and the reconciler replaces it."""
        if self.args.all or len(self.args.names) != 1:
            raise UsageError("--replica-id N terminates a replica of one service: give its NAME (and not --all)")
        if self.args.wait:
            raise UsageError(
                "--wait waits for deleted services; to watch the replica go and its replacement come, "
                f"run `fleetkeeper status {self.args.names[0]} --watch`"
            )
        name, replica = self.args.names[0], self.args.replica_id
        view = self.client.request("DELETE", f"/v1/services/{_quote(name)}/replicas/{replica}").body
        if view.get("changed") is False:
            self._said(f"replica {replica} of {name} is already going; the reconciler replaces it", view)
        else:
            self._said(f"terminating replica {replica} of {name}: the reconciler drains it and replaces it", view)
        if self.structured:
            self.emit(view)
        return EXIT_OK

    def _down_names(self) -> list[str]:
        if self.args.all and self.args.names:
            raise UsageError("give service names or --all, not both")
        if not self.args.all:
            if not self.args.names:
                raise UsageError("which service? give one or more names, or --all")
            return list(dict.fromkeys(self.args.names))
        names = [str(s["name"]) for s in self._all_services() if s.get("lifecycle") != "DELETING"]
        if names and not self.args.yes:
            shown = ", ".join(names)
            if not self.stdin.isatty():
                raise UsageError(
                    f"down --all would delete {len(names)} service(s) ({shown}); "
                    "pass -y (--yes) to confirm: there is no terminal to ask"
                )
            self.err.write(f"Delete {len(names)} service(s): {shown}? [y/N] ")
            self.err.flush()
            if self.stdin.readline().strip().lower() not in ("y", "yes"):
                self.note("nothing deleted")
                return []
        return names

    def status(self) -> int:
        if self.args.endpoint:
            return self._endpoint()
        if not self.args.watch:
            self._status_once()
            return EXIT_OK
        # --watch: as `kubectl get -w` / `watch`: refresh every --interval seconds until Ctrl-C
        # (or --count refreshes). On a terminal the screen is redrawn; elsewhere each one is appended.
        shown = 0
        try:
            while True:
                if shown and self.out.isatty() and not self.structured:
                    self.out.write("\x1b[H\x1b[2J")
                elif shown and not self.structured:
                    self.print("")
                try:
                    self._status_once(watching=True)
                except ApiError as exc:
                    if exc.status == 404 and shown:
                        self.note(f"{self.args.name} is gone")
                        return EXIT_OK
                    raise
                self.out.flush()
                shown += 1
                if self.args.count is not None and shown >= self.args.count:
                    return EXIT_OK
                time.sleep(self.args.interval)
        except KeyboardInterrupt:
            return EXIT_OK  # Ctrl-C is how a watch ends

    def _status_once(self, *, watching: bool = False) -> None:
        if self.args.name:
            view = self.client.request("GET", f"/v1/services/{self.name}").body
            if self.structured:
                self._emit_item(view, watching)
                return
            events = self._events(limit=STATUS_EVENTS)
            more = f"Events (`fleetkeeper events {self.args.name}` for more):"
            self.print(f"{render.service_detail(view)}\n\n{more}\n{render.events_table(events)}")
            return
        services = self._all_services()
        if self.args.detail:
            # --all / -v (SkyPilot's `sky serve status --all`): every service as `status NAME` shows it.
            views = [view for s in services if (view := self._service_if_there(str(s["name"]))) is not None]
            if self.structured:
                self._emit_item({"services": views}, watching)
            else:
                self.print("\n\n".join(render.service_detail(v) for v in views) if views else "no services")
            return
        if self.structured:
            self._emit_item({"services": services}, watching)
        else:
            self.print(render.services_table(services))

    def _service_if_there(self, name: str) -> dict[str, Any] | None:
        """One service's view; None when it went between the list and this read."""
        try:
            view: dict[str, Any] = self.client.request("GET", f"/v1/services/{_quote(name)}").body
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return view

    def _emit_item(self, value: Any, streaming: bool) -> None:
        """One document of a stream (--watch, --follow): JSON one a line, YAML `---` separated."""
        if not streaming:
            self.emit(value)
        elif self.args.output == "yaml":
            self.print("---\n" + render.structured(value, "yaml"))
        else:
            self.print(render.as_json_line(value))

    def _endpoint(self) -> int:
        """`status NAME --endpoint`: the URL alone (as `sky serve status --endpoint`), for scripts."""
        if not self.args.name:
            raise UsageError("--endpoint needs the service's NAME")
        if self.args.watch:
            raise UsageError("--endpoint prints one URL: it does not take --watch")
        view = self.client.request("GET", f"/v1/services/{self.name}").body
        endpoint = view.get("endpoint")
        if self.structured:
            self.emit({"name": view["name"], "endpoint": endpoint})
        elif endpoint:
            self.print(str(endpoint))
        if not endpoint:
            self.note(f"{self.args.name} has no endpoint yet ({view['status']}: {view.get('status_message') or '-'})")
            return EXIT_FAILED
        return EXIT_OK

    def access(self) -> int:
        """Show the service's owner and grants; with --add/--remove, change the grants first."""
        if self.args.read_only and not self.args.add:
            raise UsageError("--read-only applies to --add PRINCIPAL: name the principal to grant read access")
        if not self.args.add and not self.args.remove:
            view = self.client.request("GET", f"/v1/services/{self.name}").body
            shown = {"name": view["name"], "owner": view["owner"], "access": view["access"]}
            if self.structured:
                self.emit(shown)
            else:
                self.print(render.access_detail(shown))
            return EXIT_OK
        mode = "read" if self.args.read_only else "write"
        body = {"add": [{"principal": p, "mode": mode} for p in self.args.add], "remove": self.args.remove}
        view = self.client.request("POST", f"/v1/services/{self.name}/access", body).body
        if self.structured:
            self.emit(view)
        else:
            self.note(f"{self.args.name}: access {'changed' if view['changed'] else 'unchanged: it was so already'}")
            self.print(render.access_detail(view))
        return EXIT_OK

    def versions(self) -> int:
        versions = self._all_versions()
        if self.structured:
            self.emit(versions)
        else:
            self.print(render.versions_table(versions))
        return EXIT_OK

    def events(self) -> int:
        """The service's newest events; with --follow, then each new or repeated one as it comes."""
        events = self._events(limit=100)
        if self.structured and not self.args.follow:
            self.emit({"events": events})
            return EXIT_OK
        if not self.args.follow:
            self.print(render.events_table(events))
            return EXIT_OK
        seen: dict[tuple[Any, ...], int] = {}
        while True:
            for event in reversed(events):  # oldest first
                key = (event["first_seen"], event["reason"], event.get("replica_id"), event["message"])
                if seen.get(key) != event["count"]:
                    seen[key] = event["count"]
                    if self.structured:
                        self._emit_item(event, streaming=True)
                    else:
                        self.print(render.event_line(event))
            self.out.flush()
            time.sleep(2.0)
            try:
                events = self._events(limit=20)
            except ApiError as exc:
                if exc.status == 404:
                    self.note(f"{self.args.name} is gone (deleted)")
                    return EXIT_OK
                raise

    def _events(self, *, limit: int) -> list[dict[str, Any]]:
        page = self.client.request("GET", f"/v1/services/{self.name}/events?limit={limit}").body
        return list(page["events"])

    def logs(self) -> int:
        if self.args.replica_option is not None:
            if self.args.replica is not None and self.args.replica != self.args.replica_option:
                raise UsageError("give the replica once: REPLICA or --replica N")
            self.args.replica = self.args.replica_option
        if self.args.to is not None and not self.args.sync_down:
            raise UsageError("--to DIR is where --sync-down writes: add --sync-down")
        if self.args.sync_down:
            return self._sync_down()
        if not self.client.embedded:
            return self._cloud_logs()
        # Log files can outlive their service (or never have been its own): a missing service is
        # the API's 404, exit 2, as for `status`.
        view = self.client.request("GET", f"/v1/services/{self.name}").body
        base = f"/_local/logs/{self.name}"
        # This incarnation's logs only: a service deleted and created again under its name starts afresh.
        incarnation = f"uid={_quote(str(view['uid']))}"
        offsets: dict[int, int] = {}
        headed: int | None = None
        first = [incarnation]
        if self.args.tail is not None:
            first.append(f"tail={self.args.tail}")
        if self.args.since is not None:
            first.append(f"since={int(time.time()) - self.args.since}")
        while True:
            wanted, others = self._logs_wanted(f"{base}?{incarnation}", view)
            current = {int(r["replica_id"]) for r in view.get("replicas", [])}
            if not wanted and not offsets:
                more = f"; --all shows {others} of replicas no longer in it" if others else ""
                self.note(f"no logs of {self.args.name}'s current replicas yet{more}")
            for replica_id, path in wanted:
                query = [incarnation, f"offset={offsets[replica_id]}"] if replica_id in offsets else first
                answer = self.client.request("GET", f"{base}/{replica_id}?{'&'.join(query)}", raw=True)
                offsets[replica_id] = int(answer.headers.get("X-Log-Size", offsets.get(replica_id, 0)))
                text = answer.body
                if not text:
                    continue
                if self.args.replica is None and headed != replica_id:
                    ended = "" if replica_id in current else ", no longer in the service"
                    self.out.write(f"==> replica {replica_id}{ended} ({path}) <==\n")
                    headed = replica_id
                # The replica's output as its service wrote it: nothing a terminal would obey.
                text = printable(text, keep_newlines=True)
                self.out.write(text if text.endswith("\n") else text + "\n")
            self.out.flush()
            if not self.args.follow:
                return EXIT_OK
            time.sleep(0.5)
            try:
                view = self.client.request("GET", f"/v1/services/{self.name}").body
            except ApiError as exc:
                if exc.status == 404:
                    self.note(f"{self.args.name} is gone")
                    return EXIT_OK
                raise

    def _sync_down(self) -> int:
        """`logs NAME --sync-down` (SkyPilot's `sky serve logs --sync-down`): each replica's log, as it is
        now, to `replica-<id>.log` in --to DIR (default ./fleetkeeper-logs/NAME-<UTC time>)."""
        if self.args.follow:
            raise UsageError("--sync-down writes the logs as they are now: it does not take --follow")
        view = self.client.request("GET", f"/v1/services/{self.name}").body
        logs = self._embedded_logs(view) if self.client.embedded else self._cloud_replica_logs(view)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        folder = self.args.to if self.args.to is not None else Path("fleetkeeper-logs") / f"{self.args.name}-{stamp}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for replica_id, text in logs:
                (folder / f"replica-{replica_id}.log").write_text(printable(text, keep_newlines=True), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write the logs to {folder}: {exc.strerror or exc}") from exc
        if not logs:
            self.note(f"no logs of {self.args.name}'s replicas yet; nothing written to {folder}")
        else:
            ids = ", ".join(str(replica_id) for replica_id, _ in logs)
            self.print(f"synced down the logs of {self.args.name}'s replica(s) {ids} to {folder}")
        return EXIT_OK

    def _embedded_logs(self, view: dict[str, Any]) -> list[tuple[int, str]]:
        base = f"/_local/logs/{self.name}"
        incarnation = f"uid={_quote(str(view['uid']))}"
        query = [incarnation]
        if self.args.tail is not None:
            query.append(f"tail={self.args.tail}")
        if self.args.since is not None:
            query.append(f"since={int(time.time()) - self.args.since}")
        wanted, _ = self._logs_wanted(f"{base}?{incarnation}", view)
        return [
            (rid, str(self.client.request("GET", f"{base}/{rid}?{'&'.join(query)}", raw=True).body))
            for rid, _ in wanted
        ]

    def _cloud_replica_logs(self, view: dict[str, Any]) -> list[tuple[int, str]]:
        """On AWS: each replica's stream (the one asked for, else the service's current replicas)."""
        import io

        group = cloudlogs.log_group(self.args.log_group, self.args.stack)
        ids = [self.args.replica] if self.args.replica is not None else [int(r["replica_id"]) for r in view["replicas"]]
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
                since_seconds=self.args.since,
                follow=False,
                out=out,
                still_there=lambda: True,
                owner=str(view.get("owner") or ""),
            )
            if out.getvalue():
                found.append((replica_id, out.getvalue()))
        return found

    def _cloud_logs(self) -> int:
        """On AWS: the replicas' streams in the stack's log group, read with the caller's credentials."""
        group = cloudlogs.log_group(self.args.log_group, self.args.stack)
        view = self.client.request("GET", f"/v1/services/{self.name}").body

        def still_there() -> bool:
            try:
                self.client.request("GET", f"/v1/services/{self.name}")
            except ApiError as exc:
                if exc.status == 404:
                    self.note(f"{self.args.name} is gone")
                    return False
                raise
            return True

        printed = cloudlogs.print_logs(
            cloudlogs.logs_client(),
            group,
            str(view["name"]),
            str(view["uid"]),
            replica=self.args.replica,
            since_seconds=self.args.since,
            follow=self.args.follow,
            out=self.out,
            still_there=still_there,
            # Its streams are under its owner's scope (the view names the owner once ownership exists).
            owner=str(view.get("owner") or ""),
        )
        if not printed and not self.args.follow:
            self.note(f"no log lines of {self.args.name} in {group} yet")
        return EXIT_OK

    def _logs_wanted(self, base: str, view: dict[str, Any]) -> tuple[list[tuple[int, str]], int]:
        """(replica id, path) of the logs to print (one replica, the service's current ones, or --all),
        and how many logs are left out."""
        found = {int(e["replica_id"]): str(e["path"]) for e in self.client.request("GET", base).body["logs"]}
        if self.args.replica is not None:
            if self.args.replica not in found:
                name = self.args.name
                replica = self.args.replica
                raise UsageError(f"no log for replica {replica} of {name}; see `fleetkeeper logs {name} --all`")
            return [(self.args.replica, found[self.args.replica])], 0
        current = {int(r["replica_id"]) for r in view.get("replicas", [])}
        shown = set(found) if self.args.all else current | _recently_ended(found, current, view)
        wanted = [(rid, path) for rid, path in sorted(found.items()) if rid in shown]
        return wanted, len(found) - len(wanted)

    def dashboard(self) -> int:
        """The web page (fleetkeeper.dashboard): serves until Ctrl-C."""
        from fleetkeeper.dashboard.command import run as run_dashboard

        return run_dashboard(self.args, self.client, lambda line: print(line, file=self.out, flush=True))

    def doctor(self) -> int:
        """The smoke test (fleetkeeper.cli.doctor): its own output, its own exit code."""
        from fleetkeeper.cli.doctor import run_doctor

        return run_doctor(self.args, self.client, self.out, self.err)

    # -- helpers ---------------------------------------------------------------------------------------

    def _said(self, line: str, view: dict[str, Any]) -> None:
        """The one-line acknowledgement (stderr when stdout is reserved for JSON)."""
        (self.note if self.structured else self.print)(line)

    def _maybe_wait(self, view: dict[str, Any]) -> int:
        if not self.args.wait:
            if self.structured:
                self.emit(view)
            return EXIT_OK
        goal = Goal(view["name"], view["uid"], int(view["generation"]), int(view["target_version"]))
        outcome = wait_for(self.client, goal, timeout=self.args.timeout, progress=Progress(self.err))
        if self.structured:
            self.emit(outcome.view if outcome.view is not None else view)
        return self._finish(outcome.code, outcome.message)

    def _finish(self, code: int, message: str) -> int:
        if code == EXIT_OK:
            self._said(message, {})
        else:
            self.note(f"fleetkeeper: {message}")
        return code

    def _all_versions(self) -> dict[str, Any]:
        """GET .../versions page by page, as one body: name, target_version, every version."""
        first: dict[str, Any] | None = None
        versions: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query = "?limit=20" + (f"&next_token={_quote(token)}" if token else "")
            page = self.client.request("GET", f"/v1/services/{self.name}/versions{query}").body
            first = first or page
            versions.extend(page["versions"])
            token = page.get("next_token")
            if not token:
                return {"name": first["name"], "target_version": first["target_version"], "versions": versions}

    def _all_services(self) -> list[dict[str, Any]]:
        services: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query = "?limit=100" + (f"&next_token={_quote(token)}" if token else "")
            page = self.client.request("GET", f"/v1/services{query}").body
            services.extend(page["services"])
            token = page.get("next_token")
            if not token:
                return services


def _size(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB" if size >= 1024 * 1024 else f"{max(1, size // 1024)} KiB"


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file as a mapping; the API validates its fields (and names the bad ones)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(yaml_errors.describe(exc, str(path), text)) from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a spec is a mapping with `service`, `resources`, `run`...")
    return data


def _assignment(text: str, flag: str, environ: dict[str, str] | os._Environ[str]) -> tuple[str, str]:
    """NAME=VALUE, or NAME with the value from the caller's environment (as `sky` does)."""
    name, has_value, value = text.partition("=")
    name = name.strip()
    if not name:
        raise UsageError(f"{flag} {text!r}: expected NAME=VALUE or NAME")
    if has_value:
        return name, value
    if name not in environ:
        raise UsageError(f"{flag} {name}: {name} is not set in your environment; set it, or pass {flag} {name}=VALUE")
    return name, environ[name]


def read_env_file(path: Path) -> dict[str, str]:
    """A dotenv file: NAME=VALUE lines; blank lines, # comments and an `export ` prefix allowed;
    a value in matching single or double quotes is taken without them."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    values: dict[str, str] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, has_value, value = line.removeprefix("export ").partition("=")
        if not has_value or not name.strip():
            raise UsageError(f"{path}, line {number}: expected NAME=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name.strip()] = value
    return values


# The flags of `_resource_overrides`, by the `resources` field each sets.
_OVERRIDES = {"cpus": "cpus", "memory": "memory", "gpus": "accelerators", "instance_type": "instance_type"}


def resource_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `resources` fields the command line sets (`--gpus` is `accelerators`, as in SkyPilot)."""
    fields = {field: getattr(args, flag) for flag, field in _OVERRIDES.items() if getattr(args, flag, None) is not None}
    if getattr(args, "use_spot", None) is not None:
        fields["use_spot"] = args.use_spot
    return fields


def overridden(spec: dict[str, Any], fields: dict[str, Any], *, source: str) -> dict[str, Any]:
    """The spec with `fields` set in `resources`, as SkyPilot's overrides: over every alternative too
    (an `any_of` or `ordered` entry's own value for a field given here is dropped), so the flag is what
    every candidate gets. The API validates the values and names the field at fault."""
    if not fields:
        return spec
    resources = spec.get("resources")
    if resources is None:
        resources = {}
    if not isinstance(resources, dict):
        raise UsageError(f"{source}: `resources` must be a mapping to take --cpus, --memory, --gpus... overrides")
    resources = {**resources, **fields}
    for key in ("any_of", "ordered"):
        entries = resources.get(key)
        if isinstance(entries, list):
            kept = [{k: v for k, v in e.items() if k not in fields} if isinstance(e, dict) else e for e in entries]
            if all(entry == {} for entry in kept):
                del resources[key]  # nothing left to choose between: the overrides are the one choice
            else:
                resources[key] = kept
    return {**spec, "resources": resources}


def apply_values(
    spec: dict[str, Any],
    env_files: list[Path],
    envs: list[str],
    secrets: list[str],
    *,
    source: str,
    environ: dict[str, str] | os._Environ[str] | None = None,
) -> dict[str, Any]:
    """`envs` and `secrets` of the spec, filled and overridden as SkyPilot does: the spec's own
    values, then each --env-file, then each --env; the spec's secrets, then each --secret."""
    environ = os.environ if environ is None else environ
    spec = dict(spec)
    for key, flag_values in (("envs", envs), ("secrets", secrets)):
        current = spec.get(key)
        if current is not None and not isinstance(current, dict):
            if flag_values or (key == "envs" and env_files):
                raise UsageError(f"{source}: `{key}` must be a mapping of names to values to take --{key[:-1]}")
            continue
    merged_envs = dict(spec.get("envs") or {})
    for path in env_files:
        merged_envs.update(read_env_file(path))
    merged_envs.update(_assignment(text, "--env", environ) for text in envs)
    if merged_envs or "envs" in spec:
        spec["envs"] = merged_envs
    if secrets:
        merged = dict(spec.get("secrets") or {})
        merged.update(_assignment(text, "--secret", environ) for text in secrets)
        spec["secrets"] = merged
    return spec


_COMMANDS: dict[str, Callable[[Cli], int]] = {
    "up": Cli.up,
    "update": Cli.update,
    "status": Cli.status,
    "versions": Cli.versions,
    "rollback": Cli.rollback,
    "down": Cli.down,
    "access": Cli.access,
    "logs": Cli.logs,
    "events": Cli.events,
    "doctor": Cli.doctor,
    "dashboard": Cli.dashboard,
}


def run(
    argv: Sequence[str] | None = None,
    *,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    client_factory: Callable[[str], ApiClient] = ApiClient.for_url,
    stdin: IO[str] | None = None,
) -> int:
    """Run one command and return its exit code (main() exits with it)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    url: str | None = None
    try:
        args = build_parser().parse_args(argv)
        if args.command == "local":
            from fleetkeeper.local.server import serve  # moto and the handlers: only for `local`

            return serve(options_from(args), quiet=args.quiet, verbose=args.verbose)
        url = resolve_api_url(args.api_url, args.stack, local=args.local)
        token = local_token(url, local=args.local)
        client = client_factory(url)
        if token is not None:
            client.token = token
        return _COMMANDS[args.command](Cli(args, client, out, err, stdin))
    except UsageError as exc:
        print(f"fleetkeeper: {exc}", file=err)
        return EXIT_USAGE
    except ApiError as exc:
        print(exc.message, file=err)  # the API's own words, as is
        # A 429 is the API being busy, not a bad request: it is a failure to retry later (exit 1).
        return EXIT_USAGE if 400 <= exc.status < 500 and exc.status != 429 else EXIT_FAILED
    except Unreachable as exc:
        print(f"fleetkeeper: {exc}", file=err)
        if url == DEFAULT_API_URL:
            print(
                "fleetkeeper: nothing answers at the embedded mode's address: start it with `fleetkeeper local` "
                "(in another terminal), or point at a deployed stack with --stack NAME or --api-url URL",
                file=err,
            )
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("fleetkeeper: interrupted", file=err)
        return 130


def main(argv: Sequence[str] | None = None) -> None:
    try:
        code = run(argv)
        sys.stdout.flush()
    except BrokenPipeError:  # `fleetkeeper status | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_OK
    sys.exit(code)
