"""Helpers for tests that run `fleetkeeper local` and the CLI as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLEETKEEPER = "from fleetkeeper.cli.main import main; main()"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def clean_env() -> dict[str, str]:
    """The test process's environment without fleetkeeper's own settings (the server sets them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("FLEETKEEPER_", "TABLE_NAME"))}


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def process_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def eventually(check: Any, timeout: float, interval: float = 0.25, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, AssertionError, KeyError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout}s (last: {last!r})")


@dataclass
class LocalPlane:
    """A running `fleetkeeper local` subprocess."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    workdir: Path

    def info(self) -> dict[str, Any]:
        status, body = http_get(self.url + "/_local/info")
        assert status == 200
        info: dict[str, Any] = json.loads(body)
        return info

    def aws_client(self, service: str) -> Any:
        """A boto3 client of the plane's in-memory AWS (to look at what it holds)."""
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.info()["aws_endpoint"],
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )

    def cli(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`fleetkeeper ARGS --api-url <this plane>` (with `env` added to its environment)."""
        return self.run(*args, "--api-url", self.url, timeout=timeout, env=env)

    def run(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`fleetkeeper ARGS`, as is."""
        return subprocess.run(
            [sys.executable, "-c", FLEETKEEPER, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**clean_env(), **(env or {})},
            cwd=self.workdir,
            check=False,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def start_local(workdir: Path, *, tick: float = 1.0, timeout: float = 60, extra: list[str] | None = None) -> LocalPlane:
    """Start `fleetkeeper local` on a free port and wait until its API answers."""
    port = free_port()
    log = workdir / "fleetkeeper-local.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                FLEETKEEPER,
                "local",
                "--port",
                str(port),
                "--tick",
                str(tick),
                "--dir",
                str(workdir / "state"),
                *(extra or []),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**clean_env(), "PYTHONUNBUFFERED": "1"},
            cwd=workdir,
        )
    plane = LocalPlane(process, f"http://127.0.0.1:{port}", log, workdir)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"fleetkeeper local exited with {process.returncode}:\n{plane.output()}")
        return http_get(plane.url + "/_local/info")[0] == 200

    try:
        eventually(up, timeout, what="fleetkeeper local answering")
    except BaseException:
        plane.stop(signal.SIGKILL)
        raise
    return plane
