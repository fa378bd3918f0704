"""`fleetkeeper dashboard`'s options and start: the CLI's API client handed to the web server.

The client is the one every CLI command gets (fleetkeeper.cli.main.run resolves --stack, --api-url or
the user's running `fleetkeeper local`, and its credential): the dashboard calls the API as its user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.local.options import port_number, seconds

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from fleetkeeper.cli.http import ApiClient

# Refresh every 2 s against the embedded mode (one process, no cost), every 10 s against a stack
# (each refresh is 1 + 2 x services signed API calls: the list, each view and its metric).
EMBEDDED_REFRESH = 2.0
STACK_REFRESH = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=port_number, default=0, help="the port on 127.0.0.1 to serve on (default: any free one)"
    )
    parser.add_argument(
        "--allow-actions",
        action="store_true",
        help="let the page roll back and scale services (each confirmed; the API still decides who may)",
    )
    parser.add_argument(
        "--refresh",
        type=seconds(3600),
        metavar="SECONDS",
        help=f"seconds between refreshes (default {EMBEDDED_REFRESH:g} embedded, {STACK_REFRESH:g} for a stack)",
    )
    parser.add_argument(
        "--log-group", help="on AWS: the stack's replica log group (else $FLEETKEEPER_LOG_GROUP or --stack's output)"
    )


def run(args: argparse.Namespace, client: ApiClient, say: Callable[[str], None]) -> int:
    from fleetkeeper.cli import cloudlogs
    from fleetkeeper.cli.http import UsageError
    from fleetkeeper.dashboard.backend import Backend
    from fleetkeeper.dashboard.server import serve

    log_group = None
    if not client.embedded:
        try:
            log_group = cloudlogs.log_group(args.log_group, args.stack)
        except UsageError as exc:
            say(f"fleetkeeper dashboard: no replica logs ({exc})")
    if client.embedded:
        target = f"embedded mode ({client.base_url})"
    else:
        target = f"stack {args.stack} ({client.base_url})" if args.stack else client.base_url
    refresh = args.refresh or (EMBEDDED_REFRESH if client.embedded else STACK_REFRESH)
    backend = Backend(client, log_group=log_group)
    return serve(backend, args.port, target=target, allow_actions=args.allow_actions, refresh_seconds=refresh, say=say)
