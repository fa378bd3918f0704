"""The user data a replica instance boots with: run `setup` once, then `run` as a systemd service.

cloud-init runs the script as root at first boot. File contents travel base64-encoded so nothing in
a user's script can end a heredoc or be expanded by the shell that writes it. `envs` and `PORT` go
to an EnvironmentFile that both units read; `run` restarts when it exits.

The units run `setup` and `run` as SkyPilot does (fleetkeeper.spec.runtime): as the user `ubuntu`
(the default user of the Ubuntu images fleetkeeper boots by default; created on an image without it),
with passwordless sudo (a sudoers drop-in, whatever the image's own), HOME `/home/ubuntu`, started in
`~/sky_workdir`, which holds the workdir, each through SkyPilot's task preamble (`~/.bashrc`,
conda's shell functions). The run unit may bind a port below 1024 (CAP_NET_BIND_SERVICE), as
SkyPilot's `ports: 80` on a root-less replica needs. fleetkeeper's own files (the scripts, the
EnvironmentFiles, the boot and log scripts) stay in /opt/fleetkeeper, the EnvironmentFiles root-only:
systemd reads them before it drops to the user.

A version with a workdir or secrets first runs `replica_boot.py` (written beside the units): it
fetches the workdir archive from the stack's bucket into `~/sky_workdir` (then handed to the user)
and the secret values from Parameter Store into a second, root-only EnvironmentFile, with the
instance's role. Neither the values nor anything but their parameter's name is in the user data.

SkyPilot's task variables and fleetkeeper's own (fleetkeeper.spec.task_variables) go to a third
EnvironmentFile, `task.env`, which both units read last (nothing in `envs` or the secrets can shadow
them): the launch writes the values it knows, and the script adds the instance's private IP
(SKYPILOT_NODE_IPS), read from the instance metadata service with an IMDSv2 token (the launch
requires tokens) by curl, which Ubuntu (the default image and the Deep Learning AMIs) and Amazon
Linux both have. The script assumes bash, coreutils, systemd, curl, python3 and, only on an image
without the user, useradd: no package manager, no distribution's own paths.

With a log group (the stack's ReplicaLogGroup), `replica_logs.py` runs as a third unit, started
before setup: it ships both units' journal to CloudWatch Logs, one stream per replica. The two
scripts travel as plain text (without docstrings) that compresses with the rest: shipping logs costs
about 5 KB of the 16 KB, and a spec too large for both boots without it.
"""

from __future__ import annotations

import ast
import base64
import gzip
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fleetkeeper.reconciler import replica_boot
from fleetkeeper.replicas.identity import owner_scope, scope_prefix
from fleetkeeper.spec import runtime, task_variables

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetkeeper.spec.service import ServiceSpec


@dataclass(frozen=True)
class BootSource:
    """Where a replica's workdir and secrets are: what `replica_boot.py` is told to fetch."""

    bucket: str | None = None  # the workdir store's bucket
    workdir_key: str | None = None
    parameter: str | None = None  # the SecureString with the secret values
    # The stack's KMS key (its ARN): the boot refuses a parameter encrypted under any other (None:
    # Parameter Store's default key, as the api writes without one).
    kms_key: str | None = None
    log_group: str | None = None  # where the replica's output goes (CloudWatch Logs), and its stream
    log_stream: str | None = None
    # The partition's endpoint suffix (amazonaws.com.cn in China): fleetkeeper.aws.partitions.
    dns_suffix: str = replica_boot.DEFAULT_DNS_SUFFIX


def log_stream(service: str, uid: str, replica_id: int, owner: str = "") -> str:
    """The replica's CloudWatch Logs stream: `fleetkeeper logs` lists an incarnation's by prefix.
    Under the owner's scope (`_o/<scope>/...`, fleetkeeper.replicas.identity): only the owner's replica role may
    create or write it."""
    return f"{scope_prefix(owner_scope(owner))}{service}/{uid}/{replica_id}"


