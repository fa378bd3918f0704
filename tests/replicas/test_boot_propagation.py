"""A replica's boot waits for IAM to catch up, and says so when it never does.

An owner's role is made seconds before its replica launches (fleetkeeper/replicas/identity.py); until
IAM has propagated it, IMDS answers 404 for the role's credentials, S3 403 AccessDenied and SSM 400
AccessDeniedException. The boot (run as the replica runs it: a subprocess, real HTTP on 127.0.0.1)
retries exactly those answers within its propagation bound, fails at once on a real refusal, and,
past the bound, writes a typed environment failure that the user data serves on the replica's port
and the reconciler's probe reads (tests/reconciler/plan/test_failures.py: never the version's).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.reconciler import replica_boot
from fleetkeeper.reconciler.probe import ProbeTarget, probe_one
from fleetkeeper.reconciler.userdata import BootSource, render
from fleetkeeper.spec.service import parse_spec
from tests.replicas.test_boot import STACK_KEY, file_entry, tarball
from tests.support.local_boot import fake_commands, relocated

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PARAMETER = "/fleetkeeper/t/_o/0123456789abcdef/web/u1/r1"
VALUES = {"HF_TOKEN": "hf_secret"}


@dataclass
class Refusals:
    """How many more times each endpoint refuses as an unpropagated role would be refused (-1: always)."""

    credentials: int = 0
    s3: int = 0
    ssm: int = 0
    seen: dict[str, int] = field(default_factory=lambda: {"credentials": 0, "s3": 0, "ssm": 0})

    def refuse(self, what: str) -> bool:
        left = getattr(self, what)
        if left == 0:
            return False
        setattr(self, what, left - 1 if left > 0 else left)
        self.seen[what] += 1
        return True


def _imds(refusals: Refusals) -> type[BaseHTTPRequestHandler]:
    class Imds(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self._send(200, b"imds-token")

        def do_GET(self) -> None:
            base = "/latest/meta-data/iam/security-credentials/"
            if self.path.startswith(base) and refusals.refuse("credentials"):
                self._send(404, b"")  # what IMDS answers while the profile's role has no credentials yet
            elif self.path == base:
                self._send(200, b"fk-stack-0123456789abcdef")
            elif self.path == base + "fk-stack-0123456789abcdef":
                self._send(200, json.dumps({"AccessKeyId": "k", "SecretAccessKey": "s", "Token": "t"}).encode())
            elif self.path == "/latest/meta-data/placement/region":
                self._send(200, b"us-east-1")
            else:
                self._send(404, b"")

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    return Imds


def _aws(refusals: Refusals, moto_url: str) -> type[BaseHTTPRequestHandler]:
    """In front of moto: S3 and SSM refuse as AWS refuses an unpropagated role, then pass through."""

    class Aws(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if refusals.refuse("s3"):
                body = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                self._send(403, body, "application/xml")
            else:
                self._forward(b"")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if refusals.refuse("ssm"):
                denied = {"__type": "AccessDeniedException", "message": "User: ... is not authorized"}
                self._send(400, json.dumps(denied).encode(), "application/x-amz-json-1.1")
            else:
                self._forward(body)

        def _forward(self, body: bytes) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            request = urllib.request.Request(
                moto_url + self.path, data=body or None, method=self.command, headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    self._send(answer.status, answer.read(), answer.headers.get("Content-Type", ""))
            except urllib.error.HTTPError as exc:
                self._send(exc.code, exc.read(), exc.headers.get("Content-Type", ""))

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    return Aws


@dataclass
class World:
    refusals: Refusals
    imds: str
    aws: str
    digest: str
    key: str


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def world() -> Iterator[World]:
    import boto3
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    moto_url = f"http://{host}:{port}"
    # moto's backends are the process's: start from an empty AWS whatever ran before.
    urllib.request.urlopen(urllib.request.Request(moto_url + "/moto-api/reset", method="POST"), timeout=10).close()
    kw: dict[str, Any] = {
        "endpoint_url": moto_url,
        "region_name": "us-east-1",
        "aws_access_key_id": "local",
        "aws_secret_access_key": "local",
    }
    data = tarball([file_entry("server.py", b"print('hi')\n")])
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    key = f"services/_o/0123456789abcdef/web/u1/{digest[7:]}.tar.gz"
    s3 = boto3.client("s3", **kw)
    s3.create_bucket(Bucket="fk-workdirs")
    s3.put_object(Bucket="fk-workdirs", Key=key, Body=data)
    boto3.client("ssm", **kw).put_parameter(
        Name=PARAMETER, Value=json.dumps(VALUES), Type="SecureString", KeyId=STACK_KEY
    )
    refusals = Refusals()
    imds, aws = _serve(_imds(refusals)), _serve(_aws(refusals, moto_url))
    try:
        yield World(
            refusals,
            f"http://127.0.0.1:{imds.server_address[1]}",
            f"http://127.0.0.1:{aws.server_address[1]}",
            digest,
            key,
        )
    finally:
        imds.shutdown()
        aws.shutdown()
        moto.stop()


def _boot(
    world: World, tmp_path: Path, *, bound: float, parameter: str = PARAMETER
) -> subprocess.CompletedProcess[str]:
    args = ["--bucket", "fk-workdirs", "--key", world.key, "--digest", world.digest, "--dest", str(tmp_path / "work")]
    args += ["--parameter", parameter, "--kms-key", STACK_KEY, "--secret-names", "HF_TOKEN"]
    args += ["--env-file", str(tmp_path / "secrets.env"), "--report", str(tmp_path / "report.json")]
    args += ["--propagation-seconds", str(bound)]
    env = {
        "FLEETKEEPER_BOOT_IMDS": world.imds,
        "FLEETKEEPER_BOOT_ENDPOINT": world.aws,
        "FLEETKEEPER_BOOT_BACKOFF_SECONDS": "0.05",
        "PATH": "/usr/bin:/bin",
    }
    command = [sys.executable, replica_boot.__file__, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)


def test_the_boot_waits_for_iam_to_catch_up(world: World, tmp_path: Path) -> None:
    world.refusals.credentials, world.refusals.s3, world.refusals.ssm = 3, 2, 2
    done = _boot(world, tmp_path, bound=60)
    assert done.returncode == 0, done.stderr
    assert world.refusals.seen == {"credentials": 3, "s3": 2, "ssm": 2}  # every refusal was met, and waited out
    assert (tmp_path / "work" / "server.py").exists()
    assert (tmp_path / "secrets.env").read_text() == 'HF_TOKEN="hf_secret"\n'
    assert not (tmp_path / "report.json").exists()


@pytest.mark.parametrize("refusing", ["credentials", "s3", "ssm"])
def test_iam_that_never_catches_up_is_reported_as_the_environments(world: World, tmp_path: Path, refusing: str) -> None:
    setattr(world.refusals, refusing, -1)
    started = time.monotonic()
    done = _boot(world, tmp_path, bound=1.5)
    took = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["code"] == replica_boot.IDENTITY_NOT_READY == "Fleetkeeper.BootIdentityNotReady"
    assert "IAM propagation" in report["message"]
    assert world.refusals.seen[refusing] > 3  # retried with a backoff, not given up on at once
    assert 1.5 <= took < 30  # the bound, and not much more
    assert not (tmp_path / "secrets.env").exists()


def test_a_real_refusal_is_the_versions_and_is_not_waited_for(world: World, tmp_path: Path) -> None:
    started = time.monotonic()
    done = _boot(world, tmp_path, bound=60, parameter=PARAMETER + "-gone")  # SSM: 400 ParameterNotFound
    assert done.returncode == 1, done.stderr
    assert "ParameterNotFound" in done.stderr
    assert time.monotonic() - started < 30  # the 60 s bound was never waited for
    assert not (tmp_path / "report.json").exists()


def test_the_failure_report_is_what_the_probe_reads(tmp_path: Path) -> None:
    failure = replica_boot.EnvironmentFailure(replica_boot.SECRETS_REJECTED, "the secrets parameter ... failed")
    replica_boot.write_report(str(tmp_path / "report.json"), failure)
    server = replica_boot.report_server(str(tmp_path / "report.json"), 0, "127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from fleetkeeper.spec.service import ReadinessProbe

        base = f"http://127.0.0.1:{server.server_address[1]}"
        for probe in (ReadinessProbe(path="/health"), ReadinessProbe(path="/v1/chat", post_data={"q": 1})):
            result = probe_one(ProbeTarget("r0", base, probe))
            assert (result.ok, result.boot_failure) == (False, "Fleetkeeper.SecretsParameterRejected")
            assert result.detail == "HTTP 503 (boot failed: Fleetkeeper.SecretsParameterRejected)"
    finally:
        server.shutdown()
        server.server_close()


class _Forged(BaseHTTPRequestHandler):
    """An app that answers 503 with the header and a code fleetkeeper does not know."""

    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header(replica_boot.REPORT_HEADER, "Fleetkeeper.AnythingElse")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


def test_only_known_codes_become_a_boot_failure() -> None:
    from fleetkeeper.spec.service import ReadinessProbe

    server = _serve(_Forged)
    try:
        result = probe_one(ProbeTarget("r0", f"http://127.0.0.1:{server.server_address[1]}", ReadinessProbe(path="/")))
        assert (result.ok, result.boot_failure, result.detail) == (False, None, "HTTP 503")
    finally:
        server.shutdown()


def test_the_user_data_serves_an_environment_failure_on_the_replicas_port(world: World, tmp_path: Path) -> None:
    """The rendered user data, run by bash: the boot fails for the environment, the report unit is
    started (systemd-run, faked) on the spec's port, and no unit of the version is enabled."""
    world.refusals.ssm = -1
    spec = parse_spec(
        {
            "service": {"readiness_probe": {"path": "/health", "initial_delay_seconds": 3}, "ports": 9000},
            "run": "serve",
            "secrets": {"HF_TOKEN": "x"},
        }
    ).without_secret_values()
    source = BootSource(parameter=PARAMETER, kms_key=STACK_KEY)
    root = tmp_path / "root"
    bin_dir = tmp_path / "bin"
    fake_commands(bin_dir, tmp_path)
    (bin_dir / "python3").symlink_to(sys.executable)
    script = relocated(render(spec, source), tmp_path)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FLEETKEEPER_BOOT_IMDS": world.imds,
        "FLEETKEEPER_BOOT_ENDPOINT": world.aws,
        "FLEETKEEPER_BOOT_BACKOFF_SECONDS": "0.05",
    }
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 1
    assert "--propagation-seconds 1" in script  # half the initial delay
    served = (tmp_path / "systemd-run.log").read_text().split()
    assert served[:2] == ["--unit=fleetkeeper-boot-report", "--property=Restart=always"]
    assert served[-4:] == ["--serve-report", f"{root}/boot-failure.json", "--port", "9000"]
    assert json.loads((root / "boot-failure.json").read_text())["code"] == replica_boot.IDENTITY_NOT_READY
    assert not (tmp_path / "systemctl.log").exists()  # nothing of the version was enabled
