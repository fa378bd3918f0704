"""End to end: a SkyPilot-style YAML whose app hard-codes port 8080, with 2 replicas, through
`fleetkeeper local` (real processes, real HTTP on 127.0.0.1): both replicas READY and serving through
the local load balancer, each in a network namespace of its own. Without namespaces
(`--isolation shared`), the replica that cannot bind says whose the port is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from fleetkeeper.local.process_driver import namespaces_available
from tests import TESTS_DIR
from tests.support.local_process import LocalPlane, eventually, free_port, http_get, ok, start_local

if TYPE_CHECKING:
    from collections.abc import Iterator

FIXTURE = TESTS_DIR / "fixtures" / "fixed_port" / "service.yaml"
WAIT = "60"

pytestmark = pytest.mark.e2e


@pytest.fixture
def plane(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalPlane]:
    plane = start_local(tmp_path, tick=1.0, extra=list(request.param))
    yield plane
    code = plane.stop()
    assert code == 0, plane.output()


@pytest.mark.skipif(not namespaces_available()[0], reason=f"no network namespaces here: {namespaces_available()[1]}")
@pytest.mark.parametrize("plane", [["--isolation", "netns"]], indirect=True)
def test_two_replicas_of_a_fixed_port_8080_app_serve_through_the_endpoint(plane: LocalPlane) -> None:
    # No name in the spec: the service is named after the YAML's folder (its file is `service.yaml`).
    out = ok(plane.cli("up", str(FIXTURE), "--wait", "--timeout", WAIT))
    assert out.startswith("created fixed-port (v1")
    assert "fixed-port is READY at http://127.0.0.1:" in out
    view = json.loads(plane.get("/v1/services/fixed-port")[1])
    assert sorted(r["status"] for r in view["replicas"]) == ["READY", "READY"]
    endpoint = ok(plane.cli("status", "fixed-port", "--endpoint")).strip()
    assert endpoint == view["endpoint"]
    # round_robin: two requests, one to each replica, both apps on their own 8080.
    answers = {http_get(f"{endpoint}/id.txt")[1].decode().strip() for _ in range(2)}
    assert answers == {"replica 0", "replica 1"}
    logs = ok(plane.cli("logs", "fixed-port"))
    assert logs.count("PORT=8080 on its own network namespace") == 2
    assert "Address already in use" not in logs
    ok(plane.cli("down", "fixed-port", "--wait", "--timeout", WAIT))


SKYPILOT_MINIMAL = TESTS_DIR / "fixtures" / "skypilot" / "examples" / "serve" / "minimal.yaml"


@pytest.mark.skipif(not namespaces_available()[0], reason=f"no network namespaces here: {namespaces_available()[1]}")
@pytest.mark.parametrize("plane", [["--isolation", "netns"]], indirect=True)
def test_skypilots_minimal_serve_yaml_runs_with_two_replicas(plane: LocalPlane, tmp_path: Path) -> None:
    """SkyPilot's own examples/serve/minimal.yaml (`python3 -m http.server 8080`, as published), with
    its replica count raised to 2: each replica binds 8080 on a host of its own."""
    text = SKYPILOT_MINIMAL.read_text(encoding="utf-8")
    assert "replicas: 1" in text and "http.server 8080" in text
    spec = tmp_path / "minimal.yaml"
    spec.write_text(text.replace("replicas: 1", "replicas: 2"), encoding="utf-8")
    out = ok(plane.cli("up", str(spec), "--name", "minimal", "--wait", "--timeout", WAIT))
    assert "minimal is READY at http://127.0.0.1:" in out
    view = json.loads(plane.get("/v1/services/minimal")[1])
    assert sorted(r["status"] for r in view["replicas"]) == ["READY", "READY"]
    assert http_get(view["endpoint"] + "/")[0] == 200
    assert "Address already in use" not in ok(plane.cli("logs", "minimal"))
    ok(plane.cli("down", "minimal", "--wait", "--timeout", WAIT))


@pytest.mark.parametrize("plane", [["--isolation", "shared"]], indirect=True)
def test_without_namespaces_the_second_replica_says_whose_the_port_is(plane: LocalPlane) -> None:
    port = free_port()
    spec = plane.workdir / "fixed.yaml"
    spec.write_text(FIXTURE.read_text().replace("8080", str(port)))
    ok(plane.cli("up", "-n", "fixed", str(spec)))

    def said() -> str | None:
        view = json.loads(plane.get("/v1/services/fixed")[1])
        messages = [str(r.get("status_message", "")) for r in view["replicas"]] + [view["status_message"]]
        return next((m for m in messages if f"port {port} is taken by replica" in m), None)

    message = eventually(said, timeout=60, what="the port-taken message")
    assert "of fixed (pid " in message and "each must listen on its $PORT" in message
    ok(plane.cli("down", "fixed", "--wait", "--timeout", WAIT))
