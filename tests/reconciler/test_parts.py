"""The reconciler's small parts: user data, probes, the ec2 driver's edges, driver selection."""

from __future__ import annotations

import base64
import gzip
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.reconciler.driver import MANAGED_TAG, STACK_TAG
from fleetkeeper.reconciler.drivers import make_driver
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.reconciler.plan import ProbeResult
from fleetkeeper.reconciler.probe import ProbeTarget, probe_all, probe_one
from fleetkeeper.reconciler.userdata import USER_DATA_LIMIT, environment_file, render, user_data
from fleetkeeper.settings import DEFAULT_STACK_ID, Ec2Settings, Settings
from fleetkeeper.spec.service import ReadinessProbe, ServiceSpec
from tests.conftest import hello_spec

if TYPE_CHECKING:
    from collections.abc import Iterator


def _spec(**overrides: Any) -> ServiceSpec:
    return ServiceSpec.model_validate(hello_spec(**overrides))


def _files(script: str) -> dict[str, str]:
    """The files the boot script writes, decoded."""
    found = re.findall(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d > (\S+)", script)
    return {path: base64.b64decode(encoded).decode() for encoded, path in found}


def test_user_data_runs_setup_once_then_run_as_a_restarting_service_with_envs_and_port() -> None:
    spec = _spec(setup="pip install x", run="serve --port $PORT", envs={"MODEL": 'a "quoted"\\value', "N": 1})
    files = _files(render(spec))
    assert files["/opt/fleetkeeper/setup.sh"].endswith("pip install x\n")
    assert files["/opt/fleetkeeper/run.sh"].endswith("serve --port $PORT\n")
    env = files["/opt/fleetkeeper/env"]
    assert env == environment_file(spec)
    assert 'MODEL="a \\"quoted\\"\\\\value"\n' in env and 'N="1"\n' in env and 'PORT="8080"\n' in env
    run_unit = files["/etc/systemd/system/fleetkeeper-replica.service"]
    assert "Restart=always" in run_unit and "Requires=fleetkeeper-setup.service" in run_unit
    assert "Type=oneshot" in files["/etc/systemd/system/fleetkeeper-setup.service"]


def test_user_data_is_gzipped_only_when_it_would_not_fit() -> None:
    small = user_data(_spec())
    assert small.startswith(b"#!/bin/bash")
    big = user_data(_spec(setup="echo " + "x" * 15_000))
    assert len(render(_spec(setup="echo " + "x" * 15_000))) > USER_DATA_LIMIT
    assert gzip.decompress(big).startswith(b"#!/bin/bash")


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        delay = 3 if self.path == "/slow" else 0
        time.sleep(delay)
        self.send_response(503 if self.path == "/down" else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def http() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _target(base: str, path: str, timeout: int = 5) -> ProbeTarget:
    return ProbeTarget(path, base, ReadinessProbe(path=path, timeout_seconds=timeout))


def test_probe_details_are_deterministic(http: str) -> None:
    assert probe_one(_target(http, "/health")).ok
    assert probe_one(_target(http, "/down")).detail == "HTTP 503"
    assert probe_one(_target(http, "/slow", timeout=1)).detail == "timed out after 1s"
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    port = closed.server_address[1]
    closed.server_close()
    assert probe_one(_target(f"http://127.0.0.1:{port}", "/health")).detail == "connection refused"


def test_the_probe_phase_is_bounded_and_a_late_probe_is_a_failed_one(http: str) -> None:
    started = time.monotonic()
    results = probe_all([_target(http, "/health"), _target(http, "/slow", timeout=10)], budget_seconds=1)
    assert time.monotonic() - started < 2.5
    assert results["/health"].ok
    # No verdict: the run's own phase counts it a failed probe, the long probes' phase leaves it to a
    # run of its own when it could not give the probe its timeout (reconciler.run).
    assert results["/slow"] == ProbeResult(http, False, "no verdict within the run's 1s probe budget", answered=False)


def test_replica_host_replaces_the_instance_address() -> None:
    from fleetkeeper.reconciler.driver import Instance, InstanceState

    instance = Instance("i-1", InstanceState.RUNNING, "svc", "u", 1, 0, private_ip="10.1.2.3")
    assert Ec2Driver.from_settings(Ec2Settings.from_env({})).base_url(instance, 8080) == "http://10.1.2.3:8080"
    replica_host = Ec2Settings.from_env({"FLEETKEEPER_REPLICA_HOST": "127.0.0.1"})
    assert Ec2Driver.from_settings(replica_host).base_url(instance, 9000) == "http://127.0.0.1:9000"
    assert Ec2Driver().base_url(Instance("i-2", InstanceState.PENDING, "svc", "u", 1, 1), 80) is None


def test_terminate_goes_on_when_one_instance_is_already_gone(aws: None) -> None:
    from fleetkeeper import aws as clients

    # The reconciler's role terminates only the stack's managed instances (template.yaml,
    # TerminateOnlyManaged): these carry the tags its own launches do.
    managed = [{"Key": MANAGED_TAG, "Value": "true"}, {"Key": STACK_TAG, "Value": DEFAULT_STACK_ID}]
    made = clients.ec2().run_instances(
        ImageId="ami-12345678",
        MinCount=2,
        MaxCount=2,
        TagSpecifications=[{"ResourceType": "instance", "Tags": managed}],
    )["Instances"]
    ids = [i["InstanceId"] for i in made]
    Ec2Driver().terminate([ids[0], "i-0123456789abcdef0", ids[1]])
    states = clients.ec2().describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"]
    assert {i["State"]["Name"] for i in states} == {"terminated"}


def test_driver_selection() -> None:
    assert isinstance(make_driver(Settings.from_env({"TABLE_NAME": "t"})), Ec2Driver)
    with pytest.raises(ValueError, match="expected 'ec2' or 'process'"):
        Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_DRIVER": "docker"})
