"""Real HTTP in front of the api handler: each request becomes the event API Gateway would send.

Every request, /v1 and /_local alike, must first pass the run's `ApiGate` (fleetkeeper.local.auth):
`Host: 127.0.0.1:<port>`, no foreign Origin, `Authorization: Bearer <token>`, and a JSON body on a
write; else 403, 401 or 415 in the api's error shape, before any of the body is read.

Every request under /v1 is turned into an API Gateway REST proxy event (`fleetkeeper.aws.apigw`), given
to the api Lambda handler, and its response becomes the HTTP response: status, headers and body.
A few embedded-mode routes live beside the API under /_local:

  POST /_local/kick                    {"service": name}: wake the reconciler loop (the kick URL);
                                       with "delay_seconds": n, n seconds from now (SQS's DelaySeconds);
                                       with "followup": due, the reconciler's follow-up of a service
  GET  /_local/info                    where things are: API URL, logs, in-memory AWS endpoint, table
  GET  /_local/logs/<service>          the service's replica log files; ?uid=U: of that incarnation
                                       (else the newest one's)
  GET  /_local/logs/<service>/<id>     one replica's log (text); ?offset=N from byte N, ?tail=N its last
                                       N lines, ?since=EPOCH what it printed from then on (?uid=U as
                                       above); the X-Log-Size header says how long the file is
  PUT  /_local/workdirs/<sha256>       a packed workdir (the upload URL POST /v1/workdirs hands out)
  POST /_local/interrupt               {"service": name, "replica": id, "kind": "spot-interruption" or
                                       "rebalance-recommendation", "notice_seconds": 120}: simulate EC2's
                                       warning about a spot replica (and, for an interruption, its reclaim
                                       `notice_seconds` later), delivered to the reconciler as on AWS

The api handler runs one request at a time, as one Lambda execution environment does: Powertools'
Logger keeps an invocation's keys (its request id) on a module-level object, so concurrent calls
would mix their log lines.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fleetkeeper.aws.apigw import response_parts, rest_event
from fleetkeeper.kick import MAX_DELAY_SECONDS
from fleetkeeper.local.auth import ApiGate
from fleetkeeper.local.context import LocalContext
from fleetkeeper.replicas.workdirs import MAX_WORKDIR_BYTES, WorkdirInvalid
from fleetkeeper.spec.service import NAME_PATTERN

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fleetkeeper.replicas.workdirs import LocalWorkdirStore

# Outside the `fleetkeeper` logger tree: Powertools' logger there would stamp these with a handler's context.
logger = logging.getLogger("local.http_bridge")

ApiHandler = Callable[[dict[str, Any], Any], dict[str, Any]]
API_FUNCTION = "ApiFunction"
KICK_PATH = "/_local/kick"
INTERRUPT_PATH = "/_local/interrupt"
_LOG_PATH = re.compile(r"^/_local/logs/(?P<service>[^/]+)(?:/(?P<replica>\d+))?$")
_SERVICE_NAME = re.compile(NAME_PATTERN)
_REPLICA_LOG = re.compile(r"^replica-(\d+)\.log$")
_WORKDIR_PATH = re.compile(r"^/_local/workdirs/(?P<hex>[0-9a-f]{64})$")


def local_principal() -> str:
    """The identity every request through the bridge carries: `local:<os-user>`, in the place API
    Gateway puts a signer's ARN. The embedded mode makes it an administrator (server.py), so its
    user sees and changes every service, as the only user of the control plane it runs."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = f"uid-{os.getuid()}"
    return "local:" + (re.sub(r"[^\w.@-]", "-", user) or "user")


# After refusing a body: how long and how much of it the bridge reads and drops before it closes.
_LINGER_SECONDS = 2.0
_LINGER_MAX_BYTES = 4 * 1024 * 1024


