"""`fleetkeeper local`'s options, in a module light enough for the CLI to import on every run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

DEFAULT_PORT = 8080
DEFAULT_TICK = 2.0
TABLE = "fleetkeeper-local"


@dataclass
class Options:
    port: int = DEFAULT_PORT
    tick: float = DEFAULT_TICK
    local_dir: Path = field(default_factory=lambda: Path(".fleetkeeper"))
    table: str = TABLE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"API port on 127.0.0.1 (default {DEFAULT_PORT})")
    p.add_argument(
        "--tick",
        type=float,
        default=DEFAULT_TICK,
        help=f"seconds between reconciler runs (default {DEFAULT_TICK:g})",
    )
    p.add_argument(
        "--dir",
        dest="local_dir",
        type=Path,
        default=Path(".fleetkeeper"),
        help="where replica logs go (default ./.fleetkeeper)",
    )
    p.add_argument("--quiet", action="store_true", help="log warnings and errors only")


def options_from(args: argparse.Namespace) -> Options:
    return Options(port=args.port, tick=args.tick, local_dir=args.local_dir)
