"""The `process` replica driver: each replica is a local process group that really serves HTTP.

Embedded mode's stand-in for EC2. A replica runs `setup` then `run` through bash in its own session
(so terminating it kills everything it started), with the spec's `envs`, in the layout an EC2
replica (and SkyPilot's) has: HOME is the replica's own directory
`<local dir>/work/<service>/<uid>/replica-<id>/`, the workdir is unpacked into `~/sky_workdir`
inside it, and setup and run start there, each through SkyPilot's task preamble
(fleetkeeper.spec.runtime); its output is appended to `<local dir>/logs/<service>/<uid>/replica-<id>.log`.
Both are keyed by the service's uid, so a service deleted and created again under the same name
starts with none of the old run's files, and both go when the service does (`remove_incarnation`,
called by embedded mode's cleanup).

Each replica gets a host of its own where the machine allows it (`isolation` "netns", netns.py): a
network namespace of its own, `PORT` set to the spec's port as on EC2, so two replicas of an app
that hard-codes `8080` both run; the driver reaches each through a relay on an ephemeral port of
127.0.0.1. Elsewhere (`isolation` "shared": macOS, no user namespaces) replicas share this machine's
loopback: `PORT` is a free port of its own, and a replica that dies because its port is taken says
by whom ("port 8080 is taken by replica 0 of web (pid 4242)").

It reports what EC2 would: a process that exited by itself is a TERMINATED instance with its own
state reason code (`PROCESS_EXITED`: the app ended on its own, which counts against its version, as
a crash would; it is no preemption) and a message that says how it exited, with the last error line
it wrote on stderr ("exited with code 1: ModuleNotFoundError: No module named 'x'", stderr_tail.py:
bounded, control characters stripped, its secrets masked), so the reconciler sees a failed replica,
says why, and replaces it. A replica fleetkeeper terminated ends as an EC2 instance terminated
through the API does: `Client.UserInitiatedShutdown`.
Instance ids look like `local-3-pid4242`: the pid is there so a person (or a test) can find and
kill a replica's process.

It also sets SkyPilot's task variables and fleetkeeper's own (fleetkeeper.spec.task_variables) as an EC2
replica has them: SKYPILOT_NODE_IPS is 127.0.0.1, SKYPILOT_NUM_GPUS_PER_NODE the accelerators of the
spec's first candidate instance type (0 without one), whatever this host has.

A version's workdir is unpacked into the replica's working directory and its secrets are added to
its environment before `setup`, as `replica_boot.py` does on EC2 (the archive from the embedded
workdir store, the values from the in-memory AWS's Parameter Store). An app that does not listen on
its $PORT is told so (`diagnose`).

Next to each log, `replica-<id>.log.times` records when the log grew ("<epoch seconds> <size>" a line,
at most one a second), so `fleetkeeper logs --since 10m` can start at the right byte without
rewriting what the app printed.

State lives in this process only: a replica cannot outlive the embedded control plane that started
it (`stop_all` on shutdown), so there is nothing to rediscover after a restart.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar

from fleetkeeper.choices import Isolation, values
from fleetkeeper.local import netns
from fleetkeeper.local.stderr_tail import StderrTee
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
from fleetkeeper.spec import runtime, task_variables

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

LOCAL_DIR_ENV = "FLEETKEEPER_LOCAL_DIR"
DEFAULT_LOCAL_DIR = ".fleetkeeper"
LOOPBACK = "127.0.0.1"
# How replicas get a host of their own (fleetkeeper.choices' Isolation): "netns" (a network namespace
# each), "shared" (this machine's loopback, a port each), or "auto" (the default): netns where the
# machine allows it.
ISOLATION_ENV = "FLEETKEEPER_LOCAL_ISOLATION"
NETNS = Isolation.NETNS
SHARED = Isolation.SHARED
AUTO = Isolation.AUTO
# What apps print when their port is taken (Python, Go, Node, Rust, Java...).
_ADDRESS_IN_USE = re.compile(r"address already in use|EADDRINUSE|Errno 98|os error 98|BindException", re.IGNORECASE)
_PORT_IN_TEXT = re.compile(r":(\d{2,5})\b")
# What a `setup` that reached for the internet prints in a namespace with loopback only: the
# resolver's and the socket's errors (Python, curl, pip, apt, git), and pip's conclusion.
_NO_NETWORK = re.compile(
    r"Temporary failure in name resolution|Name or service not known|Could not resolve host"
    r"|Network is unreachable|No matching distribution found|Failed to establish a new connection"
    r"|nodename nor servname|getaddrinfo",
    re.IGNORECASE,
)
OFFLINE_HINT = (
    "replicas here have no outbound network, each in a namespace with loopback only: install what it "
    "needs where `fleetkeeper local` runs, put files in `workdir`, or use `--isolation shared`"
)

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
    port: int  # where the driver reaches it on 127.0.0.1
    log_path: Path
    log: IO[bytes]
    app_port: int = 0  # the app's $PORT (the spec's port in its own namespace; `port` when shared)
    spec_port: int = 0
    relay: netns.HostRelay | None = None
    # Why the process exited, beyond its code (a port someone else holds), asked once when it has.
    explain: Callable[[_Replica], str | None] | None = None
    # Its stderr on the way to its log, whose last line goes into the reason it exited (stderr_tail.py).
    stderr: StderrTee | None = None
    secrets: tuple[str, ...] = ()  # the values no reason may show
    # In a network namespace of its own: loopback only, so a failure that reads as "no network" says so.
    offline: bool = False
    terminating: bool = False
    reclaimed: bool = False
    ended_at: float | None = None

    def log_tail(self) -> str:
        """The last 8 KiB of its log ("" when it cannot be read): where its own error lines are."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, self.log_path.stat().st_size - 8192))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

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
            # Asked first: whoever holds its port is still there now, the group's leftovers too.
            why = self.explain(self) if self.explain is not None and code != 0 and not self.terminating else None
            _signal_group(self.process, signal.SIGKILL)
            self.ended_at = time.monotonic()
            if self.stderr is not None:
                self.stderr.finish(timeout=2.0)  # at once, unless something outside the group holds the pipe
            self.log.close()
            if self.relay is not None:
                self.relay.close()
            if self.reclaimed:
                reason_code, reason = SPOT_INSTANCE_TERMINATION, "Spot instance termination (simulated)"
            elif self.terminating:
                reason_code, reason = USER_INITIATED_SHUTDOWN, "terminated by fleetkeeper"
            else:
                reason_code, reason = PROCESS_EXITED, f"the replica process exited with code {_describe_exit(code)}"
                said = why or (self.stderr.summary(self.secrets) if self.stderr is not None else None)
                if said:
                    reason += f": {said}"
                if self.offline and _NO_NETWORK.search(self.log_tail()):
                    reason += f" ({OFFLINE_HINT})"
            self.instance = replace(
                self.instance,
                state=InstanceState.TERMINATED,
                state_reason_code=reason_code,
                state_reason=f"{reason_code}: {reason}",
            )
        return self.instance