class ApiBridge(ThreadingHTTPServer):
    """The embedded control plane's HTTP server (see the module docstring)."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        api_handler: ApiHandler,
        *,
        token: str,
        on_kick: Callable[[str], None],
        logs_dir: Path,
        on_interrupt: Callable[[str, int, str, float], tuple[int, dict[str, Any]]] | None = None,
        on_delayed_kick: Callable[[str, int, int | None], None] | None = None,
        info: dict[str, Any] | None = None,
        api_timeout_seconds: int = 30,
        max_body_bytes: int | None = None,
        workdirs: LocalWorkdirStore | None = None,
        principal: str | None = None,
    ) -> None:
        if max_body_bytes is None:
            from fleetkeeper.api.refusals import MAX_BODY_BYTES  # the api's own limit, not restated

            max_body_bytes = MAX_BODY_BYTES
        super().__init__(address, _RequestHandler)
        host, port = self.server_address[:2]
        self.gate = ApiGate(token, str(host), int(port))
        self.max_body_bytes = max_body_bytes
        self.api_handler = api_handler
        self.on_kick = on_kick
        self.on_interrupt = on_interrupt
        # Takes delayed kicks and follow-ups (the reconcile loop keeps them until due); without it a
        # timer thread stands in for SQS's DelaySeconds.
        self.on_delayed_kick = on_delayed_kick
        self.logs_dir = logs_dir
        self.info = dict(info or {})
        self.api_timeout_seconds = api_timeout_seconds
        self.api_lock = threading.Lock()
        self.workdirs = workdirs
        self.principal = principal or local_principal()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def call_api(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        event = rest_event(method, target, headers=headers, body=body or None, principal=self.principal)
        with self.api_lock:
            response = self.api_handler(event, LocalContext(API_FUNCTION, self.api_timeout_seconds))
        return response_parts(response)


class _RequestHandler(BaseHTTPRequestHandler):
    server: ApiBridge
    protocol_version = "HTTP/1.1"
    server_version = "fleetkeeper-local"

    def __getattr__(self, name: str) -> Callable[[], None]:
        """`do_<METHOD>` for every method: the api answers them all (no_route, in its error shape),
        where http.server would answer an unknown one with its own 501 HTML page."""
        if name.startswith("do_"):
            return lambda: self._handle(self.command)
        raise AttributeError(name)

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; without NODELAY, Nagle's algorithm holds the
        # body back for the client's delayed ACK and every request costs ~40 ms more.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.current_thread().name = API_FUNCTION  # readable logs tell the handlers apart by thread

    def finish(self) -> None:
        if getattr(self, "_unread_body", False):
            self._lingering_close()
        super().finish()

    def _lingering_close(self) -> None:
        """Close after a refusal the way HTTP servers must: answer, stop writing, then read and drop
        what the client is still sending (bounded) until it closes. Closing at once would reset the
        connection while the client is mid-body, and it would see a broken pipe, not our answer."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(_LINGER_SECONDS)
            drained = 0
            while drained < _LINGER_MAX_BYTES:
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass  # the client went away, or took longer than we wait: nothing more to do

    def _handle(self, method: str) -> None:
        started = time.perf_counter()
        try:
            refusal = self._refuse_request(method) or self._refuse_body()
            if refusal is not None:
                # The body is left unread, so the connection cannot carry another request; it is
                # drained after the answer (`finish`) so the client can read that answer.
                self.close_connection = True
                self._unread_body = True
                status, headers, payload = refusal
            elif (upload := _WORKDIR_PATH.fullmatch(self.path)) and method == "PUT":
                status, headers, payload = self._receive_workdir(upload["hex"])
            elif self.path.startswith("/_local/"):
                body = self._read_body()
                status, headers, payload = self._local(method, body)
            else:
                body = self._read_body()
                # The credential is the bridge's business: it never reaches the handler (nor its logs).
                headers_in = {k: v for k, v in self.headers.items() if k.lower() != "authorization"}
                status, headers, payload = self.server.call_api(method, self.path, headers_in, body)
        except Exception:  # the bridge must answer; the handler's own errors are already responses
            logger.exception("embedded api bridge failed on %s %s", method, self.path)
            status, headers, payload = _json(500, _error("internal_error", "the embedded server failed; see its log"))
        self._send(status, headers, payload)
        elapsed = (time.perf_counter() - started) * 1000
        level = logging.DEBUG if method == "GET" or self.path == KICK_PATH else logging.INFO
        logger.log(level, "%s %s -> %d (%.1f ms)", method, self.path, status, elapsed)

    def _refuse_request(self, method: str) -> tuple[int, dict[str, str], bytes] | None:
        """The gate's answer to a request this server must not serve (fleetkeeper.local.auth), else None."""
        declared = (self.headers.get("Content-Length") or "").strip()
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        refusal = self.server.gate.refuse(
            method,
            host=self.headers.get_all("Host") or [],
            origin=self.headers.get_all("Origin") or [],
            authorization=self.headers.get_all("Authorization") or [],
            content_type=self.headers.get("Content-Type"),
            has_body=chunked or declared not in ("", "0"),
            json_body=not (method == "PUT" and _WORKDIR_PATH.match(self.path)),
        )
        if refusal is None:
            return None
        return refusal.status, refusal.headers(), json.dumps(refusal.body()).encode()

    def _refuse_body(self) -> tuple[int, dict[str, str], bytes] | None:
        """An answer for a body the bridge will not read, before reading any of it; else None."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return _json(411, _error("length_required", "send the body with a Content-Length, not chunked"))
        declared = self.headers.get("Content-Length")
        if declared is None:
            return None
        if not (declared.strip().isascii() and declared.strip().isdigit()):  # int() takes "-1", "+1", "1_0"
            return _json(400, _error("invalid_request", f"Content-Length {declared!r} is not a byte count"))
        limit = MAX_WORKDIR_BYTES if _WORKDIR_PATH.fullmatch(self.path) else self.server.max_body_bytes
        if int(declared) > limit:
            message = f"request body is {int(declared)} bytes; the limit is {limit}"
            return _json(413, _error("payload_too_large", message))
        return None

    def _receive_workdir(self, hex_digest: str) -> tuple[int, dict[str, str], bytes]:
        """Store an uploaded workdir archive, streamed, after checking its SHA-256 and size."""
        store = self.server.workdirs
        length = int(self.headers.get("Content-Length") or 0)
        if store is None:
            self._unread_body = True
            self.close_connection = True
            return _json(404, _error("no_route", "this embedded control plane has no workdir store"))

        def chunks() -> Iterator[bytes]:
            left = length
            while left > 0:
                chunk = self.rfile.read(min(left, 1024 * 1024))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk

        try:
            size = store.receive(f"sha256:{hex_digest}", chunks(), length)
        except WorkdirInvalid as exc:
            self._unread_body = True  # what is left of the body is drained after the answer
            self.close_connection = True
            return _json(400, _error("invalid_request", f"the archive cannot be stored: {exc}"))
        return _json(200, {"digest": f"sha256:{hex_digest}", "bytes": size})

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)  # checked by _refuse_body
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        self.send_response(status)
        for key, value in headers.items():
            if key.lower() not in {"content-length", "connection", "transfer-encoding"}:
                self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _local(self, method: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        path = self.path.split("?", 1)[0]
        if path == KICK_PATH and method == "POST":
            return self._kick(body)
        if path == INTERRUPT_PATH and method == "POST":
            return self._interrupt(body)
        if path == "/_local/info" and method == "GET":
            extra = {key: value() if callable(value) else value for key, value in self.server.info.items()}
            return _json(200, {**extra, "api_url": self.server.url, "logs_dir": str(self.server.logs_dir)})
        match = _LOG_PATH.fullmatch(path)
        if match and method == "GET":
            query = parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
            return self._logs(
                match["service"],
                match["replica"],
                _number(query, "offset"),
                _number(query, "tail"),
                uid=next(iter(query.get("uid") or []), None),
                since=_number(query, "since"),
            )
        return _json(404, _error("no_route", f"no route for {method} {path}"))

    def _kick(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        try:
            asked = json.loads(body or b"{}")
        except ValueError:
            asked = None
        service = asked.get("service") if isinstance(asked, dict) else None
        delay = asked.get("delay_seconds", 0) if isinstance(asked, dict) else 0
        followup = asked.get("followup") if isinstance(asked, dict) else None
        if not isinstance(service, str) or not _SERVICE_NAME.fullmatch(service):
            return _json(400, _error("invalid_request", 'the kick body is {"service": "<name>"}'))
        if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay <= MAX_DELAY_SECONDS:
            return _json(400, _error("invalid_request", f"delay_seconds: a whole number from 0 to {MAX_DELAY_SECONDS}"))
        if followup is not None and (isinstance(followup, bool) or not isinstance(followup, int)):
            return _json(400, _error("invalid_request", "followup: the follow-up's due time, in whole epoch seconds"))
        if (delay or followup is not None) and self.server.on_delayed_kick is not None:
            self.server.on_delayed_kick(service, delay, followup)
            return _json(202, {"kicked": service, "delay_seconds": delay})
        if delay:
            # As SQS's DelaySeconds does on AWS: the kick arrives then.
            timer = threading.Timer(delay, self.server.on_kick, args=(service,))
            timer.daemon = True
            timer.start()
            return _json(202, {"kicked": service, "delay_seconds": delay})
        self.server.on_kick(service)
        return _json(202, {"kicked": service})

    def _interrupt(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        usage = (
            'the body is {"service": "<name>", "replica": <id>, "kind": "spot-interruption" (the default) or '
            '"rebalance-recommendation", "notice_seconds": <seconds until the reclaim, 120 by default>}'
        )
        try:
            asked = json.loads(body or b"{}")
        except ValueError:
            asked = None
        if not isinstance(asked, dict):
            return _json(400, _error("invalid_request", usage))
        service, replica = asked.get("service"), asked.get("replica")
        kind = asked.get("kind", "spot-interruption")
        notice = asked.get("notice_seconds", 120)
        problems = []
        if not isinstance(service, str) or not _SERVICE_NAME.fullmatch(service):
            problems.append("service: a service name")
        if isinstance(replica, bool) or not isinstance(replica, int) or replica < 0:
            problems.append("replica: a replica id (a whole number)")
        if kind not in ("spot-interruption", "rebalance-recommendation"):
            problems.append("kind: spot-interruption or rebalance-recommendation")
        if isinstance(notice, bool) or not isinstance(notice, int | float) or not 0 <= notice <= 3600:
            problems.append("notice_seconds: seconds from 0 to 3600")
        if problems or not isinstance(replica, int):
            return _json(400, _error("invalid_request", f"{'; '.join(problems)}. {usage}"))
        if self.server.on_interrupt is None:
            return _json(404, _error("no_route", "this embedded control plane cannot simulate interruptions"))
        status, answer = self.server.on_interrupt(str(service), replica, str(kind), float(notice))
        return _json(status, answer)

    def _logs(
        self,
        service: str,
        replica: str | None,
        offset: int | None = None,
        tail: int | None = None,
        *,
        uid: str | None = None,
        since: int | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        if not _SERVICE_NAME.fullmatch(service):
            return _json(400, _error("invalid_request", f"service name {service!r} is invalid"))
        if uid is not None and not _UID.match(uid):
            return _json(400, _error("invalid_request", f"uid {uid!r} is invalid"))
        folder = incarnation_folder(self.server.logs_dir / service, uid)
        if replica is None:
            logs_found = ((p, _REPLICA_LOG.fullmatch(p.name)) for p in folder.glob("replica-*.log"))
            found = sorted((int(m[1]), p) for p, m in logs_found if m)
            logs = [{"replica_id": n, "path": str(p), "bytes": p.stat().st_size} for n, p in found]
            return _json(200, {"service": service, "logs": logs})
        path = folder / f"replica-{int(replica)}.log"
        if not path.is_file():
            return _json(404, _error("not_found", f"no log for replica {replica} of {service!r} in {folder}"))
        data = path.read_bytes()
        size = len(data)
        if offset is None and since is not None:
            offset = offset_since(path, since)
        if offset is not None:
            data = data[min(offset, size) :]
        elif tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail > 0 else b""
        return 200, {"Content-Type": "text/plain; charset=utf-8", "X-Log-Size": str(size)}, data

    def log_message(self, format: str, *args: Any) -> None:  # `format`: the base class's name
        """Silence http.server's own access log; `_handle` logs each request once."""


_UID = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def incarnation_folder(service_folder: Path, uid: str | None) -> Path:
    """A service's logs live per incarnation (<service>/<uid>/): the one asked for, else the newest."""
    if uid is not None:
        return service_folder / uid
    try:
        folders = [p for p in service_folder.iterdir() if p.is_dir()]
    except OSError:
        return service_folder / "-"
    return max(folders, key=lambda p: p.stat().st_mtime, default=service_folder / "-")


def offset_since(path: Path, since: int) -> int:
    """Where in a log its lines of `since` (epoch seconds) on begin, by the `.times` file beside it
    ("<epoch> <size>" lines, written as the log grew): the size it had at the last mark before then."""
    offset = 0
    try:
        marks = path.with_name(path.name + ".times").read_text().splitlines()
    except OSError:
        return 0
    for mark in marks:
        moment, _, size = mark.partition(" ")
        try:
            if int(moment) >= since:
                break
            offset = int(size)
        except ValueError:
            continue
    return offset


def _number(query: dict[str, list[str]], name: str) -> int | None:
    values = query.get(name)
    if not values or not (values[0].isascii() and values[0].isdigit()) or len(values[0]) > 12:
        return None
    return int(values[0])


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": []}}


def _json(status: int, body: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()