# The largest source a replica is launched with (tests measure the user data with it): a workdir,
# secrets and logs, with names as long as the stack's can be.
LARGEST_SOURCE = BootSource(
    bucket="b" * 63,
    workdir_key="services/_o/" + "o" * 16 + "/" + "n" * 63 + "/" + "u" * 16 + "/" + "d" * 64 + ".tar.gz",
    parameter="/fleetkeeper/" + "t" * 128 + "/_o/" + "o" * 16 + "/" + "n" * 63 + "/" + "u" * 16 + "/" + "r" * 32,
    kms_key="arn:aws-us-gov:kms:us-gov-west-1:123456789012:key/" + "k" * 36,
    log_group="/fleetkeeper/" + "s" * 128 + "/replicas",
    log_stream=log_stream("n" * 63, "u" * 16, 10**9, owner="o"),
)


# The largest task variables a replica is launched with: the longest service name and uid, huge ids,
# the most accelerators of the catalogue.
LARGEST_TASK = task_variables.variables("n" * 63, "u" * 16, 10**9, 10**9, "trn1.32xlarge")


_BOOT_SCRIPT = Path(__file__).with_name("replica_boot.py")
_LOGS_SCRIPT = Path(__file__).with_name("replica_logs.py")

# EC2 takes at most 16 KB of user data; cloud-init unpacks gzip by itself.
USER_DATA_LIMIT = 16 * 1024
ROOT = "/opt/fleetkeeper"
USER = runtime.RUN_USER
HOME = runtime.HOME
WORKDIR = runtime.WORKDIR
# The user's passwordless sudo, as cloud-init gives an Ubuntu image's default user: written on every
# image, so a custom image_id (or an Amazon Linux default image) behaves the same.
SUDOERS = f"/etc/sudoers.d/90-fleetkeeper-{USER}"

_SETUP_UNIT = f"""[Unit]
Description=fleetkeeper replica setup
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
EnvironmentFile={ROOT}/env
EnvironmentFile=-{ROOT}/secrets.env
EnvironmentFile={ROOT}/task.env
User={USER}
WorkingDirectory={WORKDIR}
ExecStart=/bin/bash {ROOT}/setup.sh
"""

_RUN_UNIT = f"""[Unit]
Description=fleetkeeper replica
After=fleetkeeper-setup.service
Requires=fleetkeeper-setup.service

[Service]
EnvironmentFile={ROOT}/env
EnvironmentFile=-{ROOT}/secrets.env
EnvironmentFile={ROOT}/task.env
User={USER}
WorkingDirectory={WORKDIR}
AmbientCapabilities=CAP_NET_BIND_SERVICE
ExecStart=/bin/bash {ROOT}/run.sh
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""

# Started before setup (setup's output is shipped too), restarted if it stops; it only reads the
# journal, so the replica's own units never wait for it.
_LOGS_UNIT = f"""[Unit]
Description=fleetkeeper replica logs to CloudWatch Logs
After=network-online.target
Wants=network-online.target
Before=fleetkeeper-setup.service

[Service]
ExecStart=/usr/bin/env python3 {ROOT}/replica_logs.py --group ${{FK_LOG_GROUP}} --stream ${{FK_LOG_STREAM}} \
  --dns-suffix ${{FK_DNS_SUFFIX}}
