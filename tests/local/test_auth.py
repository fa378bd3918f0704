"""The embedded API serves its user's CLI and nobody else (fleetkeeper.local.auth, issue 22).

Each refusal is a 4xx in the api's error shape, decided before any of the body is read, and leaves
nothing behind: the table (read directly, not through the API) holds no service afterwards.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws
from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.local import auth
from fleetkeeper.local.auth import CREDENTIAL_FILE, ApiGate, CredentialProblem, LocalCredential
from fleetkeeper.local.http_bridge import KICK_PATH
from fleetkeeper.replicas.workdirs import LocalWorkdirStore
from fleetkeeper.store.keys import service_pk
from tests.support.local_process import serving_bridge
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fleetkeeper.local.http_bridge import ApiBridge

EVIL_ORIGIN = "https://evil.example"
ZERO_DIGEST = "0" * 64


class Plane:
    """A bridge in front of the real api handler, and what a client may send it, byte for byte."""

    def __init__(self, server: ApiBridge, credential: LocalCredential, table: str, kicks: list[str]) -> None:
        self.server = server
        self.credential = credential
        self.table = table
        self.kicks = kicks

    def send(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        """One request with exactly `headers` (http.client adds none but Content-Length, since
        skip_host and no automatic Accept-Encoding), and the answer."""
        host, port = self.server.server_address[:2]
        connection = http.client.HTTPConnection(str(host), int(port), timeout=10)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in (headers or {}).items():
                connection.putheader(name, value)
            if body or method in {"POST", "PUT"}:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body or None)
            answer = connection.getresponse()
            payload = answer.read()
            return answer.status, dict(answer.getheaders()), json.loads(payload) if payload else None
        finally:
            connection.close()

    def ours(self, **extra: str) -> dict[str, str]:
        """What the CLI sends: our Host, the run's credential (and, here, `extra`)."""
        return {"Host": self.server.gate.authority, "Authorization": self.credential.authorization, **extra}

    def services_in_the_table(self) -> list[str]:
        """The services whose items are in the table (read directly, not through the API)."""
        items = aws.dynamodb().scan(TableName=self.table)["Items"]
        return sorted({str(item["PK"]["S"]) for item in items if str(item["PK"]["S"]).startswith(service_pk(""))})

    def stored_workdirs(self) -> list[Path]:
        store = self.server.workdirs
        return [] if store is None or not store.root.exists() else list(store.root.rglob("*"))


@pytest.fixture
def plane(table: str, tmp_path: Path) -> Iterator[Plane]:
    kicks: list[str] = []
    store = LocalWorkdirStore(tmp_path / "workdirs", "")
    options = {"on_kick": kicks.append, "logs_dir": tmp_path / "logs", "workdirs": store}
    with serving_bridge(lambda_handler, tmp_path / "state", **options) as server:
        path = tmp_path / "state" / CREDENTIAL_FILE
        yield Plane(server, LocalCredential.from_json(path.read_text(), path), table, kicks)


def create_body(name: str = "web") -> bytes:
    return json.dumps({"name": name, "spec": hello_spec()}).encode()


def refused(answer: tuple[int, dict[str, str], Any], status: int, code: str, field: str) -> None:
    got, headers, body = answer
    assert got == status, body
    assert headers["Content-Type"] == "application/json"
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code and [d["field"] for d in body["error"]["details"]] == [field]
    assert not any(name.lower().startswith("access-control-") for name in headers)


# --- what a web page can send ---------------------------------------------------------------------------


