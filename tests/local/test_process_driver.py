"""The process driver: real replica processes on 127.0.0.1, as the reconciler sees them."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.local.process_driver import NETNS, PROCESS_EXITED, ProcessDriver
from fleetkeeper.model import FailureCause
from fleetkeeper.reconciler.driver import InstanceState, LaunchRequest
from fleetkeeper.reconciler.plan import termination_cause
from fleetkeeper.spec.service import parse_spec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from fleetkeeper.reconciler.driver import Instance

# A replica that answers GET / with its GREETING and PORT, after a setup step that leaves a file.
SERVER = (
    'exec python3 -c "import http.server, os\n'
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        text = os.environ['GREETING'] + ' ' + os.environ['PORT'] + ' ' + open('setup.txt').read()\n"
    "        body = text.encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "print('listening', flush=True)\n"
    "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\""
)


def spec(run: str = SERVER, setup: str | None = "echo setup-done > setup.txt", **envs: str) -> Any:
    data: dict[str, Any] = {
        "service": {"readiness_probe": "/", "replicas": 1},
        "run": run,
        "envs": {"GREETING": "hi", **envs},
    }
    if setup is not None:
        data["setup"] = setup
    return parse_spec(data)


def request(replica_id: int = 1, *, uid: str = "uid1", version: int = 1, **kw: Any) -> LaunchRequest:
    return LaunchRequest(service="web", uid=uid, version=version, replica_id=replica_id, spec=spec(**kw))


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[ProcessDriver]:
    d = ProcessDriver(tmp_path, grace_seconds=1.0)
    yield d
    d.stop_all(timeout=2)


def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except (OSError, AssertionError):
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.05)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as answer:
        return str(answer.read().decode())


def state_of(driver: ProcessDriver, instance: Instance) -> Instance:
    return next(i for i in driver.list_instances() if i.instance_id == instance.instance_id)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_replica_runs_setup_then_run_with_envs_and_its_own_port(driver: ProcessDriver) -> None:
    instance = driver.launch(request())
    url = driver.base_url(instance, 8080)
    assert url is not None and url.startswith("http://127.0.0.1:")
    port = url.rsplit(":", 1)[1]
    assert port != "8080"  # reached on a free port of 127.0.0.1, not the spec's
    # In a network namespace of its own the app gets the spec's port, as on EC2; else that free port.
    expected = "8080" if driver.isolation == NETNS else port
    assert eventually(lambda: fetch(url + "/")) == f"hi {expected} setup-done\n"
    assert instance.state is InstanceState.RUNNING
    assert (instance.service, instance.uid, instance.version, instance.replica_id) == ("web", "uid1", 1, 1)
    assert instance.instance_id.endswith(f"pid{driver.pids()[0]}")
    log = driver.log_path("web", "uid1", 1).read_text()
    assert "listening" in log and f"PORT={expected}" in log


def test_each_replica_runs_in_its_own_working_directory(driver: ProcessDriver) -> None:
    for replica_id in (1, 2):
        driver.launch(request(replica_id, run="pwd > where.txt", setup=None))
    first = eventually(lambda: (driver.work_dir("web", "uid1", 1) / "where.txt").read_text().strip())
    second = eventually(lambda: (driver.work_dir("web", "uid1", 2) / "where.txt").read_text().strip())
    assert first != second
    assert first == str(driver.work_dir("web", "uid1", 1))


def test_launch_is_idempotent_per_client_token(driver: ProcessDriver) -> None:
    first = driver.launch(request(1))
    again = driver.launch(request(1))
    other = driver.launch(request(2))
    assert again.instance_id == first.instance_id
    assert other.instance_id != first.instance_id
    assert len(driver.pids()) == 2


def test_find_instance_finds_live_replicas_by_uid_and_replica_id(driver: ProcessDriver) -> None:
    launched = driver.launch(request(3, uid="a"))
    found = driver.find_instance("a", 3)
    assert found is not None and found.instance_id == launched.instance_id
    assert driver.find_instance("a", 4) is None
    assert driver.find_instance("b", 3) is None
    driver.terminate([launched.instance_id])
    eventually(lambda: driver.find_instance("a", 3) is None)


def test_a_replica_that_exits_is_terminated_with_its_exit_code(driver: ProcessDriver) -> None:
    instance = driver.launch(request(run="echo bye; exit 3", setup=None))
    ended = eventually(lambda: (i := state_of(driver, instance)).state is InstanceState.TERMINATED and i)
    assert ended.state_reason_code == PROCESS_EXITED
    assert ended.state_reason == f"{PROCESS_EXITED}: the replica process exited with code 3"
    # The app ended on its own: that counts against its version, and it is no spot reclaim.
    assert termination_cause(PROCESS_EXITED) is FailureCause.VERSION
    assert driver.base_url(ended, 8080) is None
    assert "bye" in driver.log_path("web", "uid1", 1).read_text()


def test_a_replica_that_exits_says_its_last_error_line_in_its_reason(driver: ProcessDriver) -> None:
    run = 'echo starting; exec python3 -c "import fk_no_such_module"'
    instance = driver.launch(request(run=run, setup=None))
    ended = eventually(lambda: (i := state_of(driver, instance)).state is InstanceState.TERMINATED and i)
    assert ended.state_reason == (
        f"{PROCESS_EXITED}: the replica process exited with code 1: "
        "ModuleNotFoundError: No module named 'fk_no_such_module'"
    )
    # stderr still reaches the log, whole, after what the app printed on stdout.
    log = driver.log_path("web", "uid1", 1).read_text()
    assert log.index("starting") < log.index("Traceback (most recent call last)")
    assert "ModuleNotFoundError" in log


def test_a_reason_never_shows_a_secret_of_the_replica(driver: ProcessDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "_secrets", lambda _request: {"API_TOKEN": "tok-5ecret-value"})
    instance = driver.launch(request(run='echo "fatal: token $API_TOKEN refused" >&2; exit 2', setup=None))
    ended = eventually(lambda: (i := state_of(driver, instance)).state is InstanceState.TERMINATED and i)
    assert ended.state_reason == f"{PROCESS_EXITED}: the replica process exited with code 2: fatal: token *** refused"


def test_a_failing_setup_ends_the_replica_before_run(driver: ProcessDriver) -> None:
    instance = driver.launch(request(setup="exit 7", run="echo run-started; sleep 30"))
    ended = eventually(lambda: (i := state_of(driver, instance)).state is InstanceState.TERMINATED and i)
    assert ended.state_reason_code == PROCESS_EXITED
    assert "exited with code 7" in (ended.state_reason or "")
    assert "run-started" not in driver.log_path("web", "uid1", 1).read_text()


def test_a_killed_replica_is_reported_terminated(driver: ProcessDriver) -> None:
    instance = driver.launch(request(run="sleep 30", setup=None))
    os.killpg(driver.pids()[0], signal.SIGKILL)
    ended = eventually(lambda: (i := state_of(driver, instance)).state is InstanceState.TERMINATED and i)
    assert ended.state_reason_code == PROCESS_EXITED
    assert "SIGKILL" in (ended.state_reason or "")


def test_terminate_stops_the_whole_process_group(driver: ProcessDriver, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    instance = driver.launch(request(run=f"sleep 300 & echo $! > {pidfile}; wait", setup=None))
    child = int(eventually(lambda: pidfile.read_text().strip()))
    assert alive(child)
    driver.terminate([instance.instance_id])
    ended = eventually(lambda: (i := state_of(driver, instance)).state is InstanceState.TERMINATED and i)
    assert ended.state_reason_code == "Client.UserInitiatedShutdown"
    assert ended.state_reason == "Client.UserInitiatedShutdown: terminated by fleetkeeper"
    eventually(lambda: not alive(child))
    driver.terminate([instance.instance_id])  # terminating a terminated replica is not an error
    driver.terminate(["local-999-pid1"])  # nor is an unknown id


def test_terminate_kills_a_replica_that_ignores_sigterm(driver: ProcessDriver, tmp_path: Path) -> None:
    ready = tmp_path / "trapped"
    instance = driver.launch(request(run=f"trap '' TERM; touch {ready}; while true; do sleep 0.1; done", setup=None))
    eventually(ready.exists)
    started = time.monotonic()
    driver.terminate([instance.instance_id])
    assert state_of(driver, instance).state is InstanceState.SHUTTING_DOWN
    eventually(lambda: state_of(driver, instance).state is InstanceState.TERMINATED)
    assert time.monotonic() - started >= driver.grace_seconds * 0.9  # TERM was ignored; KILL after the grace


def test_replicas_do_not_inherit_the_control_planes_aws_settings(
    driver: ProcessDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_KICK_URL", "http://127.0.0.1:1/_local/kick")
    out = tmp_path / "env.txt"
    driver.launch(request(run=f"env > {out}", setup=None))
    env = eventually(lambda: out.read_text() if "PORT=" in out.read_text() else None)
    assert "GREETING=hi" in env
    assert "AWS_SECRET_ACCESS_KEY" not in env and "FLEETKEEPER_KICK_URL" not in env
    assert "PATH=" in env


def test_stop_all_ends_every_replica(driver: ProcessDriver) -> None:
    for replica_id in (1, 2, 3):
        driver.launch(request(replica_id, run="sleep 300", setup=None))
    pids = driver.pids()
    assert len(pids) == 3
    driver.stop_all(timeout=3)
    assert driver.pids() == []
    assert not any(alive(pid) for pid in pids)
    assert all(i.state is InstanceState.TERMINATED for i in driver.list_instances())


def test_shared_is_one_driver_per_process_logging_under_the_local_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_LOCAL_DIR", str(tmp_path / "here"))
    ProcessDriver.reset_shared()
    try:
        shared = ProcessDriver.shared()
        assert ProcessDriver.shared() is shared
        assert (
            shared.log_path("web", "u1", 2) == (tmp_path / "here" / "logs" / "web" / "u1" / "replica-2.log").resolve()
        )
    finally:
        ProcessDriver.reset_shared()


def test_terminated_replicas_are_forgotten_after_a_while(tmp_path: Path) -> None:
    driver = ProcessDriver(tmp_path, forget_after_seconds=0.2)
    instance = driver.launch(request(run="exit 0", setup=None))
    eventually(lambda: state_of(driver, instance).state is InstanceState.TERMINATED)
    eventually(lambda: driver.list_instances() == [])
