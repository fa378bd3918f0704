"""Helpers for tests that run `fleetkeeper local` and the CLI as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetkeeper.local.auth import (
    CREDENTIAL_FILE,
    RUNTIME_DIR_ENV,
    LocalCredential,
    new_token,
    publish,
    withdraw,
)
from fleetkeeper.local.http_bridge import ApiBridge

if TYPE_CHECKING:
    from collections.abc import Iterator

FLEETKEEPER = "from fleetkeeper.cli.main import main; main()"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def clean_env() -> dict[str, str]:
    """The test process's environment without fleetkeeper's own settings (the server sets them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("FLEETKEEPER_", "TABLE_NAME"))}


def http_get(url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as answer:
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


def ok(result: Any) -> str:
    """A CLI run's stdout, once it exited 0 (else what it printed, in the failure)."""
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return str(result.stdout)


@dataclass
class LocalPlane:
    """A running `fleetkeeper local` subprocess."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    workdir: Path

    @property
    def state(self) -> Path:
        return self.workdir / "state"

    @property
    def env(self) -> dict[str, str]:
        """What the plane and its CLI runs share: where the user's running planes are listed."""
        return {RUNTIME_DIR_ENV: str(self.workdir / "run")}

    def credential(self) -> LocalCredential:
        """The run's credential, as the CLI (or a user's curl) reads it from the state dir."""
        path = self.state / CREDENTIAL_FILE
        return LocalCredential.from_json(path.read_text(), path)

    def auth(self) -> dict[str, str]:
        return {"Authorization": self.credential().authorization}

    def get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        """GET <plane>PATH with the run's credential, as the CLI sends it."""
        return http_get(self.url + path, timeout=timeout, headers=self.auth())

    def service(self, name: str) -> dict[str, Any]:
        """GET /v1/services/NAME: the service's view (it must exist)."""
        status, body = self.get(f"/v1/services/{name}")
        assert status == 200, body
        shown: dict[str, Any] = json.loads(body)
        return shown

    def info(self) -> dict[str, Any]:
        status, body = self.get("/_local/info")
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
            aws_access_key_id=self.credential().aws_access_key_id,
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
            env={**clean_env(), **self.env, **(env or {})},
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
            env={**clean_env(), RUNTIME_DIR_ENV: str(workdir / "run"), "PYTHONUNBUFFERED": "1"},
            cwd=workdir,
        )
    plane = LocalPlane(process, f"http://127.0.0.1:{port}", log, workdir)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"fleetkeeper local exited with {process.returncode}:\n{plane.output()}")
        return plane.get("/_local/info")[0] == 200

    try:
        eventually(up, timeout, what="fleetkeeper local answering")
    except BaseException:
        plane.stop(signal.SIGKILL)
        raise
    return plane


@contextmanager
def serving_bridge(api_handler: Any, state_dir: Path, **options: Any) -> Iterator[ApiBridge]:
    """An ApiBridge on a free port, serving in a thread, its credential published as `fleetkeeper
    local` publishes it (so the CLI finds it on its own; tests/conftest.py points the runtime dir at
    a temporary one)."""
    token = new_token()
    server = ApiBridge(("127.0.0.1", 0), api_handler, token=token, **options)
    published = publish(LocalCredential(server.url, token, os.getpid()), state_dir)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        withdraw(published)
        server.shutdown()
        server.server_close()
