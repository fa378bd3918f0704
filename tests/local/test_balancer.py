"""The local load balancer in-process, against real HTTP servers on 127.0.0.1: policies, requests
passed on unchanged, streaming, the 503, drains, closing the port, and the RequestCount metric."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from fleetkeeper.local.balancer import LOAD_BALANCER_DIMENSION, LocalBalancer, put_request_counts
from fleetkeeper.model import EndpointConfig
from fleetkeeper.reconciler.balancer import DrainState, Target

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fleetkeeper.model import EndpointRecord

CONFIG = EndpointConfig(port=8080, policy="round_robin", drain_seconds=30, health_path="/health")


class Backend:
    """A replica: answers with its name, echoes what it got; /stream sends 3 chunks, each after a
    gate opens; /slow holds the request until `release` is set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[dict[str, Any]] = []
        self.gates = [threading.Event() for _ in range(3)]
        self.release = threading.Event()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                backend.seen.append(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                )
                if self.path == "/stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for number, gate in enumerate(backend.gates):
                        gate.wait(10)
                        data = f"token {number}\n".encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if self.path == "/slow":
                    backend.release.wait(10)
                answer = json.dumps({"replica": backend.name, "path": self.path}).encode()
                self.send_response(201 if self.command == "POST" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Replica", backend.name)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def target(self, replica_id: int) -> Target:
        return Target(replica_id=replica_id, instance_id=f"local-{self.name}", port=0, url=self.url)

    def close(self) -> None:
        for gate in self.gates:
            gate.set()
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def backends() -> Iterator[list[Backend]]:
    made = [Backend("a"), Backend("b")]
    yield made
    for backend in made:
        backend.close()


@pytest.fixture
def balancer() -> Iterator[LocalBalancer]:
    made = LocalBalancer(idle_timeout=5, metrics_interval=3600)
    yield made
    made.close()


def request(url: str, method: str = "GET", path: str = "/", **kw: Any) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, **kw)
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        connection.close()


def served(balancer: LocalBalancer, backends: list[Backend], config: EndpointConfig = CONFIG) -> EndpointRecord:
    endpoint = balancer.ensure("svc", "0123456789abcdef", config, None)
    balancer.register(endpoint, [b.target(n) for n, b in enumerate(backends)])
    return endpoint


def test_round_robin_spreads_requests_and_passes_them_on_unchanged(
    balancer: LocalBalancer, backends: list[Backend]
) -> None:
    endpoint = served(balancer, backends)
    assert endpoint.url.startswith("http://127.0.0.1:")
    answers = [request(endpoint.url, path=f"/v1/x?n={n}&q=a%20b")[2] for n in range(10)]
    replicas = Counter(json.loads(a)["replica"] for a in answers)
    assert replicas == {"a": 5, "b": 5}
    host = f"localhost:{endpoint.route}"
    status, headers, _body = request(
        endpoint.url, "POST", "/chat/completions?stream=0", body=b'{"x": 1}', headers={"X-Custom": "kept", "Host": host}
    )
    assert status == 201 and headers["X-Replica"] in ("a", "b")
    seen = next(s for b in backends for s in b.seen if s["method"] == "POST")
    assert seen["path"] == "/chat/completions?stream=0" and seen["body"] == b'{"x": 1}'
    assert seen["headers"]["X-Custom"] == "kept" and seen["headers"]["Host"] == host
    assert seen["headers"]["X-Forwarded-For"] == "127.0.0.1"
    assert seen["headers"]["X-Forwarded-Port"] == endpoint.route
    # Nothing of aiohttp's own: the client's Accept-Encoding (http.client's "identity") as it was.
    assert "User-Agent" not in seen["headers"] and seen["headers"]["Accept-Encoding"] == "identity"
    assert all(s["path"].endswith("&q=a%20b") for b in backends for s in b.seen if s["method"] == "GET")


