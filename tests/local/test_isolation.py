"""Each local replica on a host of its own (a network namespace each), and the shared-loopback
fallback that names whoever holds a replica's port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.local import netns
from fleetkeeper.local.http_bridge import incarnation_folder, offset_since
from fleetkeeper.local.process_driver import (
    NETNS,
    OFFLINE_HINT,
    PROCESS_EXITED,
    SHARED,
    ProcessDriver,
    namespaces_available,
    port_mismatch,
)
from fleetkeeper.reconciler.driver import InstanceState, LaunchRequest
from fleetkeeper.reconciler.probe import ProbeTarget, probe_one
from fleetkeeper.spec.service import ReadinessProbe, parse_spec
from tests.local.test_process_driver import eventually, fetch, state_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

NAMESPACES, WHY_NOT = namespaces_available()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason=f"no network namespaces here: {WHY_NOT}")

# SkyPilot's minimal serving app: a fixed port, whatever $PORT says; each replica writes its id first.
FIXED = 'echo "replica $FLEETKEEPER_REPLICA_ID" > id.txt && exec python3 -m http.server {port} --bind 127.0.0.1'


def fixed_port_spec(port: int) -> Any:
    return parse_spec(
        {
            "service": {"readiness_probe": "/", "replicas": 2},
            "resources": {"ports": port},
            "run": FIXED.format(port=port),
        }
    )


def launch(driver: ProcessDriver, replica_id: int, port: int) -> Any:
    return driver.launch(LaunchRequest("web", "uid1", 1, replica_id, fixed_port_spec(port)))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def make_driver(tmp_path: Path) -> Iterator[Callable[[str], ProcessDriver]]:
    made: list[ProcessDriver] = []

    def make(isolation: str) -> ProcessDriver:
        driver = ProcessDriver(tmp_path / isolation, grace_seconds=1.0, isolation=isolation)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.stop_all(timeout=2)


@needs_namespaces
def test_two_replicas_of_a_fixed_port_app_each_have_the_port_in_a_namespace_of_their_own(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    driver = make_driver(NETNS)
    assert driver.isolation == NETNS
    # 8080 for both, as SkyPilot's YAMLs have it, whatever this machine runs on its own 8080.
    first, second = launch(driver, 0, 8080), launch(driver, 1, 8080)
    urls = [driver.base_url(first, 8080), driver.base_url(second, 8080)]
    assert all(url is not None and url.startswith("http://127.0.0.1:") for url in urls)
    assert len(set(urls)) == 2
    assert eventually(lambda: fetch(f"{urls[0]}/id.txt")) == "replica 0\n"
    assert eventually(lambda: fetch(f"{urls[1]}/id.txt")) == "replica 1\n"
    log = driver.log_path("web", "uid1", 1).read_text()
    assert "PORT=8080 on its own network namespace" in log
    assert driver.diagnose(first) is None  # it listens where it was told to: $PORT is 8080
    assert [i.state for i in driver.list_instances()] == [InstanceState.RUNNING, InstanceState.RUNNING]


# What pip prints when its index cannot be resolved. Printed, not provoked: a test that tried a public
# host would send traffic beyond 127.0.0.1 wherever a namespace were not what it claims.
_PIP_OFFLINE = (
    "echo \"WARNING: Retrying after connection broken by 'NewConnectionError: Failed to establish a new "
    "connection: [Errno -3] Temporary failure in name resolution'\" >&2; "
    "echo 'ERROR: No matching distribution found for vllm' >&2; exit 1"
)


def _ended_reason(driver: ProcessDriver) -> str:
    spec = parse_spec(
        {
            "service": {"readiness_probe": "/", "replicas": 1},
            "resources": {"ports": 8080},
            "setup": _PIP_OFFLINE,
            "run": "sleep 30",
        }
    )
    instance = driver.launch(LaunchRequest("web", "uid1", 1, 0, spec))
    ended = eventually(lambda: (i := state_of(driver, instance)).state is InstanceState.TERMINATED and i)
    return ended.state_reason or ""


@needs_namespaces
def test_a_setup_that_reaches_for_the_internet_is_told_replicas_have_no_network(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    """Issue 36: a `setup` with `pip install` failed with pip's last line and nothing on why."""
    assert _ended_reason(make_driver(NETNS)) == (
        f"{PROCESS_EXITED}: the replica process exited with code 1: "
        f"ERROR: No matching distribution found for vllm ({OFFLINE_HINT})"
    )


