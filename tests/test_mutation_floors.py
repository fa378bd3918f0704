"""`make mutate`'s floors (.ci/mutation_floors.py, tests/mutation_floors.toml): the check reads
mutmut's results as mutmut prints them, and the checked-in floors cover every planner module."""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from typing import TYPE_CHECKING

from tests import REPO_ROOT

if TYPE_CHECKING:
    from types import ModuleType

FLOORS_FILE = REPO_ROOT / "tests" / "mutation_floors.toml"
PLANNER = REPO_ROOT / "functions" / "fleetkeeper" / "reconciler" / "plan"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_floors", REPO_ROOT / ".ci" / "mutation_floors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# As `mutmut results --all true` (mutmut 3.8) prints them: functions, methods (ǁ-mangled), statuses.
RESULTS = """\
    fleetkeeper.reconciler.plan.scale.x_desired__mutmut_1: killed
    fleetkeeper.reconciler.plan.scale.x_desired__mutmut_2: killed
    fleetkeeper.reconciler.plan.scale.x_desired__mutmut_3: timeout
    fleetkeeper.reconciler.plan.scale.x_desired__mutmut_4: survived
    fleetkeeper.reconciler.plan.endpoints.xǁ_Balanceǁapply__mutmut_1: killed
    fleetkeeper.reconciler.plan.endpoints.xǁ_Balanceǁapply__mutmut_2: no tests
    fleetkeeper.store.keys.x_service_pk__mutmut_1: survived
    fleetkeeper.store.keys.x_service_pk__mutmut_2: skipped
"""


def test_results_are_tallied_per_module() -> None:
    script = _script()
    tally = script.tally(RESULTS.splitlines())
    assert set(tally) == {
        "fleetkeeper.reconciler.plan.scale",
        "fleetkeeper.reconciler.plan.endpoints",
        "fleetkeeper.store.keys",
    }
    assert script.score(tally["fleetkeeper.reconciler.plan.scale"]) == (3, 4)  # a timeout is a kill
    assert script.score(tally["fleetkeeper.reconciler.plan.endpoints"]) == (1, 2)  # no tests: counted, alive
    assert script.score(tally["fleetkeeper.store.keys"]) == (0, 1)  # skipped: not counted


def test_a_module_below_its_floor_fails_and_one_at_it_passes() -> None:
    script = _script()
    tally = script.tally(RESULTS.splitlines())
    required = ["fleetkeeper.reconciler.plan"]
    floors = {"fleetkeeper.reconciler.plan.scale": 0.75, "fleetkeeper.reconciler.plan.endpoints": 0.5}
    assert script.check(tally, floors, required) == []  # store.keys: no floor, not in a required package
    below = script.check(tally, {**floors, "fleetkeeper.reconciler.plan.scale": 0.8}, required)
    assert [p.split(":")[0] for p in below] == ["fleetkeeper.reconciler.plan.scale"]
    missing = script.check(tally, {"fleetkeeper.reconciler.plan.scale": 0.5}, required)
    assert [p.split(":")[0] for p in missing] == ["fleetkeeper.reconciler.plan.endpoints"]
    assert "no floor" in missing[0]


def test_an_unfinished_run_fails_the_check() -> None:
    script = _script()
    tally = script.tally([*RESULTS.splitlines(), "    fleetkeeper.reconciler.plan.scale.x_cap__mutmut_1: not checked"])
    problems = script.check(tally, {"fleetkeeper.reconciler.plan.scale": 0.0}, [])
    assert len(problems) == 1 and "not checked" in problems[0]


def test_the_suggested_floors_are_a_little_below_the_scores() -> None:
    script = _script()
    lines = [
        *RESULTS.splitlines(),
        *(f"    fleetkeeper.reconciler.plan.work.x_w__mutmut_{n}: killed" for n in range(9)),
        "    fleetkeeper.reconciler.plan.work.x_w__mutmut_9: survived",
    ]
    suggested = tomllib.loads(script.suggested(script.tally(lines)))["floors"]
    assert suggested["fleetkeeper.reconciler.plan.work"] == 0.85  # 90%: on a 5% mark, one below
    assert suggested["fleetkeeper.reconciler.plan.scale"] == 0.7  # 75%
    assert suggested["fleetkeeper.reconciler.plan.endpoints"] == 0.45  # 50%
    assert suggested["fleetkeeper.store.keys"] == 0.0  # 0%: never below 0
    one_of_three = [f"    m.x_f__mutmut_{n}: {'killed' if n == 0 else 'survived'}" for n in range(3)]
    assert tomllib.loads(script.suggested(script.tally(one_of_three)))["floors"]["m"] == 0.3  # 33.3%


def test_every_planner_module_has_a_floor_and_every_floor_a_module() -> None:
    config = tomllib.loads(FLOORS_FILE.read_text())
    assert config["required"] == ["fleetkeeper.reconciler.plan"]
    # mutmut mutates functions and methods only: a module of constants has no mutant to floor.
    modules = {
        "fleetkeeper.reconciler.plan" + ("" if path.stem == "__init__" else f".{path.stem}")
        for path in PLANNER.glob("*.py")
        if any(isinstance(node, ast.FunctionDef) for node in ast.walk(ast.parse(path.read_text())))
    }
    floors = config["floors"]
    assert modules - set(floors) == set(), "a planner module without a floor: measure it (docs/architecture/testing.md)"
    for module, floor in floors.items():
        path = REPO_ROOT / "functions" / (module.replace(".", "/") + ".py")
        package = REPO_ROOT / "functions" / module.replace(".", "/") / "__init__.py"
        assert path.exists() or package.exists(), f"a floor for no module: {module}"
        assert 0.0 <= floor <= 1.0, module
