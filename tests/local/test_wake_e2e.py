"""End to end: wake from zero in `fleetkeeper local` (a subprocess, with its defaults: a run every 2 s,
RequestCount every 60 s), through its API, the service's endpoint and plain HTTP on 127.0.0.1.

A service with `min_replicas: 0` sits at zero replicas, its endpoint routed to the wake target. A
client asks; the balancer counts nothing (no target served it, as the ALB's RequestCount) but records
the demand and kicks the reconciler, and answers 503 with Retry-After. The client retries as told and
gets a 200 from a replica within 30 s of its first request. Left alone, the service goes back to zero
after its downscale-to-zero delay (10 s here), its endpoint back on the wake target: and the next
request wakes it again.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.support.local_process import LocalPlane, eventually, http_get, ok, start_local

if TYPE_CHECKING:
    from collections.abc import Iterator

NAME = "wake-e2e"
TO_ZERO_DELAY = 10
# `fleetkeeper local`'s default tick (fleetkeeper.local.options.DEFAULT_TICK).
DEFAULT_TICK = 2.0

APP = """exec python3 -u - <<'PY'
import http.server, os

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"awake\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), int(os.environ["PORT"])), Handler).serve_forever()
PY
"""

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    workdir = tmp_path_factory.mktemp("wake")
    plane = start_local(workdir, tick=DEFAULT_TICK)  # and every other option at its default
    yield plane
    assert plane.stop() == 0, plane.output()


def replicas(plane: LocalPlane) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = plane.service(NAME).get("replicas") or []
    return found


def target(plane: LocalPlane) -> int | None:
    autoscaling = plane.service(NAME).get("autoscaling") or {}
    value = autoscaling.get("target_replicas")
    return int(value) if value is not None else None


def request_count(plane: LocalPlane) -> float:
    """Every RequestCount datapoint the local balancer published so far, summed."""
    cloudwatch = plane.aws_client("cloudwatch")
    metrics = cloudwatch.list_metrics(Namespace="AWS/ApplicationELB", MetricName="RequestCount")["Metrics"]
    total = 0.0
    for metric in metrics:
        stats = cloudwatch.get_metric_statistics(
            Namespace="AWS/ApplicationELB",
            MetricName="RequestCount",
            Dimensions=metric["Dimensions"],
            StartTime=time.time() - 3600,
            EndTime=time.time() + 60,
            Period=60,
            Statistics=["Sum"],
        )
        total += sum(point["Sum"] for point in stats["Datapoints"])
    return total


def retry_until_served(endpoint: str, limit: float) -> tuple[float, list[int], float]:
    """GET the endpoint as a client honouring Retry-After would: (seconds from the first request to
    the 200, the statuses seen, the Retry-After it was told)."""
    first = time.monotonic()
    statuses: list[int] = []
    told = 0.0
    while time.monotonic() - first < limit:
        status, body, headers = get(endpoint + "/hello")
        statuses.append(status)
        if status == 200:
            assert body == b"awake\n"
            return time.monotonic() - first, statuses, told
        assert status == 503, (status, body)
        answer = json.loads(body)
        assert answer["error"]["code"] == "waking", answer
        told = float(headers["Retry-After"])
        time.sleep(told)
    raise AssertionError(f"no 200 within {limit}s: {statuses}")


def get(url: str) -> tuple[int, bytes, dict[str, str]]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read(), dict(answer.headers.items())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers.items())


def test_a_service_at_zero_wakes_on_a_request_and_returns_to_zero(plane: LocalPlane) -> None:
    spec = {
        "service": {
            "readiness_probe": {"path": "/", "initial_delay_seconds": 20, "timeout_seconds": 1},
            "replica_policy": {
                "min_replicas": 0,
                "max_replicas": 2,
                "target_qps_per_replica": 10,
                "upscale_delay_seconds": 10,
                "downscale_delay_seconds": TO_ZERO_DELAY,
                "downscale_to_zero_delay_seconds": TO_ZERO_DELAY,
            },
        },
        "run": APP,
    }
    path = plane.workdir / "wake.yaml"
    path.write_text(yaml.safe_dump(spec))
    ok(plane.cli("up", str(path), "--name", NAME))
    endpoint = eventually(lambda: plane.service(NAME).get("endpoint"), 30, 0.2, "an endpoint")
    # At zero: nothing runs. Nothing asks, so nothing moves (and the first reading keeps it at zero).
    time.sleep(3 * DEFAULT_TICK)
    assert replicas(plane) == [] and target(plane) in (None, 0)

    took, statuses, told = retry_until_served(endpoint, 30)
    assert statuses[0] == 503 and told > 0
    assert took < 30, statuses
    assert target(plane) == 1
    # The answered requests are the only ones the balancer counted (the 503s had no target).
    assert request_count(plane) <= 1  # published at the next interval: 0 now, or the one 200
    print(f"\nwake e2e: first request -> 200 in {took:.1f}s ({len(statuses)} requests, Retry-After {told:g}s)")

    # Left alone: back to zero, the replica drained and terminated; no sooner than the delay after the
    # first request was served (the demand stops counting once a replica serves: the metric takes over).
    served = time.monotonic()
    eventually(lambda: target(plane) == 0, 240, 0.5, "the target back at zero")
    # (the route switched back at most one Retry-After before the client's 200)
    assert time.monotonic() - served >= TO_ZERO_DELAY - told
    eventually(lambda: replicas(plane) == [], 60, 0.5, "no replica left")
    status, body = http_get(endpoint + "/hello", timeout=5)
    assert status == 503 and json.loads(body)["error"]["code"] == "waking"  # and that asks again
    eventually(lambda: target(plane) == 1, 30, 0.5, "woken again")
    ok(plane.cli("down", NAME, "--wait", "--timeout", "60"))
