"""`fleetkeeper local` as a subprocess serves its user's CLI and nobody else (issue 22).

Its CLI works with no extra step (the credential is found on its own); a web page, a DNS-rebinding
name, another local process and the in-memory AWS's own endpoints get 4xx and change nothing; the
state dir and what is in it are its user's only; the credential goes away with the run.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from fleetkeeper.local.auth import CREDENTIAL_FILE, RUNTIME_DIR_ENV
from tests import REPO_ROOT
from tests.support.local_process import LocalPlane, eventually, start_local

EXAMPLE = REPO_ROOT / "examples" / "hello" / "service.yaml"
SECRET = "hf_e2e_never_leaves"

pytestmark = pytest.mark.e2e


def send(url: str, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, Any]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            connection.putheader(name, value)
        connection.endheaders(body or None)
        answer = connection.getresponse()
        payload = answer.read()
        return answer.status, payload
    finally:
        connection.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def services(plane: LocalPlane) -> list[str]:
    """The names in the embedded table, read through its in-memory AWS with the run's own key."""
    items = plane.aws_client("dynamodb").scan(TableName=plane.info()["table"])["Items"]
    return sorted({item["name"]["S"] for item in items if "name" in item})


def test_only_the_users_cli_drives_the_embedded_mode(tmp_path: Path) -> None:
    plane = start_local(tmp_path)
    try:
        # The CLI, with no flag: finds the run's credential on its own.
        created = plane.run("up", str(EXAMPLE), "--name", "mine", "--secret", f"HF_TOKEN={SECRET}")
        assert created.returncode == 0, created.stderr
        assert services(plane) == ["mine"]

        # Private: the state dir, the credential, the logs (a replica's log once it has started).
        credential = plane.credential()
        assert mode(plane.state) == 0o700 and mode(plane.state / CREDENTIAL_FILE) == 0o600
        assert mode(plane.state / "logs") == 0o700
        # One folder per incarnation (logs/<service>/<uid>/).
        logs = eventually(lambda: sorted((plane.state / "logs" / "mine").glob("*/replica-*.log")), 30, what="a log")
        assert all(mode(log) == 0o600 for log in logs)

        authority = urlsplit(plane.url).netloc
        body = json.dumps({"name": "planted", "spec": {"run": "touch /tmp/pwned", "service": {}}}).encode()
        # A web page's no-cors POST; a DNS-rebinding name; another local process without the credential.
        page = {"Host": authority, "Origin": "https://evil.example", "Content-Type": "text/plain"}
        assert send(plane.url, "POST", "/v1/services", page, body)[0] == 403
        rebinding = {"Host": "evil.example:" + str(urlsplit(plane.url).port), "Content-Type": "application/json"}
        assert send(plane.url, "POST", "/v1/services", {**rebinding, **plane.auth()}, body)[0] == 403
        assert (
            send(plane.url, "POST", "/v1/services", {"Host": authority, "Content-Type": "application/json"}, body)[0]
            == 401
        )
        assert send(plane.url, "GET", "/_local/info", {"Host": authority})[0] == 401
        # The in-memory AWS's own endpoints, from outside the process: refused, no secret, no CORS.
        aws = credential.aws_endpoint
        for headers in ({"Host": urlsplit(aws).netloc}, {"Host": urlsplit(aws).netloc, "Origin": "https://x.example"}):
            status, payload = send(aws, "GET", "/moto-api/data.json", headers)
            assert status == 403 and SECRET.encode() not in payload
        assert services(plane) == ["mine"]

        # Another user's CLI (its own runtime dir: no credential of this run) sends nothing.
        stranger = plane.run("status", "--api-url", plane.url, env={RUNTIME_DIR_ENV: str(tmp_path / "stranger")})
        assert stranger.returncode == 2 and "no running `fleetkeeper local` of yours" in stranger.stderr
        assert plane.run("down", "mine").returncode == 0
    finally:
        code = plane.stop()
    assert code == 0, plane.output()
    # The run's credential went away with it: a later process on that port gets nothing from the CLI.
    assert not (plane.state / CREDENTIAL_FILE).exists()
    assert not any((tmp_path / "run").iterdir())
    later = plane.run("status")
    assert later.returncode == 2 and "no API to talk to" in later.stderr
    assert os.path.isdir(plane.state)


def test_local_refuses_to_start_where_the_cli_could_not_find_its_credential(tmp_path: Path) -> None:
    """A runtime dir it cannot use (here a file): exit 2 saying so, not a server nobody can drive."""
    import subprocess
    import sys

    from tests.support.local_process import FLEETKEEPER, clean_env, free_port

    (tmp_path / "not-a-dir").write_text("")
    env = {**clean_env(), RUNTIME_DIR_ENV: str(tmp_path / "not-a-dir" / "run")}
    started = subprocess.run(
        [sys.executable, "-c", FLEETKEEPER, "local", "--port", str(free_port()), "--dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert started.returncode == 2, started.stderr
    assert "cannot link the credential from" in started.stderr and RUNTIME_DIR_ENV in started.stderr
    assert not (tmp_path / "state" / CREDENTIAL_FILE).exists()
