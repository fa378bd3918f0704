"""The api's side of autoscaling: a policy that cannot work is a 400 that says where and what, and
GET /v1/services/NAME (and `fleetkeeper status NAME`) shows the current rate, the autoscaled target
and the pending decision with its reason and time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cli.render import service_detail
from fleetkeeper.cli.waiting import desired_replicas
from fleetkeeper.model import AutoscalerState, Recommendation, from_iso, to_iso, utcnow
from fleetkeeper.store.runs import ReconcilerStore
from fleetkeeper.store.table import Table
from tests.support import TABLE
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec


def policy_spec(**policy: Any) -> dict[str, Any]:
    return hello_spec(service={"readiness_probe": "/health", "ports": 8080, "replica_policy": policy})


@pytest.mark.parametrize(
    ("policy", "problem"),
    [
        (
            {"min_replicas": 3, "max_replicas": 2, "target_qps_per_replica": 1},
            "max_replicas (2) must be >= min_replicas (3)",
        ),
        (
            {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1, "upscale_delay_seconds": -1},
            "-1 is too small: at least 0",
        ),
        (
            {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1, "downscale_delay_seconds": -5},
            "-5 is too small: at least 0",
        ),
        ({"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 0}, "0 is too small: it must be above 0"),
        ({"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1e9}, "at most"),
        (
            {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1, "upscale_delay_seconds": 10**6},
            "upscale_delay_seconds (1000000) must be at most 86400",
        ),
        (
            {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1, "downscale_to_zero_delay_seconds": 60},
            "applies only with min_replicas 0",
        ),
        ({"min_replicas": 1, "max_replicas": 3}, "requires target_qps_per_replica"),
    ],
)
def test_a_policy_that_cannot_work_is_a_400_naming_where_and_what(
    api: HandlerClient, policy: dict[str, Any], problem: str
) -> None:
    response = api.call("POST", "/v1/services", {"name": "web", "spec": policy_spec(**policy)})
    assert response.status == 400, response.body
    details = response.body["error"]["details"]
    assert [d["field"] for d in details if problem in d["problem"]], details
    assert all(d["field"].startswith("spec.service.replica_policy") for d in details), details
    assert api.call("GET", "/v1/services/web").status == 404  # nothing written


def test_the_view_shows_the_rate_the_target_and_the_pending_decision(api: HandlerClient) -> None:
    spec = policy_spec(
        min_replicas=1, max_replicas=3, target_qps_per_replica=2, upscale_delay_seconds=300, downscale_delay_seconds=600
    )
    assert api.call("POST", "/v1/services", {"name": "web", "spec": spec}).status == 201
    view = api.call("GET", "/v1/services/web").body
    assert view["autoscaling"] == {
        "target_replicas": 1,
        "min_replicas": 1,
        "max_replicas": 3,
        "target_qps_per_replica": 2.0,
        "request_rate": None,
        "request_rate_at": None,
        "request_rate_window_seconds": 60,
        "recommended_replicas": None,
        "pending": None,
        "waking": False,
    }
    # No change pending: the line names none (issue 36).
    assert "  autoscaling: 1 replica(s) (1-3, 2 req/s each); no reading yet\n" in service_detail(view)

    # The reconciler saw 7.9 req/s four minutes ago (recommending ceil(7.9 / 2) = 4, clipped to 3).
    store = ReconcilerStore(Table(TABLE))
    state = store.load("web")
    assert state is not None
    seen = utcnow() - timedelta(seconds=240)
    history = (Recommendation(to_iso(seen - timedelta(hours=1)), 1, 0.5), Recommendation(to_iso(seen), 3, 7.9))
    store.record_autoscaler(state.service, None, AutoscalerState(target=1, history=history))
    view = api.call("GET", "/v1/services/web").body
    scaling = view["autoscaling"]
    assert scaling["target_replicas"] == 1 and scaling["recommended_replicas"] == 3
    assert scaling["request_rate"] == 7.9 and scaling["request_rate_at"] == to_iso(seen)
    pending = scaling["pending"]
    assert (pending["direction"], pending["replicas"]) == ("up", 3)
    assert from_iso(pending["at"]) == from_iso(to_iso(seen)) + timedelta(seconds=300)
    assert pending["reason"] == "7.9 req/s > 2 \N{MULTIPLICATION SIGN} 1"
    assert pending["message"] in (
        f"scaling up to 3 in {s}s: 7.9 req/s > 2 \N{MULTIPLICATION SIGN} 1" for s in range(50, 61)
    )
    line = service_detail(view).splitlines()[2]
    assert line.startswith(
        "  autoscaling: 1 replica(s) (1-3, 2 req/s each); 7.9 req/s (60s window, read 4m ago); scaling up to 3 in "
    )
    assert desired_replicas(view) == 1


def test_a_fixed_service_has_no_autoscaling(api: HandlerClient) -> None:
    assert api.call("POST", "/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    view = api.call("GET", "/v1/services/web").body
    assert view["autoscaling"] is None
    assert "autoscaling" not in service_detail(view)
