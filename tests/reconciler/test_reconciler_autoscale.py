"""Autoscaling through the reconciler's shell, on moto's CloudWatch and elbv2 behind the strict-AWS
layer (which holds GetMetricData to AWS's documented limits: 500 metrics a call, valid ids, periods).

The request rates of every autoscaled service of a run come from ONE batch of GetMetricData calls
(ceil(n / 500)), never one call per service; a service with no data point for five windows has
zero requests, one whose newest data point is missing has no reading (it may be late); a
steady service costs no write; the autoscaler's state lives in the table, so a new reconciler
(a restart between every run) decides the same.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.model import ReplicaStatus
from fleetkeeper.reconciler.balancer import METRIC_NAME, METRIC_NAMESPACE
from fleetkeeper.reconciler.metrics import MAX_QUERIES_PER_CALL, RequestRates
from tests.support.reconciler_world import World, make_alb, raw_client

if TYPE_CHECKING:
    from fleetkeeper.model import ServiceState
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer

NOW = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)


def put_count(dimensions: tuple[tuple[str, str], ...], at: datetime, count: float) -> None:
    raw_client("cloudwatch").put_metric_data(
        Namespace=METRIC_NAMESPACE,
        MetricData=[
            {
                "MetricName": METRIC_NAME,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions],
                "Timestamp": at,
                "Value": count,
                "Unit": "Count",
            }
        ],
    )


def dims(number: int) -> tuple[tuple[str, str], ...]:
    return (("LoadBalancer", "app/fk/0123456789abcdef"), ("TargetGroup", f"targetgroup/fk-{number}/{number:016d}"))


def test_a_thousand_and_one_services_take_three_calls_and_a_quiet_metric_is_zero(
    aws: None, strict_aws: StrictAws
) -> None:
    rates = RequestRates(window_seconds=60, lag_seconds=60, quiet_windows=5)
    start, end = rates.window(NOW)
    assert (start, end) == (datetime(2026, 1, 1, 11, 58, tzinfo=UTC), datetime(2026, 1, 1, 11, 59, tzinfo=UTC))
    put_count(dims(7), start + timedelta(seconds=0), 474.0)  # 7.9 req/s over the minute
    put_count(dims(7), start - timedelta(minutes=2), 60.0)  # an older minute: not the rate
    put_count(dims(900), start, 60.0)
    put_count(dims(900), end, 6000.0)  # the next minute: outside the window
    put_count(dims(1000), start - timedelta(seconds=1), 6000.0)  # the minute before: no reading
    put_count(dims(999), start - timedelta(minutes=5), 6000.0)  # before the quiet windows: quiet
    keys = {f"svc-{n:04d}": dims(n) for n in range(1001)}
    read = rates.read(keys, NOW)
    assert strict_aws.attempts_of("cloudwatch", "GetMetricData") == 3 == RequestRates.calls_for(1001)
    assert strict_aws.cloudwatch.metrics_requested == [500, 500, 1]
    assert set(read) == set(keys)
    assert read["svc-0007"] == pytest.approx(7.9)
    assert read["svc-0900"] == pytest.approx(1.0)
    # Heard from a minute ago and not since: its newest data point may be late. No reading.
    assert read["svc-1000"] is None
    # Five minutes without a data point (the ALB's silence for a minute without requests): zero.
    assert read["svc-0999"] == 0.0
    assert {k for k, v in read.items() if v != 0.0} == {"svc-0007", "svc-0900", "svc-1000"}


def test_a_late_data_point_is_no_reading_and_holds_the_target(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy service's newest minute arrives late (CloudWatch has the minutes before it only): the
    autoscaler must not take the gap for zero requests and start its way down (or to zero)."""
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    rates = RequestRates(window_seconds=60, lag_seconds=0)
    world = World(server, balancer=make_alb(), rates=rates)
    world.create("busy", service=autoscaled_service(server.port))
    world.converge()
    load = Load(world, rates)
    load.per_second = {"busy": 5.0}
    for _ in range(3):
        load.run()
    assert target_of(world, "busy") == 3
    before = world.store.load("busy")
    assert before is not None and before.service.autoscaler is not None
    # Its data points stop arriving (late, not absent: the load goes on). Runs 61 s apart read
    # nothing new for the newest minute; each is "no reading": no recommendation is recorded (a 0
    # req/s one would start the downscale delay's count).
    load.per_second = {}
    for _ in range(4):  # fewer runs than the quiet windows (5)
        world.run()
        assert target_of(world, "busy") == 3
    after = world.store.load("busy")
    assert after is not None and after.service.autoscaler == before.service.autoscaler


