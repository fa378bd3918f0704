"""End to end: `fleetkeeper doctor` against `fleetkeeper local` (a subprocess), both through the CLI
as a user runs them, every step over real HTTP on 127.0.0.1: the API, the service's endpoint on the
local load balancer, the wake target's 503, STS AssumeRole on the in-memory AWS (moto's server),
and the read-only EC2 and ELB calls of the last check, there too.

What embedded mode cannot show, and the doctor says so in its line: the second owner's service is
owned by the embedded mode's one user, since its API gives every request that identity (the bearer
token proves the user, not a role); the ownership check itself runs against the real api handler in
tests/cli/test_doctor_owner.py. And the in-memory AWS holds no instance or target group (replicas are
processes, the balancer a local one), so the AWS part of the last check finds nothing to find here:
tests/cli/test_doctor_leftovers.py shows it finding what is left.

A failed step, and the clean-up that runs after it, are tests/cli/test_doctor.py's (a fake clock,
no waiting). A fast tick and metrics interval and a two-second scale-to-zero delay keep the run
short (24 to 45 s measured, on 2 busy cores). The delay is longer than one metric interval: a 1 s
bucket between two polls may hold no request, and zero would then come during the rollout.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pytest

from tests.support.local_process import LocalPlane, start_local

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.e2e

ROLE = "arn:aws:iam::123456789012:role/fk-doctor-second"
FAST = ["--serve-timeout", "60", "--update-timeout", "60", "--zero-timeout", "60", "--wake-timeout", "60"]
FAST += ["--second-owner-timeout", "60", "--delete-timeout", "60", "--leftovers-timeout", "30"]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    plane = start_local(tmp_path_factory.mktemp("doctor"), tick=0.5, extra=["--metrics-interval", "1"])
    yield plane
    assert plane.stop() == 0, plane.output()


def services(plane: LocalPlane) -> list[str]:
    status, body = plane.get("/v1/services")
    assert status == 200
    return [s["name"] for s in json.loads(body)["services"]]


def test_the_doctor_passes_every_step_and_leaves_nothing(plane: LocalPlane) -> None:
    started = time.monotonic()
    result = plane.run("doctor", "--to-zero-delay", "2", "--second-owner-role", ROLE, *FAST, timeout=300)
    took = time.monotonic() - started

    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{plane.output()[-4000:]}"
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"fleetkeeper doctor: {plane.url} (embedded mode); services fk-doctor-")
    steps = [line.split(None, 2)[:2] for line in lines[1:9]]
    assert steps == [["PASS", str(n)] for n in range(1, 9)], result.stdout
    create, serve, update, zero, wake, second, delete, leftovers = lines[1:9]
    name = create.split()[4]
    assert serve.endswith(f"answered HTTP 200 '{name} v1' (READY v1)")
    assert "v2 rolled out: GET http://127.0.0.1:" in update and f"answered HTTP 200 '{name} v2'" in update
    assert "0 replicas, target 0, waking route" in zero
    assert "503 waking (Retry-After 5s), then HTTP 200" in wake and f"'{name} v2'" in wake
    assert f"assumed arn:aws:sts::123456789012:assumed-role/fk-doctor-second/{name}" in second
    assert "embedded mode gives every request its one user's identity" in second
    assert f"deleted and gone: {name} (" in delete and f"{name}-b (" in delete
    assert "nothing left: the API (404 for each, and not listed)" in leftovers
    assert "the in-memory AWS: instances tagged fleetkeeper:stack=local" in leftovers
    assert lines[9].startswith("doctor passed: 8 passed, 0 failed, 0 skipped")
    # As the doctor says: nothing of it is left in the control plane.
    assert services(plane) == []
    assert plane.info()["endpoints"] == {}
    print(f"\ndoctor e2e: {took:.1f}s")