def test_a_cross_site_simple_post_is_refused_and_creates_nothing(plane: Plane) -> None:
    """A page's `fetch(url, {method: "POST", mode: "no-cors", body})`: text/plain, the page's Origin."""
    headers = {"Host": plane.server.gate.authority, "Origin": EVIL_ORIGIN, "Content-Type": "text/plain"}
    refused(plane.send("POST", "/v1/services", create_body(), headers), 403, "forbidden", "Origin")
    # Even with the credential (it cannot have it), a foreign Origin is refused.
    answer = plane.send("POST", "/v1/services", create_body(), plane.ours(Origin=EVIL_ORIGIN))
    refused(answer, 403, "forbidden", "Origin")
    refused(plane.send("POST", "/v1/services", create_body(), plane.ours(Origin="null")), 403, "forbidden", "Origin")
    assert plane.services_in_the_table() == [] and plane.kicks == []


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_write_whose_body_is_not_declared_json_is_a_415_and_creates_nothing(
    plane: Plane, content_type: str | None
) -> None:
    """The simple content types (and none at all, which the handler would parse as JSON)."""
    headers = plane.ours() if content_type is None else plane.ours(**{"Content-Type": content_type})
    refused(plane.send("POST", "/v1/services", create_body(), headers), 415, "unsupported_media_type", "Content-Type")
    assert plane.services_in_the_table() == []
    answer = plane.send("POST", KICK_PATH, b'{"service": "web"}', plane.ours())
    refused(answer, 415, "unsupported_media_type", "Content-Type")
    assert plane.kicks == []


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:{port}",  # a DNS-rebinding name: resolves to 127.0.0.1, but it is not our name
        "evil.example",
        "localhost:{port}",  # may resolve to ::1, where another process can hold the port
        "127.0.0.1:1",
        "127.0.0.1",
        "",
    ],
)
def test_a_foreign_host_is_refused_even_with_the_credential(plane: Plane, host: str) -> None:
    port = plane.server.server_address[1]
    headers = plane.ours(**{"Host": host.format(port=port), "Content-Type": "application/json"})
    refused(plane.send("POST", "/v1/services", create_body(), headers), 403, "forbidden", "Host")
    refused(plane.send("GET", "/_local/info", headers=headers), 403, "forbidden", "Host")
    assert plane.services_in_the_table() == []


def test_a_request_without_a_host_or_with_two_is_refused(plane: Plane) -> None:
    json_type = {"Content-Type": "application/json", "Authorization": plane.credential.authorization}
    refused(plane.send("POST", "/v1/services", create_body(), json_type), 403, "forbidden", "Host")
    host, port = plane.server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), int(port), timeout=10)
    connection.putrequest("GET", "/v1/services", skip_host=True)
    connection.putheader("Host", plane.server.gate.authority)
    connection.putheader("Host", "evil.example")
    connection.putheader("Authorization", plane.credential.authorization)
    connection.endheaders()
    answer = connection.getresponse()
    assert answer.status == 403 and json.loads(answer.read())["error"]["details"][0]["field"] == "Host"
    connection.close()