@pytest.mark.parametrize(
    ("queries", "problem"),
    [
        (MAX_QUERIES_PER_CALL + 1, "must not have a size greater than 500"),
        ("M0", "must start with a lowercase letter"),
        ("dup", "is not unique"),
        (45, "must be 1, 5, 10, 20, 30, 60 or a multiple of 60"),
    ],
)
def test_the_strict_layer_holds_get_metric_data_to_its_documented_limits(
    aws: None, strict_aws: StrictAws, queries: Any, problem: str
) -> None:
    def query(query_id: str, period: int = 60) -> dict[str, Any]:
        metric = {"Namespace": METRIC_NAMESPACE, "MetricName": METRIC_NAME, "Dimensions": []}
        return {"Id": query_id, "MetricStat": {"Metric": metric, "Period": period, "Stat": "Sum"}}

    if isinstance(queries, int) and queries > 100:
        batch = [query(f"m{n}") for n in range(queries)]
    elif queries == "dup":
        batch = [query("m1"), query("m1")]
    elif isinstance(queries, int):
        batch = [query("m1", queries)]
    else:
        batch = [query(queries)]
    with pytest.raises(ClientError) as refused:
        raw_client("cloudwatch").get_metric_data(
            MetricDataQueries=batch, StartTime=NOW - timedelta(minutes=1), EndTime=NOW
        )
    assert refused.value.response["Error"]["Code"] == "ValidationError"
    assert problem in refused.value.response["Error"]["Message"]
    assert strict_aws.cloudwatch.metrics_requested == []


# --- the whole loop through the shell --------------------------------------------------------------


def autoscaled_service(port: int) -> dict[str, Any]:
    return {
        "readiness_probe": "/health",
        "ports": port,
        "replica_policy": {
            "min_replicas": 1,
            "max_replicas": 3,
            "target_qps_per_replica": 1,
            "upscale_delay_seconds": 120,
            "downscale_delay_seconds": 300,
        },
    }


class Load:
    """Publishes each service's RequestCount for the minute a run reads (as the ALB would, once)."""

    def __init__(self, world: World, rates: RequestRates) -> None:
        self.world = world
        self.rates = rates
        self.per_second: dict[str, float] = {}
        self.published: set[tuple[str, datetime]] = set()

    def run(self, name: str | None = None) -> None:
        start, _ = self.rates.window(self.world.clock())
        for service, rate in self.per_second.items():
            state = self.world.store.load(service)
            assert state is not None and state.service.endpoint is not None
            if rate > 0 and (service, start) not in self.published:
                self.published.add((service, start))
                put_count(state.service.endpoint.dimensions, start, rate * self.rates.window_seconds)
        self.world.run(name)


def serving(world: World, name: str) -> list[int]:
    state = world.store.load(name)
    assert state is not None
    return sorted(r.replica_id for r in state.replicas.values() if r.status is ReplicaStatus.READY)


def target_of(world: World, name: str) -> int | None:
    state: ServiceState | None = world.store.load(name)
    assert state is not None
    return state.service.autoscaler.target if state.service.autoscaler is not None else None