EnvironmentFile={ROOT}/logs.env
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
"""


def _systemd_quote(value: str) -> str:
    """A value for a systemd EnvironmentFile line: double-quoted, with backslashes, quotes, `$` and
    backquotes escaped (replica_boot.systemd_quote, the secrets' too).

    Newlines stay as they are: inside double quotes systemd keeps a real newline, while an escaped
    `\\n` would reach the service as a backslash and an n (a PEM key in `envs` must survive).
    """
    return replica_boot.systemd_quote(value)


def environment_file(spec: ServiceSpec) -> str:
    env = {**spec.envs, "PORT": str(spec.port)}
    return "".join(f"{key}={_systemd_quote(value)}\n" for key, value in sorted(env.items()))


def task_file(task: Mapping[str, str]) -> str:
    """The launch's part of `task.env` (the instance adds its IP at boot: `_node_ips`)."""
    return "".join(f"{key}={_systemd_quote(value)}\n" for key, value in sorted(task.items()))


# The instance's private IP from IMDSv2 (a token first: the launch sets HttpTokens=required), as the
# node-IP variables. FLEETKEEPER_BOOT_IMDS is unset on an instance (cloud-init's environment); tests
# point it at a stand-in on 127.0.0.1, as they do replica_boot.py's.
_IMDS_CURL = "curl -sSf --retry 5 --retry-connrefused --connect-timeout 2"


def _node_ips() -> str:
    names = task_variables.NODE_IP_VARIABLES
    lines = "".join(f'{name}=\\"%s\\"\\n' for name in names)
    ips = ' "$ip"' * len(names)
    return (
        'imds="${FLEETKEEPER_BOOT_IMDS:-http://169.254.169.254}"\n'
        f"token=$({_IMDS_CURL} -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' \"$imds/latest/api/token\")\n"
        f'ip=$({_IMDS_CURL} -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/local-ipv4")\n'
        f'printf "{lines}"{ips} >> {ROOT}/task.env\n'
    )


def _write(path: str, content: str, mode: str, owner: str | None = None) -> str:
    encoded = base64.b64encode(content.encode()).decode()
    own = f"chown {owner}: {path}\n" if owner else ""
    return f"echo '{encoded}' | base64 -d > {path}\nchmod {mode} {path}\n{own}"


def _user() -> str:
    """The user setup and run run as, with its home and `~/sky_workdir`, and passwordless sudo (the
    image's default user on Ubuntu; created, with a group of its own, where the image lacks it)."""
    return (
        f"id -u {USER} > /dev/null 2>&1 || useradd --create-home --home-dir {HOME} --user-group "
        f"--shell /bin/bash {USER}\n"
        + _write(SUDOERS, f"{USER} ALL=(ALL) NOPASSWD:ALL\n", "440")
        + f"mkdir -p {WORKDIR}\nchown {USER}: {HOME} {WORKDIR}\n"
    )


_SCRIPT_END = "FLEETKEEPER_SCRIPT_END"
_SCRIPTS: dict[Path, str] = {}


def _script(path: Path) -> str:
    """One of fleetkeeper's own instance scripts without its docstrings (comments go with ast):
    what the instance runs, in less of the 16 KB. Computed once per process."""
    if path not in _SCRIPTS:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                first = node.body[0] if node.body else None
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    node.body = node.body[1:] or [ast.Pass()]
        _SCRIPTS[path] = ast.unparse(tree) + "\n"
    return _SCRIPTS[path]


def _write_script(path: str, script: Path) -> str:
    """Our own script as plain text in a quoted heredoc (nothing in it is expanded): plain text
    compresses with the rest of the user data, where base64 would not."""
    content = _script(script)
    if _SCRIPT_END in content:
        raise ValueError(f"{script.name} contains the heredoc's end marker")
    return f"cat > {path} <<'{_SCRIPT_END}'\n{content}{_SCRIPT_END}\nchmod 700 {path}\n"


def _ships_logs(source: BootSource | None) -> bool:
    return source is not None and bool(source.log_group and source.log_stream)


# Where the boot writes an environment failure (replica_boot.EnvironmentFailure), and the transient
# unit that then serves it on the replica's port for the reconciler's probe (replica_boot.serve_report).
BOOT_REPORT = f"{ROOT}/boot-failure.json"
REPORT_UNIT = "fleetkeeper-boot-report"


def propagation_seconds(spec: ServiceSpec) -> int:
    """How long the boot waits for IAM (replica_boot.PROPAGATION_SECONDS), at most half the probe's
    initial delay: the failure report must be up while the replica may still fail as the
    environment's, before the initial delay makes it the version's."""
    delay = spec.service.readiness_probe.initial_delay_seconds
    return min(replica_boot.PROPAGATION_SECONDS, delay // 2)


def _boot(source: BootSource | None, spec: ServiceSpec) -> str:
    """Fetch the workdir and secrets before anything of the version runs (replica_boot.py); if that
    fails for the environment, serve the report on the replica's port, and stop either way."""
    digest = spec.workdir.digest if spec.workdir is not None else None
    if source is None or not ((source.workdir_key and digest) or source.parameter):
        return ""
    args = ["python3", f"{ROOT}/replica_boot.py", "--dest", WORKDIR, "--env-file", f"{ROOT}/secrets.env"]
    args += ["--dns-suffix", source.dns_suffix, "--propagation-seconds", str(propagation_seconds(spec))]
    args += ["--report", BOOT_REPORT]
    if source.workdir_key and source.bucket and digest:
        args += ["--bucket", source.bucket, "--key", source.workdir_key, "--digest", digest]
    if source.parameter:
        args += ["--parameter", source.parameter, "--kms-key", source.kms_key or "alias/aws/ssm"]
        args += ["--secret-names", ",".join(spec.secret_names)]
    serve = ["systemd-run", f"--unit={REPORT_UNIT}", "--property=Restart=always", "/usr/bin/env", "python3"]
    serve += [f"{ROOT}/replica_boot.py", "--serve-report", BOOT_REPORT, "--port", str(spec.port)]
    script = "" if _ships_logs(source) else _write_script(f"{ROOT}/replica_boot.py", _BOOT_SCRIPT)
    return (
        script
        + f"if ! {' '.join(map(shlex.quote, args))}; then\n"
        + f"  if [ -s {BOOT_REPORT} ]; then {' '.join(map(shlex.quote, serve))} || true; fi\n"
        + "  exit 1\nfi\n"
        # Unpacked by root: the user's to change, as SkyPilot's synced workdir is.
        + f"chown -R {USER}: {WORKDIR}\n"
    )


def _logs(source: BootSource | None) -> str:
    """The log shipper and its unit, started at once (before the boot fetch and setup)."""
    if source is None or not source.log_group or not source.log_stream:
        return ""
    env = (
        f"FK_LOG_GROUP={_systemd_quote(source.log_group)}\nFK_LOG_STREAM={_systemd_quote(source.log_stream)}\n"
        f"FK_DNS_SUFFIX={_systemd_quote(source.dns_suffix)}\n"
    )
    return (
        _write_script(f"{ROOT}/replica_boot.py", _BOOT_SCRIPT)
        + _write_script(f"{ROOT}/replica_logs.py", _LOGS_SCRIPT)
        + _write(f"{ROOT}/logs.env", env, "600")
        + _write("/etc/systemd/system/fleetkeeper-logs.service", _LOGS_UNIT, "644")
        + "systemctl daemon-reload\nsystemctl enable --now fleetkeeper-logs.service || true\n"
    )


def _setup_script(spec: ServiceSpec) -> str:
    """`setup` as SkyPilot runs it, with conda installed first when setup or run calls it."""
    return runtime.task_script(spec.setup, install_conda=runtime.calls_conda(spec.setup, spec.run))


def render(spec: ServiceSpec, source: BootSource | None = None, task: Mapping[str, str] | None = None) -> str:
    """The boot script for one replica of `spec`, with its task variables (fleetkeeper.spec.task_variables)."""
    boot = _boot(source, spec)
    return (
        "#!/bin/bash\n"
        "# fleetkeeper replica bootstrap (generated)\n"
        "set -euo pipefail\n"
        f"mkdir -p {ROOT}\n"
        + _user()
        + _logs(source)
        + boot
        + _write(f"{ROOT}/env", environment_file(spec), "600")
        + _write(f"{ROOT}/task.env", task_file(task or {}), "600")
        + _node_ips()
        + _write(f"{ROOT}/setup.sh", _setup_script(spec), "700", owner=USER)
        + _write(f"{ROOT}/run.sh", runtime.task_script(spec.run), "700", owner=USER)
        + _write("/etc/systemd/system/fleetkeeper-setup.service", _SETUP_UNIT, "644")
        + _write("/etc/systemd/system/fleetkeeper-replica.service", _RUN_UNIT, "644")
        + "systemctl daemon-reload\n"
        "systemctl enable --now fleetkeeper-replica.service\n"
    )


def user_data(spec: ServiceSpec, source: BootSource | None = None, task: Mapping[str, str] | None = None) -> bytes:
    """`render(spec)` as EC2 takes it: gzipped when the plain script would not fit in 16 KB.

    Shipping logs costs about 5 KB compressed: a spec that fits only without it boots without it
    (its output stays in the instance's journal) rather than not at all; the api checks a spec's
    user data without logs, as before, and with the largest task variables (LARGEST_TASK)."""
    data = _encoded(render(spec, source, task))
    if len(data) > USER_DATA_LIMIT and source is not None and _ships_logs(source):
        return _encoded(render(spec, replace(source, log_group=None, log_stream=None), task))
    return data


def _encoded(text: str) -> bytes:
    script = text.encode()
    if len(script) <= USER_DATA_LIMIT:
        return script
    return gzip.compress(script, mtime=0)
