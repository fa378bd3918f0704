"""The autoscaler's cost: GetMetricData calls and metrics a reconcile run requests, their monthly
price, and the CPU of one decision.

For each service count, `RequestRates.read` (what every run calls) reads that many autoscaled
services' RequestCount from moto's CloudWatch, with a botocore hook counting the calls and the
metrics each requested; the monthly figures assume the scheduled run every minute (30 days) and
CloudWatch's published price for GetMetricData, $0.01 per 1,000 metrics requested (the free
tier's API requests do not cover GetMetricData). Then `decide` over a day of one-minute decisions
of a noisy rate, per decision.

    .venv/bin/python bench/autoscale.py [--services 100 10000]

Nothing leaves the process (moto in memory).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functions"))

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_REGION", "us-east-1")

from fleetkeeper import aws
from fleetkeeper.reconciler.autoscale import ScalingPolicy, decide
from fleetkeeper.reconciler.metrics import RequestRates

PRICE_PER_1000_METRICS = 0.01  # USD, GetMetricData, "per 1,000 metrics requested"
RUNS_PER_MONTH = 60 * 24 * 30  # the scheduled run, rate(1 minute)


def calls_for(services: int) -> tuple[int, list[int]]:
    from moto import mock_aws

    with mock_aws():
        aws.reset_clients()
        client = aws.cloudwatch()
        requested: list[int] = []

        def count(params: dict[str, Any], **_: Any) -> None:
            requested.append(len(params.get("MetricDataQueries", [])))

        client.meta.events.register("provide-client-params.cloudwatch.GetMetricData", count)
        balancer = ("LoadBalancer", "app/fk/0123456789abcdef")
        dimensions = {
            f"svc-{n:05d}": (balancer, ("TargetGroup", f"targetgroup/fk-{n}/{n:016x}")) for n in range(services)
        }
        rates = RequestRates()
        read = rates.read(dimensions, datetime.now(UTC))
        assert len(read) == services and not any(read.values())
        return len(requested), requested


def decision_cpu(decisions: int = 1440) -> float:
    """Microseconds per `decide` over a day of minutes of a noisy, stepping rate."""
    policy = ScalingPolicy(min_replicas=1, max_replicas=10, target_qps_per_replica=2.0)
    rng = random.Random(7)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    state = None
    began = time.perf_counter()
    for minute in range(decisions):
        base = 4.0 if (minute // 120) % 2 == 0 else 12.0
        state = decide(policy, state, base * rng.uniform(0.9, 1.1), start + timedelta(minutes=minute))
    return (time.perf_counter() - began) / decisions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, nargs="+", default=[100, 10_000])
    args = parser.parse_args()
    print("autoscaled  GetMetricData  metrics   metrics a month  USD a month")
    print("services    calls a run    a run     (1 run a minute) (GetMetricData)")
    for services in args.services:
        calls, requested = calls_for(services)
        assert calls == RequestRates.calls_for(services), (calls, requested)
        assert max(requested) <= 500
        per_month = sum(requested) * RUNS_PER_MONTH
        cost = per_month / 1000 * PRICE_PER_1000_METRICS
        print(f"{services:>10}  {calls:>13}  {sum(requested):>7}  {per_month:>16,}  {cost:>11,.2f}")
    print(f"\ndecide(): {decision_cpu():.1f} us per decision (a day of one-minute decisions of a noisy rate)")


if __name__ == "__main__":
    main()
