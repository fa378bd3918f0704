"""The seeded simulation's cost, with moto's tunings (tests/support/moto_tuning.py) and without: one seed,
the same steps, each run in a process of its own. Prints the CPU seconds of each (and per 100
steps, to show how a step's cost grows with a seed's history), the speed-up, and whether the two
runs made the same AWS calls (the strict layer's call log: operation and a digest of every
request) and took the same steps: they must, or a tuning changed what moto answers. The CPU is
also printed at every 100 entries of the step log (steps, kick deliveries and the final
convergence runs each log one).

    .venv/bin/python bench/simulation_speed.py [--seed 6] [--steps 200] [--stacks 1]

CPU time, not wall time: it is what another process on the same cores disturbs least (the
machine is shared). Nothing leaves the process: moto is in memory, probes are the model's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(seed: int, steps: int, stacks: int) -> None:
    sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
    import logging

    import tests.conftest  # noqa: F401  (the suite's environment, and the tunings unless disabled)
    from tests.simulation.sim import Simulation

    logging.disable(logging.CRITICAL)  # the reconciler's logs of injected faults: not the figure
    start = time.process_time()
    marks: list[float] = []
    simulation = Simulation(seed, stacks=stacks)
    simulation.strict.record_calls = True
    check = simulation._check

    def counted() -> None:
        check()
        if len(simulation.steps) >= 100 * (len(marks) + 1):
            marks.append(round(time.process_time() - start, 2))

    simulation._check = counted  # type: ignore[method-assign]
    outcome = "passed"
    try:
        simulation.run(steps)
    except AssertionError as failure:
        outcome = f"failed: {str(failure).splitlines()[0]}"
    cpu = time.process_time() - start
    digest = hashlib.sha256(json.dumps([simulation.strict.call_log, simulation.steps]).encode()).hexdigest()
    print(
        json.dumps(
            {"cpu": cpu, "marks": marks, "calls": len(simulation.strict.call_log), "digest": digest, "outcome": outcome}
        )
    )


def run(seed: int, steps: int, stacks: int, *, tuned: bool) -> dict[str, object]:
    env = {**os.environ, "FLEETKEEPER_MOTO_TUNING": "1" if tuned else "0"}
    command = [sys.executable, __file__, "--child", "--seed", str(seed), "--steps", str(steps), "--stacks", str(stacks)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--stacks", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.seed, args.steps, args.stacks)
        return
    print(f"simulation seed {args.seed}, {args.steps} steps, {args.stacks} stack(s)")
    results = {}
    for tuned in (False, True):
        label = "tuned moto" if tuned else "plain moto"
        result = results[tuned] = run(args.seed, args.steps, args.stacks, tuned=tuned)
        print(f"  {label}: {result['cpu']:.1f} s CPU, {result['calls']} AWS calls, {result['outcome']}")
        print(f"    CPU at every 100 entries of the step log: {result['marks']}")
    plain, tuned_result = results[False], results[True]
    print(f"  speed-up: {float(plain['cpu']) / float(tuned_result['cpu']):.2f}x")  # type: ignore[arg-type]
    same = plain["digest"] == tuned_result["digest"]
    print(f"  same calls and steps: {'yes' if same else 'NO'} ({tuned_result['digest'][:16]})")  # type: ignore[index]
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
