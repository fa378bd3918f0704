"""A host of its own for each local replica: a network namespace per replica, where Linux allows it.

On EC2 every replica is a machine: an app that hard-codes `python3 -m http.server 8080` (as many
SkyPilot YAMLs do) runs fine on two replicas, and nothing else on the machine holds its port. On one
laptop two such replicas collide, and the API's own port may be the one they want. So, where an
unprivileged user may create namespaces (Linux with user namespaces enabled), each replica starts in
a new user and network namespace: its own loopback, brought up, with nothing else on it. The replica
gets the spec's port as $PORT, as on EC2.

A network namespace has no route to the host's loopback, but a Unix socket is a file: it is reached
by path from any network namespace. So this launcher, run inside the new namespace, listens on a
Unix socket and relays each connection to 127.0.0.1:<port> inside, and the process driver listens on
an ephemeral 127.0.0.1 port on the host and relays each connection to that Unix socket. The balancer
and the prober see a replica as before: an address on 127.0.0.1.

    prober/balancer -> 127.0.0.1:<ephemeral> (host relay) -> <run dir>/<replica>.sock
                    -> (launcher, inside the replica's namespace) -> 127.0.0.1:<spec's port> -> the app

The launcher stays as the parent of the user's command (`setup` then `run`, through bash) in the
same process group: it relays, passes TERM/INT/HUP on, and exits as its child did (the same code, or
killed by the same signal), so the driver reports the app's own exit.

This file is run as a script (`python -I netns.py ...`), so it imports the standard library only; the
driver imports `available` and `HostRelay` from it. Without user namespaces (macOS, a kernel or
container that forbids them) the driver falls back to the shared loopback (process_driver.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

LOOPBACK = "127.0.0.1"
# unshare(2) flags (linux/sched.h) and the interface ioctls (linux/sockios.h, linux/if.h).
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_CHUNK = 65536
SCRIPT = Path(__file__).resolve()


def enter_own_network() -> None:
    """Move this (single-threaded) process into a new user and network namespace, keeping its own
    uid and gid (so files it writes are the user's, and an exec drops the namespace's capabilities
    as for any unprivileged process), and bring the namespace's loopback up."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWUSER|CLONE_NEWNET): {os.strerror(code)}")
    # An unprivileged process may map its own ids only, and its gid only once setgroups is denied.
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(control.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(control.fileno(), _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def available(timeout: float = 10.0) -> tuple[bool, str]:
    """Whether replicas can get namespaces here, and why not: a child process tries what a launch does
    (the check cannot run in this process, which has threads: unshare(CLONE_NEWUSER) refuses those)."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces are Linux's ({sys.platform} here)"
    try:
        done = subprocess.run(
            [sys.executable, "-I", str(SCRIPT), "--check"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if done.returncode != 0:
        return False, (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return True, "each replica has a network namespace of its own"


# -- relaying ------------------------------------------------------------------------------------------


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until EOF, then pass the EOF on (half-close): HTTP/1.0 clients and streams need it."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    with client:
        try:
            upstream = connect()
        except OSError:
            # Nothing listens behind the relay (the app is starting, or gone): reset at once, as
            # close to "connection refused" as an accepted connection can get.
            with contextlib.suppress(OSError):
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        with upstream:
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()


def serve(listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
    """Accept on `listener` until it is closed; each connection is relayed to a new `connect()`."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_relay, args=(client, connect), name="relay", daemon=True).start()


def unix_connector(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix.connect(path)
        except OSError:
            unix.close()
            raise
        return unix

    return connect


def tcp_connector(port: int) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        return socket.create_connection((LOOPBACK, port), timeout=5)

    def connected() -> socket.socket:
        conn = connect()
        conn.settimeout(None)  # the timeout was for connecting; a stream may be idle for minutes
        return conn

    return connected


class HostRelay:
    """The host's side: 127.0.0.1:<ephemeral> relayed to a replica's Unix socket."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(512)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(
            target=serve, args=(self._listener, unix_connector(socket_path)), name="replica-relay", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        # shutdown() wakes the accept() blocked in the relay's thread; close() alone may not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


# -- the launcher ------------------------------------------------------------------------------------


# The lowest port an unprivileged process may bind: per network namespace (ip-sysctl.rst), and the
# namespace's own to set. In its own namespace a replica may bind any port, as on EC2 (`ports: 80`).
_UNPRIVILEGED_PORT_START = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")


def _launch(socket_path: str, port: int, command: Sequence[str]) -> int:
    enter_own_network()
    if port < 1024:  # the host's own setting is untouched: this is the namespace's
        _UNPRIVILEGED_PORT_START.write_text("0")
    Path(socket_path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(512)
    threading.Thread(target=serve, args=(listener, tcp_connector(port)), name="relay", daemon=True).start()
    child = subprocess.Popen(command)  # same process group: the driver's group signals reach it too
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A signal sent to this process alone (a person's `kill <pid>`) reaches the app as well.
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
    listener.close()
    with contextlib.suppress(OSError):
        Path(socket_path).unlink()
    if code < 0:  # end as the app ended: killed by the same signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition cannot be set (nor need be)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is not to end the process: as a shell reports it
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netns.py", description="Run a command in a network namespace of its own.")
    parser.add_argument("--check", action="store_true", help="only check that this machine allows it")
    parser.add_argument("--socket", help="the Unix socket to relay to 127.0.0.1:--port inside")
    parser.add_argument("--port", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.check:
        try:
            enter_own_network()
            with socket.socket() as probe:  # the namespace's loopback is up and ours
                probe.bind((LOOPBACK, 0))
        except OSError as exc:
            print(f"no network namespace for replicas: {exc}", file=sys.stderr)
            return 1
        except AttributeError:  # no unshare() in this C library
            print("no network namespace for replicas: no unshare() here", file=sys.stderr)
            return 1
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not (args.socket and args.port and command):
        parser.error("--socket, --port and a command are needed")
    try:
        return _launch(args.socket, args.port, command)
    except OSError as exc:
        code = exc.errno or errno.EPERM
        print(f"fleetkeeper: could not give the replica a network of its own: {exc}", file=sys.stderr)
        return 127 if code == errno.ENOENT else 126


if __name__ == "__main__":
    sys.exit(main())
