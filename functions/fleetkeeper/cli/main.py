"""`fleetkeeper`: up, update, status, versions, rollback, down, logs, local.

Exit codes (CI relies on them, docs/CLI.md):
  0  success
  1  the service FAILED, was rolled back by the circuit breaker, or --wait timed out; also: the API
     could not be reached, failed (5xx) or kept throttling (429)
  2  bad usage, or a request the API rejected (4xx but 429: a bad spec, a duplicate up, a missing service),
     with the API's message printed as is
"""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING

from fleetkeeper.cli.args import build_parser
from fleetkeeper.cli.commands import down, logs, read, status, tools, write
from fleetkeeper.cli.http import (
    DEFAULT_API_URL,
    ApiClient,
    ApiError,
    Unreachable,
    UsageError,
    local_token,
    resolve_api_url,
)
from fleetkeeper.cli.invocation import EXIT_USAGE, Cli
from fleetkeeper.cli.waiting import EXIT_FAILED, EXIT_OK
from fleetkeeper.local.options import options_from

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# Each command, by the name argparse gives it (fleetkeeper.cli.args), as a function of the invocation.
_COMMANDS: dict[str, Callable[[Cli], int]] = {
    "up": write.up,
    "update": write.update,
    "status": status.status,
    "versions": read.versions,
    "rollback": write.rollback,
    "down": down.down,
    "access": read.access,
    "logs": logs.logs,
    "events": read.events,
    "doctor": tools.doctor,
    "dashboard": tools.dashboard,
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