def test_sharing_this_machines_network_the_same_failure_gets_no_offline_hint(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    assert _ended_reason(make_driver(SHARED)) == (
        f"{PROCESS_EXITED}: the replica process exited with code 1: ERROR: No matching distribution found for vllm"
    )


@needs_namespaces
def test_a_replica_serves_on_port_80_in_its_own_namespace(make_driver: Callable[[str], ProcessDriver]) -> None:
    """SkyPilot takes `ports: 80`; an unprivileged app binds it in its namespace (the host's rule stays)."""
    driver = make_driver(NETNS)
    replica = launch(driver, 0, 80)
    url = driver.base_url(replica, 80)
    assert url is not None
    assert eventually(lambda: fetch(f"{url}/id.txt")) == "replica 0\n"
    assert "PORT=80 on its own network namespace" in driver.log_path("web", "uid1", 0).read_text()


@needs_namespaces
def test_a_port_below_1024_is_open_to_the_replicas_user_in_its_namespace_only(tmp_path: Path) -> None:
    setting = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
    launcher = [sys.executable, "-I", str(netns.SCRIPT), "--socket", str(tmp_path / "r.sock")]
    inside = subprocess.run(
        [*launcher, "--port", "80", "--", "cat", setting], capture_output=True, text=True, check=True
    )
    assert inside.stdout == "0\n"
    high = subprocess.run(
        [*launcher, "--port", "8080", "--", "cat", setting], capture_output=True, text=True, check=True
    )
    with open(setting) as host:
        assert high.stdout == host.read()  # a namespace's own default, as the host's: untouched


@needs_namespaces
def test_a_namespaced_app_on_another_port_is_diagnosed_and_its_probe_says_nothing_answered(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    driver = make_driver(NETNS)
    spec = parse_spec(
        {
            "service": {"readiness_probe": "/", "replicas": 1},
            "resources": {"ports": 8080},
            "run": "exec python3 -m http.server 9000 --bind 127.0.0.1",
        }
    )
    instance = driver.launch(LaunchRequest("web", "uid1", 1, 0, spec))
    message = eventually(lambda: driver.diagnose(instance))
    # $PORT is the spec's port here: what to change is the spec or the app, not "read $PORT".
    assert message == (
        "listening on 9000, not on the spec's port 8080 ($PORT): set the spec's port to it "
        "(`service.ports: 9000`), or make the app listen on 8080"
    )
    url = driver.base_url(instance, 8080)
    assert url is not None
    result = probe_one(ProbeTarget("r", url, ReadinessProbe(path="/", timeout_seconds=2)))
    assert result.detail == "connection closed before an answer"


@needs_namespaces
def test_a_replica_killed_by_a_signal_ends_as_its_app_did(make_driver: Callable[[str], ProcessDriver]) -> None:
    driver = make_driver(NETNS)
    spec = parse_spec({"service": {"readiness_probe": "/", "replicas": 1}, "run": "sleep 0.2; kill -KILL $$"})
    instance = driver.launch(LaunchRequest("web", "uid1", 1, 0, spec))

    def ended() -> Any:
        found = driver.instance(instance.instance_id)
        return found if found is not None and found.state is InstanceState.TERMINATED else None

    gone = eventually(ended)
    assert gone.state_reason_code == PROCESS_EXITED
    assert gone.state_reason.endswith("exited with code -9 (killed by SIGKILL)")


def test_without_namespaces_a_replica_whose_port_is_taken_names_the_replica_holding_it(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    driver = make_driver(SHARED)
    assert driver.isolation == SHARED
    port = free_port()
    first = launch(driver, 0, port)
    eventually(lambda: fetch(f"http://127.0.0.1:{port}/id.txt"))  # replica 0 holds the port
    second = launch(driver, 1, port)

    def ended() -> Any:
        found = driver.instance(second.instance_id)
        return found if found is not None and found.state is InstanceState.TERMINATED else None

    gone = eventually(ended)
    pid = first.instance_id.rsplit("pid", 1)[1]
    assert gone.state_reason_code == PROCESS_EXITED
    assert f"port {port} is taken by replica 0 of web (pid " in gone.state_reason
    assert gone.state_reason.startswith(f"{PROCESS_EXITED}: the replica process exited with code 1: port {port}")
    assert "each must listen on its $PORT" in gone.state_reason
    assert pid  # the holder is named by pid, a process of replica 0's group
    # The one that did bind is told it listens elsewhere than its $PORT.
    assert driver.diagnose(first) is not None


def test_without_namespaces_a_port_held_by_another_program_names_its_command(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    driver = make_driver(SHARED)
    port = free_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); time.sleep(60)",
        ]
    )
    try:
        eventually(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True)
        instance = launch(driver, 0, port)

        def ended() -> Any:
            found = driver.instance(instance.instance_id)
            return found if found is not None and found.state is InstanceState.TERMINATED else None

        gone = eventually(ended)
        assert f"port {port} is taken by `{sys.executable} -c import socket" in gone.state_reason
        assert f"(pid {holder.pid})" in gone.state_reason
    finally:
        holder.kill()
        holder.wait()


def test_isolation_is_one_of_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use one of auto, netns, shared"):
        ProcessDriver(tmp_path, isolation="vm")


def test_the_host_relay_resets_a_connection_when_nothing_listens_behind_it(tmp_path: Path) -> None:
    relay = netns.HostRelay(str(tmp_path / "nobody.sock"))
    try:
        result = probe_one(ProbeTarget("r", f"http://127.0.0.1:{relay.port}", ReadinessProbe(path="/")))
        assert result.detail == "connection closed before an answer"
    finally:
        relay.close()


def test_logs_and_work_dirs_are_per_incarnation_and_go_with_it(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    driver = make_driver(SHARED)
    spec = parse_spec(
        {"service": {"readiness_probe": "/", "replicas": 1}, "run": "echo run-$FLEETKEEPER_SERVICE; sleep 30"}
    )
    old = driver.launch(LaunchRequest("web", "uid-old", 1, 0, spec))
    new = driver.launch(LaunchRequest("web", "uid-new", 1, 0, spec))
    assert driver.log_path("web", "uid-old", 0) != driver.log_path("web", "uid-new", 0)
    assert driver.work_dir("web", "uid-old", 0).is_dir() and driver.work_dir("web", "uid-new", 0).is_dir()
    driver.terminate([old.instance_id])
    driver.remove_incarnation("web", "uid-old")
    assert not (driver.local_dir / "logs" / "web" / "uid-old").exists()
    assert not (driver.local_dir / "work" / "web" / "uid-old").exists()
    assert driver.log_path("web", "uid-new", 0).exists()  # the other incarnation keeps its own
    driver.terminate([new.instance_id])
    driver.remove_incarnation("web", "uid-new")
    assert not (driver.local_dir / "logs" / "web").exists()
    assert not (driver.local_dir / "work" / "web").exists()


def test_a_log_since_a_moment_starts_at_the_size_it_had_then(tmp_path: Path) -> None:
    log = tmp_path / "replica-0.log"
    log.write_text("a\nb\nc\n")
    assert offset_since(log, 100) == 0  # no marks yet: all of it
    (tmp_path / "replica-0.log.times").write_text("100 2\n105 4\n110 6\n")
    assert offset_since(log, 99) == 0
    assert offset_since(log, 100) == 0
    assert offset_since(log, 101) == 2
    assert offset_since(log, 107) == 4
    assert offset_since(log, 200) == 6


def test_the_driver_notes_when_each_log_grew(make_driver: Callable[[str], ProcessDriver]) -> None:
    driver = make_driver(SHARED)
    spec = parse_spec({"service": {"readiness_probe": "/", "replicas": 1}, "run": "echo hello; sleep 30"})
    driver.launch(LaunchRequest("web", "uid1", 1, 0, spec))
    times = driver.log_path("web", "uid1", 0).with_name("replica-0.log.times")
    marks = eventually(lambda: times.read_text().splitlines())
    moment, size = marks[-1].split()
    assert abs(int(moment) - time.time()) < 30 and int(size) > 0


def test_logs_of_a_service_are_read_from_the_incarnation_asked_for_else_the_newest(tmp_path: Path) -> None:
    (tmp_path / "web" / "old").mkdir(parents=True)
    (tmp_path / "web" / "new").mkdir()
    os.utime(tmp_path / "web" / "old", (1000, 1000))
    os.utime(tmp_path / "web" / "new", (2000, 2000))
    assert incarnation_folder(tmp_path / "web", "old") == tmp_path / "web" / "old"
    assert incarnation_folder(tmp_path / "web", None) == tmp_path / "web" / "new"
    assert not incarnation_folder(tmp_path / "none", None).exists()


def test_local_asked_for_namespaces_where_there_are_none_exits_2_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetkeeper.local import server
    from fleetkeeper.local.options import Options

    monkeypatch.setattr(server, "namespaces_available", lambda: (False, "unshare: Operation not permitted"))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        assert server.serve(Options(port=0, local_dir=tmp_path, isolation=NETNS)) == 2
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert capsys.readouterr().err == (
        "fleetkeeper local: --isolation netns: unshare: Operation not permitted; use --isolation shared (or auto)\n"
    )


def test_without_namespaces_the_port_an_apps_message_names_is_the_one_reported(
    make_driver: Callable[[str], ProcessDriver],
) -> None:
    driver = make_driver(SHARED)
    port = free_port()  # nothing holds it by the time the replica looks: "another process"
    spec = parse_spec(
        {
            "service": {"readiness_probe": "/", "replicas": 1},
            "resources": {"ports": 8080},
            "run": f'echo "listen tcp 127.0.0.1:{port}: bind: address already in use" >&2; exit 1',
        }
    )
    instance = driver.launch(LaunchRequest("web", "uid1", 1, 0, spec))

    def ended() -> Any:
        found = driver.instance(instance.instance_id)
        return found if found is not None and found.state is InstanceState.TERMINATED else None

    gone = eventually(ended)
    assert f"exited with code 1: port {port} is taken by another process; replicas share" in gone.state_reason


def test_the_port_hint_says_what_to_change_for_each_isolation() -> None:
    assert port_mismatch([9000, 9001], 8080, isolated=True) == (
        "listening on 9000, 9001, not on the spec's port 8080 ($PORT): set the spec's port "
        "(`service.ports`) to the one it serves on, or make the app listen on 8080"
    )
    assert port_mismatch([8080], 52933, isolated=False) == (
        "listening on 8080, expected $PORT=52933: replicas share this machine's loopback here, so each gets "
        "a free port in $PORT: make the app listen on $PORT"
    )