def test_load_scales_a_service_to_its_max_and_back_with_one_metric_call_per_run(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    rates = RequestRates(window_seconds=60, lag_seconds=0)
    world = World(server, balancer=make_alb(), rates=rates)
    for name in ("busy", "idle"):
        world.create(name, service=autoscaled_service(server.port))
    world.converge()
    assert serving(world, "busy") == serving(world, "idle") == [0]
    assert target_of(world, "busy") == target_of(world, "idle") == 1

    load = Load(world, rates)
    load.per_second = {"busy": 5.0}
    calls = strict_aws.attempts_of("cloudwatch", "GetMetricData")
    # Not before the upscale delay (120 s) of recommendations agrees: two runs, 61 s apart, hold.
    for _ in range(2):
        load.run()
        assert target_of(world, "busy") == 1
    load.run()
    assert target_of(world, "busy") == 3  # clip(ceil(5 / 1), 1, 3)
    for _ in range(6):
        load.run()
    assert serving(world, "busy") == [0, 1, 2]
    assert serving(world, "idle") == [0]
    runs = 9
    # Every run read both services' rates in one call.
    assert strict_aws.attempts_of("cloudwatch", "GetMetricData") - calls == runs
    assert strict_aws.cloudwatch.metrics_requested[-runs:] == [2] * runs

    # Steady under load: no write at all, one metric call per run.
    mark = world.log.mark()
    load.run()
    load.run("busy")  # a kick: that one service's rate only
    assert world.log.mutations(mark) == []
    assert [op for service, op in world.log.since(mark) if service == "cloudwatch"] == ["GetMetricData"] * 2
    assert strict_aws.cloudwatch.metrics_requested[-2:] == [2, 1]

    # The load stops: no reading while its last data points are recent (the newest may be late),
    # zero requests once `quiet_windows` windows passed without one, and back to min after the
    # downscale delay (300 s) of zero readings; a new reconciler every run (nothing in memory
    # carries over: the state is in the table).
    load.per_second = {}
    targets = []
    for _ in range(rates.quiet_windows + 8):
        world.restart()
        load.run()
        targets.append(target_of(world, "busy"))
    assert targets[: rates.quiet_windows + 3] == [3] * (rates.quiet_windows + 3)
    assert targets[-1] == 1
    world.converge()
    assert len(serving(world, "busy")) == 1
    assert target_of(world, "idle") == 1
    # Each move of the target is a Scaled event, written with the decision (newest first).
    records, _ = world.commands.events_page("busy", limit=100, next_token=None)
    assert [r.event.message for r in records if r.event.reason == "Scaled"] == [
        "target replicas 3 -> 1: 0 req/s recommends 1",
        "target replicas 1 -> 3: 5 req/s recommends 3",
    ]
    records, _ = world.commands.events_page("idle", limit=100, next_token=None)
    assert not [r for r in records if r.event.reason == "Scaled"]


def test_a_failed_metric_read_holds_every_target(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    rates = RequestRates(window_seconds=60, lag_seconds=0)
    world = World(server, balancer=make_alb(), rates=rates)
    world.create("busy", service=autoscaled_service(server.port))
    world.converge()
    before = world.store.load("busy")
    strict_aws.throttle("cloudwatch", "GetMetricData", times=10, code="ThrottlingException")
    mark = world.log.mark()
    report = world.run()
    assert "request rates" in report.errors
    assert world.log.mutations(mark) == []
    after = world.store.load("busy")
    assert before is not None and after is not None
    assert after.service.autoscaler == before.service.autoscaler


# --- crashes and races around the decision --------------------------------------------------------------


def loaded_world(server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> tuple[World, Load]:
    """A service converged at 1 under 5 req/s for two runs: the next run raises its target to 3."""
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    rates = RequestRates(window_seconds=60, lag_seconds=0)
    world = World(server, balancer=make_alb(), rates=rates)
    world.create("busy", service=autoscaled_service(server.port))
    world.converge()
    load = Load(world, rates)
    load.per_second = {"busy": 5.0}
    load.run()
    load.run()
    assert target_of(world, "busy") == 1
    return world, load


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_at_the_decisions_write_changes_no_decision(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The run that raises the target dies just before its autoscaler write, or just after it (the
    answer lost): a new reconciler's next run decides the same target, and the service converges to
    exactly 3 replicas, none launched twice."""
    from tests.support.reconciler_world import Crash

    world, load = loaded_world(server, monkeypatch)
    store = world.reconciler.store
    original = store.record_autoscaler

    def crashing(*args: Any, **kwargs: Any) -> Any:
        if when == "after":
            original(*args, **kwargs)
        raise Crash(f"crash {when} the autoscaler's write")

    monkeypatch.setattr(store, "record_autoscaler", crashing)
    with pytest.raises(Crash):
        load.run()
    assert target_of(world, "busy") == (3 if when == "after" else 1)
    world.restart()
    load.run()
    assert target_of(world, "busy") == 3
    for _ in range(5):
        load.run()
    assert serving(world, "busy") == [0, 1, 2]
    launched = [i["Tags"] for i in world.instances()]
    assert len(launched) == 3


def test_of_two_reconcilers_deciding_at_once_only_the_first_write_lands(
    aws: None, strict_aws: StrictAws, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper.store.errors import Superseded

    world, _ = loaded_world(server, monkeypatch)
    state = world.store.load("busy")
    assert state is not None and state.service.autoscaler is not None
    before = state.service.autoscaler
    store = world.reconciler.store
    written = store.record_autoscaler(state.service, before, replace(before, target=3))
    assert written is not None and written.rev == before.rev + 1
    with pytest.raises(Superseded):
        store.record_autoscaler(state.service, before, replace(before, target=2))
    with pytest.raises(Superseded):
        store.record_autoscaler(state.service, None, replace(before, target=2))
    assert target_of(world, "busy") == 3
