"""The user data a replica instance boots with: run `setup` once, then `run` as a systemd service.

cloud-init runs the script as root at first boot. File contents travel base64-encoded so nothing in
a user's script can end a heredoc or be expanded by the shell that writes it. `envs` and `PORT` go
to an EnvironmentFile that both units read; `run` restarts when it exits.

A version with a workdir or secrets first runs `replica_boot.py` (written beside the units): it
fetches the workdir archive from the stack's bucket into the working directory and the secret values
from Parameter Store into a second, root-only EnvironmentFile, with the instance's role. Neither the
values nor anything but their parameter's name is in the user data.
"""

from __future__ import annotations

import base64
import gzip
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetkeeper.spec import ServiceSpec


@dataclass(frozen=True)
class BootSource:
    """Where a replica's workdir and secrets are: what `replica_boot.py` is told to fetch."""

    bucket: str | None = None  # the workdir store's bucket
    workdir_key: str | None = None
    parameter: str | None = None  # the SecureString with the secret values


_BOOT_SCRIPT = Path(__file__).with_name("replica_boot.py")

# EC2 takes at most 16 KB of user data; cloud-init unpacks gzip by itself.
USER_DATA_LIMIT = 16 * 1024
ROOT = "/opt/fleetkeeper"

_SETUP_UNIT = f"""[Unit]
Description=fleetkeeper replica setup
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
EnvironmentFile={ROOT}/env
EnvironmentFile=-{ROOT}/secrets.env
WorkingDirectory={ROOT}/work
ExecStart=/bin/bash {ROOT}/setup.sh
"""

_RUN_UNIT = f"""[Unit]
Description=fleetkeeper replica
After=fleetkeeper-setup.service
Requires=fleetkeeper-setup.service

[Service]
EnvironmentFile={ROOT}/env
EnvironmentFile=-{ROOT}/secrets.env
WorkingDirectory={ROOT}/work
ExecStart=/bin/bash {ROOT}/run.sh
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""


def _systemd_quote(value: str) -> str:
    """A value for a systemd EnvironmentFile line: double-quoted, backslashes and quotes escaped.

    Newlines stay as they are: inside double quotes systemd keeps a real newline, while an escaped
    `\\n` would reach the service as a backslash and an n (a PEM key in `envs` must survive).
    """
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def environment_file(spec: ServiceSpec) -> str:
    env = {**spec.envs, "PORT": str(spec.port)}
    return "".join(f"{key}={_systemd_quote(value)}\n" for key, value in sorted(env.items()))


def _write(path: str, content: str, mode: str) -> str:
    encoded = base64.b64encode(content.encode()).decode()
    return f"echo '{encoded}' | base64 -d > {path}\nchmod {mode} {path}\n"


def _boot(source: BootSource | None, digest: str | None) -> str:
    """Fetch the workdir and secrets before anything of the version runs (replica_boot.py)."""
    if source is None or not ((source.workdir_key and digest) or source.parameter):
        return ""
    args = ["python3", f"{ROOT}/replica_boot.py", "--dest", f"{ROOT}/work", "--env-file", f"{ROOT}/secrets.env"]
    if source.workdir_key and source.bucket and digest:
        args += ["--bucket", source.bucket, "--key", source.workdir_key, "--digest", digest]
    if source.parameter:
        args += ["--parameter", source.parameter]
    return _write(f"{ROOT}/replica_boot.py", _BOOT_SCRIPT.read_text(), "700") + " ".join(map(shlex.quote, args)) + "\n"


def render(spec: ServiceSpec, source: BootSource | None = None) -> str:
    """The boot script for one replica of `spec`."""
    setup = "set -euo pipefail\n" + (spec.setup or "true") + "\n"
    run = "set -uo pipefail\n" + spec.run + "\n"
    boot = _boot(source, spec.workdir.digest if spec.workdir is not None else None)
    return (
        "#!/bin/bash\n"
        "# fleetkeeper replica bootstrap (generated)\n"
        "set -euo pipefail\n"
        f"mkdir -p {ROOT}/work\n"
        + boot
        + _write(f"{ROOT}/env", environment_file(spec), "600")
        + _write(f"{ROOT}/setup.sh", setup, "700")
        + _write(f"{ROOT}/run.sh", run, "700")
        + _write("/etc/systemd/system/fleetkeeper-setup.service", _SETUP_UNIT, "644")
        + _write("/etc/systemd/system/fleetkeeper-replica.service", _RUN_UNIT, "644")
        + "systemctl daemon-reload\n"
        "systemctl enable --now fleetkeeper-replica.service\n"
    )


def user_data(spec: ServiceSpec, source: BootSource | None = None) -> bytes:
    """`render(spec)` as EC2 takes it: gzipped when the plain script would not fit in 16 KB."""
    script = render(spec, source).encode()
    if len(script) <= USER_DATA_LIMIT:
        return script
    return gzip.compress(script, mtime=0)
