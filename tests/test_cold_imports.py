"""What a Lambda handler's cold start imports: only what every invocation needs.

A fresh interpreter imports each handler module as Lambda does, and the test reads `sys.modules` and
pydantic's build state: the cheap, deterministic guard of the import cost that bench/cold_start.py
measures (docs/PERFORMANCE.md). A module listed here is needed by some invocations only, and is
imported where it is used; importing it at module level again fails this test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import REPO_ROOT

_PROBE = """
import json, sys
import {module}
modules = sorted(sys.modules)  # before this probe imports anything of its own
from pydantic import BaseModel

def models(module):
    return [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, BaseModel) and v is not BaseModel]

built = []
for name in ("fleetkeeper.spec.service", "fleetkeeper.api.models"):
    if name in sys.modules:
        built += [f"{{name}}.{{m.__name__}}" for m in models(sys.modules[name]) if m.__pydantic_complete__]
print(json.dumps({{"modules": modules, "built": built}}))
"""


def cold_import(module: str) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "functions"), "TABLE_NAME": "unused"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    result: dict[str, list[str]] = json.loads(out.strip().splitlines()[-1])
    return result


# Needed by some api invocations only: each is imported by the code that uses it.
API_DEFERRED = [
    # Placing a spec: only a spec's validation and the views of a service or version need them.
    "fleetkeeper.spec.placement",
    "fleetkeeper.spec.catalogue",
    "fleetkeeper.spec.images",
    "fleetkeeper.spec.skypilot_fields",
    "fleetkeeper.spec.task_variables",
    # The autoscaler's view: only GET of one service.
    "fleetkeeper.reconciler.autoscale",
    # The commands and what they are built from: not for a request refused before any route.
    "fleetkeeper.api.services",
    "fleetkeeper.store",
    "fleetkeeper.store.commands",
    "fleetkeeper.kick",
    "fleetkeeper.replicas.secrets",
    "fleetkeeper.api.request_hmac",
    # The OpenAPI document's generator: GET /v1/openapi.json only.
    "fleetkeeper.api.openapi",
    "fleetkeeper.api.openapi_document",
    # Never in the api's import: the reconciler's code, boto3, botocore's clients, and Powertools'
    # resolvers, whose package imports every resolver it has (asyncio with AppSync's).
    "fleetkeeper.reconciler",
    "boto3",
    "botocore.session",
    "aws_lambda_powertools.event_handler",
    "asyncio",
]


def test_the_api_imports_only_what_every_invocation_needs() -> None:
    loaded = set(cold_import("fleetkeeper.api.handler")["modules"])
    assert sorted(m for m in API_DEFERRED if m in loaded) == []
    # What it does import at module level, so the list above cannot pass by the import failing.
    assert {"fleetkeeper.api.models", "fleetkeeper.spec.service", "fleetkeeper.api.routing", "pydantic"} <= loaded


def test_the_api_builds_no_model_at_import() -> None:
    """pydantic's validators of the spec and of the api's bodies (defer_build) are built by the first
    request that uses each, so an invocation builds its own route's only."""
    assert cold_import("fleetkeeper.api.handler")["built"] == []


@pytest.mark.parametrize(
    ("module", "deferred"),
    [
        # The reconciler's whole work (run, planner, drivers, spec) is imported by its first run.
        ("fleetkeeper.reconciler.handler", ["fleetkeeper.reconciler.run", "fleetkeeper.spec.service", "boto3"]),
        ("fleetkeeper.cleanup.handler", ["fleetkeeper.spec.service", "fleetkeeper.spec.placement", "boto3"]),
        ("fleetkeeper.wake.handler", ["fleetkeeper.spec.service", "fleetkeeper.spec.placement", "boto3", "pydantic"]),
    ],
)
def test_the_other_handlers_keep_their_imports_small(module: str, deferred: list[str]) -> None:
    loaded = set(cold_import(module)["modules"])
    assert module in loaded
    assert sorted(m for m in deferred if m in loaded) == []


def test_the_deferred_models_still_validate_on_first_use() -> None:
    """A deferred model builds itself on first use and answers as before (here in this process)."""
    from fleetkeeper.api.models import CreateServiceRequest
    from fleetkeeper.spec.service import parse_spec

    spec = parse_spec({"resources": {"instance_type": "t3.micro"}, "run": "x", "service": {"readiness_probe": "/"}})
    assert spec.resources.placement.instance_types == ("t3.micro",)
    request = CreateServiceRequest.model_validate({"name": "web", "spec": spec.to_json_dict()})
    assert request.name == "web"
    assert CreateServiceRequest.__pydantic_complete__
