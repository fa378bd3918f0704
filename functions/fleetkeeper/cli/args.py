"""The command line: every command's arguments, parsed by argparse (fleetkeeper.cli.main runs them).

Usage errors raise UsageError instead of exiting, so main() owns every exit (and tests can call it).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fleetkeeper.choices import UpdateMode, values
from fleetkeeper.cli.cloudlogs import since_seconds
from fleetkeeper.cli.doctor_options import add_arguments as add_doctor_arguments
from fleetkeeper.cli.help_text import COMMAND_HELP
from fleetkeeper.cli.http import DEFAULT_API_URL, UsageError
from fleetkeeper.dashboard.command import add_arguments as add_dashboard_arguments
from fleetkeeper.local.options import add_arguments, seconds

DEFAULT_TIMEOUT = 900.0
# -o: the API's objects as JSON or YAML (stdout holds the document only), or tables for people.
STRUCTURED = ("json", "yaml")
DEFAULT_WATCH_INTERVAL = 2.0


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors raise so main() owns every exit (and tests can call it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().strip()}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetkeeper")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def summary(description: str) -> str:
    """A command's line in the top-level --help: its description's first sentence, whole (the
    descriptions are wrapped for their own --help; a line break is not the end of a sentence)."""
    text = " ".join(description.split())
    end = re.search(r"\.(\s|$)", text)
    return text[: end.start()] if end else text


def _command(commands: Any, name: str, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    description, examples = COMMAND_HELP[name]
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
    `resources` before it is sent (fleetkeeper.cli.spec_input.overridden)."""
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


@dataclass(frozen=True)
class _Shared:
    """The argument groups several commands take (argparse parents)."""

    common: argparse.ArgumentParser  # where the API is
    output: argparse.ArgumentParser  # -o
    waiting: argparse.ArgumentParser  # --wait for a version
    waiting_gone: argparse.ArgumentParser  # --wait for services to go


def _shared() -> _Shared:
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
    return _Shared(common, output, waiting, waiting_gone)


def build_parser() -> argparse.ArgumentParser:
    shared = _shared()
    parser = _Parser(
        prog="fleetkeeper",
        description="Drive a fleetkeeper control plane: on AWS (--stack, --api-url) or embedded (`fleetkeeper local`).",
        epilog="examples:\n  fleetkeeper local &\n  fleetkeeper up service.yaml --wait\n  fleetkeeper status",
    )
    parser.add_argument("--version", action="version", version=f"fleetkeeper {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    # In the order `fleetkeeper --help` lists them.
    _up_and_update(commands, shared)
    _status_and_versions(commands, shared)
    _rollback_and_down(commands, shared)
    _access_and_events(commands, shared)
    _logs(commands, shared)

    doctor = _command(commands, "doctor", [shared.common])
    add_doctor_arguments(doctor)

    dashboard = _command(commands, "dashboard", [shared.common])
    add_dashboard_arguments(dashboard)

    local = _command(commands, "local", [])
    add_arguments(local)
    return parser


def _up_and_update(commands: Any, shared: _Shared) -> None:
    up = _command(commands, "up", [shared.common, shared.output, shared.waiting])
    up.add_argument("spec", type=Path, metavar="SPEC.yaml")
    up.add_argument("--name", "-n", help="the service's name (replaces the spec's `name`)")
    _spec_inputs(up)
    _resource_overrides(up)

    update = _command(commands, "update", [shared.common, shared.output, shared.waiting])
    update.add_argument("name", metavar="NAME")
    update.add_argument("spec", type=Path, metavar="SPEC.yaml")
    update.add_argument("--mode", choices=values(UpdateMode), help="default: the spec's update.mode")
    _spec_inputs(update)
    _resource_overrides(update)


def _status_and_versions(commands: Any, shared: _Shared) -> None:
    status = _command(commands, "status", [shared.common, shared.output])
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

    versions = _command(commands, "versions", [shared.common, shared.output])
    versions.add_argument("name", metavar="NAME")


def _rollback_and_down(commands: Any, shared: _Shared) -> None:
    rollback = _command(commands, "rollback", [shared.common, shared.output, shared.waiting])
    rollback.add_argument("name", metavar="NAME")
    rollback.add_argument("--to", type=int, dest="version", metavar="N", help="default: the previous version")

    down = _command(commands, "down", [shared.common, shared.output, shared.waiting_gone])
    down.add_argument("names", nargs="*", metavar="NAME")
    down.add_argument("--all", "-a", action="store_true", help="every service")
    down.add_argument("--yes", "-y", action="store_true", help="do not ask before --all")
    down.add_argument(
        "--replica-id",
        type=_replica_id,
        metavar="N",
        help="terminate replica N of NAME only (the reconciler drains it and launches its replacement)",
    )


def _access_and_events(commands: Any, shared: _Shared) -> None:
    access = _command(commands, "access", [shared.common, shared.output])
    access.add_argument("name", metavar="NAME")
    access.add_argument(
        "--add", action="append", default=[], metavar="PRINCIPAL", help="grant it write access (repeatable)"
    )
    access.add_argument("--read-only", action="store_true", help="grant --add principals read access only")
    access.add_argument("--remove", action="append", default=[], metavar="PRINCIPAL", help="revoke it (repeatable)")

    events = _command(commands, "events", [shared.common, shared.output])
    events.add_argument("name", metavar="NAME")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events until Ctrl-C")


def _logs(commands: Any, shared: _Shared) -> None:
    logs = _command(commands, "logs", [shared.common])
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


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (a whole number above 0)")
    return int(text)


def _replica_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise argparse.ArgumentTypeError(f"{text!r} is not a replica id (a whole number; `fleetkeeper status NAME`)")
    return int(text)


def _count(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines")
    return int(text)
