"""The local load balancer as the wake target (fleetkeeper/wake/demand.py), in-process against real HTTP on
127.0.0.1: while routed to it, a request with no replica records the demand (`on_demand`) and gets
503 with Retry-After, and is not counted (no target served it, as the ALB's RequestCount); routed
back, requests reach the replicas and are counted; a service not routed to it keeps the plain 503
and records nothing."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from fleetkeeper.local.balancer import LocalBalancer
from fleetkeeper.wake import demand as wake
from tests.local.test_balancer import CONFIG, Backend, request

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def demands() -> list[str]:
    return []


@pytest.fixture
def balancer(demands: list[str]) -> Iterator[LocalBalancer]:
    made = LocalBalancer(idle_timeout=5, metrics_interval=3600, on_demand=demands.append)
    yield made
    made.close()


def counted(balancer: LocalBalancer) -> int:
    return sum(endpoint.requests for endpoint in balancer._endpoints.values())


def test_a_waking_endpoint_records_demand_and_answers_503_with_retry_after(
    balancer: LocalBalancer, demands: list[str]
) -> None:
    endpoint = balancer.ensure("svc", "0123456789abcdef", CONFIG, None)
    balancer.route(endpoint, waking=True)
    status, headers, body = request(endpoint.url, path="/generate")
    assert status == 503
    assert headers["Retry-After"] == str(wake.RETRY_AFTER_SECONDS)
    assert headers["Cache-Control"] == "no-store"
    assert json.loads(body)["error"] == {"code": "waking", "message": wake.wake_message("svc"), "details": []}
    assert demands == ["svc"]
    assert counted(balancer) == 0


def test_routed_back_the_requests_reach_the_replicas_and_are_counted(
    balancer: LocalBalancer, demands: list[str]
) -> None:
    backend = Backend("a")
    try:
        endpoint = balancer.ensure("svc", "0123456789abcdef", CONFIG, None)
        balancer.route(endpoint, waking=True)
        balancer.register(endpoint, [backend.target(0)])
        # A registered replica serves even before the route moves back (nothing is lost meanwhile).
        assert request(endpoint.url)[0] == 200
        balancer.route(endpoint, waking=False)
        assert request(endpoint.url)[0] == 200
        assert demands == [] and counted(balancer) == 2
    finally:
        backend.close()


def test_an_endpoint_not_routed_to_the_wake_target_keeps_the_plain_503(
    balancer: LocalBalancer, demands: list[str]
) -> None:
    endpoint = balancer.ensure("svc", "0123456789abcdef", CONFIG, None)
    status, headers, body = request(endpoint.url)
    assert status == 503 and "Retry-After" not in headers
    assert json.loads(body)["error"]["code"] == "no_ready_replica"
    assert demands == []


def test_a_failing_demand_record_still_answers_503(demands: list[str]) -> None:
    def broken(service: str) -> None:
        raise RuntimeError("table unreachable")

    made = LocalBalancer(idle_timeout=5, metrics_interval=3600, on_demand=broken)
    try:
        endpoint = made.ensure("svc", "0123456789abcdef", CONFIG, None)
        made.route(endpoint, waking=True)
        assert request(endpoint.url)[0] == 503
    finally:
        made.close()


def test_the_local_balancer_serves_a_registered_replica_at_once(balancer: LocalBalancer) -> None:
    backend = Backend("a")
    try:
        endpoint = balancer.ensure("svc", "0123456789abcdef", CONFIG, None)
        assert balancer.serves(endpoint, [backend.target(0)]) is False
        balancer.register(endpoint, [backend.target(0)])
        assert balancer.serves(endpoint, [backend.target(0)]) is True
    finally:
        backend.close()
