"""`fleetkeeper local` as a subprocess: it starts, serves the API, says where things are, stops cleanly."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests import REPO_ROOT
from tests.support.local_process import eventually, process_running, start_local

EXAMPLE = REPO_ROOT / "examples" / "hello" / "service.yaml"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_local_serves_the_api_and_exits_cleanly_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    plane = start_local(tmp_path)
    try:
        info = plane.info()
        assert info["api_url"] == plane.url
        assert info["aws_endpoint"].startswith("http://127.0.0.1:")
        assert info["logs_dir"] == str(tmp_path / "state" / "logs")

        created = plane.cli("up", str(EXAMPLE), "--name", "smoke", "-o", "json")
        assert created.returncode == 0, created.stderr
        assert json.loads(created.stdout)["name"] == "smoke"
        status, body = plane.get("/v1/services/smoke")
        assert status == 200 and json.loads(body)["target_version"] == 1
    finally:
        code = plane.stop(sig)
    output = plane.output()
    assert code == 0, output
    assert f"API            {plane.url}" in output
    assert "GPUs simulated (none is used)   (docs/CLI.md, local)" in output  # what a replica here cannot do
    assert str(tmp_path / "state" / "logs") in output
    assert output.rstrip().endswith("fleetkeeper local: stopped")


def test_local_refuses_a_port_that_is_taken(tmp_path: Path) -> None:
    plane = start_local(tmp_path)
    try:
        port = plane.url.rsplit(":", 1)[1]
        second = plane.run("local", "--port", port, "--dir", str(tmp_path / "other"), timeout=60)
        assert second.returncode == 2
        assert f"cannot start on 127.0.0.1:{port}" in second.stderr
    finally:
        assert plane.stop() == 0


def test_closing_the_terminal_sighup_stops_every_replica(tmp_path: Path) -> None:
    plane = start_local(tmp_path)
    try:
        created = plane.cli("up", str(EXAMPLE), "--name", "hup")
        assert created.returncode == 0, created.stderr

        def replica_pids() -> set[int]:
            status, body = plane.get("/v1/services/hup")
            replicas = json.loads(body)["replicas"] if status == 200 else []
            # The process driver's instance ids end with the replica's pid: local-<n>-pid<pid>.
            pids = {int(r["instance_id"].rsplit("pid", 1)[1]) for r in replicas if r.get("instance_id")}
            return pids if len(pids) == 2 and all(process_running(p) for p in pids) else set()

        pids = eventually(replica_pids, timeout=30, what="2 replica processes running")
    finally:
        code = plane.stop(signal.SIGHUP)
    try:
        assert code == 0, plane.output()
        eventually(lambda: not any(process_running(p) for p in pids), timeout=10, what="every replica process gone")
    finally:  # a failure must not leave the replicas behind (each is its own process group)
        for pid in pids:
            if process_running(pid):
                os.killpg(pid, signal.SIGKILL)
