"""SkyPilot's task variables (SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS, SKYPILOT_NUM_GPUS_PER_NODE...)
and fleetkeeper's own reach a replica's `setup` and `run`, on EC2 and in embedded mode, and a spec
cannot shadow them.

The ec2 user data is run as cloud-init runs it (bash, as root there), with its paths moved under a
temporary directory, `systemctl` recorded instead of run, and the instance metadata service a fake
IMDSv2 on 127.0.0.1 that answers only with a token; the two units' EnvironmentFiles are then read in
their order, as systemd reads them, and setup.sh/run.sh run with the result.
"""

from __future__ import annotations

import base64
import gzip
import re
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.reconciler.driver import LaunchRequest
from fleetkeeper.reconciler.userdata import (
    LARGEST_SOURCE,
    LARGEST_TASK,
    USER_DATA_LIMIT,
    render,
    task_file,
    user_data,
)
from fleetkeeper.spec import task_variables
from fleetkeeper.spec.service import parse_spec, stored_spec
from tests.local.test_process_driver import eventually
from tests.support.local_boot import fake_commands, relocated

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fleetkeeper.local.process_driver import ProcessDriver

BASE: dict[str, Any] = {"service": {"readiness_probe": "/health"}, "run": "serve"}
SHOWN = sorted(task_variables.NAMES | {"PORT", "MODEL"})
PRINT = " ".join(f'{name}="${{{name}:-}}"' for name in SHOWN)


# --- the values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance_type", "gpus"),
    [
        ("g5.12xlarge", "4"),
        ("p5.48xlarge", "8"),
        ("inf2.48xlarge", "12"),
        ("c6i.large", "0"),
        ("x9.huge", "0"),
        (None, "0"),
    ],
)
def test_a_replica_is_one_node_of_rank_0_with_its_types_accelerators(instance_type: str | None, gpus: str) -> None:
    values = task_variables.variables("web", "u1", 3, 0, instance_type)
    assert values == {
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_SETUP_NODE_RANK": "0",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": gpus,
        "SKYPILOT_SETUP_NUM_GPUS_PER_NODE": gpus,
        "SKYPILOT_TASK_ID": "fleetkeeper-u1_web-0_3",
        "SKYPILOT_SERVE_REPLICA_ID": "1",  # SkyPilot counts replicas from 1
        "FLEETKEEPER_SERVICE": "web",
        "FLEETKEEPER_VERSION": "3",
        "FLEETKEEPER_REPLICA_ID": "0",
    }
    with_ip = task_variables.variables("web", "u1", 3, 0, instance_type, node_ip="10.0.0.7")
    assert with_ip == {**values, "SKYPILOT_NODE_IPS": "10.0.0.7", "SKYPILOT_SETUP_NODE_IPS": "10.0.0.7"}
    assert set(with_ip) == task_variables.NAMES