def port_mismatch(listening: Sequence[int], port: int, *, isolated: bool) -> str:
    """What to change when a replica listens elsewhere than on its $PORT. In a namespace of its own
    $PORT is the spec's port, as on EC2: the spec and the app must agree (reading $PORT is one way,
    naming the app's port in the spec the other); sharing this machine's loopback, $PORT is a free
    port of the replica's own, which the app has to read."""
    shown = ", ".join(map(str, listening))
    if isolated:
        fix = (
            f"set the spec's port to it (`service.ports: {listening[0]}`)"
            if len(listening) == 1
            else "set the spec's port (`service.ports`) to the one it serves on"
        )
        return f"listening on {shown}, not on the spec's port {port} ($PORT): {fix}, or make the app listen on {port}"
    return (
        f"listening on {shown}, expected $PORT={port}: replicas share this machine's loopback here, so each "
        "gets a free port in $PORT: make the app listen on $PORT"
    )


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
        isolation: str | None = None,
    ) -> None:
        """`isolation`: NETNS, SHARED or AUTO (None: $FLEETKEEPER_LOCAL_ISOLATION, else AUTO)."""
        self.local_dir = local_dir
        # The embedded mode's own stack id: its replicas carry it as an EC2 replica carries its stack's.
        self.stack_id = stack_id
        self.isolation, self.isolation_note = _resolve_isolation(isolation or os.environ.get(ISOLATION_ENV) or AUTO)
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
        # Unix sockets of the replicas' relays: a short path of its own (sun_path holds 107 bytes,
        # and a local dir under a test's tmp_path can be longer than that).
        self._run_dir: Path | None = None
        self._log_sizes: dict[Path, int] = {}
        self._sampler: threading.Thread | None = None
        self._stop_sampling = threading.Event()

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
        """Where the replica is reached on 127.0.0.1: its relay's port in a namespace of its own, else
        its own $PORT (`port`, the spec's port, is what EC2 replicas use)."""
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
            pgid, port = replica.process.pid, replica.app_port
        listening = sorted(_listening_ports(pgid) - {port})
        if not listening:
            return None
        return port_mismatch(listening, port, isolated=self.isolation == NETNS)

    # -- embedded mode ---------------------------------------------------------------------------------

    def log_path(self, service: str, uid: str, replica_id: int) -> Path:
        """The replica's log, in its service incarnation's folder (the uid: a service deleted and
        created again under its name does not see the old run's lines)."""
        return self.local_dir / "logs" / service / uid / f"replica-{replica_id}.log"

    def home_dir(self, service: str, uid: str, replica_id: int) -> Path:
        """The replica's HOME: its own, as each EC2 replica has its own disk (and /home/ubuntu)."""
        return self.local_dir / "work" / service / uid / f"replica-{replica_id}"

    def work_dir(self, service: str, uid: str, replica_id: int) -> Path:
        """The replica's working directory, `~/sky_workdir` (SkyPilot's): the workdir is unpacked there."""
        return self.home_dir(service, uid, replica_id) / runtime.WORKDIR_NAME

    def remove_incarnation(self, service: str, uid: str) -> None:
        """Delete a deleted service's logs and working directories (embedded mode's cleanup calls this
        once the incarnation is gone; its replicas were terminated before)."""
        for kind in ("logs", "work"):
            folder = self.local_dir / kind / service
            shutil.rmtree(folder / uid, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if no other incarnation is left in it
        gone = self.local_dir / "logs" / service / uid
        with self._lock:
            for path in [p for p in self._log_sizes if p.is_relative_to(gone)]:
                del self._log_sizes[path]

    def stop_all(self, timeout: float | None = None) -> None:
        """Stop every replica (shutdown): TERM to all groups, then KILL what is left after the grace."""
        self._stop_sampling.set()
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
            self._sample_logs()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    def pids(self) -> list[int]:
        """Process ids of the replicas still running (process group leaders)."""
        with self._lock:
            return [r.process.pid for r in self._replicas.values() if r.process.poll() is None]

    # -- internals -------------------------------------------------------------------------------------

    def _start(self, request: LaunchRequest) -> _Replica:
        """Runs a replica as a process group of its own (in a network namespace under netns
        isolation), its output appended to its log, as an EC2 replica's boot runs the spec."""
        spec = request.spec
        isolated = self.isolation == NETNS
        # In a namespace of its own the app gets the spec's port, as on EC2; sharing this machine's
        # loopback, a free port of its own.
        app_port = spec.port if isolated else self._free_port()
        log_path = self.log_path(request.service, request.uid, request.replica_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        work_dir = self.work_dir(request.service, request.uid, request.replica_id)
        work_dir.mkdir(parents=True, exist_ok=True)
        self._unpack_workdir(request, work_dir)
        secrets = self._secrets(request)
        log = log_path.open("ab")
        started = to_iso(utcnow())
        host = "its own network namespace" if isolated else "this machine's loopback"
        log.write(
            f"# fleetkeeper: service {request.service} replica {request.replica_id} version "
            f"{request.version}, PORT={app_port} on {host}, started {started}\n".encode()
        )
        log.flush()
        first = task_variables.first_instance_type(spec)
        env = self._environment(request, app_port, work_dir, secrets, first)
        setup = runtime.task_script(spec.setup) if spec.setup else ""
        command = ["bash", "-c", _WRAPPER, "fleetkeeper-replica", setup, runtime.task_script(spec.run)]
        self._seq += 1
        socket_path = ""
        if isolated:
            socket_path = str(self._sockets() / f"r{self._seq}.sock")
            relayed = ["--socket", socket_path, "--port", str(app_port), "--"]
            command = [sys.executable, "-I", str(netns.SCRIPT), *relayed, *command]
        try:
            process = subprocess.Popen(  # the user's own spec, run as the user, as on EC2
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.PIPE,
                env=env,
                cwd=work_dir,
                start_new_session=True,  # its own process group: terminate kills all it started
            )
        except OSError as exc:
            log.close()
            raise LaunchRefused("ProcessLaunchFailed", str(exc)) from exc
        assert process.stderr is not None  # stderr=PIPE
        stderr = StderrTee(process.stderr, log, name=f"replica-{self._seq}-stderr")
        relay = netns.HostRelay(socket_path) if isolated else None
        instance = self._instance(request, process.pid, started, first)
        self._start_sampler()
        return _Replica(
            instance=instance,
            process=process,
            port=relay.port if relay is not None else app_port,
            log_path=log_path,
            log=log,
            app_port=app_port,
            spec_port=spec.port,
            relay=relay,
            explain=None if isolated else self._port_taken,
            stderr=stderr,
            secrets=tuple(secrets.values()),
            offline=isolated,
        )

    def _environment(
        self, request: LaunchRequest, app_port: int, work_dir: Path, secrets: dict[str, str], first: str | None
    ) -> dict[str, str]:
        """The replica's environment: this one's minus the control plane's own variables, then the spec's
        envs and secrets, then the variables an EC2 replica gets."""
        spec = request.spec
        env = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_PREFIXES)}
        env.update(spec.envs)
        env.update(secrets)
        env["PORT"] = str(app_port)
        # `~` is the replica's own directory, as /home/ubuntu is an EC2 replica's: `cd ~/sky_workdir`,
        # `tee ~/server.log` stay inside it.
        env["HOME"] = str(work_dir.parent)
        # SkyPilot's task variables and fleetkeeper's own, as an EC2 replica has them (over envs and
        # secrets): this host is the node, the accelerators those of the first candidate type.
        env.update(
            task_variables.variables(
                request.service, request.uid, request.version, request.replica_id, first, node_ip=LOOPBACK
            )
        )
        # A local replica listens on loopback only, whatever its spec says (on EC2 it binds all
        # interfaces, so the reconciler's probes reach it): see examples/hello.
        env["HOST"] = LOOPBACK
        return env

    def _instance(self, request: LaunchRequest, pid: int, started: str, first: str | None) -> Instance:
        """The replica process as the reconciler sees an instance, tagged as RunInstances tags one."""
        return Instance(
            instance_id=f"local-{self._seq}-pid{pid}",
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

    def _sockets(self) -> Path:
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix="fk-"))
        return self._run_dir

    def _port_taken(self, replica: _Replica) -> str | None:
        """Why a replica sharing this machine's loopback could not bind: whose the port is. Read from
        the end of its log (an app's own "Address already in use"), asked while the holder still runs."""
        lines = [line for line in replica.log_tail().splitlines() if _ADDRESS_IN_USE.search(line)]
        if not lines:
            return None
        said = {int(m) for line in lines for m in _PORT_IN_TEXT.findall(line) if 0 < int(m) < 65536}
        said.discard(replica.app_port)
        # The port its message names (Go, Node), else the spec's: the usual suspect, as in a SkyPilot
        # YAML's `python3 -m http.server 8080` (Python's message names no port).
        candidates = sorted(said) or ([replica.spec_port] if replica.spec_port not in (0, replica.app_port) else [])
        if not candidates:
            return "its port is taken (Address already in use) and it does not listen on its $PORT"
        held = {port: _pid_listening_on(port) for port in candidates}
        port = next((p for p in candidates if held[p] is not None), candidates[0])
        return (
            f"port {port} is taken by {self._holder(held[port])}; replicas share this machine's "
            f"loopback here ({self.isolation_note}), so each must listen on its $PORT ({replica.app_port})"
        )

    def _holder(self, pid: int | None) -> str:
        if pid is None:
            return "another process"
        if pid == os.getpid():
            return "fleetkeeper local itself"
        group = _group_of(pid)
        for other in self._replicas.values():
            if other.process.pid == group and other.process.poll() is None:
                instance = other.instance
                return f"replica {instance.replica_id} of {instance.service} (pid {pid})"
        command = _command_line(pid)
        return f"`{command}` (pid {pid})" if command else f"another process (pid {pid})"

    def _unpack_workdir(self, request: LaunchRequest, work_dir: Path) -> None:
        """The version's workdir into the replica's working directory (replica_boot.py on EC2)."""
        workdir = request.spec.workdir
        if workdir is None:
            return
        from fleetkeeper.replicas.workdirs import service_key

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
        from fleetkeeper.replicas.secrets import SecretStore

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

    def _start_sampler(self) -> None:
        if self._sampler is None or not self._sampler.is_alive():
            self._stop_sampling.clear()
            self._sampler = threading.Thread(target=self._sample_forever, name="replica-log-times", daemon=True)
            self._sampler.start()

    def _sample_forever(self) -> None:
        while not self._stop_sampling.wait(1.0):
            with self._lock:
                self._sample_logs()

    def _sample_logs(self) -> None:
        """Note, beside each log that grew, when it did (`logs --since` reads it)."""
        now = time.time()
        for replica in self._replicas.values():
            path = replica.log_path
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if self._log_sizes.get(path) == size:
                continue
            self._log_sizes[path] = size
            with contextlib.suppress(OSError), path.with_name(path.name + ".times").open("a") as times:
                times.write(f"{now:.0f} {size}\n")

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


