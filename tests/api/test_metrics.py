"""GET /v1/services/NAME/metrics: the endpoint's request rate over time (its CloudWatch RequestCount,
as the autoscaler reads it) against what the replicas are sized for, for the dashboard's plot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fleetkeeper import aws
from fleetkeeper.model import AutoscalerState, Recommendation, to_iso
from fleetkeeper.store.runs import ReconcilerStore
from fleetkeeper.store.table import Table
from tests.support import TABLE
from tests.support.builders import ENDPOINT
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec


def policy_spec() -> dict[str, Any]:
    policy = {"min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": 2}
    return hello_spec(service={"readiness_probe": "/health", "ports": 8080, "replica_policy": policy})


def publish(count: float, at: datetime) -> None:
    """One RequestCount datapoint of ENDPOINT's target group, as the ALB (or the local balancer) sends it."""
    aws.cloudwatch().put_metric_data(
        Namespace="AWS/ApplicationELB",
        MetricData=[
            {
                "MetricName": "RequestCount",
                "Dimensions": [{"Name": k, "Value": v} for k, v in ENDPOINT.dimensions],
                "Timestamp": at,
                "Value": count,
                "Unit": "Count",
            }
        ],
    )


def with_endpoint(name: str) -> None:
    store = ReconcilerStore(Table(TABLE))
    state = store.load(name)
    assert state is not None
    store.record_endpoint(state.service, ENDPOINT)


def test_the_rate_per_bucket_oldest_first_with_the_autoscalers_target(api: HandlerClient) -> None:
    assert api.call("POST", "/v1/services", {"name": "web", "spec": policy_spec()}).status == 201
    with_endpoint("web")
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    # 120 requests five minutes ago, 30 + 30 two minutes ago (one bucket: summed), none in between.
    publish(120, minute - timedelta(minutes=5) + timedelta(seconds=10))
    publish(30, minute - timedelta(minutes=2) + timedelta(seconds=5))
    publish(30, minute - timedelta(minutes=2) + timedelta(seconds=40))
    publish(600, minute - timedelta(minutes=50))  # outside the 10 minutes asked for
    store = ReconcilerStore(Table(TABLE))
    state = store.load("web")
    assert state is not None
    seen = to_iso(minute - timedelta(minutes=2))
    store.record_autoscaler(state.service, None, AutoscalerState(target=2, history=(Recommendation(seen, 2, 1.0),)))

    shown = api.call("GET", "/v1/services/web/metrics?minutes=10")
    assert shown.status == 200, shown.body
    assert shown.body == {
        "name": "web",
        "period_seconds": 60,
        "request_rate": [
            {"at": to_iso(minute - timedelta(minutes=5)), "rate": 2.0},
            {"at": to_iso(minute - timedelta(minutes=2)), "rate": 1.0},
        ],
        "target_replicas": 2,
        "target_qps_per_replica": 2.0,
        "recommendations": [{"at": seen, "replicas": 2, "rate": 1.0}],
    }


def test_a_service_without_an_endpoint_has_no_points_and_its_fixed_count(api: HandlerClient) -> None:
    assert api.call("POST", "/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    shown = api.call("GET", "/v1/services/web/metrics").body
    assert shown["request_rate"] == [] and shown["recommendations"] == []
    assert shown["target_replicas"] == 2 and shown["target_qps_per_replica"] is None


def test_only_a_reader_of_the_service_sees_its_metrics(api: HandlerClient) -> None:
    assert api.call("POST", "/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    stranger = api.as_("arn:aws:sts::123456789012:assumed-role/someone-else/session")
    assert stranger.call("GET", "/v1/services/web/metrics").status == 404
    assert api.call("GET", "/v1/services/nope/metrics").status == 404


def test_the_stretch_asked_for_is_bounded(api: HandlerClient) -> None:
    assert api.call("POST", "/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    for minutes in ("0", "1441", "ten"):
        answer = api.call("GET", f"/v1/services/web/metrics?minutes={minutes}")
        assert answer.status == 400, answer.body
        assert "minutes" in answer.body["error"]["message"]
