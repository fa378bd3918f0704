"""A replica in China (aws-cn) reaches amazonaws.com.cn endpoints: the reconciler puts its region's
partition DNS suffix (botocore's partition data) in the user data, and the boot and the log shipper
build their S3, SSM and CloudWatch Logs URLs with it."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.aws.partitions import dns_suffix
from fleetkeeper.reconciler import replica_boot, replica_logs
from fleetkeeper.reconciler.driver import LaunchRequest
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.reconciler.userdata import render
from fleetkeeper.settings import Ec2Settings
from fleetkeeper.spec.service import parse_spec
from tests.replicas.test_boot import file_entry, tarball

CN_KEY = "arn:aws-cn:kms:cn-north-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.mark.parametrize(
    ("region", "suffix"),
    [
        ("cn-north-1", "amazonaws.com.cn"),
        ("cn-northwest-1", "amazonaws.com.cn"),
        ("cn-south-7", "amazonaws.com.cn"),  # a region newer than botocore: its partition's pattern
        ("us-gov-west-1", "amazonaws.com"),
        ("eu-west-1", "amazonaws.com"),
        (None, "amazonaws.com"),
    ],
)
def test_a_regions_dns_suffix_is_its_partitions(region: str | None, suffix: str) -> None:
    assert dns_suffix(region) == suffix


def test_a_cn_north_1_replica_is_rendered_with_the_china_suffix() -> None:
    environ = {
        "TABLE_NAME": "fk",
        "AWS_REGION": "cn-north-1",
        "WORKDIR_BUCKET": "fk-workdirs",
        "FLEETKEEPER_REPLICA_LOG_GROUP": "/fleetkeeper/fk/replicas",
        "FLEETKEEPER_SECRETS_KEY_ID": CN_KEY,
    }
    driver = Ec2Driver.from_settings(Ec2Settings.from_env(environ))
    spec = parse_spec(
        {"service": {}, "run": "serve", "workdir": {"digest": "sha256:" + "c" * 64}, "secrets": {"HF_TOKEN": "x"}}
    ).without_secret_values()
    request = LaunchRequest(service="web", uid="u1", version=1, replica_id=0, spec=spec, secrets_ref="r1")
    script = render(spec, driver._boot_source(request))
    assert "amazonaws.com\n" not in script and ".amazonaws.com " not in script
    boot = next(line for line in script.splitlines() if line.startswith("if ! python3 /opt/fleetkeeper/replica_boot"))
    assert "--dns-suffix amazonaws.com.cn" in boot
    assert f"--kms-key {CN_KEY}" in boot
    [logs_env] = re.findall(r"^echo '([A-Za-z0-9+/=]+)' \| base64 -d > /opt/fleetkeeper/logs.env$", script, re.M)
    assert 'FK_DNS_SUFFIX="amazonaws.com.cn"' in base64.b64decode(logs_env).decode()
    [unit] = re.findall(
        r"^echo '([A-Za-z0-9+/=]+)' \| base64 -d > /etc/systemd/system/fleetkeeper-logs.service$", script, re.M
    )
    assert "--dns-suffix ${FK_DNS_SUFFIX}" in base64.b64decode(unit).decode()  # the shipper's unit passes it on


class _Recorder:
    """urllib's stand-in for the boot: the URLs it asks for, answered as S3 and SSM would."""

    def __init__(self, archive: bytes) -> None:
        self.urls: list[str] = []
        self.archive = archive

    def __call__(
        self, url: str, method: str = "GET", headers: Any = None, data: Any = None, timeout: float = 0
    ) -> bytes:
        self.urls.append(url)
        if "X-Amz-Target" in (headers or {}) or "x-amz-target" in (headers or {}):
            entry = {"Type": "SecureString", "KeyId": CN_KEY, "Version": 1, "Value": json.dumps({"HF_TOKEN": "v"})}
            return json.dumps({"Parameters": [entry]}).encode()
        return self.archive


def test_the_boot_and_the_shipper_call_the_china_endpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    archive = tarball([file_entry("server.py", b"print(1)\n")])
    digest = "sha256:" + hashlib.sha256(archive).hexdigest()
    recorder = _Recorder(archive)
    creds = {"key": "k", "secret": "s", "token": "t"}
    monkeypatch.setattr(replica_boot, "_request", recorder)
    monkeypatch.setattr(replica_boot, "instance_identity", lambda: ("cn-north-1", creds))
    args = ["--bucket", "fk-workdirs", "--key", "services/web/u1/x.tar.gz", "--digest", digest]
    args += ["--dest", str(tmp_path / "work"), "--env-file", str(tmp_path / "secrets.env")]
    args += ["--parameter", "/fleetkeeper/fk/web/u1/r1", "--kms-key", CN_KEY, "--secret-names", "HF_TOKEN"]
    assert replica_boot.main([*args, "--dns-suffix", "amazonaws.com.cn"]) == 0
    assert recorder.urls == [
        "https://fk-workdirs.s3.cn-north-1.amazonaws.com.cn/services/web/u1/x.tar.gz",
        "https://ssm.cn-north-1.amazonaws.com.cn/",
    ]
    shipper = replica_logs.Shipper("/fleetkeeper/fk/replicas", "web/u1/0", dns_suffix="amazonaws.com.cn")
    shipper.send([{"timestamp": 1, "message": "hello"}])
    assert recorder.urls[2:] == ["https://logs.cn-north-1.amazonaws.com.cn/"] * 2  # CreateLogStream, PutLogEvents
