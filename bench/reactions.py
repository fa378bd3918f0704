"""How fast fleetkeeper reacts between the schedule's ticks (issue 26), in schedule time: with
follow-ups and EC2's state-change notifications, and with the schedule alone (before them).

    .venv/bin/python bench/reactions.py [--quick]

Each scenario runs the reconciler over the strict-AWS layer on moto, in memory, on a simulated
clock (tests/simulation/reactions.py): instances boot in 60 s and their app answers 10 s later;
EventBridge and SQS deliver to a warm worker 1 s after an event or a delay. Nothing leaves the process.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import TYPE_CHECKING, Any, TypeVar

import offline_aws  # noqa: F401  (first: the path, fake credentials, probes on 127.0.0.1)

from fleetkeeper import aws
from tests.simulation import reactions as r
from tests.strict_aws import FaultRates, StrictAws
from tests.support.reconciler_world import ProbeServer

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")
MONTH_HOURS = 730  # what AWS bills as a month


def isolated(seed: int, scenario: Callable[[StrictAws], T]) -> T:
    from moto import mock_aws

    aws.reset_clients()
    strict = StrictAws(seed=seed, faults=FaultRates.parse(""))
    with mock_aws(), strict.active():
        return scenario(strict)


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"


def worst(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else max(v for v in values if v is not None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer phases (a smoke run)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    server = ProbeServer()
    out: dict[str, Any] = {}
    try:
        # The schedule's phase against the launch, and how much longer than BOOT an instance takes
        # (which moves the app's first answer against the follow-ups' 10 s cadence).
        phases = [0, 30] if args.quick else [0, 20, 40]
        boots = [0, 5] if args.quick else [0, 3, 6, 9]
        target = r.BOOT + r.READY
        print(f"instances boot in {r.BOOT:.0f} s, the app answers {r.READY:.0f} s later; delivery {r.DELIVERY:.0f} s\n")

        print("1. app answering -> replica READY and registered (target <= 15 s)")
        for follow in (True, False):
            lags = [
                isolated(n, lambda s, p=p, b=b, f=follow: r.ready_latency(server, follow_ups=f, phase=p, extra_boot=b))
                for n, (p, b) in enumerate((p, b) for p in phases for b in boots)
            ]
            found = [lag.seconds for lag in lags]
            done = [v for v in found if v is not None]
            label = "with follow-ups" if follow else "schedule only  "
            mean = sum(done) / len(done) if done else float("nan")
            print(f"   {label}: worst {seconds(worst(found))}, mean {mean:.1f} s over {len(found)} phases")
            out[f"ready_{follow}"] = worst(found)

        bound = 10 * (target + 15)
        print(f"\n2. rolling update of 10 replicas, surge 1 (target <= 10 x ({target:.0f} + 15) = {bound:.0f} s)")
        for follow in (True, False):
            roll = isolated(100, lambda s, f=follow: r.rolling_update(server, follow_ups=f))
            label = "with follow-ups" if follow else "schedule only  "
            print(
                f"   {label}: {seconds(roll.seconds)}; SQS messages sent {roll.sent}, extra invocations "
                f"{roll.invocations} (follow-ups {roll.followups})"
            )
            out[f"roll_{follow}"] = roll

        print("\n3. instance terminated by AWS -> replacement launched (target <= 10 s after EC2's event)")
        for follow, events, label in ((True, True, "with EC2 events"), (False, False, "schedule only  ")):
            lags = [
                isolated(
                    200 + n,
                    lambda s, p=p, f=follow, e=events: r.replacement_latency(
                        server, s, follow_ups=f, events=e, phase=p, at=p / 2
                    ),
                )
                for n, p in enumerate(phases)
            ]
            found = [lag.seconds for lag in lags]
            print(f"   {label}: worst {seconds(worst(found))} after the instance ended ({len(found)} phases)")

        print("\n4. cost per service (extra invocations and SQS messages beyond the schedule's)")
        steady, writes = isolated(300, lambda s: r.steady_cost(server, hours=1.0))
        print(
            f"   steady state: {steady.sent * MONTH_HOURS} SQS messages, {steady.invocations * MONTH_HOURS} extra "
            f"invocations and {writes * MONTH_HOURS} DynamoDB writes a month (1 h measured: {steady.sent}, "
            f"{steady.invocations}, {writes})"
        )
        roll = out["roll_True"]
        print(
            f"   during an update of 10 replicas: {roll.sent} SQS messages (each after one UpdateItem) and "
            f"{roll.invocations} extra invocations per update; a service updated once a day: "
            f"{roll.sent * 30:,} messages and {roll.invocations * 30:,} invocations a month"
        )
    finally:
        with contextlib.suppress(Exception):
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
