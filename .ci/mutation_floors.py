"""Fails when a mutated module's share of killed mutants is below its floor (`make mutate` runs it).

Reads `mutmut results --all true` (one `    NAME: STATUS` line per mutant; a mutant's NAME starts
with its module's dotted path, e.g. `fleetkeeper.reconciler.plan.observe.x__observe__mutmut_42`)
from a file or stdin, and the floors from a TOML file (default tests/mutation_floors.toml):

    required = ["fleetkeeper.reconciler.plan"]  # packages whose every module must have a floor

    [floors]
    "fleetkeeper.reconciler.plan.observe" = 0.85

A module's score is killed / counted, where killed counts mutmut's "killed", "timeout" (the mutant
made the tests hang: they noticed) and "caught by type check", and counted is every mutant but the
"skipped" ones. A mutant "not checked" (the run stopped early) fails the check: a score over part of
a module proves nothing. Every module with results in a `required` package must have a floor, so a
new planner module gets one; the others' scores are printed, unchecked. A module with a floor but no
results (a narrowed `make mutate MUTATE_PATHS=...`) is not checked. Exit 0 when every checked module
is at or above its floor, 1 otherwise.

`--measured` prints each module's score and the floor it would suggest, as TOML, for updating the
floors file after a run: the score rounded down to 5%, and 5% lower still when the score is a
multiple of 5% (100% gives 95%), so that a floor always leaves a little room under what was measured
(a mutant timing out one run and surviving the next, say).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

KILLED = {"killed", "timeout", "caught by type check"}
NOT_COUNTED = {"skipped"}
INCOMPLETE = {"not checked", "check was interrupted by user"}
LINE = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>.+?)\s*$")
DEFAULT_FLOORS = Path(__file__).resolve().parent.parent / "tests" / "mutation_floors.toml"


def module_of(mutant: str) -> str:
    """`pkg.mod.x_func__mutmut_3` / `pkg.mod.xǁClassǁmethod__mutmut_3` -> `pkg.mod`."""
    mangled = mutant.partition("__mutmut_")[0]
    return mangled.rpartition(".")[0]


def tally(lines: list[str]) -> dict[str, Counter[str]]:
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    for line in lines:
        found = LINE.match(line)
        if found:
            by_module[module_of(found["name"])][found["status"]] += 1
    return dict(by_module)


def score(statuses: Counter[str]) -> tuple[int, int]:
    killed = sum(n for status, n in statuses.items() if status in KILLED)
    counted = sum(n for status, n in statuses.items() if status not in NOT_COUNTED)
    return killed, counted


def check(by_module: dict[str, Counter[str]], floors: dict[str, float], required: list[str]) -> list[str]:
    problems = []
    for module, statuses in sorted(by_module.items()):
        killed, counted = score(statuses)
        incomplete = sum(n for status, n in statuses.items() if status in INCOMPLETE)
        ratio = killed / counted if counted else 1.0
        floor = floors.get(module)
        line = f"{module}: {killed}/{counted} killed ({ratio:.1%})"
        if incomplete:
            problems.append(f"{line}: {incomplete} mutant(s) not checked, the run did not finish")
        elif floor is None:
            if any(module == p or module.startswith(f"{p}.") for p in required):
                problems.append(f"{line}: no floor in the floors file; add one (--measured suggests it)")
        elif ratio < floor:
            problems.append(f"{line}: below its floor {floor:.0%}")
        print(f"{line}, floor {'- (not enforced)' if floor is None else f'{floor:.0%}'}")
    return problems


def suggested(by_module: dict[str, Counter[str]]) -> str:
    lines = ["[floors]"]
    for module, statuses in sorted(by_module.items()):
        killed, counted = score(statuses)
        ratio = killed / counted if counted else 1.0
        steps = math.floor(ratio * 20 + 1e-9)
        if steps == ratio * 20:  # on a 5% mark: a little below it
            steps -= 1
        floor = max(steps, 0) / 20
        lines.append(f'"{module}" = {floor:.2f}  # measured {killed}/{counted} ({ratio:.1%})')
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("results", nargs="?", help="`mutmut results --all true` output (default: stdin)")
    parser.add_argument("--floors", type=Path, default=DEFAULT_FLOORS)
    parser.add_argument("--measured", action="store_true", help="print the measured scores as floors, check nothing")
    args = parser.parse_args(argv)
    text = Path(args.results).read_text() if args.results else sys.stdin.read()
    by_module = tally(text.splitlines())
    if not by_module:
        print("mutation floors: no mutant in the results (did `mutmut run` run?)", file=sys.stderr)
        return 1
    if args.measured:
        print(suggested(by_module))
        return 0
    config = tomllib.loads(args.floors.read_text())
    floors = {str(k): float(v) for k, v in config["floors"].items()}
    problems = check(by_module, floors, [str(p) for p in config.get("required", [])])
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
