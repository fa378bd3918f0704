"""The rate examples/autoscale/service.yaml's load command reaches, against a local HTTP server.

Runs the command from the example's comment (its URL range cut to --requests) against a threaded
HTTP server on 127.0.0.1 that answers as the example's app does, and prints the requests a second it
reached next to the rate the comment promises.

    .venv/bin/python bench/example_load.py [--requests 100]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.examples.load_command import bounded, hello_server, load_command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    command, promised = load_command()
    with hello_server() as (endpoint, paths):
        started = time.monotonic()
        env = {"E": endpoint, "PATH": os.environ["PATH"]}
        subprocess.run(["sh", "-c", bounded(command, args.requests)], env=env, check=True)
        elapsed = time.monotonic() - started
    print(f"load command: {command}")
    rate = len(paths) / elapsed
    print(f"requests: {len(paths)} in {elapsed:.1f} s = {rate:.1f} req/s (the example promises {promised})")


if __name__ == "__main__":
    main()