# --- what another local user (or process) can send ------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer ",
        "Bearer wrong",
        "Basic {token}",  # the right secret in the wrong scheme
        "Bearer {token}x",
        "{token}",
    ],
)
def test_a_request_without_the_runs_credential_is_a_401_and_creates_nothing(
    plane: Plane, authorization: str | None
) -> None:
    headers = {"Host": plane.server.gate.authority, "Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization.format(token=plane.credential.token)
    answer = plane.send("POST", "/v1/services", create_body(), headers)
    refused(answer, 401, "unauthorized", "Authorization")
    assert answer[1]["WWW-Authenticate"] == 'Bearer realm="fleetkeeper-local"'
    for method, path, body in [
        ("GET", "/v1/services", b""),
        ("GET", "/_local/info", b""),
        ("GET", "/_local/logs/web", b""),
        ("POST", KICK_PATH, b'{"service": "web"}'),
        ("DELETE", "/v1/services/web", b""),
        ("PUT", f"/_local/workdirs/{ZERO_DIGEST}", b"not an archive"),
    ]:
        refused(plane.send(method, path, body, headers), 401, "unauthorized", "Authorization")
    assert plane.services_in_the_table() == [] and plane.kicks == [] and plane.stored_workdirs() == []


def test_the_credential_of_another_run_is_refused(plane: Plane) -> None:
    other = auth.new_token()
    headers = plane.ours(**{"Authorization": f"Bearer {other}", "Content-Type": "application/json"})
    answer = plane.send("POST", "/v1/services", create_body(), headers)
    refused(answer, 401, "unauthorized", "Authorization")
    assert "not this run's" in answer[2]["error"]["message"]
    assert plane.services_in_the_table() == []


def test_the_clis_request_is_served_and_the_credential_never_reaches_the_handler(table: str, tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        seen.append(event)
        return lambda_handler(event, context)

    with serving_bridge(handler, tmp_path / "state", on_kick=lambda _n: None, logs_dir=tmp_path / "logs") as server:
        path = tmp_path / "state" / CREDENTIAL_FILE
        plane = Plane(server, LocalCredential.from_json(path.read_text(), path), table, [])
        json_type = {"Content-Type": "application/json; charset=utf-8"}
        status, _, body = plane.send("POST", "/v1/services", create_body(), plane.ours(**json_type))
        assert status == 201, body
        # A page of our own origin (a UI served by this server one day) is not refused for its Origin.
        origin = {"Origin": f"http://{server.gate.authority}"}
        assert plane.send("GET", "/v1/services/web", headers=plane.ours(**origin))[0] == 200
    assert plane.services_in_the_table() == [service_pk("web")]
    assert seen and all("authorization" not in {k.lower() for k in event["headers"]} for event in seen)


# --- the gate on its own --------------------------------------------------------------------------------


def test_the_gate_checks_host_and_origin_before_the_credential_and_the_body_last() -> None:
    gate = ApiGate("secret", "127.0.0.1", 8080)
    ok = {"host": ["127.0.0.1:8080"], "origin": [], "authorization": ["Bearer secret"]}
    assert gate.refuse("POST", **ok, content_type="application/json", has_body=True) is None
    assert gate.refuse("GET", **ok, content_type=None, has_body=False) is None
    assert gate.refuse("POST", **ok, content_type=None, has_body=False) is None  # a rollback: no body
    # The workdir upload takes an archive, still behind the credential.
    assert gate.refuse("PUT", **ok, content_type="application/gzip", has_body=True, json_body=False) is None
    bad_everything = {"host": ["evil.example:8080"], "origin": [EVIL_ORIGIN], "authorization": []}
    refusal = gate.refuse("POST", **bad_everything, content_type="text/plain", has_body=True)
    assert refusal is not None and (refusal.status, refusal.field) == (403, "Host")
    refusal = gate.refuse("POST", **{**bad_everything, "host": ["127.0.0.1:8080"]}, content_type=None, has_body=True)
    assert refusal is not None and (refusal.status, refusal.field) == (403, "Origin")
    refusal = gate.refuse("POST", **{**ok, "authorization": []}, content_type="text/plain", has_body=True)
    assert refusal is not None and (refusal.status, refusal.field) == (401, "Authorization")
    refusal = gate.refuse("POST", **{**ok, "authorization": ["Bearer secret"] * 2}, content_type=None, has_body=False)
    assert refusal is not None and refusal.status == 401


# --- private files --------------------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_credential_is_a_0600_file_in_a_0700_state_dir_linked_for_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(auth.RUNTIME_DIR_ENV, str(tmp_path / "run"))
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # left world-readable by an earlier version: tightened
    os.chmod(state, 0o755)
    credential = LocalCredential("http://127.0.0.1:8123", auth.new_token(), os.getpid())
    published = auth.publish(credential, state)
    assert published.path == state / CREDENTIAL_FILE
    assert mode(state) == 0o700 and mode(published.path) == 0o600
    assert mode(tmp_path / "run") == 0o700
    assert published.link.is_symlink() and published.link.resolve() == published.path.resolve()
    assert auth.credential_for("http://127.0.0.1:8123") == credential
    assert auth.running() == [credential]
    assert auth.credential_for("http://localhost:8123") is None  # the exact URL only
    assert auth.credential_for("http://127.0.0.1:8124") is None
    auth.withdraw(published)
    assert not published.path.exists() and not published.link.is_symlink()
    assert auth.credential_for("http://127.0.0.1:8123") is None


def test_a_credential_readable_by_others_or_of_a_dead_server_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(auth.RUNTIME_DIR_ENV, str(tmp_path / "run"))
    credential = LocalCredential("http://127.0.0.1:8123", auth.new_token(), os.getpid())
    published = auth.publish(credential, tmp_path / "state")
    published.path.chmod(0o644)
    with pytest.raises(CredentialProblem, match="readable or writable by others"):
        auth.credential_for("http://127.0.0.1:8123")
    published.path.chmod(0o600)
    # The server was killed (no withdraw): its pid is gone, so is the credential's use.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    auth.write_private(
        published.path, LocalCredential(credential.api_url, credential.token, int(gone.stdout)).to_json()
    )
    assert auth.credential_for("http://127.0.0.1:8123") is None and auth.running() == []


def test_a_state_dir_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setattr(os, "getuid", lambda: os.stat(state).st_uid + 1)
    with pytest.raises(CredentialProblem, match="not to you"):
        auth.private_dir(state)
