"""The wake target's bounds: its reserved concurrency (template.yaml) and, per process, how many
requests one client gets through to the demand recorder (fleetkeeper.wake.sources).

Before them, a flood of anonymous requests to services at zero took the account's Lambda
concurrency from the api and the reconciler, and one client cycling through service names had each
request recorded and kicked.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.wake import handler as wake_handler
from fleetkeeper.wake.sources import SOURCE_REQUESTS, SourceBound, source_of
from tests.support.cfn import Resolver, translate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_source_gets_its_limit_per_window_and_others_are_not_affected() -> None:
    clock = Clock()
    bound = SourceBound(limit=3, window=10.0, monotonic=clock)
    assert [bound.admit("198.51.100.7") for _ in range(4)] == [True, True, True, False]
    assert bound.retry_after("198.51.100.7") == 11
    assert bound.admit("203.0.113.9")  # another client
    clock.now += 5
    assert not bound.admit("198.51.100.7")  # a refused request does not count, the window slides
    clock.now += 5
    assert bound.admit("198.51.100.7")


def test_the_bound_forgets_the_least_recently_seen_sources_past_its_size() -> None:
    bound = SourceBound(limit=1, window=60.0, max_sources=2, monotonic=Clock())
    assert bound.admit("a") and bound.admit("b") and bound.admit("c")
    assert bound.admit("a")  # forgotten (the oldest): counts afresh
    assert not bound.admit("c")


@pytest.mark.parametrize(
    ("forwarded", "source"),
    [
        ("198.51.100.7", "198.51.100.7"),
        # A client's own X-Forwarded-For comes first; the load balancer appends the address it saw.
        ("10.9.9.9, 1.2.3.4, 198.51.100.7", "198.51.100.7"),
        ("", "unknown"),
    ],
)
def test_the_source_is_the_address_the_load_balancer_appended(forwarded: str, source: str) -> None:
    assert source_of({"x-forwarded-for": forwarded} if forwarded else {}) == source


def _event(source: str) -> dict[str, Any]:
    return {"headers": {"host": "web.svc.example.com", "x-forwarded-for": f"6.6.6.6, {source}"}}


def test_a_client_over_its_bound_gets_429_and_costs_no_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETKEEPER_DOMAIN_NAME", "svc.example.com")
    wake_handler.reset()
    recorded: list[str] = []
    monkeypatch.setattr(wake_handler, "recorder", lambda: recorded.append)
    answers = [wake_handler.lambda_handler(_event("198.51.100.7"), None) for _ in range(SOURCE_REQUESTS + 5)]
    assert [a["statusCode"] for a in answers] == [503] * SOURCE_REQUESTS + [429] * 5
    assert len(recorded) == SOURCE_REQUESTS
    refused = answers[-1]
    assert int(refused["headers"]["Retry-After"]) >= 1 and "too_many_requests" in refused["body"]
    # Another client is still answered (and its demand recorded).
    assert wake_handler.lambda_handler(_event("203.0.113.9"), None)["statusCode"] == 503
    assert len(recorded) == SOURCE_REQUESTS + 1
    wake_handler.reset()


def test_the_wake_function_has_reserved_concurrency(translated: dict[str, Any]) -> None:
    function = translated["Resources"]["WakeFunction"]["Properties"]
    assert function["ReservedConcurrentExecutions"] == {
        "Fn::If": ["HasWakeReservation", {"Ref": "WakeConcurrency"}, {"Ref": "AWS::NoValue"}]
    }
    parameter = translated["Parameters"]["WakeConcurrency"]
    assert Resolver(translated).ref("WakeConcurrency") == parameter["Default"] == 5
    assert Resolver(translated).resolve(function["ReservedConcurrentExecutions"]) == 5
    # 0 reserves nothing (a reservation of 0 would stop the function): an account whose quota cannot
    # reserve any (a new account's 10) deploys with WakeConcurrency=0.
    assert parameter["MinValue"] == 0
    no_reservation = translate(overrides={"WakeConcurrency": 0})
    props = no_reservation["Resources"]["WakeFunction"]["Properties"]
    assert Resolver(no_reservation).resolve(props["ReservedConcurrentExecutions"]) is None
