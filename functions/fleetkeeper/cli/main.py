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
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import yaml

from fleetkeeper.cli import render
from fleetkeeper.cli.http import ApiClient, ApiError, Unreachable, UsageError, is_loopback, resolve_api_url
from fleetkeeper.cli.waiting import EXIT_FAILED, EXIT_OK, Goal, Progress, wait_for
from fleetkeeper.local.options import add_arguments, options_from, seconds

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

EXIT_USAGE = 2
DEFAULT_TIMEOUT = 900.0
LOGS_ON_AWS = (
    "logs are only available in embedded mode (`fleetkeeper logs` reads its replica log files); on AWS "
    "a replica logs to its instance's journal (journalctl -u fleetkeeper-replica)"
)


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors raise so main() owns every exit (and tests can call it)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    where = common.add_argument_group("where the API is")
    where.add_argument("--api-url", help="the API's base URL (else $FLEETKEEPER_API_URL, --stack, or embedded mode)")
    where.add_argument("--stack", help="a deployed fleetkeeper stack: use its ApiUrl output")
    output = _Parser(add_help=False)
    output.add_argument("--output", "-o", choices=["table", "json"], default="table", help="output format")
    waiting = _Parser(add_help=False)
    waiting.add_argument("--wait", action="store_true", help="wait until the service is READY (or gone)")
    waiting.add_argument(
        "--timeout", type=seconds(), default=DEFAULT_TIMEOUT, help="seconds --wait waits (default 900)"
    )

    parser = _Parser(prog="fleetkeeper", description="Drive a fleetkeeper control plane (AWS or embedded).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    up = commands.add_parser("up", parents=[common, output, waiting], help="create a service from a spec")
    up.add_argument("spec", type=Path, metavar="SPEC.yaml")
    up.add_argument("--name", "-n", help="service name (overrides the spec's `name`)")

    update = commands.add_parser("update", parents=[common, output, waiting], help="roll out a new version")
    update.add_argument("name", metavar="NAME")
    update.add_argument("spec", type=Path, metavar="SPEC.yaml")
    update.add_argument("--mode", choices=["rolling", "blue_green"], help="default: the spec's update.mode")

    status = commands.add_parser("status", parents=[common, output], help="one service, or all")
    status.add_argument("name", nargs="?", metavar="NAME")

    versions = commands.add_parser("versions", parents=[common, output], help="a service's versions")
    versions.add_argument("name", metavar="NAME")

    rollback = commands.add_parser("rollback", parents=[common, output, waiting], help="go back to a version")
    rollback.add_argument("name", metavar="NAME")
    rollback.add_argument("--to", type=int, dest="version", metavar="N", help="default: the previous version")

    down = commands.add_parser("down", parents=[common, output, waiting], help="delete a service")
    down.add_argument("name", metavar="NAME")

    logs = commands.add_parser("logs", parents=[common], help="replica logs (embedded mode)")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("replica", nargs="?", type=int, metavar="REPLICA")

    local = commands.add_parser("local", help="run the whole control plane on this machine")
    add_arguments(local)
    return parser


class Cli:
    """One invocation: the parsed arguments, the API client, and where output goes."""

    def __init__(self, args: argparse.Namespace, client: ApiClient, out: IO[str], err: IO[str]) -> None:
        self.args = args
        self.client = client
        self.out = out
        self.err = err

    def print(self, text: str) -> None:
        print(text, file=self.out)

    def note(self, text: str) -> None:
        print(text, file=self.err)

    @property
    def name(self) -> str:
        """NAME as one path segment: a name with a slash must reach the API as a bad name, not a route."""
        return _quote(self.args.name)

    @property
    def json(self) -> bool:
        return getattr(self.args, "output", "table") == "json"

    # -- commands --------------------------------------------------------------------------------------

    def up(self) -> int:
        spec = load_spec(self.args.spec)
        if self.args.name:
            spec.pop("name", None)  # --name overrides the spec's own name (one spec, many services)
        name = self.args.name or spec.get("name")
        if not name:
            raise UsageError(f"{self.args.spec}: give the service a name with --name or a `name:` in the spec")
        view = self.client.request("POST", "/v1/services", {"name": name, "spec": spec}).body
        self._said(f"created {name} (v{view['target_version']}, {view['status']})", view)
        return self._maybe_wait(view)

    def update(self) -> int:
        body: dict[str, Any] = {"spec": load_spec(self.args.spec)}
        if self.args.mode:
            body["mode"] = self.args.mode
        view = self.client.request("PUT", f"/v1/services/{self.name}", body).body
        self._said(f"updating {self.args.name} to v{view['target_version']} ({view.get('mode')})", view)
        return self._maybe_wait(view)

    def rollback(self) -> int:
        body = None if self.args.version is None else {"version": self.args.version}
        view = self.client.request("POST", f"/v1/services/{self.name}/rollback", body).body
        self._said(f"rolling {self.args.name} back to v{view['target_version']}", view)
        return self._maybe_wait(view)

    def down(self) -> int:
        view = self.client.request("DELETE", f"/v1/services/{self.name}").body
        self._said(f"deleting {self.args.name}: {view['status']}", view)
        if not self.args.wait:
            if self.json:
                self.print(render.as_json(view))
            return EXIT_OK
        goal = Goal(view["name"], view["uid"], int(view["generation"]), None)
        outcome = wait_for(self.client, goal, timeout=self.args.timeout, progress=Progress(self.err))
        if self.json:
            self.print(render.as_json(view))
        return self._finish(outcome.code, outcome.message)

    def status(self) -> int:
        if self.args.name:
            view = self.client.request("GET", f"/v1/services/{self.name}").body
            self.print(render.as_json(view) if self.json else render.service_detail(view))
            return EXIT_OK
        services = self._all_services()
        self.print(render.as_json({"services": services}) if self.json else render.services_table(services))
        return EXIT_OK

    def versions(self) -> int:
        versions = self._all_versions()
        self.print(render.as_json(versions) if self.json else render.versions_table(versions))
        return EXIT_OK

    def logs(self) -> int:
        if not self.client.embedded:
            raise UsageError(LOGS_ON_AWS)
        # Log files can outlive their service (or never have been its own): a missing service is
        # the API's 404, exit 2, as for `status`.
        self.client.request("GET", f"/v1/services/{self.name}")
        base = f"/_local/logs/{self.name}"
        if self.args.replica is not None:
            self.out.write(self.client.request("GET", f"{base}/{self.args.replica}", raw=True).body)
            return EXIT_OK
        found = self.client.request("GET", base).body["logs"]
        if not found:
            self.note(f"no replica logs for {self.args.name} yet")
        for entry in found:
            text = self.client.request("GET", f"{base}/{entry['replica_id']}", raw=True).body
            self.out.write(f"==> replica {entry['replica_id']} ({entry['path']}) <==\n{text}")
            if text and not text.endswith("\n"):
                self.out.write("\n")
        return EXIT_OK

    # -- helpers ---------------------------------------------------------------------------------------

    def _said(self, line: str, view: dict[str, Any]) -> None:
        """The one-line acknowledgement (stderr when stdout is reserved for JSON)."""
        (self.note if self.json else self.print)(line)

    def _maybe_wait(self, view: dict[str, Any]) -> int:
        if not self.args.wait:
            if self.json:
                self.print(render.as_json(view))
            return EXIT_OK
        goal = Goal(view["name"], view["uid"], int(view["generation"]), int(view["target_version"]))
        outcome = wait_for(self.client, goal, timeout=self.args.timeout, progress=Progress(self.err))
        if self.json:
            self.print(render.as_json(outcome.view if outcome.view is not None else view))
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
        raise UsageError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a spec is a mapping with `service`, `resources`, `run`...")
    return data


_COMMANDS: dict[str, Callable[[Cli], int]] = {
    "up": Cli.up,
    "update": Cli.update,
    "status": Cli.status,
    "versions": Cli.versions,
    "rollback": Cli.rollback,
    "down": Cli.down,
    "logs": Cli.logs,
}


def run(
    argv: Sequence[str] | None = None,
    *,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    client_factory: Callable[[str], ApiClient] = ApiClient.for_url,
) -> int:
    """Run one command and return its exit code (main() exits with it)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        args = build_parser().parse_args(argv)
        if args.command == "local":
            from fleetkeeper.local.server import serve  # moto and the handlers: only for `local`

            return serve(options_from(args), quiet=args.quiet)
        url = resolve_api_url(args.api_url, args.stack)
        if args.command == "logs" and not is_loopback(url):
            raise UsageError(LOGS_ON_AWS)  # said before the client looks for credentials to sign with
        client = client_factory(url)
        return _COMMANDS[args.command](Cli(args, client, out, err))
    except UsageError as exc:
        print(f"fleetkeeper: {exc}", file=err)
        return EXIT_USAGE
    except ApiError as exc:
        print(exc.message, file=err)  # the API's own words, as is
        # A 429 is the API being busy, not a bad request: it is a failure to retry later (exit 1).
        return EXIT_USAGE if 400 <= exc.status < 500 and exc.status != 429 else EXIT_FAILED
    except Unreachable as exc:
        print(f"fleetkeeper: {exc}", file=err)
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