_availability: tuple[bool, str] | None = None
_availability_lock = threading.Lock()


def namespaces_available() -> tuple[bool, str]:
    """Whether replicas can have network namespaces here, and a note why (checked once a process)."""
    global _availability  # one check per process: it starts a child process
    with _availability_lock:
        if _availability is None:
            _availability = netns.available()
        return _availability


def _resolve_isolation(asked: str) -> tuple[Isolation, str]:
    """The isolation replicas get, and why (`RESOLVED`: each Isolation's, AUTO is NETNS where the
    machine allows it)."""
    if asked not in values(Isolation):
        raise ValueError(f"{ISOLATION_ENV}={asked!r}: use one of {', '.join(Isolation)}")
    return RESOLVED[Isolation(asked)]()


def _netns() -> tuple[Isolation, str]:
    ok, note = namespaces_available()
    if ok:
        return NETNS, note
    return SHARED, f"no network namespaces here: {note}"


# What each isolation asked for resolves to, and why (tests/test_choices.py: one per Isolation).
# NETNS asked for where the machine has no namespaces is SHARED too: `fleetkeeper local` refuses
# it before the driver is made (fleetkeeper.local.server, IsolationUnavailable).
RESOLVED: Mapping[Isolation, Callable[[], tuple[Isolation, str]]] = {
    Isolation.AUTO: _netns,
    Isolation.NETNS: _netns,
    Isolation.SHARED: lambda: (SHARED, "--isolation shared"),
}


