"""Embedded mode, measured: seconds from `up` to READY and from `update` to READY at v2 (--tick 1),
and the API's p50/p99 latency over 500 GETs.

Starts `fleetkeeper local` as a subprocess on a free port of 127.0.0.1 and talks to it over HTTP,
as the CLI does. The latency part needs only the api; the READY parts need the reconciler: without
it this prints the latency, says what is missing, and exits 1.

    .venv/bin/python bench/local_latency.py [--gets 500] [--tick 1]
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from fleetkeeper.cli.http import ApiClient
from fleetkeeper.cli.waiting import Goal, Progress, wait_for

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hello" / "service.yaml"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_local(workdir: Path, tick: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETKEEPER_")}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from fleetkeeper.cli.main import main; main()",
            "local",
            "--port",
            str(port),
            "--tick",
            str(tick),
            "--dir",
            str(workdir),
            "--quiet",
        ],
        stdout=(workdir / "local.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/_local/info", timeout=1):
                return process, url
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"fleetkeeper local did not start; see {workdir / 'local.log'}")


def spec(greeting: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data.pop("name")
    data["envs"]["GREETING"] = greeting
    data["service"]["readiness_probe"].update(initial_delay_seconds=30, timeout_seconds=1)
    return data


def api_latency(url: str, name: str, gets: int) -> tuple[float, float]:
    """p50 and p99 in ms of GET /v1/services/<name> over one kept-alive connection."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    samples = []
    for _ in range(gets):
        started = time.perf_counter()
        connection.request("GET", f"/v1/services/{name}")
        answer = connection.getresponse()
        answer.read()
        samples.append((time.perf_counter() - started) * 1000)
        assert answer.status == 200, answer.status
    connection.close()
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49], cuts[98]


def wait_ready(client: ApiClient, view: dict[str, Any]) -> None:
    goal = Goal(view["name"], view["uid"], int(view["generation"]), int(view["target_version"]))
    outcome = wait_for(client, goal, timeout=300, progress=Progress(io.StringIO(), tty=False), interval=0.1)
    if outcome.code != 0:
        raise SystemExit(f"not READY: {outcome.message}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gets", type=int, default=500)
    parser.add_argument("--tick", type=float, default=1.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fk-bench-") as scratch:
        process, url = start_local(Path(scratch), args.tick)
        client = ApiClient(url)
        try:
            print(f"embedded mode, --tick {args.tick:g}, {os.cpu_count()} CPUs")
            started = time.monotonic()
            created = client.request("POST", "/v1/services", {"name": "bench", "spec": spec("v1")}).body
            post_ms = (time.monotonic() - started) * 1000
            # Each time runs from the request to READY, polled every 0.1 s.
            wait_ready(client, created)
            print(f"up -> READY (2 replicas)            {time.monotonic() - started:6.2f} s")
            started = time.monotonic()
            updated = client.request("PUT", "/v1/services/bench", {"spec": spec("v2")}).body
            wait_ready(client, updated)
            print(f"update -> READY at v2 (rolling)     {time.monotonic() - started:6.2f} s")
            p50, p99 = api_latency(url, "bench", args.gets)
            print(f"POST /v1/services (create)          {post_ms:6.1f} ms")
            print(f"GET /v1/services/NAME x{args.gets}: p50 {p50:6.1f} ms   p99 {p99:6.1f} ms")
            client.request("DELETE", "/v1/services/bench")
            return 0
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