def test_least_load_avoids_the_busy_replica(balancer: LocalBalancer, backends: list[Backend]) -> None:
    endpoint = served(balancer, backends, EndpointConfig(8080, "least_load", 30, "/health"))
    a, b = backends
    first = threading.Thread(target=request, args=(endpoint.url, "GET", "/slow"))
    first.start()
    deadline = time.monotonic() + 5
    while not (a.seen or b.seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    busy = a if a.seen else b
    idle = b if busy is a else a
    answers = [json.loads(request(endpoint.url)[2])["replica"] for _ in range(4)]
    assert answers == [idle.name] * 4
    busy.release.set()
    first.join(5)


def test_a_streaming_answer_reaches_the_client_chunk_by_chunk(balancer: LocalBalancer, backends: list[Backend]) -> None:
    endpoint = served(balancer, backends[:1])
    stream = backends[0]
    host, port = endpoint.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/stream")
    stream.gates[0].set()
    answer = connection.getresponse()
    assert answer.status == 200 and answer.getheader("Content-Type") == "text/event-stream"
    # The first token arrives while the replica still holds the others back: nothing is buffered.
    assert answer.readline() == b"token 0\n"
    stream.gates[1].set()
    assert answer.readline() == b"token 1\n"
    stream.gates[2].set()
    assert answer.read() == b"token 2\n"
    connection.close()


def test_no_registered_replica_is_a_quick_503_in_fleetkeepers_error_shape(balancer: LocalBalancer) -> None:
    endpoint = balancer.ensure("svc", "0123456789abcdef", CONFIG, None)
    started = time.monotonic()
    status, headers, body = request(endpoint.url, path="/anything")
    assert time.monotonic() - started < 1
    assert status == 503 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == {
        "error": {"code": "no_ready_replica", "message": "service svc has no READY replica right now", "details": []}
    }


def test_an_unreachable_replica_is_skipped_for_a_reachable_one(
    balancer: LocalBalancer, backends: list[Backend]
) -> None:
    endpoint = served(balancer, backends[:1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    balancer.register(endpoint, [Target(replica_id=9, instance_id="local-dead", port=0, url=dead)])
    assert [request(endpoint.url)[0] for _ in range(6)] == [200] * 6


class Resetting:
    """A replica that is gone behind its relay: each connection is accepted, then closed unanswered."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            connection.recv(65536)
            connection.close()


def test_a_replica_whose_connection_fails_is_dropped_at_once_and_the_request_retried(
    balancer: LocalBalancer, backends: list[Backend]
) -> None:
    # A killed replica in its own namespace: its relay accepts, then resets. Each idempotent request
    # is answered by the live replica, and the gone one is not tried again (SkyPilot's balancer drops
    # a replica it cannot reach; the ALB would 502 until its health check noticed).
    gone = Resetting()
    endpoint = served(balancer, backends[:1])
    balancer.register(endpoint, [Target(replica_id=9, instance_id="local-gone", port=0, url=gone.url)])
    try:
        assert [request(endpoint.url)[0] for _ in range(8)] == [200] * 8
        # Tried by one request only (whose client, aiohttp's, may connect twice), never again.
        assert 1 <= gone.accepted <= 2
    finally:
        gone.listener.close()


def test_a_request_that_may_have_been_acted_on_is_not_sent_again(balancer: LocalBalancer) -> None:
    gone = Resetting()
    endpoint = balancer.ensure("svc", "0123456789abcdef", CONFIG, None)
    balancer.register(endpoint, [Target(replica_id=9, instance_id="local-gone", port=0, url=gone.url)])
    try:
        status, _, body = request(endpoint.url, "PATCH", "/")
        assert status == 502 and json.loads(body)["error"]["code"] == "bad_gateway"
    finally:
        gone.listener.close()


def test_a_deregistered_replica_drains_its_requests_in_flight(balancer: LocalBalancer, backends: list[Backend]) -> None:
    endpoint = served(balancer, backends[:1])
    a = backends[0]
    answers: list[int] = []
    slow = threading.Thread(target=lambda: answers.append(request(endpoint.url, path="/slow")[0]))
    slow.start()
    deadline = time.monotonic() + 5
    while not a.seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert balancer.drain_states(endpoint, [a.target(0)]) == {"local-a": DrainState.IN_SERVICE}
    balancer.deregister(endpoint, [a.target(0)])
    assert balancer.drain_states(endpoint, [a.target(0)]) == {"local-a": DrainState.DRAINING}
    assert request(endpoint.url)[0] == 503  # no new request goes to it
    a.release.set()
    slow.join(5)
    assert answers == [200]  # the one in flight finished
    assert balancer.drain_states(endpoint, [a.target(0)]) == {"local-a": DrainState.DRAINED}
    balancer.deregister(endpoint, [a.target(0)])  # again: no error


def test_remove_closes_the_port(balancer: LocalBalancer, backends: list[Backend]) -> None:
    endpoint = served(balancer, backends)
    assert balancer.endpoints() == {"svc": endpoint.url}
    balancer.remove("svc", "0123456789abcdef", endpoint)
    with pytest.raises(ConnectionRefusedError):
        request(endpoint.url)
    assert balancer.endpoints() == {}
    balancer.remove("svc", "0123456789abcdef", endpoint)  # again: no error
    # ensure is idempotent per incarnation: the same uid keeps its port while it is open.
    again = balancer.ensure("svc", "fedcba9876543210", CONFIG, None)
    assert balancer.ensure("svc", "fedcba9876543210", CONFIG, again).url == again.url


def test_only_loopback_targets_are_accepted(balancer: LocalBalancer) -> None:
    endpoint = balancer.ensure("svc", "0123456789abcdef", CONFIG, None)
    with pytest.raises(ValueError, match=r"127\.0\.0\.1 only"):
        balancer.register(endpoint, [Target(replica_id=0, instance_id="i-1", port=8080, url="http://10.0.0.1:8080")])


def test_requests_are_published_as_the_albs_request_count(aws: None, backends: list[Backend]) -> None:
    balancer = LocalBalancer(idle_timeout=5, metrics_interval=3600, publisher=put_request_counts)
    try:
        published(balancer, backends)
    finally:
        balancer.close()


def published(balancer: LocalBalancer, backends: list[Backend]) -> None:
    endpoint = served(balancer, backends)
    for _ in range(7):
        request(endpoint.url)
    balancer.publish_now()
    dimensions = dict(endpoint.dimensions)
    assert dimensions["LoadBalancer"] == LOAD_BALANCER_DIMENSION
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    stats = cloudwatch.get_metric_statistics(
        Namespace="AWS/ApplicationELB",
        MetricName="RequestCount",
        Dimensions=[{"Name": k, "Value": v} for k, v in sorted(dimensions.items())],
        StartTime=datetime.now(UTC) - timedelta(minutes=5),
        EndTime=datetime.now(UTC) + timedelta(minutes=1),
        Period=60,
        Statistics=["Sum"],
    )["Datapoints"]
    assert sum(point["Sum"] for point in stats) == 7


def test_a_client_that_leaves_mid_stream_frees_its_replica(balancer: LocalBalancer, backends: list[Backend]) -> None:
    endpoint = served(balancer, backends[:1])
    stream = backends[0]
    host, port = endpoint.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/stream")
    stream.gates[0].set()
    answer = connection.getresponse()
    assert answer.readline() == b"token 0\n"
    connection.close()  # the client goes away with two tokens to come
    stream.gates[1].set()
    stream.gates[2].set()
    balancer.deregister(endpoint, [stream.target(0)])
    deadline = time.monotonic() + 5
    while balancer.drain_states(endpoint, [stream.target(0)])["local-a"] is not DrainState.DRAINED:
        assert time.monotonic() < deadline, "the abandoned request still counts as in flight"
        time.sleep(0.05)
    balancer.register(endpoint, [stream.target(0)])
    assert request(endpoint.url)[0] == 200


@pytest.mark.parametrize("host", ["rebound.attacker.example:{port}", "127.0.0.1:1", "", "127.0.0.1"])
def test_a_request_addressed_to_another_name_never_reaches_a_replica(
    balancer: LocalBalancer, backends: list[Backend], host: str
) -> None:
    """DNS rebinding: a page points a name of its own at 127.0.0.1, and the browser sends the request
    (and lets the page read the answer) with that name in Host. Only this endpoint's own address
    passes."""
    endpoint = served(balancer, backends)
    status, _headers, body = request(endpoint.url, headers={"Host": host.format(port=endpoint.route)})
    assert status == 403
    assert json.loads(body)["error"]["code"] == "forbidden" and "Host header must be" in body.decode()
    assert all(not b.seen for b in backends)
    assert request(endpoint.url)[0] == 200  # http.client sends 127.0.0.1:<port>