@pytest.mark.parametrize(
    ("section", "name"),
    [("envs", "SKYPILOT_NODE_RANK"), ("envs", "SKYPILOT_NUM_GPUS_PER_NODE"), ("secrets", "FLEETKEEPER_SERVICE")],
)
def test_a_spec_may_not_set_them(section: str, name: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec({**BASE, section: {name: "7", "OTHER": "x"}})
    assert f"{name}: fleetkeeper sets this for every replica" in str(caught.value), caught.value
    # One stored before the rule still loads (a third EnvironmentFile keeps it from shadowing them).
    value = '"7"' if section == "envs" else "null"  # a stored spec keeps secret names only
    assert stored_spec(f'{{"service": {{}}, "run": "x", "{section}": {{"{name}": {value}}}}}')


def test_the_largest_task_variables_fit_beside_the_largest_boot_source() -> None:
    data = user_data(parse_spec(BASE), LARGEST_SOURCE, LARGEST_TASK)
    assert len(data) <= USER_DATA_LIMIT
    assert b"replica_logs.py" in gzip.decompress(data)


# --- the ec2 user data, booted ---------------------------------------------------------------------

NODE_IP = "10.20.30.40"


class FakeImds(BaseHTTPRequestHandler):
    """IMDSv2: a token (for a PUT with a TTL) first, then the instance's local IPv4 with it."""

    refuse_tokens = False

    def do_PUT(self) -> None:
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._send(400)
        elif self.refuse_tokens:
            self._send(403)
        else:
            self._send(200, b"imds-token")

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != "imds-token":
            self._send(401)
        elif self.path == "/latest/meta-data/local-ipv4":
            self._send(200, NODE_IP.encode())
        else:
            self._send(404)

    def _send(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeImds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        FakeImds.refuse_tokens = False
        server.shutdown()
        server.server_close()


def _boot(tmp_path: Path, script: str, imds_url: str) -> subprocess.CompletedProcess[str]:
    """Runs the user data with /opt/fleetkeeper, the user's home and the unit directory under tmp_path."""
    if shutil.which("curl") is None:
        pytest.skip("curl (on every image the user data boots) is not on this machine")
    bin_dir = tmp_path / "bin"
    fake_commands(bin_dir, tmp_path)
    moved = relocated(script, tmp_path)
    return subprocess.run(
        ["bash", "-c", moved],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FLEETKEEPER_BOOT_IMDS": imds_url},
        check=False,
    )


def _systemd_environment(unit: str, tmp_path: Path) -> dict[str, str]:
    """The unit's EnvironmentFiles in order, later ones winning, `-` ones optional, each line
    KEY="value" with backslash escapes (systemd's double-quoted form)."""
    env: dict[str, str] = {}
    for line in unit.splitlines():
        if not line.startswith("EnvironmentFile="):
            continue
        path = line.removeprefix("EnvironmentFile=")
        optional = path.startswith("-")
        file = tmp_path / "root" / path.lstrip("-").removeprefix("/opt/fleetkeeper/")
        if optional and not file.exists():
            continue
        for key, quoted in re.findall(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"$', file.read_text(), re.M | re.S):
            env[key] = re.sub(r"\\(.)", r"\1", quoted, flags=re.S)
    return env


def _shown(output: str) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)=(.*)$", output, re.M))


def test_setup_and_run_see_the_task_variables_with_the_instances_own_ip(tmp_path: Path, imds: str) -> None:
    spec = stored_spec(
        '{"service": {}, "setup": "env > setup.env", "run": "env > run.env",'
        ' "envs": {"MODEL": "m", "SKYPILOT_NODE_RANK": "7"}, "secrets": {"SKYPILOT_NUM_NODES": null}}'
    )  # stored before the names were refused: it still cannot shadow them
    task = task_variables.variables("web", "u1", 2, 5, "g5.12xlarge")
    done = _boot(tmp_path, render(spec, None, task), imds)
    assert done.returncode == 0, done.stderr
    assert "enable --now fleetkeeper-replica.service" in (tmp_path / "systemctl.log").read_text()
    # What replica_boot.py would have written from the version's secrets.
    (tmp_path / "root" / "secrets.env").write_text('SKYPILOT_NUM_NODES="9"\n')
    for unit, script, out in [
        ("fleetkeeper-setup", "setup.sh", "setup.env"),
        ("fleetkeeper-replica", "run.sh", "run.env"),
    ]:
        text = (tmp_path / "units" / f"{unit}.service").read_text()
        files = [line for line in text.splitlines() if line.startswith("EnvironmentFile=")]
        assert files[-1] == "EnvironmentFile=/opt/fleetkeeper/task.env"  # read last: nothing shadows it
        env = _systemd_environment(text, tmp_path)
        # As systemd starts the unit: as its User=, whose HOME it sets, in its WorkingDirectory.
        assert "User=ubuntu\nWorkingDirectory=/home/ubuntu/sky_workdir\n" in text
        home = tmp_path / "home"
        work = home / "sky_workdir"
        ran = subprocess.run(
            ["bash", str(tmp_path / "root" / script)],
            cwd=work,
            env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env},
            check=False,
        )
        assert ran.returncode == 0
        seen = _shown((work / out).read_text())
        assert {k: seen.get(k) for k in sorted(task_variables.NAMES)} == {
            **task,
            "SKYPILOT_NODE_IPS": NODE_IP,
            "SKYPILOT_SETUP_NODE_IPS": NODE_IP,
        }
        assert (seen["MODEL"], seen["PORT"], seen["SKYPILOT_NUM_GPUS_PER_NODE"]) == ("m", "8080", "4")


def test_without_an_imds_token_the_boot_stops_before_any_unit(tmp_path: Path, imds: str) -> None:
    FakeImds.refuse_tokens = True
    done = _boot(tmp_path, render(parse_spec(BASE), None, task_variables.variables("web", "u1", 1, 0, None)), imds)
    assert done.returncode != 0
    assert not (tmp_path / "systemctl.log").exists()


def test_the_task_file_is_the_launchs_values_quoted_for_systemd() -> None:
    text = task_file({"B": 'say "hi"', "A": "1"})
    assert text == 'A="1"\nB="say \\"hi\\""\n'
    script = render(parse_spec(BASE), None, {"A": "1"})
    [encoded] = re.findall(r"^echo '([A-Za-z0-9+/=]+)' \| base64 -d > /opt/fleetkeeper/task.env$", script, re.M)
    assert base64.b64decode(encoded).decode() == 'A="1"\n'


# --- embedded mode -----------------------------------------------------------------------------------


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[ProcessDriver]:
    from fleetkeeper.local.process_driver import ProcessDriver

    d = ProcessDriver(tmp_path, grace_seconds=1.0)
    yield d
    d.stop_all(timeout=2)


@pytest.mark.parametrize(("resources", "gpus"), [({"accelerators": "A10G:4"}, "4"), ({}, "0"), ({"cpus": 2}, "0")])
def test_a_local_replica_gets_them_on_127_0_0_1_with_its_first_candidates_accelerators(
    driver: ProcessDriver, tmp_path: Path, resources: dict[str, Any], gpus: str
) -> None:
    out = tmp_path / "out"
    spec = parse_spec(
        {
            **BASE,
            "resources": resources,
            "envs": {"MODEL": "m"},
            "setup": f"env > {out}.setup",
            "run": f"env > {out}.run",
        }
    )
    driver.launch(LaunchRequest(service="web", uid="u9", version=2, replica_id=3, spec=spec))
    for stage in ("setup", "run"):
        seen = eventually(lambda s=stage: _shown((tmp_path / f"out.{s}").read_text()) or None)
        assert {k: seen.get(k) for k in sorted(task_variables.NAMES)} == task_variables.variables(
            "web", "u9", 2, 3, "g5.12xlarge" if gpus == "4" else None, node_ip="127.0.0.1"
        ), stage
        assert seen["SKYPILOT_NUM_GPUS_PER_NODE"] == gpus and seen["MODEL"] == "m"
