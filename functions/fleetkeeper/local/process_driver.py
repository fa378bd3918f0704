"""The `process` replica driver: each replica is a local process group that really serves HTTP.

Embedded mode's stand-in for EC2. A replica runs `setup` then `run` through bash in its own session
(so terminating it kills everything it started), with the spec's `envs` and `PORT` set to a free
port on 127.0.0.1, in its own working directory `<local dir>/work/<service>/replica-<id>/`, and its
output appended to `<local dir>/logs/<service>/replica-<id>.log`.

It reports what EC2 would: a process that exited by itself is a TERMINATED instance with its own
state reason code (`PROCESS_EXITED`: the app ended on its own, which counts against its version, as
a crash would; it is no preemption) and a message that says how it exited, so the reconciler sees a
failed replica and replaces it. A replica fleetkeeper terminated ends as an EC2 instance terminated
through the API does: `Client.UserInitiatedShutdown`.
Instance ids look like `local-3-pid4242`: the pid is there so a person (or a test) can find and
kill a replica's process.

It also sets SkyPilot's task variables and fleetkeeper's own (fleetkeeper.task_variables) as an EC2
replica has them: SKYPILOT_NODE_IPS is 127.0.0.1, SKYPILOT_NUM_GPUS_PER_NODE the accelerators of the
spec's first candidate instance type (0 without one), whatever this host has.

A version's workdir is unpacked into the replica's working directory and its secrets are added to
its environment before `setup`, as `replica_boot.py` does on EC2 (the archive from the embedded
workdir store, the values from the in-memory AWS's Parameter Store). An app that does not listen on
its $PORT is told so (`diagnose`): local replicas share one host, so each gets a port of its own.

State lives in this process only: a replica cannot outlive the embedded control plane that started
it (`stop_all` on shutdown), so there is nothing to rediscover after a restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar

from fleetkeeper import task_variables
from fleetkeeper.model import Market, to_iso, utcnow
from fleetkeeper.reconciler.driver import (
    MANAGED_TAG,
    REPLICA_TAG,
    SERVICE_TAG,
    STACK_TAG,
    UID_TAG,
    VERSION_TAG,
    Instance,
    InstanceState,
    LaunchRefused,
    LaunchRequest,
)
from fleetkeeper.reconciler.ownership import is_ours
from fleetkeeper.reconciler.replica_boot import BootError, unpack
from fleetkeeper.settings import LOCAL_STACK_ID, TABLE_NAME_ENV, WORKDIR_DIR_ENV, stack_id_of

if TYPE_CHECKING:
    from collections.abc import Sequence

LOCAL_DIR_ENV = "FLEETKEEPER_LOCAL_DIR"
DEFAULT_LOCAL_DIR = ".fleetkeeper"
LOOPBACK = "127.0.0.1"

# bash runs `setup` ($1) and, if it succeeded, replaces itself with `run` ($2): the group leader is
# then the service itself, and a failing setup ends the replica with setup's exit code.
_WRAPPER = 'if [ -n "$1" ]; then bash -c "$1" || exit $?; fi; exec bash -c "$2"'

# Variables of the control plane that a replica must not inherit (an EC2 replica would not have
# them either): fake AWS credentials, the table name, Powertools and fleetkeeper settings.
_PRIVATE_PREFIXES = ("AWS_", "FLEETKEEPER_", "POWERTOOLS_", "TABLE_NAME")

# State reason codes: the driver's own for a replica process that exited by itself, and EC2's for
# an instance terminated through the API (here: by fleetkeeper) and for a spot instance AWS took back
# (here: a simulated interruption, `reclaim`).
PROCESS_EXITED = "Fleetkeeper.ProcessExited"
USER_INITIATED_SHUTDOWN = "Client.UserInitiatedShutdown"
SPOT_INSTANCE_TERMINATION = "Server.SpotInstanceTermination"
# What a local replica's instance type is called when its spec names none.
LOCAL_INSTANCE_TYPE = "local"
# Launch refusals of a version whose workdir or secrets cannot be had (they count against it).
WORKDIR_UNAVAILABLE = "Fleetkeeper.WorkdirUnavailable"
SECRETS_UNAVAILABLE = "Fleetkeeper.SecretsUnavailable"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class _Replica:
    """One launched replica: its process and what the driver reports about it."""

    instance: Instance
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    log: IO[bytes]
    terminating: bool = False
    reclaimed: bool = False
    ended_at: float | None = None

    def refresh(self) -> Instance:
        """The instance as of now: RUNNING, SHUTTING_DOWN, or TERMINATED with the reason."""
        code = self.process.poll()
        if code is None:
            state = InstanceState.SHUTTING_DOWN if self.terminating else InstanceState.RUNNING
            if self.instance.state is not state:
                self.instance = replace(self.instance, state=state)
            return self.instance
        if self.instance.state is not InstanceState.TERMINATED:
            # What the replica started in the background dies with it, as on a terminated machine.
            _signal_group(self.process, signal.SIGKILL)
            self.ended_at = time.monotonic()
            self.log.close()
            if self.reclaimed:
                reason_code, reason = SPOT_INSTANCE_TERMINATION, "Spot instance termination (simulated)"
            elif self.terminating:
                reason_code, reason = USER_INITIATED_SHUTDOWN, "terminated by fleetkeeper"
            else:
                reason_code, reason = PROCESS_EXITED, f"the replica process exited with code {_describe_exit(code)}"
            self.instance = replace(
                self.instance,
                state=InstanceState.TERMINATED,
                state_reason_code=reason_code,
                state_reason=f"{reason_code}: {reason}",
            )
        return self.instance


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


class ProcessDriver:
    """ReplicaDriver whose instances are local process groups (see the module docstring)."""

    _shared: ClassVar[ProcessDriver | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        local_dir: Path,
        *,
        grace_seconds: float = 5.0,
        forget_after_seconds: float = 600.0,
        workdirs: Path | None = None,
        secrets_prefix: str | None = None,
        stack_id: str = LOCAL_STACK_ID,
    ) -> None:
        self.local_dir = local_dir
        # The embedded mode's own stack id: its replicas carry it as an EC2 replica carries its stack's.
        self.stack_id = stack_id
        # The embedded workdir store's directory and the parameters' path of the version secrets.
        self.workdirs = workdirs
        self.secrets_prefix = secrets_prefix
        self.grace_seconds = grace_seconds
        # Terminated replicas stay visible for a while (as EC2 keeps terminated instances listed),
        # long enough for the reconciler to see why they ended, then they are forgotten.
        self.forget_after_seconds = forget_after_seconds
        self._replicas: dict[str, _Replica] = {}
        self._by_token: dict[str, str] = {}
        self._seq = 0
        self._lock = threading.RLock()

    @classmethod
    def shared(cls) -> ProcessDriver:
        """The process-wide driver (the reconciler's `make_driver()` returns this one)."""
        with cls._shared_lock:
            if cls._shared is None:
                table = os.environ.get(TABLE_NAME_ENV)
                workdirs = os.environ.get(WORKDIR_DIR_ENV)
                cls._shared = cls(
                    Path(os.environ.get(LOCAL_DIR_ENV) or DEFAULT_LOCAL_DIR).resolve(),
                    workdirs=Path(workdirs) if workdirs else None,
                    secrets_prefix=f"/fleetkeeper/{table}" if table else None,
                    stack_id=stack_id_of(os.environ),
                )
            return cls._shared

    @classmethod
    def reset_shared(cls) -> None:
        """Stop and drop the process-wide driver (tests, and a control plane that restarts in-process)."""
        with cls._shared_lock:
            if cls._shared is not None:
                cls._shared.stop_all()
            cls._shared = None

    # -- the ReplicaDriver protocol ------------------------------------------------------------------

    def list_instances(self, uids: Sequence[str] | None = None) -> list[Instance]:
        wanted = None if uids is None else set(uids)
        with self._lock:
            self._forget_old()
            instances = [replica.refresh() for replica in self._replicas.values()]
        if wanted is None:
            return [i for i in instances if i.stack == self.stack_id]
        return [i for i in instances if i.uid in wanted]

    def adopt(self, instance_ids: Sequence[str]) -> None:
        with self._lock:
            for instance_id in instance_ids:
                replica = self._replicas.get(instance_id)
                if replica is not None:
                    replica.instance = replace(
                        replica.instance,
                        stack=self.stack_id,
                        tags={**replica.instance.tags, STACK_TAG: self.stack_id},
                    )

    def find_instance(self, uid: str, replica_id: int) -> Instance | None:
        with self._lock:
            for replica in self._replicas.values():
                instance = replica.refresh()
                if (
                    instance.uid == uid
                    and instance.replica_id == replica_id
                    and instance.state is not InstanceState.TERMINATED
                    and is_ours(instance, self.stack_id, {uid})
                ):
                    return instance
            return None

    def instance(self, instance_id: str) -> Instance | None:
        with self._lock:
            replica = self._replicas.get(instance_id)
            return None if replica is None else replica.refresh()

    def pool_count(self, request: LaunchRequest) -> int:
        return 1  # one laptop: every attempt goes to the same place

    def reclaim(self, instance_id: str, after_seconds: float) -> bool:
        """Simulate AWS taking a spot replica back `after_seconds` from now (two minutes on AWS, after
        its interruption warning): its process group is killed and it ends with EC2's reclaim reason.
        False when there is no such live replica."""
        with self._lock:
            replica = self._replicas.get(instance_id)
            if replica is None or replica.process.poll() is not None:
                return False

        def take_back() -> None:
            with self._lock:
                if replica.process.poll() is None:
                    replica.reclaimed = True
                    _signal_group(replica.process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                replica.process.wait(timeout=5)
            with self._lock:
                replica.refresh()

        timer = threading.Timer(max(after_seconds, 0.0), take_back)
        timer.daemon = True
        timer.start()
        return True

    def launch(self, request: LaunchRequest) -> Instance:
        with self._lock:
            token = request.client_token(self.stack_id)
            known = self._by_token.get(token)
            if known is not None and known in self._replicas:
                return self._replicas[known].refresh()
            replica = self._start(request)
            self._replicas[replica.instance.instance_id] = replica
            self._by_token[token] = replica.instance.instance_id
            return replica.instance

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Send TERM to each replica's process group; KILL it if it is still there after the grace."""
        with self._lock:
            doomed = [self._replicas[i] for i in instance_ids if i in self._replicas]
            for replica in doomed:
                if replica.process.poll() is None and not replica.terminating:
                    replica.terminating = True
                    _signal_group(replica.process, signal.SIGTERM)
                    timer = threading.Timer(self.grace_seconds, self._kill_if_alive, args=(replica,))
                    timer.daemon = True
                    timer.start()
                replica.refresh()

    def base_url(self, instance: Instance, port: int) -> str | None:
        """The replica's own port on 127.0.0.1 (`port`, the spec's port, is what EC2 replicas use)."""
        with self._lock:
            replica = self._replicas.get(instance.instance_id)
            if replica is None or replica.refresh().state is InstanceState.TERMINATED:
                return None
            return f"http://{LOOPBACK}:{replica.port}"

    def diagnose(self, instance: Instance) -> str | None:
        """Why a replica that is running does not answer on its $PORT, when it listens elsewhere:
        an app that ignores $PORT (a SkyPilot YAML's fixed port) is told so, not "connection refused"."""
        with self._lock:
            replica = self._replicas.get(instance.instance_id)
            if replica is None or replica.process.poll() is not None:
                return None
            pgid, port = replica.process.pid, replica.port
        listening = sorted(_listening_ports(pgid) - {port})
        if not listening:
            return None
        shown = ", ".join(map(str, listening))
        return f"listening on {shown}, expected $PORT={port}: read $PORT in embedded mode"

    # -- embedded mode ---------------------------------------------------------------------------------

    def log_path(self, service: str, replica_id: int) -> Path:
        return self.local_dir / "logs" / service / f"replica-{replica_id}.log"

    def work_dir(self, service: str, replica_id: int) -> Path:
        """The replica's working directory: its own, as each EC2 replica has its own disk."""
        return self.local_dir / "work" / service / f"replica-{replica_id}"

    def stop_all(self, timeout: float | None = None) -> None:
        """Stop every replica (shutdown): TERM to all groups, then KILL what is left after the grace."""
        with self._lock:
            live = [r for r in self._replicas.values() if r.process.poll() is None]
            for replica in live:
                replica.terminating = True
                _signal_group(replica.process, signal.SIGTERM)
        deadline = time.monotonic() + (self.grace_seconds if timeout is None else timeout)
        for replica in live:
            try:
                replica.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(replica.process, signal.SIGKILL)
                replica.process.wait()
        with self._lock:
            for replica in live:
                replica.refresh()

    def pids(self) -> list[int]:
        """Process ids of the replicas still running (process group leaders)."""
        with self._lock:
            return [r.process.pid for r in self._replicas.values() if r.process.poll() is None]

    # -- internals -------------------------------------------------------------------------------------

    def _start(self, request: LaunchRequest) -> _Replica:
        spec = request.spec
        port = self._free_port()
        log_path = self.log_path(request.service, request.replica_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        work_dir = self.work_dir(request.service, request.replica_id)
        work_dir.mkdir(parents=True, exist_ok=True)
        self._unpack_workdir(request, work_dir)
        secrets = self._secrets(request)
        log = log_path.open("ab")
        started = to_iso(utcnow())
        log.write(
            f"# fleetkeeper: service {request.service} replica {request.replica_id} version "
            f"{request.version}, PORT={port}, started {started}\n".encode()
        )
        log.flush()
        env = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_PREFIXES)}
        env.update(spec.envs)
        env.update(secrets)
        env["PORT"] = str(port)
        # SkyPilot's task variables and fleetkeeper's own, as an EC2 replica has them (over envs and
        # secrets): this host is the node, the accelerators those of the first candidate type.
        candidates = spec.resources.placement.instance_types
        first = candidates[0] if candidates else None
        env.update(
            task_variables.variables(
                request.service, request.uid, request.version, request.replica_id, first, node_ip=LOOPBACK
            )
        )
        # A local replica listens on loopback only, whatever its spec says (on EC2 it binds all
        # interfaces, so the reconciler's probes reach it): see examples/hello.
        env["HOST"] = LOOPBACK
        try:
            process = subprocess.Popen(  # the user's own spec, run as the user, as on EC2
                ["bash", "-c", _WRAPPER, "fleetkeeper-replica", spec.setup or "", spec.run],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=work_dir,
                start_new_session=True,  # its own process group: terminate kills all it started
            )
        except OSError as exc:
            log.close()
            raise LaunchRefused("ProcessLaunchFailed", str(exc)) from exc
        self._seq += 1
        instance = Instance(
            instance_id=f"local-{self._seq}-pid{process.pid}",
            state=InstanceState.RUNNING,
            service=request.service,
            uid=request.uid,
            version=request.version,
            replica_id=request.replica_id,
            private_ip=LOOPBACK,
            launched_at=started,
            stack=self.stack_id,
            client_token=request.client_token(self.stack_id),
            spot=request.market is Market.SPOT,
            instance_type=first or LOCAL_INSTANCE_TYPE,
            tags={
                MANAGED_TAG: "true",
                STACK_TAG: self.stack_id,
                SERVICE_TAG: request.service,
                UID_TAG: request.uid,
                VERSION_TAG: str(request.version),
                REPLICA_TAG: str(request.replica_id),
            },
        )
        return _Replica(instance=instance, process=process, port=port, log_path=log_path, log=log)

    def _unpack_workdir(self, request: LaunchRequest, work_dir: Path) -> None:
        """The version's workdir into the replica's working directory (replica_boot.py on EC2)."""
        workdir = request.spec.workdir
        if workdir is None:
            return
        from fleetkeeper.workdir_store import service_key

        archive = (self.workdirs or self.local_dir / "workdirs") / service_key(
            request.service, request.uid, workdir.digest, request.owner
        )
        try:
            unpack(archive.read_bytes(), workdir.digest, work_dir)
        except (OSError, BootError) as exc:
            raise LaunchRefused(WORKDIR_UNAVAILABLE, f"workdir {workdir.digest}: {exc}") from exc

    def _secrets(self, request: LaunchRequest) -> dict[str, str]:
        """The version's secret values, from Parameter Store (the in-memory AWS's)."""
        if request.secrets_ref is None or self.secrets_prefix is None:
            return {}
        from fleetkeeper.secret_store import SecretStore

        try:
            return SecretStore(self.secrets_prefix).get(
                request.service, request.uid, request.secrets_ref, request.owner
            )
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
            raise LaunchRefused(SECRETS_UNAVAILABLE, f"the version's secrets could not be read ({code})") from exc

    def _free_port(self) -> int:
        """A free port no live replica of ours was given (a replica may not be listening yet)."""
        taken = {r.port for r in self._replicas.values() if r.process.poll() is None}
        for _ in range(50):
            port = free_port()
            if port not in taken:
                return port
        raise LaunchRefused("NoFreePort", "could not find a free port on 127.0.0.1")

    def _kill_if_alive(self, replica: _Replica) -> None:
        if replica.process.poll() is None:
            _signal_group(replica.process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                replica.process.wait(timeout=5)
        with self._lock:
            replica.refresh()

    def _forget_old(self) -> None:
        now = time.monotonic()
        for instance_id, replica in list(self._replicas.items()):
            replica.refresh()
            if replica.ended_at is not None and now - replica.ended_at > self.forget_after_seconds:
                del self._replicas[instance_id]


def _listening_ports(pgid: int) -> set[int]:
    """TCP ports the processes of group `pgid` listen on (Linux /proc; empty elsewhere)."""
    proc = Path("/proc")
    inodes: set[str] = set()
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return set()
    for entry in entries:
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for fd in (entry / "fd").iterdir():
                target = str(fd.readlink())
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except (OSError, ValueError, IndexError):
            continue
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The replica is its own session and group leader (start_new_session): its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
