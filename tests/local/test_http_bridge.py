"""The HTTP bridge: real HTTP on 127.0.0.1 in front of the real api handler (moto in-process)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.api.refusals import MAX_BODY_BYTES
from fleetkeeper.local.auth import CREDENTIAL_FILE, LocalCredential
from fleetkeeper.local.http_bridge import KICK_PATH, ApiBridge
from tests.support.local_process import serving_bridge
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


class Bridge:
    def __init__(self, server: ApiBridge, kicks: list[str], credential: LocalCredential) -> None:
        self.server = server
        self.kicks = kicks
        self.credential = credential

    @property
    def head(self) -> str:
        """The header lines every request needs: our Host, and the run's credential."""
        return f"Host: {self.server.gate.authority}\r\nAuthorization: {self.credential.authorization}"

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        request = urllib.request.Request(
            self.server.url + path,
            data=data,
            method=method,
            headers={
                "Content-Type": "application/json",
                "Authorization": self.credential.authorization,
                **(headers or {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, dict(answer.headers.items()), answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers.items()), exc.read()


@pytest.fixture
def bridge(table: str, tmp_path: Path) -> Iterator[Bridge]:
    kicks: list[str] = []
    with serving_bridge(lambda_handler, tmp_path / "state", on_kick=kicks.append, logs_dir=tmp_path / "logs") as server:
        path = tmp_path / "state" / CREDENTIAL_FILE
        yield Bridge(server, kicks, LocalCredential.from_json(path.read_text(), path))


def test_a_request_reaches_the_handler_and_its_response_comes_back_whole(bridge: Bridge) -> None:
    status, headers, body = bridge.call("POST", "/v1/services", {"name": "web", "spec": hello_spec()})
    assert status == 201
    assert headers["ETag"] == '"1"'
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body)
    assert json.loads(body)["name"] == "web"

    status, _, body = bridge.call("GET", "/v1/services?limit=1")
    assert status == 200 and [s["name"] for s in json.loads(body)["services"]] == ["web"]


def test_error_statuses_and_bodies_pass_through_as_the_handler_made_them(bridge: Bridge) -> None:
    spec = hello_spec(file_mounts={"/x": "y"})
    status, _, body = bridge.call("POST", "/v1/services", {"name": "web", "spec": spec})
    assert status == 400
    assert "file_mounts" in json.loads(body)["error"]["message"]

    status, _, body = bridge.call("GET", "/v1/services/nope")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"

    status, _, body = bridge.call("GET", "/nowhere")
    assert status == 404 and json.loads(body)["error"]["code"] == "no_route"


def test_request_headers_reach_the_handler(bridge: Bridge) -> None:
    bridge.call("POST", "/v1/services", {"name": "web", "spec": hello_spec()})
    stale = {"If-Match": '"7"'}
    status, _, body = bridge.call("PUT", "/v1/services/web", {"spec": hello_spec()}, headers=stale)
    assert status == 412, body
    status, headers, _ = bridge.call(
        "PUT", "/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}, headers={"If-Match": "1"}
    )
    assert status == 200 and headers["ETag"] == '"2"'


def test_query_strings_reach_the_handler(bridge: Bridge) -> None:
    status, _, body = bridge.call("GET", "/v1/services?limit=0")
    assert status == 400 and "limit" in json.loads(body)["error"]["message"]


def test_the_kick_endpoint_wakes_the_reconciler_with_the_service_name(bridge: Bridge) -> None:
    status, _, _ = bridge.call("POST", KICK_PATH, {"service": "web"})
    assert status == 202 and bridge.kicks == ["web"]
    status, _, _ = bridge.call("POST", KICK_PATH, {"nothing": 1})
    assert status == 400 and bridge.kicks == ["web"]
    status, _, _ = bridge.call("POST", KICK_PATH, b"not json")
    assert status == 400


def test_a_delayed_kick_or_a_follow_up_goes_to_the_reconcile_loop_until_due(bridge: Bridge) -> None:
    later: list[tuple[str, int, int | None]] = []
    bridge.server.on_delayed_kick = lambda service, delay, followup: later.append((service, delay, followup))
    status, _, _ = bridge.call("POST", KICK_PATH, {"service": "web", "delay_seconds": 10, "followup": 1234})
    assert status == 202
    status, _, _ = bridge.call("POST", KICK_PATH, {"service": "web", "delay_seconds": 90})
    assert status == 202
    status, _, body = bridge.call("POST", KICK_PATH, {"service": "web", "delay_seconds": 10, "followup": "soon"})
    assert status == 400 and b"followup" in body
    assert later == [("web", 10, 1234), ("web", 90, None)] and bridge.kicks == []


def test_the_apis_own_kick_after_a_write_arrives_through_the_kick_url(
    bridge: Bridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_KICK_URL", bridge.server.url + KICK_PATH)
    monkeypatch.setenv("FLEETKEEPER_KICK_TOKEN", bridge.credential.token)
    status, _, _ = bridge.call("POST", "/v1/services", {"name": "kicked", "spec": hello_spec()})
    assert status == 201
    assert bridge.kicks == ["kicked"]
    bridge.call("DELETE", "/v1/services/kicked")
    assert bridge.kicks == ["kicked", "kicked"]


def test_replica_logs_are_listed_and_served(bridge: Bridge, tmp_path: Path) -> None:
    old = tmp_path / "logs" / "web" / "uid-old"
    old.mkdir(parents=True)
    (old / "replica-0.log").write_text("an older incarnation's\n")
    os.utime(old, (1000, 1000))
    folder = tmp_path / "logs" / "web" / "uid-new"
    folder.mkdir(parents=True)
    (folder / "replica-10.log").write_text("ten\n")
    (folder / "replica-2.log").write_text("two\n")
    (folder / "notes.txt").write_text("not a replica log")

    status, _, body = bridge.call("GET", "/_local/logs/web")  # no uid: the newest incarnation's
    assert status == 200
    assert [entry["replica_id"] for entry in json.loads(body)["logs"]] == [2, 10]
    status, _, body = bridge.call("GET", "/_local/logs/web?uid=uid-old")
    assert [entry["replica_id"] for entry in json.loads(body)["logs"]] == [0]
    assert bridge.call("GET", "/_local/logs/web?uid=..")[0] == 400
    status, headers, body = bridge.call("GET", "/_local/logs/web/10?uid=uid-new")
    assert (status, body) == (200, b"ten\n") and headers["Content-Type"].startswith("text/plain")
    # ?since=EPOCH: from the size the log had at the last mark before then (the driver's .times file).
    (folder / "replica-10.log").write_text("ten\neleven\n")
    (folder / "replica-10.log.times").write_text("100 4\n200 11\n")
    assert bridge.call("GET", "/_local/logs/web/10?uid=uid-new&since=150")[2] == b"eleven\n"
    assert bridge.call("GET", "/_local/logs/web/10?uid=uid-new&since=50")[2] == b"ten\neleven\n"
    assert bridge.call("GET", "/_local/logs/web/3")[0] == 404
    assert bridge.call("GET", "/_local/logs/..%2Fetc")[0] == 400
    assert bridge.call("GET", "/_local/logs/Bad_Name/1")[0] == 400


def test_info_says_where_things_are(bridge: Bridge, tmp_path: Path) -> None:
    status, _, body = bridge.call("GET", "/_local/info")
    info = json.loads(body)
    assert status == 200
    assert info["api_url"] == bridge.server.url and info["logs_dir"] == str(tmp_path / "logs")


def test_concurrent_requests_each_get_their_own_answer(bridge: Bridge) -> None:
    """The handler runs one request at a time: answers never cross between concurrent requests."""
    names = [f"svc-{i}" for i in range(12)]
    results: dict[str, Any] = {}

    def create(name: str) -> None:
        status, _, body = bridge.call("POST", "/v1/services", {"name": name, "spec": hello_spec()})
        results[name] = (status, json.loads(body)["name"])

    threads = [threading.Thread(target=create, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {name: (201, name) for name in names}


# --- requests the bridge must answer itself ------------------------------------------------------------


def raw(bridge: Bridge, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes, bool]:
    """Send bytes as they are; the answer, and whether the server closed the connection after it."""
    with socket.create_connection(bridge.server.server_address[:2], timeout=5) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        payload = answer.read()
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
        return answer.status, dict(answer.getheaders()), payload, closed


def error_code(payload: bytes) -> str:
    error = json.loads(payload)["error"]
    assert set(error) == {"code", "message", "details"}
    return str(error["code"])


@pytest.mark.parametrize("length", ["abc", "-1", "1.5", ""])
def test_a_content_length_that_is_not_a_byte_count_is_a_400(bridge: Bridge, length: str) -> None:
    head = f"POST /v1/services HTTP/1.1\r\n{bridge.head}\r\nContent-Type: application/json\r\nContent-Length: {length}"
    status, _, payload, _ = raw(bridge, head.encode(), b"{}")
    assert status == 400 and error_code(payload) == "invalid_request"


def test_a_body_over_the_apis_limit_is_refused_unread_and_the_connection_closed(bridge: Bridge) -> None:
    head = f"POST /v1/services HTTP/1.1\r\n{bridge.head}\r\nContent-Type: application/json\r\n"
    for length in (MAX_BODY_BYTES + 1, 10**15):
        status, headers, payload, closed = raw(bridge, (head + f"Content-Length: {length}").encode(), b"{}")
        assert status == 413 and error_code(payload) == "payload_too_large"
        assert closed and headers["Connection"] == "close"
    assert bridge.kicks == []


def test_a_chunked_body_is_refused_with_411(bridge: Bridge) -> None:
    connection = http.client.HTTPConnection(*bridge.server.server_address[:2], timeout=5)
    body = iter([json.dumps({"name": "web", "spec": hello_spec()}).encode()])
    connection.request(
        "POST",
        "/v1/services",
        body=body,
        headers={"Content-Type": "application/json", "Authorization": bridge.credential.authorization},
        encode_chunked=True,
    )
    answer = connection.getresponse()
    assert answer.status == 411 and error_code(answer.read()) == "length_required"
    connection.close()
    assert bridge.call("GET", "/v1/services/web")[0] == 404  # nothing was created


@pytest.mark.parametrize("method", ["OPTIONS", "HEAD", "TRACE", "PATCH", "FOO"])
def test_every_method_is_answered_by_the_api_in_its_own_error_shape(bridge: Bridge, method: str) -> None:
    connection = http.client.HTTPConnection(*bridge.server.server_address[:2], timeout=5)
    connection.request(method, "/v1/services/web", headers={"Authorization": bridge.credential.authorization})
    answer = connection.getresponse()
    payload = answer.read()
    assert 400 <= answer.status < 500 and answer.getheader("Content-Type") == "application/json"
    if method != "HEAD":  # HEAD's answer has headers only
        assert error_code(payload) in {"no_route", "not_found"}
    connection.close()
