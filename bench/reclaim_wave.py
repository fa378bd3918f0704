"""Reclaim waves: EC2 warns about half of a spot service's replicas and takes each back two minutes
later. Prints, per seeded wave, the READY capacity's low point against the bound issue 14 sets
(target - L, L = replicas reclaimed before a replacement was READY), and a summary.

    .venv/bin/python bench/reclaim_wave.py [--seeds 20] [--base 0]

Each wave runs the reconciler over the strict-AWS layer on moto, in memory (tests/simulation/
reclaim.py); probes go to a server on 127.0.0.1. Nothing leaves the process.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys

import offline_aws  # noqa: F401  (first: the path, fake credentials, probes on 127.0.0.1)

from fleetkeeper import aws
from tests.simulation.reclaim import WaveResult, run_wave, summary
from tests.strict_aws import FaultRates, StrictAws
from tests.support.reconciler_world import ProbeServer, World


def one(seed: int, server: ProbeServer) -> WaveResult:
    from moto import mock_aws

    aws.reset_clients()
    strict = StrictAws(seed=seed, faults=FaultRates.parse(""))
    with mock_aws(), strict.active():
        return run_wave(seed, World(server), strict)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--base", type=int, default=0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    server = ProbeServer()
    results = []
    print(f"{'seed':>5} {'target':>6} {'warned':>6} {'fallback':>8} {'refused':>7} {'min READY':>9} "
          f"{'bound':>5} {'L':>2} {'back at':>7}")  # fmt: skip
    try:
        for seed in range(args.base, args.base + args.seeds):
            r = one(seed, server)
            results.append(r)
            back = f"{r.recovered_after}s" if r.recovered_after is not None else "never"
            print(
                f"{r.seed:>5} {r.target:>6} {r.warned:>6} {'dynamic' if r.dynamic_fallback else 'none':>8} "
                f"{r.spot_refusals:>7} {r.min_ready:>9} {r.bound:>5} {r.lost:>2} {back:>7}"
                f"{'' if r.holds else '  BOUND BROKEN'}"
            )
    finally:
        with contextlib.suppress(Exception):
            server.close()
    print()
    for key, value in summary(results).items():
        print(f"{key}: {value}")
    return 0 if all(r.holds for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
