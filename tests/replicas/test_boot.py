"""A replica's first boot: replica_boot.py fetches the workdir (S3) and secrets (SSM) with the
instance role and nothing but the standard library; the user data runs it before `setup`.

Its SigV4 signatures are compared with botocore's for the same requests; it is run as the replica
runs it (a subprocess with the images' python3) against a fake IMDSv2 and an in-memory AWS.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.reconciler import replica_boot
from fleetkeeper.reconciler.userdata import BootSource, render, user_data
from fleetkeeper.spec.service import parse_spec

if TYPE_CHECKING:
    pass

# The stack's secrets key, as the reconciler names it in the user data (template.yaml SecretsKey.Arn).
STACK_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
CREDS = {"key": "AKIDEXAMPLE", "secret": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "token": "session-token"}


def botocore_headers(
    method: str, url: str, headers: dict[str, str], body: bytes, service: str
) -> tuple[dict[str, str], datetime.datetime]:
    """botocore's signature of the request, and the moment it signed at (its X-Amz-Date)."""
    from botocore.auth import S3SigV4Auth, SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=url, headers=headers, data=body)
    auth = (S3SigV4Auth if service == "s3" else SigV4Auth)(
        Credentials(CREDS["key"], CREDS["secret"], CREDS["token"]), service, "eu-west-1"
    )
    auth.add_auth(request)
    signed = {k.lower(): v for k, v in request.headers.items()}
    moment = datetime.datetime.strptime(signed["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    return signed, moment


def test_an_ssm_request_is_signed_as_botocore_signs_it() -> None:
    url = "https://ssm.eu-west-1.amazonaws.com/"
    body = json.dumps({"Name": "/fleetkeeper/t/web/u1/r1", "WithDecryption": True}).encode()
    headers = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "AmazonSSM.GetParameter"}
    theirs, moment = botocore_headers("POST", url, headers, body, "ssm")
    ours = replica_boot.sign("POST", url, headers, body, "ssm", "eu-west-1", CREDS, moment)
    assert ours["authorization"] == theirs["authorization"]
    assert ours["x-amz-security-token"] == "session-token"


def test_an_s3_get_is_signed_as_botocore_signs_it() -> None:
    url = replica_boot.s3_url("fk-workdirs", "services/web/u1/" + "a" * 64 + ".tar.gz", "eu-west-1")
    theirs, moment = botocore_headers("GET", url, {}, b"", "s3")
    ours = replica_boot.sign("GET", url, {}, b"", "s3", "eu-west-1", CREDS, moment)
    assert ours["authorization"] == theirs["authorization"]
    assert ours["x-amz-content-sha256"] == hashlib.sha256(b"").hexdigest()


def tarball(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def file_entry(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def test_unpack_checks_the_digest_then_unpacks(tmp_path: Path) -> None:
    data = tarball([file_entry("app/server.py", b"print(1)\n")])
    with pytest.raises(replica_boot.BootError, match="refusing to unpack"):
        replica_boot.unpack(data, "sha256:" + "0" * 64, tmp_path / "a")
    replica_boot.unpack(data, "sha256:" + hashlib.sha256(data).hexdigest(), tmp_path / "b")
    assert (tmp_path / "b" / "app" / "server.py").read_text() == "print(1)\n"


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/escape.txt"])
def test_unpack_refuses_entries_outside_the_directory(tmp_path: Path, name: str) -> None:
    data = tarball([file_entry(name, b"x")])
    with pytest.raises(replica_boot.BootError, match="outside its directory"):
        replica_boot.unpack(data, "sha256:" + hashlib.sha256(data).hexdigest(), tmp_path / "w")


def test_unpack_refuses_links_out_of_the_directory(tmp_path: Path) -> None:
    link = tarfile.TarInfo("passwd")
    link.type, link.linkname = tarfile.SYMTYPE, "../../etc/passwd"
    data = tarball([(link, None)])
    with pytest.raises(replica_boot.BootError, match="links out"):
        replica_boot.unpack(data, "sha256:" + hashlib.sha256(data).hexdigest(), tmp_path / "w")


# --- the whole boot, as a replica runs it ---------------------------------------------------------------


def test_a_replica_fetches_its_workdir_and_secrets_at_boot(endpoints: tuple[str, str], tmp_path: Path) -> None:
    import boto3

    aws_url, imds_url = endpoints
    kw: dict[str, Any] = {
        "endpoint_url": aws_url,
        "region_name": "us-east-1",
        "aws_access_key_id": "local",
        "aws_secret_access_key": "local",
    }
    data = tarball([file_entry("server.py", b"print('hi')\n"), file_entry("conf/app.toml", b"a = 1\n")])
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    key = f"services/web/u1/{digest[7:]}.tar.gz"
    s3 = boto3.client("s3", **kw)
    s3.create_bucket(Bucket="fk-workdirs")
    s3.put_object(Bucket="fk-workdirs", Key=key, Body=data)
    values = {"HF_TOKEN": 'tok "quoted" \\ $x', "PEM": "-----BEGIN-----\nabc\n-----END-----"}
    boto3.client("ssm", **kw).put_parameter(
        Name="/fleetkeeper/t/web/u1/r1", Value=json.dumps(values), Type="SecureString", KeyId=STACK_KEY
    )

    env_file = tmp_path / "secrets.env"
    args = ["--bucket", "fk-workdirs", "--key", key, "--digest", digest, "--dest", str(tmp_path / "work")]
    args += ["--parameter", "/fleetkeeper/t/web/u1/r1", "--env-file", str(env_file)]
    args += ["--kms-key", STACK_KEY, "--secret-names", "HF_TOKEN,PEM"]
    done = subprocess.run(
        [sys.executable, replica_boot.__file__, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"FLEETKEEPER_BOOT_IMDS": imds_url, "FLEETKEEPER_BOOT_ENDPOINT": aws_url, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "work" / "conf" / "app.toml").read_text() == "a = 1\n"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert env_file.read_text() == replica_boot.environment_file(values)
    assert "tok" not in done.stdout + done.stderr  # a value is never printed
    assert "2 secret(s) written" in done.stdout

    # A digest that is not the object's: the boot fails, nothing is unpacked.
    bad = subprocess.run(
        [
            sys.executable,
            replica_boot.__file__,
            "--bucket",
            "fk-workdirs",
            "--key",
            key,
            "--digest",
            "sha256:" + "0" * 64,
            "--dest",
            str(tmp_path / "bad"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"FLEETKEEPER_BOOT_IMDS": imds_url, "FLEETKEEPER_BOOT_ENDPOINT": aws_url, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert bad.returncode == 1 and "refusing to unpack" in bad.stderr
    assert not (tmp_path / "bad").exists()


# --- the user data ------------------------------------------------------------------------------------------


def test_the_user_data_fetches_before_setup_and_names_no_value() -> None:
    spec = parse_spec(
        {
            "service": {},
            "run": "python3 server.py",
            "setup": "pip install -r requirements.txt",
            "workdir": {"digest": "sha256:" + "c" * 64},
            "secrets": {"HF_TOKEN": "hf_value_never_in_user_data"},
        }
    ).without_secret_values()
    source = BootSource(
        bucket="fk-workdirs",
        workdir_key="services/web/u1/" + "c" * 64 + ".tar.gz",
        parameter="/fleetkeeper/t/web/u1/r1",
    )
    script = render(spec, source)
    boot = next(
        line for line in script.splitlines() if line.startswith("if ! python3 /opt/fleetkeeper/replica_boot.py")
    )
    assert "--key services/web/u1/" in boot and f"--digest sha256:{'c' * 64}" in boot
    assert "--parameter /fleetkeeper/t/web/u1/r1" in boot
    # The names the version declares and the key it must be under (Parameter Store's default without one).
    assert "--secret-names HF_TOKEN" in boot and "--kms-key alias/aws/ssm" in boot
    assert "--kms-key " + STACK_KEY in render(spec, replace(source, kms_key=STACK_KEY))
    # Fetched first, then the units (both read the secrets' EnvironmentFile) are enabled.
    assert script.index("replica_boot.py --dest") < script.index("systemctl enable")
    units = [base64.b64decode(line.split("'")[1]).decode() for line in script.splitlines() if line.startswith("echo '")]
    assert sum("EnvironmentFile=-/opt/fleetkeeper/secrets.env" in unit for unit in units) == 2
    assert "hf_value_never_in_user_data" not in script
    assert len(user_data(spec, source)) <= 16 * 1024


def test_a_version_without_workdir_or_secrets_boots_as_before() -> None:
    spec = parse_spec({"service": {}, "run": "serve"})
    assert "replica_boot" not in render(spec, BootSource(bucket="fk-workdirs"))