def _processes() -> list[Path]:
    try:
        return [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _socket_inodes(entry: Path) -> set[str]:
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in (entry / "fd").iterdir():
            with contextlib.suppress(OSError):
                target = str(fd.readlink())
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _listen_table(net: Path) -> dict[str, int]:
    """Socket inode -> TCP port, of the sockets listening in the network namespace of `net`
    (/proc/<pid>/net, or /proc/net for this process's own)."""
    found: dict[str, int] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":  # 0A: LISTEN
                found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def _group_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    except OSError:
        text = _ask("ps", "-o", "command=", "-p", str(pid))  # no /proc (macOS)
    return text if len(text) <= 80 else text[:77] + "..."


def _pid_listening_on(port: int) -> int | None:
    """A process listening on TCP `port` of this machine's loopback: from /proc on Linux, else lsof."""
    if Path("/proc/net/tcp").exists():
        return _listeners().get(port)
    answer = _ask("lsof", "-nP", "-t", f"-iTCP:{port}", "-sTCP:LISTEN").split()
    return int(answer[0]) if answer and answer[0].isdigit() else None


def _ask(*command: str) -> str:
    """A system tool's answer, or "" when it is not there or fails (it only improves a message)."""
    if shutil.which(command[0]) is None:
        return ""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _listening_ports(pgid: int) -> set[int]:
    """TCP ports the processes of group `pgid` listen on, in their own network namespace (Linux
    /proc; empty elsewhere)."""
    inodes: set[str] = set()
    for entry in _processes():
        if _group_of(int(entry.name)) == pgid:
            inodes |= _socket_inodes(entry)
    table = _listen_table(Path(f"/proc/{pgid}/net"))
    return {port for inode, port in table.items() if inode in inodes}


def _listeners() -> dict[int, int]:
    """TCP port -> a pid listening on it, in this process's network namespace (Linux /proc)."""
    table = _listen_table(Path("/proc/net"))
    if not table:
        return {}
    found: dict[int, int] = {}
    for entry in _processes():
        for inode in _socket_inodes(entry) & table.keys():
            found.setdefault(table[inode], int(entry.name))
    return found


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The replica is its own session and group leader (start_new_session): its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
