"""SkyPilot's runtime on an EC2 replica, proved on real SkyPilot YAMLs (tests/fixtures/skypilot/): the
user data each boots with (fleetkeeper.reconciler.userdata) runs `setup` and `run` as the `ubuntu`
user with passwordless sudo, HOME /home/ubuntu, in ~/sky_workdir (which holds the workdir), through
SkyPilot's task preamble and with nothing added that changes how the commands behave (no `set -e`).

Each YAML goes through `fleetkeeper up` to the api as its users bring it (tests/spec/test_skypilot_yamls.py),
and the stored spec is rendered as the reconciler renders it. The conda YAMLs' setup then really runs
(as the unit would: its HOME, its working directory, its EnvironmentFiles) against a stand-in conda
that records what it is asked: their `conda activate x || conda create ...` flow works unchanged.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkeeper.reconciler.userdata import SUDOERS, BootSource, render
from fleetkeeper.spec import runtime
from fleetkeeper.spec.service import ServiceSpec, stored_spec
from tests.spec.test_skypilot_yamls import FIXTURES, api_url, cli
from tests.spec.test_task_variables import imds
from tests.support.local_boot import fake_commands, relocated

__all__ = ["api_url", "imds"]  # fixtures, used by name

# The fixtures that run conda (as SkyPilot's images let them), and those whose workdir holds what
# `run` starts by a path relative to ~/sky_workdir (`python3 server.py`).
CONDA = {
    "llm/qwen/serve-7b.yaml": [],
    "llm/vllm/service.yaml": [],
    "examples/serve/llama2/llama2.yaml": ["--env", "HF_TOKEN"],
}
WORKDIR = ["examples/serve/http_server/task.yaml", "examples/serve/authentication/task.yaml"]
SOURCE = BootSource(bucket="stack-workdirs", workdir_key="services/x/u1/d.tar.gz")


def accepted_spec(api_url: str, path: str, flags: list[str], monkeypatch: pytest.MonkeyPatch) -> ServiceSpec:
    """The spec the api stored for a fixture, as the reconciler reads it."""
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    code, out, err = cli(api_url, "up", "-n", "runtime", path, *flags, "-o", "json")
    assert code == 0, err
    return stored_spec(json.dumps(json.loads(out)["spec"]))


def files_of(script: str) -> dict[str, tuple[str, str, str | None]]:
    """Each file the user data writes: its content, mode and owner."""
    found = re.findall(
        r"^echo '([A-Za-z0-9+/=]+)' \| base64 -d > (\S+)\nchmod (\d+) \2\n(?:chown (\S+): \2\n)?", script, re.M
    )
    return {path: (base64.b64decode(data).decode(), mode, owner or None) for data, path, mode, owner in found}


def assert_skypilots_runtime(spec: ServiceSpec, script: str) -> dict[str, tuple[str, str, str | None]]:
    files = files_of(script)
    # The user: created where the image lacks it, with a home of its own; passwordless sudo.
    assert "id -u ubuntu > /dev/null 2>&1 || useradd --create-home --home-dir /home/ubuntu" in script
    assert files[SUDOERS] == ("ubuntu ALL=(ALL) NOPASSWD:ALL\n", "440", None)
    assert "mkdir -p /home/ubuntu/sky_workdir\nchown ubuntu: /home/ubuntu /home/ubuntu/sky_workdir\n" in script
    for unit in ("fleetkeeper-setup", "fleetkeeper-replica"):
        text = files[f"/etc/systemd/system/{unit}.service"][0]
        assert "User=ubuntu\nWorkingDirectory=/home/ubuntu/sky_workdir\n" in text
    run_unit = files["/etc/systemd/system/fleetkeeper-replica.service"][0]
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE\n" in run_unit  # `ports: 80` without root
    # setup and run: the user's scripts (owned by them), SkyPilot's preamble, the commands as written.
    for name, commands in (("setup.sh", spec.setup), ("run.sh", spec.run)):
        content, mode, owner = files[f"/opt/fleetkeeper/{name}"]
        assert (mode, owner) == ("700", "ubuntu")
        assert content.endswith("\ncd ~/sky_workdir\n" + (commands or "true") + "\n")
        assert "set -e" not in content and "set -u" not in content and "pipefail" not in content
        assert "source ~/.bashrc" in content and "/etc/profile.d/conda.sh" in content
    return files


@pytest.mark.parametrize("path", sorted(CONDA))
def test_a_conda_yamls_setup_runs_unchanged_as_ubuntu_in_its_home(
    path: str, api_url: str, imds: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = accepted_spec(api_url, path, CONDA[path], monkeypatch)
    original: dict[str, Any] = yaml.safe_load((FIXTURES / path).read_text())
    assert spec.setup == original["setup"] and "conda activate" in spec.setup
    script = render(spec)
    files = assert_skypilots_runtime(spec, script)
    setup = files["/opt/fleetkeeper/setup.sh"][0]
    # conda comes first where the image has none (Ubuntu's and the base DLAMI), as SkyPilot's images have it.
    assert setup.startswith("#!/bin/bash\nif ! command -v conda")
    assert "Miniforge3-Linux-$(uname -m).sh" in setup and '-b -p "$HOME/miniconda3"' in setup

    # The user data on this machine (paths under tmp_path, root-only commands stood in for)...
    if shutil.which("curl") is None:
        pytest.skip("curl (on every image the user data boots) is not on this machine")
    fake_commands(tmp_path / "bin", tmp_path)
    done = subprocess.run(
        ["bash", "-c", relocated(script, tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FLEETKEEPER_BOOT_IMDS": imds},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    home = tmp_path / "home"
    assert (home / "sky_workdir").is_dir()
    assert (tmp_path / "sudoers.d" / "90-fleetkeeper-ubuntu").read_text() == "ubuntu ALL=(ALL) NOPASSWD:ALL\n"
    assert "ubuntu: " in (tmp_path / "chown.log").read_text()
    # ...then setup as its unit runs it: HOME /home/ubuntu (systemd sets it for User=), in ~/sky_workdir,
    # with conda installed in ~/miniconda3: a stand-in that records its calls and knows no env yet.
    conda = home / "miniconda3"
    (conda / "bin").mkdir(parents=True)
    (conda / "etc" / "profile.d").mkdir(parents=True)
    (conda / "bin" / "conda").write_text(f'#!/bin/sh\n[ "$1 $2" = "info --base" ] && echo {conda}\n')
    (conda / "bin" / "conda").chmod(0o755)
    calls = tmp_path / "calls.log"
    (conda / "etc" / "profile.d" / "conda.sh").write_text(
        "conda() {\n"
        f'  echo "conda $* (HOME=$HOME, in $PWD)" >> {calls}\n'
        f'  case "$1" in activate) grep -q "create -n $2 " {calls} ;; *) true ;; esac\n'
        "}\n"
    )
    for tool in ("pip", "python"):
        (conda / "bin" / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        (conda / "bin" / tool).chmod(0o755)
    ran = subprocess.run(
        ["bash", str(tmp_path / "root" / "setup.sh")],
        cwd=home / "sky_workdir",
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "HF_TOKEN": "hf_test_token"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    env = re.search(r"conda activate (\w+)", spec.setup)
    assert env is not None
    lines = calls.read_text().splitlines()
    where = f"(HOME={home}, in {home / 'sky_workdir'})"
    # The first activate fails (no such env), and the YAML's own `if [ $? -ne 0 ]` creates it.
    assert lines[:3] == [
        f"conda activate {env.group(1)} {where}",
        f"conda create -n {env.group(1)} python={lines[1].split('python=')[1].split()[0]} -y {where}",
        f"conda activate {env.group(1)} {where}",
    ]
    assert any(line.startswith("pip install") for line in lines)


@pytest.mark.parametrize("path", WORKDIR)
def test_a_workdir_yaml_finds_its_files_in_sky_workdir(
    path: str, api_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = accepted_spec(api_url, path, [], monkeypatch)
    assert spec.workdir is not None and spec.run.startswith("python3 server.py")  # relative to ~/sky_workdir
    script = render(spec, SOURCE)
    assert_skypilots_runtime(spec, script)
    boot = next(line for line in script.splitlines() if line.startswith("if ! python3 /opt/fleetkeeper/replica_boot"))
    assert " --dest /home/ubuntu/sky_workdir " in boot
    # Unpacked by root, then the user's (before any unit starts).
    after = script.split(boot, 1)[1]
    assert after.index("chown -R ubuntu: /home/ubuntu/sky_workdir\n") < after.index("systemctl enable --now")
    # No conda asked for, none installed.
    assert not runtime.calls_conda(spec.setup, spec.run)
    assert "miniforge" not in files_of(script)["/opt/fleetkeeper/setup.sh"][0].lower()
