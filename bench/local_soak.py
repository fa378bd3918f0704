"""`fleetkeeper local` kept open: its memory against the number of rolling updates, and its exit time.

Starts the embedded control plane (a real `fleetkeeper local` subprocess on a free port of
127.0.0.1, a fresh directory), creates a small service (2 replicas of `python3 -m http.server`),
then rolls out --updates new versions one after the other (each a changed env value, waited for
until READY at that version), printing the plane's resident memory (VmRSS) every --every updates.
At the end it sends SIGINT, as Ctrl-C does, and prints how long the process took to exit.

Memory that grows with the updates is a leak: the in-memory AWS's stream, transactions and stream
iterators are bounded (fleetkeeper/local/moto_memory.py), so after a warm-up the figure stays flat.
Not part of `make test`: it takes minutes (about 2 to 4 s per update).

    .venv/bin/python bench/local_soak.py [--updates 200] [--every 10] [--replicas 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
NAME = "soak"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def spec(replicas: int, version: int) -> dict[str, Any]:
    return {
        "service": {"readiness_probe": {"path": "/", "initial_delay_seconds": 30}, "replicas": replicas},
        "envs": {"SOAK_VERSION": str(version)},
        "update": {"mode": "rolling", "max_surge": 1, "max_unavailable": 0},
        "run": "exec python3 -m http.server $PORT --bind 127.0.0.1",
    }


def wait_ready(api: Api, generation: int, deadline_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, view = api.call("GET", f"/v1/services/{NAME}")
        if status == 200 and int(view.get("observed_generation", 0)) >= generation and view.get("status") == "READY":
            return view
        time.sleep(0.2)
    raise RuntimeError(f"{NAME} not READY at generation {generation} in {deadline_s:g}s: {view}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fk-soak-") as workdir:
        state = Path(workdir) / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETKEEPER_", "TABLE_NAME"))}
        env["FLEETKEEPER_RUNTIME_DIR"] = str(Path(workdir) / "run")
        plane = subprocess.Popen(
            [str(BIN / "fleetkeeper"), "local", "--port", str(port), "--dir", str(state), "--quiet", "--tick", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            credential = state / "local-api.json"
            deadline = time.monotonic() + 60
            while not credential.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            api = Api(f"http://127.0.0.1:{port}", json.loads(credential.read_text())["token"])
            status, view = api.call("POST", "/v1/services", {"name": NAME, "spec": spec(args.replicas, 0)})
            if status >= 300:
                raise RuntimeError(f"create: {status} {view}")
            wait_ready(api, int(view.get("generation", 1)), 120)
            print(f"{'updates':>8} {'RSS MB':>8} {'s/update':>9}")
            print(f"{0:>8} {rss_mb(plane.pid):>8.1f} {'':>9}", flush=True)
            started = time.monotonic()
            for number in range(1, args.updates + 1):
                status, view = api.call("PUT", f"/v1/services/{NAME}", {"spec": spec(args.replicas, number)})
                if status >= 300:
                    raise RuntimeError(f"update {number}: {status} {view}")
                wait_ready(api, int(view["generation"]), 120)
                if number % args.every == 0:
                    took = (time.monotonic() - started) / args.every
                    print(f"{number:>8} {rss_mb(plane.pid):>8.1f} {took:>9.2f}", flush=True)
                    started = time.monotonic()
            interrupted = time.monotonic()
            os.killpg(plane.pid, signal.SIGINT)
            code = plane.wait(timeout=600)
            print(f"SIGINT -> exit {code} in {time.monotonic() - interrupted:.2f}s", flush=True)
        finally:
            if plane.poll() is None:
                os.killpg(plane.pid, signal.SIGKILL)
                plane.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
