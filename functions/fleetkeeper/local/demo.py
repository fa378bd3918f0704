"""`make local`: the embedded control plane plus a demo service, until Ctrl-C.

Starts what `fleetkeeper local` starts, then does what a new user would type in a second terminal:
`fleetkeeper up examples/hello/service.yaml --wait`, `fleetkeeper status hello`, and one request
to a replica. Then it keeps running so you can try the CLI against it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from fleetkeeper.choices import Isolation, values
from fleetkeeper.cli.main import run as cli
from fleetkeeper.local.options import (
    DEFAULT_METRICS_INTERVAL,
    DEFAULT_PORT,
    DEFAULT_TICK,
    MAX_TICK,
    Options,
    seconds,
)
from fleetkeeper.local.server import serve

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetkeeper.local.server import EmbeddedControlPlane

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hello" / "service.yaml"
SERVICE = "hello"


def say(text: str) -> None:
    print(text, flush=True)


def first_answer(api_url: str, token: str) -> str:
    """Two GET / through the service's endpoint (its load balancer spreads them over the replicas)."""
    request = urllib.request.Request(f"{api_url}/v1/services/{SERVICE}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        view = json.load(answer)
    endpoint = view.get("endpoint")
    if not endpoint:
        return "the service has no endpoint yet"
    lines = []
    for _ in range(2):
        with urllib.request.urlopen(endpoint + "/", timeout=5) as reply:
            lines.append(f"GET {endpoint}/ -> {reply.status}: {reply.read().decode().strip()}")
    return "\n".join(lines)


def tour(plane: EmbeddedControlPlane) -> None:
    url = plane.api_url
    api = ["--api-url", url]
    cli_hint = "fleetkeeper"  # it finds this plane on its own (fleetkeeper.local.auth)
    shown = EXAMPLE.relative_to(Path.cwd()) if EXAMPLE.is_relative_to(Path.cwd()) else EXAMPLE
    say(f"\n$ fleetkeeper up {shown} --wait")
    if cli(["up", str(EXAMPLE), "--wait", "--timeout", "300", *api]) != 0:
        say("the demo service did not become READY; see the log lines above")
        return
    say(f"\n$ fleetkeeper status {SERVICE}")
    cli(["status", SERVICE, *api])
    say("\n$ curl <its endpoint>/   (twice)")
    say(first_answer(url, plane.token))
    say(
        "\nThe control plane keeps running. In another terminal (source .venv/bin/activate first):\n"
        f"  {cli_hint} status {SERVICE}            (--watch: refreshed until Ctrl-C)\n"
        f"  curl $({cli_hint} status {SERVICE} --endpoint)/\n"
        f"  {cli_hint} logs {SERVICE}\n"
        f"  {cli_hint} up examples/autoscale/service.yaml --wait   (then load it: see that file)\n"
        f"  {cli_hint} down {SERVICE} --wait\n"
        "Ctrl-C here stops every replica and exits."
    )


def _quiet_tour(plane: EmbeddedControlPlane) -> None:
    try:
        tour(plane)
    except (OSError, ValueError):
        return  # the control plane stopped under the tour (Ctrl-C): the shutdown message says it all


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make local", description=__doc__)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--tick", type=seconds(MAX_TICK), default=DEFAULT_TICK)
    parser.add_argument("--dir", dest="local_dir", type=Path, default=Path(".fleetkeeper"))
    parser.add_argument(
        "--metrics-interval",
        type=seconds(MAX_TICK),
        default=DEFAULT_METRICS_INTERVAL,
        help="seconds between the endpoints' request counts, which the autoscaler reads "
        f"(default {DEFAULT_METRICS_INTERVAL:g}; `make local METRICS_INTERVAL=2`)",
    )
    parser.add_argument("--isolation", choices=values(Isolation), default=Isolation.AUTO.value)
    parser.add_argument("-v", "--verbose", action="store_true", help="print the handlers' logs (INFO), every run's too")
    args = parser.parse_args(argv)

    def started(plane: EmbeddedControlPlane) -> None:
        threading.Thread(target=_quiet_tour, args=(plane,), name="demo", daemon=True).start()

    logging.getLogger().setLevel(logging.INFO if args.verbose else logging.WARNING)
    return serve(
        Options(
            port=args.port,
            tick=args.tick,
            local_dir=args.local_dir,
            metrics_interval=args.metrics_interval,
            isolation=args.isolation,
        ),
        quiet=not args.verbose,
        verbose=args.verbose,
        on_started=started,
    )


if __name__ == "__main__":
    sys.exit(main())
