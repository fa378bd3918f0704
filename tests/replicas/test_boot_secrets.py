"""A replaced secrets parameter is not code execution (issue 34).

A principal allowed ssm:DeleteParameter and ssm:PutParameter on the stack's path, with no right on
its KMS key, can recreate a version's parameter as a String (or a SecureString under another key)
holding `{"BASH_ENV": "$(...)"}`: written into secrets.env it would run as root in every unit's bash.
The boot accepts only the newest version of a SecureString under the stack's key whose names are
exactly the version's, refuses names that make a value code, and writes values so that neither
systemd nor bash reads anything but the value. The api refuses those names in a spec.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.reconciler import replica_boot
from fleetkeeper.spec import secret_names
from tests.replicas.test_boot import STACK_KEY
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

NAME = "/fleetkeeper/t/web/u1/r1"
OTHER_KEY = "arn:aws:kms:us-east-1:123456789012:key/99999999-12ab-34cd-56ef-1234567890ab"
PWNED = "/tmp/fleetkeeper-pwned"


def _ssm(aws_url: str) -> Any:
    import boto3

    return boto3.client(
        "ssm", endpoint_url=aws_url, region_name="us-east-1", aws_access_key_id="l", aws_secret_access_key="l"
    )


def _boot(endpoints: tuple[str, str], tmp_path: Path, names: str = "HF_TOKEN") -> subprocess.CompletedProcess[str]:
    aws_url, imds_url = endpoints
    args = ["--parameter", NAME, "--kms-key", STACK_KEY, "--secret-names", names]
    args += ["--env-file", str(tmp_path / "secrets.env"), "--report", str(tmp_path / "report.json")]
    env = {"FLEETKEEPER_BOOT_IMDS": imds_url, "FLEETKEEPER_BOOT_ENDPOINT": aws_url, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, replica_boot.__file__, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)


def _assert_rejected(done: subprocess.CompletedProcess[str], tmp_path: Path, says: str) -> None:
    assert done.returncode == 3, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["code"] == replica_boot.SECRETS_REJECTED == "Fleetkeeper.SecretsParameterRejected"
    assert "failed verification" in report["message"] and says in report["message"], report["message"]
    assert not (tmp_path / "secrets.env").exists()  # nothing of it written


# --- the parameter, as the boot reads it from SSM -------------------------------------------------------


@pytest.mark.parametrize(
    ("put", "says"),
    [
        # Recreated as a plain String: no KMS right needed to write it.
        ({"Type": "String", "Value": json.dumps({"HF_TOKEN": "x", "BASH_ENV": f"$(touch {PWNED})"})}, "not a Secure"),
        # A SecureString, but under another key (Parameter Store's default key, or anyone's).
        ({"Type": "SecureString", "Value": json.dumps({"HF_TOKEN": "x"})}, "not the stack's key"),
        ({"Type": "SecureString", "Value": json.dumps({"HF_TOKEN": "x"}), "KeyId": OTHER_KEY}, "not the stack's key"),
    ],
)
def test_a_parameter_fleetkeeper_did_not_write_is_refused(
    endpoints: tuple[str, str], tmp_path: Path, put: dict[str, str], says: str
) -> None:
    _ssm(endpoints[0]).put_parameter(Name=NAME, **put)
    _assert_rejected(_boot(endpoints, tmp_path), tmp_path, says)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"HF_TOKEN": "x", "EXTRA": "y"}, "does not declare: 'EXTRA'"),
        ({"HF_TOKEN": "x", "BASH_ENV": f"$(touch {PWNED})"}, "does not declare: 'BASH_ENV'"),
        ({"HF_TOKEN\nBASH_ENV": "x"}, "does not declare: 'HF_TOKEN\\nBASH_ENV'"),
        ({}, "lacks declared names: HF_TOKEN"),
        ({"HF_TOKEN": 7}, "not text"),
        ({"HF_TOKEN": "a\x00b"}, "not text"),
    ],
)
def test_names_other_than_the_versions_are_refused(
    endpoints: tuple[str, str], tmp_path: Path, values: dict[str, object], says: str
) -> None:
    _ssm(endpoints[0]).put_parameter(Name=NAME, Value=json.dumps(values), Type="SecureString", KeyId=STACK_KEY)
    _assert_rejected(_boot(endpoints, tmp_path), tmp_path, says)


def test_the_newest_version_is_the_one_verified(endpoints: tuple[str, str], tmp_path: Path) -> None:
    ssm = _ssm(endpoints[0])
    ssm.put_parameter(Name=NAME, Value=json.dumps({"HF_TOKEN": "x"}), Type="SecureString", KeyId=STACK_KEY)
    ssm.put_parameter(
        Name=NAME, Value=json.dumps({"HF_TOKEN": "y"}), Type="SecureString", KeyId=OTHER_KEY, Overwrite=True
    )
    _assert_rejected(_boot(endpoints, tmp_path), tmp_path, "not the stack's key")


@pytest.mark.parametrize("newest_is_ours", [True, False])
def test_the_newest_version_is_found_across_pages_of_history(
    endpoints: tuple[str, str], tmp_path: Path, newest_is_ours: bool
) -> None:
    """GetParameterHistory answers 50 versions a page, oldest first: the newest is on the last."""
    ssm = _ssm(endpoints[0])
    first, then = (OTHER_KEY, STACK_KEY) if newest_is_ours else (STACK_KEY, OTHER_KEY)
    for number in range(55):
        key = first if number < 54 else then
        value = json.dumps({"HF_TOKEN": f"v{number}"})
        ssm.put_parameter(Name=NAME, Value=value, Type="SecureString", KeyId=key, Overwrite=number > 0)
    done = _boot(endpoints, tmp_path)
    if newest_is_ours:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "secrets.env").read_text() == 'HF_TOKEN="v54"\n'
    else:
        _assert_rejected(done, tmp_path, "not the stack's key")


def test_a_declared_name_that_runs_code_is_the_versions_failure(endpoints: tuple[str, str], tmp_path: Path) -> None:
    """A version stored before the api refused the name: its own fault, nothing fetched."""
    done = _boot(endpoints, tmp_path, names="HF_TOKEN,BASH_ENV")
    assert done.returncode == 1 and "declares the secret BASH_ENV" in done.stderr
    assert not (tmp_path / "report.json").exists()


def test_the_key_is_its_arn_or_its_id_never_an_alias() -> None:
    assert replica_boot._is_key(STACK_KEY, STACK_KEY)
    assert replica_boot._is_key("1234abcd-12ab-34cd-56ef-1234567890ab", STACK_KEY)
    for other in (OTHER_KEY, "alias/aws/ssm", "alias/fleetkeeper/stack/secrets", "", None, "key/1234abcd"):
        assert not replica_boot._is_key(other, STACK_KEY)


# --- what secrets.env holds, and how the units' readers read it -----------------------------------------

AWKWARD = {
    "QUOTE": "say \"hi\" 'there'",
    "NEWLINE": "line one\nBASH_ENV=/tmp/x\nline three",
    "DOLLAR": f"$(touch {PWNED}) ${{HOME}} `id` $HOME",
    "BACKSLASH": "ends with \\",
    "PEM": "-----BEGIN KEY-----\nabc\n-----END KEY-----\n",
    "SPACES": "  padded  ",
}


def _systemd_env_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile rules for double-quoted values (systemd.exec(5), EnvironmentFile=):
    `\\` before one of `"\\`$` is that character, a backslash-newline is a continuation, any other
    backslash is kept with what follows; quoted text may span lines; no expansion."""
    env: dict[str, str] = {}
    i = 0
    while i < len(text):
        end = text.index("=", i)
        key = text[i:end]
        assert text[end + 1] == '"', text[end:]
        j, value = end + 2, []
        while text[j] != '"':
            if text[j] == "\\":
                following = text[j + 1]
                if following == "\n":
                    pass
                elif following in '"\\`$':
                    value.append(following)
                else:
                    value.append("\\" + following)
                j += 2
            else:
                value.append(text[j])
                j += 1
        assert text[j + 1] == "\n"
        env[key] = "".join(value)
        i = j + 2
    return env


