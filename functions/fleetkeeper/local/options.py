"""`fleetkeeper local`'s options, in a module light enough for the CLI to import on every run."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fleetkeeper.choices import Isolation, values

if TYPE_CHECKING:
    from collections.abc import Callable

# Where no app would listen: not 8080, 8000 or 8081 (the ports SkyPilot's and most apps' examples
# hard-code), so the API never takes a replica's port on a machine without network namespaces.
DEFAULT_PORT = 8470
DEFAULT_TICK = 2.0
MAX_TICK = 3600.0
TABLE = "fleetkeeper-local"
# The local load balancer: how long a proxied request may sit without a byte either way (streams of
# tokens need minutes), and how often it publishes its RequestCount datapoints: every few seconds
# (the ALB's minute would leave the autoscaler blind for two minutes at a laptop).
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_METRICS_INTERVAL = 5.0
# The dashboard (fleetkeeper.dashboard): beside the API's default port; with another --port, any free one.
DEFAULT_DASHBOARD_PORT = DEFAULT_PORT + 1
NO_DASHBOARD = -1


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def seconds(maximum: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds above 0 and at most `maximum`.

    float() takes "nan" and "inf": a NaN tick made the reconciler loop spin, an infinite one
    killed its thread, and a NaN --timeout never ends a wait.
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not (math.isfinite(value) and 0 < value <= maximum):
            limit = f" and at most {maximum:g}" if math.isfinite(maximum) else ""
            raise argparse.ArgumentTypeError(f"{text} seconds: must be a finite number above 0{limit}")
        return value

    parse.__name__ = "seconds"  # argparse names the type in its messages
    return parse


@dataclass
class Options:
    port: int = DEFAULT_PORT
    tick: float = DEFAULT_TICK
    local_dir: Path = field(default_factory=lambda: Path(".fleetkeeper"))
    table: str = TABLE
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    metrics_interval: float = DEFAULT_METRICS_INTERVAL
    isolation: str = Isolation.AUTO
    # None: DEFAULT_DASHBOARD_PORT beside the default API port, else a free one; NO_DASHBOARD: none.
    dashboard_port: int | None = None
    allow_actions: bool = False

    @property
    def dashboard_port_to_bind(self) -> int | None:
        if self.dashboard_port == NO_DASHBOARD:
            return None
        if self.dashboard_port is not None:
            return self.dashboard_port
        return DEFAULT_DASHBOARD_PORT if self.port == DEFAULT_PORT else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help=f"API port on 127.0.0.1 (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "--tick",
        type=seconds(MAX_TICK),
        default=DEFAULT_TICK,
        help=f"seconds between reconciler runs, up to {MAX_TICK:g} (default {DEFAULT_TICK:g})",
    )
    p.add_argument(
        "--dir",
        dest="local_dir",
        type=Path,
        default=Path(".fleetkeeper"),
        help="the run's state, yours only (0700): its credential, workdirs, replica logs (default ./.fleetkeeper)",
    )
    p.add_argument(
        "--idle-timeout",
        type=seconds(MAX_TICK),
        default=DEFAULT_IDLE_TIMEOUT,
        help=f"seconds a request through a service's endpoint may be idle (default {DEFAULT_IDLE_TIMEOUT:g})",
    )
    p.add_argument(
        "--metrics-interval",
        type=seconds(MAX_TICK),
        default=DEFAULT_METRICS_INTERVAL,
        help=f"seconds between the endpoints' RequestCount datapoints (default {DEFAULT_METRICS_INTERVAL:g})",
    )
    p.add_argument(
        "--isolation",
        choices=values(Isolation),
        default=Isolation.AUTO.value,
        help="how replicas get a host of their own: netns (a network namespace each, PORT = the spec's port), "
        "shared (this machine's loopback, a free PORT each), auto (netns where Linux allows it; the default)",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="also log what every reconciler run did (INFO, each tick)"
    )
    p.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    dashboard = p.add_mutually_exclusive_group()
    dashboard.add_argument(
        "--dashboard-port",
        type=port_number,
        help=f"the dashboard's port on 127.0.0.1 (default {DEFAULT_DASHBOARD_PORT} with the default --port, "
        "else any free one)",
    )
    dashboard.add_argument(
        "--no-dashboard", dest="dashboard_port", action="store_const", const=NO_DASHBOARD, help="serve no dashboard"
    )
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="let the dashboard roll back and scale services (each confirmed; read-only by default)",
    )


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        port=args.port,
        tick=args.tick,
        local_dir=args.local_dir,
        idle_timeout=args.idle_timeout,
        metrics_interval=args.metrics_interval,
        isolation=args.isolation,
        dashboard_port=args.dashboard_port,
        allow_actions=args.allow_actions,
    )
