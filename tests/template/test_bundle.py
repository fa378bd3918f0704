"""The functions' bundle (functions/Makefile, which `sam build` runs for every function): the wheels
for the runtime and architecture template.yaml names, and bytecode a fresh interpreter takes for
every fleetkeeper module a handler imports, checked against its source. The `code` step runs here
with this interpreter: a .pyc is read only by the version that wrote it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.local.template import load_template
from tests import REPO_ROOT

FUNCTIONS = REPO_ROOT / "functions"
VERSION = "{}.{}".format(*sys.version_info[:2])
# PEP 552: the flags word after the magic number; 0b11 is "hash-based, checked against the source".
CHECKED_HASH = 0b11


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(FUNCTIONS), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _functions() -> dict[str, dict[str, Any]]:
    resources: dict[str, dict[str, Any]] = load_template()["Resources"]
    return {lid: body for lid, body in resources.items() if body["Type"] == "AWS::Serverless::Function"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    artifacts = tmp_path_factory.mktemp("artifacts")
    # What the development machine left in the source tree must not reach the bundle.
    stale = artifacts / "fleetkeeper" / "__pycache__"
    stale.mkdir(parents=True)
    (stale / "handler.cpython-39.pyc").write_bytes(b"stale")
    done = _make("code", f"ARTIFACTS_DIR={artifacts}", f"PYTHON={sys.executable}", f"RUNTIME={VERSION}")
    assert done.returncode == 0, done.stderr
    return artifacts


def _import_verbosely(bundle: Path, module: str) -> str:
    """What `python -v` prints importing `module` from the bundle (dependencies from this venv)."""
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(bundle), *site]),
        "PYTHONDONTWRITEBYTECODE": "1",  # as Lambda's read-only /var/task
    }
    done = subprocess.run(
        [sys.executable, "-S", "-v", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=bundle,
        check=True,
    )
    return done.stderr


def test_every_function_is_built_by_the_makefile_for_its_runtime_and_architecture() -> None:
    template = load_template()
    function_globals = template["Globals"]["Function"]
    assert function_globals["CodeUri"] == "functions/"
    runtime = function_globals["Runtime"].removeprefix("python")
    platform = {"arm64": "manylinux2014_aarch64", "x86_64": "manylinux2014_x86_64"}[
        function_globals["Architectures"][0]
    ]
    functions = _functions()
    assert len(functions) == 7
    for logical_id, body in functions.items():
        assert body.get("Metadata", {}).get("BuildMethod") == "makefile", logical_id
        assert "CodeUri" not in body["Properties"] and "Runtime" not in body["Properties"], logical_id
        plan = _make("-n", f"build-{logical_id}", "ARTIFACTS_DIR=/nonexistent")
        assert plan.returncode == 0, (logical_id, plan.stderr)
        assert f"--python-version {runtime}" in plan.stdout and f"--platform {platform}" in plan.stdout
        assert "--only-binary=:all:" in plan.stdout and "--requirement requirements.txt" in plan.stdout
        assert "compileall" in plan.stdout and "--invalidation-mode checked-hash" in plan.stdout


@pytest.mark.parametrize(
    "module",
    [
        "fleetkeeper.api.handler",
        "fleetkeeper.reconciler.handler",
        "fleetkeeper.wake.handler",
        "fleetkeeper.cleanup.handler",
        "fleetkeeper.deploy.zone_check",
        "fleetkeeper.uninstall.handler",
    ],
)
def test_a_fresh_interpreter_compiles_no_fleetkeeper_module_a_handler_imports(bundle: Path, module: str) -> None:
    lines = _import_verbosely(bundle, module).splitlines()
    ours = [line for line in lines if line.startswith("# code object from") and "fleetkeeper" in line]
    assert len(ours) >= 3
    from_source = [line for line in ours if not line.rstrip("'").endswith(".pyc")]
    assert from_source == []
    assert all(str(bundle) in line for line in ours)


def test_the_bytecode_is_checked_against_its_source_and_nothing_stale_is_kept(bundle: Path) -> None:
    compiled = sorted((bundle / "fleetkeeper").rglob("*.pyc"))
    sources = sorted((bundle / "fleetkeeper").rglob("*.py"))
    assert len(compiled) == len(sources) > 50
    tag = sys.implementation.cache_tag
    assert all(path.name.endswith(f".{tag}.pyc") for path in compiled)
    assert all(int.from_bytes(path.read_bytes()[4:8], "little") == CHECKED_HASH for path in compiled)


def test_a_source_edited_in_the_bundle_runs_as_edited(tmp_path: Path) -> None:
    done = _make("code", f"ARTIFACTS_DIR={tmp_path}", f"PYTHON={sys.executable}", f"RUNTIME={VERSION}")
    assert done.returncode == 0, done.stderr
    errors = tmp_path / "fleetkeeper" / "errors.py"
    errors.write_text(errors.read_text() + "\nEDITED_IN_THE_BUNDLE = True\n")
    lines = _import_verbosely(tmp_path, "fleetkeeper.errors").splitlines()
    assert any(line.startswith("# code object from") and line.rstrip("'").endswith("errors.py") for line in lines)


def test_a_python_other_than_the_runtime_and_a_missing_artifacts_dir_are_refused(tmp_path: Path) -> None:
    wrong = _make("code", f"ARTIFACTS_DIR={tmp_path}", f"PYTHON={sys.executable}", "RUNTIME=3.99")
    assert wrong.returncode != 0
    assert f"is Python {VERSION}; the functions run Python 3.99" in wrong.stderr
    assert not (tmp_path / "fleetkeeper").exists()
    missing = _make("code", f"PYTHON={sys.executable}", f"RUNTIME={VERSION}")
    assert missing.returncode != 0 and "ARTIFACTS_DIR is not set" in missing.stderr
