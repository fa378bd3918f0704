"""Load-balancer pools (docs/architecture/load-balancer-pools.md): what placing N services costs in
AWS calls, how many load balancers they take, what a steady stack costs per period, and the
hourly price per service and per idle stack.

On the strict-AWS layer over in-process moto (tests/strict_aws: ELB's quotas per ALB and per
Region), as the tests run it. Placements go through the ALB adapter directly, one new balancer
(a worker's run: what it learnt of the pools is forgotten) per RUN services, which is how a
worker's shard of services meets them. Calls are counted with a botocore hook on the adapter's own
clients. Nothing leaves the process.

    PYTHONPATH=functions:. .venv/bin/python bench/pools.py [--services 1000] [--run 50]
        [--alb-hour 0.0225]

The price is an input: --alb-hour is the ALB's hourly charge in us-east-1 as AWS's pricing page
gives it (https://aws.amazon.com/elasticloadbalancing/pricing/); LCUs (traffic) are left aside,
they are paid per request whatever the number of load balancers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

for key, value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}.items():
    os.environ.setdefault(key, value)

HOURS_PER_MONTH = 730


class Calls:
    """AWS calls made through fleetkeeper's clients, by (service, operation)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def hook(self, client: Any) -> None:
        client.meta.events.register("before-call.*.*", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.counts[(model.service_model.service_name, model.name)] += 1

    def total(self) -> int:
        return sum(self.counts.values())


def place(services: int, run: int, *, domain: str | None) -> dict[str, Any]:
    from moto import mock_aws

    from fleetkeeper import aws
    from fleetkeeper.model import EndpointConfig
    from tests.strict_aws import StrictAws
    from tests.support.moto_tuning import amis_file
    from tests.support.reconciler_world import make_pooled_alb

    os.environ["MOTO_AMIS_PATH"] = amis_file()
    aws.reset_clients()
    config = EndpointConfig(port=8080, policy="least_load", drain_seconds=30, health_path="/")
    with mock_aws(), StrictAws(seed=1).active():
        template = make_pooled_alb(domain=domain, zone=domain is not None)
        calls = Calls()
        calls.hook(aws.elbv2())
        calls.hook(aws.route53())
        started = time.perf_counter()
        records = []
        balancer = template
        for n in range(services):
            if n % run == 0:
                balancer = replace(template)
                balancer.forget()
            records.append(balancer.ensure(f"s{n}", f"{n:016x}", config, None))
        seconds = time.perf_counter() - started
        placing = dict(calls.counts)
        pools = len({r.load_balancer for r in records})
        # The steady state of the pools: the dispatcher's sweep, once a period (a steady service's
        # run calls no balancer at all: tests/reconciler/test_endpoint.py shows it, not measured here).
        calls.counts.clear()
        balancer = replace(template)
        balancer.forget()
        balancer.retire_pools(datetime(2026, 1, 1, tzinfo=UTC))
        sweep = calls.total()
        # Every service deleted: the sweep tags the empty pools, then deletes them.
        for n, record in enumerate(records):
            if n % run == 0:
                balancer = replace(template)
                balancer.forget()
            balancer.remove(f"s{n}", f"{n:016x}", record)
        balancer = replace(template)
        balancer.retire_pools(datetime(2026, 1, 1, tzinfo=UTC))
        retired = balancer.retire_pools(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=1))
    aws.reset_clients()
    return {
        "pools": pools,
        "calls": placing,
        "seconds": seconds,
        "sweep_calls": sweep,
        "retired": len(retired),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--run", type=int, default=50, help="services placed per worker run (one balancer each)")
    parser.add_argument("--alb-hour", type=float, default=0.0225, help="USD per ALB-hour (us-east-1, pricing page)")
    args = parser.parse_args()
    for label, domain in (("without a domain", None), ("with a domain and a hosted zone", "svc.example.com")):
        result = place(args.services, args.run, domain=domain)
        total = sum(result["calls"].values())
        elbv2 = {op: n for (svc, op), n in sorted(result["calls"].items()) if svc == "elbv2"}
        route53 = sum(n for (svc, _), n in result["calls"].items() if svc == "route53")
        per_service = HOURS_PER_MONTH * args.alb_hour * result["pools"] / args.services
        print(f"== {args.services} services {label} ({args.run} per run)")
        print(f"load balancers: {result['pools']} (the template's + {result['pools'] - 1} pools)")
        print(f"AWS calls to place them: {total} ({total / args.services:.2f} per service; Route 53: {route53})")
        print("  elbv2: " + ", ".join(f"{op} {n}" for op, n in elbv2.items()))
        print(f"wall time on moto behind the strict layer: {result['seconds']:.1f} s")
        print(f"steady state: the dispatcher's sweep of the pools, {result['sweep_calls']} calls per period")
        print(f"after every service is deleted: {result['retired']} pools retired by the sweep")
        print(
            f"ALB hours: ${args.alb_hour * result['pools']:.4f}/h for all of them, "
            f"${per_service:.3f} per service per month (LCUs aside)"
        )
    idle = HOURS_PER_MONTH * args.alb_hour
    print(f"== an idle stack: one ALB (the template's), ${idle:.2f} per month; no pool (they go with their services)")


if __name__ == "__main__":
    main()
