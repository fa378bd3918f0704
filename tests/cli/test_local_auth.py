"""The CLI sends nothing to a loopback port that is not its user's running `fleetkeeper local`.

Before: with no --api-url, --stack or $FLEETKEEPER_API_URL it sent every request, a spec's
--secret values included, unsigned to http://127.0.0.1:8080, to whatever process held that port.
Now it talks to the embedded mode only when its credential is there (found on its own) or --local
is given, and attaches that credential; anything else is a usage error (exit 2) before any request.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.cli.http import ApiClient
from fleetkeeper.cli.main import run
from fleetkeeper.local.auth import RUNTIME_DIR_ENV, LocalCredential, new_token, publish, withdraw

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SPEC = "name: web\nservice:\n  readiness_probe: /health\n  replicas: 1\nrun: python3 -m http.server $PORT\n"


class Squatter(ThreadingHTTPServer):
    """Whatever process holds a loopback port: records every request it gets, answers 201."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, dict[str, str], bytes]] = []
        squatter = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                squatter.received.append((self.command, self.path, dict(self.headers.items()), body))
                payload = json.dumps({"name": "web", "target_version": 1, "status": "PENDING", "services": []})
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload.encode())

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def squatter() -> Iterator[Squatter]:
    server = Squatter()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("FLEETKEEPER_API_URL", raising=False)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "run"))
    return tmp_path / "run"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run(list(argv), out=out, err=err, client_factory=lambda url: ApiClient(url, sleep=lambda _s: None))
    return code, out.getvalue(), err.getvalue()


def up_with_a_secret(tmp_path: Path, *where: str) -> tuple[int, str, str]:
    spec = tmp_path / "web.yaml"
    spec.write_text(SPEC)
    return cli("up", str(spec), "--secret", "HF_TOKEN=hf_very_secret", *where)


def test_with_no_api_given_and_no_local_plane_running_nothing_is_sent(tmp_path: Path, squatter: Squatter) -> None:
    code, _, err = up_with_a_secret(tmp_path)
    assert code == 2
    assert "no API to talk to" in err and "--stack NAME" in err and "fleetkeeper local" in err
    assert squatter.received == []


def test_a_loopback_port_without_the_users_credential_gets_no_request(tmp_path: Path, squatter: Squatter) -> None:
    """The squatter holds the port; the user named it, but no `fleetkeeper local` of theirs runs there."""
    code, _, err = up_with_a_secret(tmp_path, "--api-url", squatter.url)
    assert code == 2
    assert f"no running `fleetkeeper local` of yours answers at {squatter.url}" in err and "--local" in err
    assert squatter.received == []


def test_the_users_running_plane_is_found_on_its_own_and_gets_its_credential(
    tmp_path: Path, squatter: Squatter
) -> None:
    credential = LocalCredential(squatter.url, new_token(), os.getpid())
    published = publish(credential, tmp_path / "state")
    try:
        code, _, err = up_with_a_secret(tmp_path)  # no --api-url: found in the runtime dir
        assert code == 0, err
        code, _, err = cli("status", "--api-url", squatter.url)
        assert code == 0, err
    finally:
        withdraw(published)
    assert [(m, p) for m, p, _, _ in squatter.received] == [("POST", "/v1/services"), ("GET", "/v1/services?limit=100")]
    assert all(headers["Authorization"] == f"Bearer {credential.token}" for _, _, headers, _ in squatter.received)


def test_local_sends_to_the_default_or_given_loopback_url_without_a_credential(
    tmp_path: Path, squatter: Squatter
) -> None:
    """--local: the user vouches for the port (a loopback API of their own, e.g. `sam local start-api`)."""
    code, _, err = cli("status", "--api-url", squatter.url, "--local")
    assert code == 0, err
    assert len(squatter.received) == 1 and "Authorization" not in squatter.received[0][2]
    code, _, err = cli("status", "--local", "--api-url", "https://abc.execute-api.eu-west-1.amazonaws.com/api")
    assert code == 2 and "--local is the embedded mode on this machine" in err


def test_a_credential_others_can_read_or_of_a_dead_server_is_not_used(tmp_path: Path, squatter: Squatter) -> None:
    credential = LocalCredential(squatter.url, new_token(), os.getpid())
    published = publish(credential, tmp_path / "state")
    published.path.chmod(0o644)
    code, _, err = cli("status", "--api-url", squatter.url)
    assert code == 2 and "readable or writable by others" in err
    published.path.chmod(0o600)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = LocalCredential(squatter.url, credential.token, int(gone.stdout))
    published.path.write_text(dead.to_json())
    assert cli("status", "--api-url", squatter.url)[0] == 2
    assert cli("status")[0] == 2
    assert squatter.received == []


def test_a_credential_is_for_its_exact_url_only(tmp_path: Path, squatter: Squatter) -> None:
    """`localhost` may be ::1, another socket: the credential of 127.0.0.1:<port> is not sent there."""
    credential = LocalCredential(squatter.url, new_token(), os.getpid())
    publish(credential, tmp_path / "state")
    port = squatter.server_address[1]
    code, _, err = cli("status", "--api-url", f"http://localhost:{port}")
    assert code == 2 and "no running `fleetkeeper local`" in err
    assert squatter.received == []


def test_several_running_planes_need_a_choice(tmp_path: Path) -> None:
    for port in (8101, 8102):
        publish(LocalCredential(f"http://127.0.0.1:{port}", new_token(), os.getpid()), tmp_path / f"state-{port}")
    code, _, err = cli("status")
    assert code == 2 and "http://127.0.0.1:8101, http://127.0.0.1:8102" in err and "--api-url" in err


def test_the_workdir_upload_carries_the_credential_to_the_api_only(tmp_path: Path, squatter: Squatter) -> None:
    archive = tmp_path / "workdir.tar.gz"
    archive.write_bytes(b"archive")
    client = ApiClient(squatter.url, token="t0ken")
    client.upload(f"{squatter.url}/_local/workdirs/{'0' * 64}", "PUT", {}, archive)
    other = Squatter()
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        client.upload(f"{other.url}/elsewhere", "PUT", {}, archive)
    finally:
        other.shutdown()
        other.server_close()
    assert squatter.received[0][2]["Authorization"] == "Bearer t0ken"
    assert "Authorization" not in other.received[0][2]