def test_values_reach_systemd_and_bash_exactly_and_define_nothing_else(tmp_path: Path) -> None:
    text = replica_boot.environment_file(AWKWARD)
    assert _systemd_env_file(text) == AWKWARD
    path = tmp_path / "secrets.env"
    path.write_text(text)
    dumped = subprocess.run(
        [
            "bash",
            "-c",
            f'set -a; . {path}; for n in "$@"; do printf "%s\\0" "${{!n}}"; done; compgen -v',
            "-",
            *AWKWARD,
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout
    values = dumped.split("\0")
    assert dict(zip(AWKWARD, values, strict=False)) == AWKWARD
    assert "BASH_ENV" not in values[-1].split()  # the newline did not start an assignment
    assert not Path(PWNED).exists()  # nothing was run


def test_an_env_file_refuses_a_name_that_is_not_a_shell_name() -> None:
    with pytest.raises(replica_boot.BootError, match="not shell names"):
        replica_boot.environment_file({"A\nBASH_ENV": "x"})


# --- the same names, refused by the api ------------------------------------------------------------------


def test_the_boot_and_the_api_refuse_the_same_names() -> None:
    assert replica_boot.REFUSED_SECRET_NAMES == secret_names.REFUSED_SECRET_NAMES
    assert replica_boot.REFUSED_SECRET_PREFIXES == secret_names.REFUSED_SECRET_PREFIXES


@pytest.mark.parametrize(
    "name", ["BASH_ENV", "BASH_FUNC_x", "ENV", "PS4", "SHELLOPTS", "PATH", "LD_PRELOAD", "PYTHONPATH", "NODE_OPTIONS"]
)
def test_a_spec_declaring_a_refused_secret_is_a_400_naming_it(api: HandlerClient, name: str) -> None:
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec(secrets={name: "x", "HF_TOKEN": "y"})})
    assert response.status == 400, response.body
    assert f"secret {name}:" in response.error["message"]
    assert [d["field"] for d in response.error["details"]] == ["spec.secrets"]
    assert api.get("/v1/services").body["services"] == []  # nothing written


@pytest.mark.parametrize("name", ["HF_TOKEN", "PIP_EXTRA_INDEX_URL", "NODE_AUTH_TOKEN", "GIT_TOKEN", "bash_env"])
def test_ordinary_secret_names_are_allowed(name: str) -> None:
    assert not secret_names.refused_secret_name(name)
    assert not replica_boot.refused_secret_name(name)
