"""`doctor` and `dashboard`: commands with modules of their own, imported when they run."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetkeeper.cli.invocation import Cli


def dashboard(cli: Cli) -> int:
    """The web page (fleetkeeper.dashboard): serves until Ctrl-C."""
    from fleetkeeper.dashboard.command import run as run_dashboard

    return run_dashboard(cli.args, cli.client, lambda line: print(line, file=cli.out, flush=True))


def doctor(cli: Cli) -> int:
    """The smoke test (fleetkeeper.cli.doctor): its own output, its own exit code."""
    from fleetkeeper.cli.doctor import run_doctor

    return run_doctor(cli.args, cli.client, cli.out, cli.err)
