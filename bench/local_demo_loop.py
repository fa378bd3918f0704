"""`make local`'s demo, N times on a loaded machine: does hello reach READY every time?

Each round starts the embedded control plane (`fleetkeeper local`, default tick) on a free port of
127.0.0.1 with a fresh directory, runs `fleetkeeper up examples/hello/service.yaml --wait` against
it, records the exit code and the service's final status, then stops the control plane (which
stops the replicas). `--burners N` runs N busy-looping processes for the whole loop, so the
reconciler, the api and the replicas compete for the CPU as on a busy laptop. Not part of
`make test`: it takes minutes.

    .venv/bin/python bench/local_demo_loop.py [--rounds 20] [--burners 1] [--timeout 180]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hello" / "service.yaml"
BIN = Path(sys.executable).parent


def _burn() -> None:
    while True:
        pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_api(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v1/services", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the control plane did not answer on {url}")


def status_of(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/v1/services/hello", timeout=5) as answer:
            view = json.load(answer)
    except OSError as exc:
        return f"unreadable: {exc}"
    service = view.get("service", view)
    return f"{service.get('status')}: {service.get('status_message')}"


def one_round(number: int, timeout: float) -> tuple[bool, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="fk-demo-") as local_dir:
        env = {**os.environ, "FLEETKEEPER_API_URL": url}
        plane = subprocess.Popen(
            [str(BIN / "fleetkeeper"), "local", "--port", str(port), "--dir", local_dir, "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        try:
            wait_for_api(url, 60)
            started = time.monotonic()
            up = subprocess.run(
                [
                    str(BIN / "fleetkeeper"),
                    "up",
                    str(EXAMPLE),
                    "--wait",
                    "--timeout",
                    str(int(timeout)),
                    "--api-url",
                    url,
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            took = time.monotonic() - started
            final = status_of(url)
            ok = up.returncode == 0 and final.startswith("READY")
            detail = f"round {number}: exit {up.returncode} after {took:.1f}s, {final}"
            if not ok:
                detail += f"\n  stdout: {up.stdout.strip()[-500:]}\n  stderr: {up.stderr.strip()[-500:]}"
            return ok, detail
        finally:
            os.killpg(plane.pid, signal.SIGINT)
            try:
                plane.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(plane.pid, signal.SIGKILL)
                plane.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burners", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args()
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    passed = 0
    try:
        for number in range(1, args.rounds + 1):
            ok, detail = one_round(number, args.timeout)
            passed += ok
            print(("ok    " if ok else "FAIL  ") + detail, flush=True)
    finally:
        for burner in burners:
            burner.terminate()
    print(f"hello READY in {passed}/{args.rounds} rounds with {args.burners} CPU burner(s)", flush=True)
    return 0 if passed == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
