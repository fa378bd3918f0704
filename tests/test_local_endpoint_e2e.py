"""End to end: a service's endpoint in `fleetkeeper local` (a subprocess), driven through the CLI,
its endpoint and plain HTTP.

up --wait (its last line names the endpoint) -> requests through the endpoint reach every READY
replica -> a rolling update, then a blue-green one, while a client polls the endpoint: zero failed
requests, and a streaming answer started before each update arrives whole although its replica is
drained and terminated under it -> the RequestCount metric in the in-memory AWS -> down --wait: the
endpoint's port is closed, nothing of the service is left.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import boto3
import pytest
import yaml

from tests.local_process import LocalPlane, eventually, http_get, start_local

if TYPE_CHECKING:
    from collections.abc import Iterator

NAME = "stream-e2e"
WAIT = "60"
CHUNKS = 40  # one every 0.2 s: a stream of 8 s, longer than an update takes to drain its replica

APP = """exec python3 -u - <<'PY'
import http.server, os, time

PORT = int(os.environ["PORT"])
GREETING = os.environ["GREETING"]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            for n in range(int(os.environ["CHUNKS"])):
                self.wfile.write(f"{GREETING} {PORT} chunk {n}\\n".encode())
                self.wfile.flush()
                time.sleep(0.2)
            return
        text = "ok" if self.path == "/health" else f"{GREETING} {PORT} {self.path}"
        body = (text + "\\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), PORT), Handler).serve_forever()
PY
"""

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    workdir = tmp_path_factory.mktemp("endpoint")
    # Metrics every second, so the test reads them without waiting a minute.
    plane = start_local(workdir, tick=1.0, extra=["--metrics-interval", "1"])
    yield plane
    assert plane.stop() == 0, plane.output()


def spec_file(plane: LocalPlane, greeting: str, mode: str) -> str:
    spec = {
        "service": {
            "readiness_probe": {"path": "/health", "initial_delay_seconds": 20, "timeout_seconds": 1},
            "replicas": 2,
            "load_balancing_policy": "round_robin",
        },
        "envs": {"GREETING": greeting, "CHUNKS": str(CHUNKS)},
        "update": {"mode": mode, "max_surge": 1, "max_unavailable": 0},
        "run": APP,
    }
    path = plane.workdir / f"{greeting}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def ok(result: Any) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return str(result.stdout)


def view(plane: LocalPlane) -> dict[str, Any]:
    status, body = http_get(f"{plane.url}/v1/services/{NAME}")
    assert status == 200, body
    shown: dict[str, Any] = json.loads(body)
    return shown


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


class Poller(threading.Thread):
    """GET through the endpoint every 20 ms; every failure (status or error) is kept."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.answered_by: set[str] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                status, body = http_get(self.endpoint + "/poll?x=1", timeout=5)
            except OSError as exc:
                self.failures.append(repr(exc))
            else:
                if status == 200 and body.decode().endswith("/poll?x=1\n"):
                    self.ok += 1
                    self.answered_by.add(body.decode().split()[0])
                else:
                    self.failures.append(f"{status}: {body[:200]!r}")
            time.sleep(0.02)


class Stream(threading.Thread):
    """One streaming GET through the endpoint, read to its end."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        host, port = endpoint.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=30)
        self.connection.request("GET", "/stream")
        self.answer = self.connection.getresponse()
        self.first = self.answer.readline().decode()
        self.rest = b""
        self.error: BaseException | None = None

    @property
    def replica_port(self) -> int:
        return int(self.first.split()[1])

    def run(self) -> None:
        try:
            self.rest = self.answer.read()
        except BaseException as exc:
            self.error = exc
        finally:
            self.connection.close()

    def lines(self) -> list[str]:
        return [self.first.rstrip("\n"), *self.rest.decode().splitlines()]


def drained_under_stream(plane: LocalPlane, stream: Stream) -> bool:
    """True once the API shows the stream's replica DRAINING (or gone) while the stream still runs."""
    replicas = view(plane)["replicas"]
    mine = [r for r in replicas if r.get("url") and port_of(r["url"]) == stream.replica_port]
    return stream.is_alive() and (not mine or mine[0]["endpoint_state"] == "DRAINING")


def update_under_load(plane: LocalPlane, endpoint: str, greeting: str, mode: str) -> tuple[Poller, Stream]:
    poller = Poller(endpoint)
    poller.start()
    stream = Stream(endpoint)
    stream.start()
    try:
        ok(plane.cli("update", NAME, spec_file(plane, greeting, mode), "--wait", "--timeout", WAIT))
        eventually(lambda: drained_under_stream(plane, stream) or not stream.is_alive(), 20, 0.1, "a drain")
        assert drained_under_stream(plane, stream) or stream.lines()[-1].endswith(f"chunk {CHUNKS - 1}")
        stream.join(30)
        time.sleep(0.5)
    finally:
        poller.stop.set()
        poller.join(10)
    return poller, stream


def test_the_endpoint_balances_drains_and_closes(plane: LocalPlane) -> None:
    out = ok(plane.cli("up", spec_file(plane, "v1", "rolling"), "--name", NAME, "--wait", "--timeout", WAIT))
    shown = view(plane)
    endpoint = shown["endpoint"]
    assert endpoint.startswith("http://127.0.0.1:")
    assert out.splitlines()[-1].startswith(f"{NAME} is READY at {endpoint} at v1")
    assert f"endpoint: {endpoint}" in ok(plane.cli("status", NAME))
    assert plane.info()["endpoints"] == {NAME: endpoint}
    assert f"service {NAME}: endpoint {endpoint} (round_robin)" in plane.output()  # printed as it opens

    # Spread over every READY replica (round robin), path and query unchanged.
    ready = {port_of(r["url"]) for r in shown["replicas"] if r["status"] == "READY"}
    assert len(ready) == 2
    answers = [http_get(f"{endpoint}/a/b?c=d%20e")[1].decode().split() for _ in range(10)]
    assert {a[0] for a in answers} == {"v1"} and {a[2] for a in answers} == {"/a/b?c=d%20e"}
    assert {int(a[1]) for a in answers} == ready

    # A rolling update, then a blue-green one, under load: not one failed request, and the stream
    # started before each arrives whole from its drained replica.
    for greeting, mode in (("v2", "rolling"), ("v3", "blue_green")):
        poller, stream = update_under_load(plane, endpoint, greeting, mode)
        assert poller.failures == [], poller.failures[:5]
        assert poller.ok > 20 and greeting in poller.answered_by
        assert stream.error is None
        lines = stream.lines()
        assert len(lines) == CHUNKS and lines[-1].endswith(f"chunk {CHUNKS - 1}")
        assert len({line.rsplit(" chunk", 1)[0] for line in lines}) == 1  # one replica, start to end
        assert all(r["version"] == int(greeting[1]) for r in view(plane)["replicas"])

    # The requests were counted as the ALB counts them, in the in-memory AWS.
    info = plane.info()
    cloudwatch = boto3.client(
        "cloudwatch",
        endpoint_url=info["aws_endpoint"],
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )

    def counted() -> float:
        metrics = cloudwatch.list_metrics(Namespace="AWS/ApplicationELB", MetricName="RequestCount")["Metrics"]
        dims = [m["Dimensions"] for m in metrics]
        assert dims, "no RequestCount metric yet"
        stats = cloudwatch.get_metric_statistics(
            Namespace="AWS/ApplicationELB",
            MetricName="RequestCount",
            Dimensions=dims[0],
            StartTime=datetime.now(UTC) - timedelta(minutes=10),
            EndTime=datetime.now(UTC) + timedelta(minutes=1),
            Period=60,
            Statistics=["Sum"],
        )["Datapoints"]
        return float(sum(point["Sum"] for point in stats))

    assert eventually(lambda: counted() >= 50, 10, 0.5, "RequestCount datapoints")

    ok(plane.cli("down", NAME, "--wait", "--timeout", WAIT))
    with pytest.raises(ConnectionRefusedError):
        http.client.HTTPConnection("127.0.0.1", port_of(endpoint), timeout=2).request("GET", "/")
    assert plane.info()["endpoints"] == {}
