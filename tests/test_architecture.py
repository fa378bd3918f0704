"""The import contracts of pyproject.toml ([tool.importlinter], checked by `make imports`) can fail.

Each case copies the package, plants one real violation in the copy (at the top of a module, inside
a function, under TYPE_CHECKING, or two hops away) and runs import-linter on the copy with the
project's own configuration: the contract it names must break. An unmodified copy keeps every
contract, which also proves the copy, not the installed package, is what was analysed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO_ROOT

ROOT = REPO_ROOT
PACKAGE = ROOT / "functions" / "fleetkeeper"
CONFIG = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

LAZY = "\n\ndef _planted_violation() -> None:\n    {}\n"
TYPE_ONLY = "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    {}\n"
TOP = "\n{}\n"

# (contract id, module the import is planted in, the import, how it is planted)
VIOLATIONS = [
    # handlers -> services -> store -> model/spec
    ("layers", "fleetkeeper.store", "import fleetkeeper.api.services", LAZY),
    ("layers", "fleetkeeper.store", "from fleetkeeper.reconciler import run", TOP),
    ("layers", "fleetkeeper.model", "from fleetkeeper.store import Store", TYPE_ONLY),
    ("layers", "fleetkeeper.spec.service", "from fleetkeeper.cleanup import logic", LAZY),
    ("layers", "fleetkeeper.api.services", "import fleetkeeper.api.handler", LAZY),
    # Two modules of one layer are independent of each other.
    ("layers", "fleetkeeper.api.services", "from fleetkeeper.cleanup.logic import Cleaner", LAZY),
    ("layers", "fleetkeeper.reconciler.handler", "import fleetkeeper.cleanup.handler", LAZY),
    # The planner does no I/O: its package and each of its modules.
    ("pure-planner", "fleetkeeper.reconciler.plan", "import socket", TOP),
    ("pure-planner", "fleetkeeper.reconciler.plan.replicas", "import boto3", LAZY),
    ("pure-planner", "fleetkeeper.reconciler.plan", "from urllib.request import urlopen", LAZY),
    ("pure-planner", "fleetkeeper.reconciler.plan.spot_warnings", "import time", LAZY),
    ("pure-planner", "fleetkeeper.reconciler.plan", "from fleetkeeper.reconciler.probe import probe_all", TOP),
    ("pure-planner", "fleetkeeper.reconciler.plan.observe", "from fleetkeeper.store import Store", TYPE_ONLY),
    ("pure-planner", "fleetkeeper.reconciler.plan.replicas", "from fleetkeeper.reconciler.apply import Applier", LAZY),
    # Indirectly: the planner imports the model, the model would import the AWS clients.
    ("pure-planner", "fleetkeeper.model", "from fleetkeeper import aws", LAZY),
    # What Lambda runs never imports the embedded mode, the CLI or what its bundle lacks.
    # (The first is how the reconciler picked the process driver before the embedded mode registered it.)
    ("lambda-bundle", "fleetkeeper.reconciler.drivers", "import fleetkeeper.local.process_driver", LAZY),
    ("lambda-bundle", "fleetkeeper.cleanup.logic", "from fleetkeeper.cli import main", LAZY),
    ("lambda-bundle", "fleetkeeper.kick", "import yaml", LAZY),
    ("lambda-bundle", "fleetkeeper.store.table", "from fleetkeeper.local.template import load_template", LAZY),
    ("lambda-bundle", "fleetkeeper.errors", "import moto", LAZY),
    # The local load balancer (and aiohttp, which it runs on) is the embedded mode's alone.
    ("lambda-bundle", "fleetkeeper.reconciler.balancers", "from fleetkeeper.local.balancer import LocalBalancer", LAZY),
    ("lambda-bundle", "fleetkeeper.reconciler.balancers.alb", "import aiohttp", LAZY),
    # The dashboard is a local web server of the user's: never in a function.
    ("lambda-bundle", "fleetkeeper.api.services", "from fleetkeeper.dashboard import server", LAZY),
    ("pure-planner", "fleetkeeper.reconciler.plan.endpoints", "from fleetkeeper.reconciler.balancers import alb", LAZY),
]  # fmt: skip


def module_file(root: Path, module: str) -> Path:
    """The source file of `module` in the package copy under `root` (a package's __init__.py)."""
    path = root.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def copy_package(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "fleetkeeper", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """import-linter with the project's configuration on the package copy under `root`."""
    args = [str(LINT_IMPORTS), "--config", str(CONFIG), "--no-cache"]
    for contract in contracts:
        args += ["--contract", contract]
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_an_unmodified_copy_keeps_every_contract(tmp_path: Path) -> None:
    result = lint_imports(copy_package(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("contract", "module", "statement", "planting"),
    VIOLATIONS,
    ids=[f"{c}:{m}:{s}" for c, m, s, _ in VIOLATIONS],
)
def test_a_planted_violation_breaks_its_contract(
    tmp_path: Path, contract: str, module: str, statement: str, planting: str
) -> None:
    root = copy_package(tmp_path)
    target = module_file(root, module)
    target.write_text(target.read_text(encoding="utf-8") + planting.format(statement), encoding="utf-8")
    result = lint_imports(root, contract)
    assert result.returncode == 1, f"{contract} kept despite `{statement}` in {module}:\n{result.stdout}"
    assert "BROKEN" in result.stdout and module in result.stdout, result.stdout


def test_every_deployed_handler_is_under_the_lambda_bundle_contract() -> None:
    # A function added to template.yaml whose module the contract does not name could import the
    # embedded mode, the CLI or a package its bundle lacks, and only fail once deployed.
    import tomllib

    from fleetkeeper.local.template import load_template

    handlers = {
        body["Properties"]["Handler"].rsplit(".", 1)[0]
        for body in load_template()["Resources"].values()
        if body["Type"] == "AWS::Serverless::Function"
    }
    contracts = tomllib.loads(CONFIG.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    (bundle,) = (c for c in contracts if c["id"] == "lambda-bundle")
    assert handlers, "no function found in template.yaml"
    assert handlers <= set(bundle["source_modules"]), handlers - set(bundle["source_modules"])
