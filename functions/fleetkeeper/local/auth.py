"""Who may drive `fleetkeeper local`: its user's CLI, and nobody else on the machine or the web.

The embedded control plane runs `run:` commands as the developer, and holds their secrets in clear,
so its HTTP API (and its in-memory AWS) must refuse what a web page, a DNS-rebinding name or another
local user could send. Each run of `fleetkeeper local`:

- makes a fresh random credential and writes it, with the API's URL and the server's pid, to
  `<state dir>/local-api.json`, mode 0600 in a 0700 directory (CREDENTIAL_FILE);
- links that file from the user's runtime directory (`$XDG_RUNTIME_DIR/fleetkeeper`, else
  `~/.cache/fleetkeeper/run`; $FLEETKEEPER_RUNTIME_DIR overrides it) as `api-<port>.json`, so that
  the CLI finds it from any directory, with no flag to type;
- requires on every request: `Host: 127.0.0.1:<port>` exactly (a DNS-rebinding name is refused),
  no `Origin` but its own (a browser always sends one on a cross-site write), `Authorization:
  Bearer <token>` (compared in constant time), and `Content-Type: application/json` on a write
  with a body (what a page may send without a CORS preflight is text/plain, a form, or nothing);
- withdraws both files when it stops.

The CLI uses a credential only for the exact URL it was made for, only from a file its user owns
that nobody else can read, and only while the server that wrote it is alive: a port some other
process took over gets no token and no secret (docs/architecture/embedded-mode.md, "The embedded
mode's trust boundary").

This module is imported by the CLI on every run: standard library only.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

CREDENTIAL_FILE = "local-api.json"
RUNTIME_DIR_ENV = "FLEETKEEPER_RUNTIME_DIR"
PRIVATE_UMASK = 0o077
BEARER = "Bearer"
# Writes a browser can send cross-site without a preflight carry a body of one of the "simple"
# content types; a write with a body must say it is JSON, which only a CORS-approved page could.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_REGISTRY_ENTRY = re.compile(r"^api-(\d{1,5})\.json$")


class CredentialProblem(Exception):
    """A credential file or directory that must not be trusted (someone else's, or readable by others)."""


@dataclass(frozen=True)
class LocalCredential:
    """What `fleetkeeper local` writes for its user's CLI (and for curl: see docs/CLI.md)."""

    api_url: str
    token: str
    pid: int
    # The in-memory AWS: its endpoint, and the access key id it takes (it is the credential there).
    aws_endpoint: str = ""
    aws_access_key_id: str = ""

    @property
    def authorization(self) -> str:
        return f"{BEARER} {self.token}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: Path) -> LocalCredential:
        try:
            data = json.loads(text)
            return cls(
                api_url=str(data["api_url"]),
                token=str(data["token"]),
                pid=int(data["pid"]),
                aws_endpoint=str(data.get("aws_endpoint", "")),
                aws_access_key_id=str(data.get("aws_access_key_id", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CredentialProblem(f"{source} is not a fleetkeeper local credential: {exc}") from None


def new_token() -> str:
    """256 random bits, hex: safe in a header, a file and a shell variable."""
    return secrets.token_hex(32)


def new_access_key_id() -> str:
    """An access key id for the in-memory AWS, in AWS's alphabet ([A-Z0-9]), random per run."""
    return "FKLOCAL" + secrets.token_hex(16).upper()


# --- private files ------------------------------------------------------------------------------------


def private_dir(path: Path) -> Path:
    """`path` as a directory only its user can enter (0700): created so, or tightened if it is theirs.

    A directory another user owns is refused: they could read what we write, or plant a credential."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise CredentialProblem(f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise CredentialProblem(f"{path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}): choose another")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write `path` as a 0600 file, atomically (a reader never sees half of it)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    partial.replace(path)


def read_private(path: Path) -> str:
    """The text of a file its reader owns and nobody else can read or write; else CredentialProblem."""
    fd = os.open(path, os.O_RDONLY)
    try:
        info = os.fstat(fd)  # of what was opened, not of what the name points at a moment later
        if not stat.S_ISREG(info.st_mode):
            raise CredentialProblem(f"{path} is not a regular file")
        if info.st_uid != os.getuid():
            raise CredentialProblem(f"{path} belongs to uid {info.st_uid}, not to you: refusing to use it")
        if stat.S_IMODE(info.st_mode) & 0o077:
            mode = oct(stat.S_IMODE(info.st_mode))
            raise CredentialProblem(f"{path} is readable or writable by others (mode {mode}): refusing to use it")
        with os.fdopen(fd, "r", encoding="utf-8", closefd=False) as handle:
            return handle.read(64 * 1024)
    finally:
        os.close(fd)


# --- where the CLI finds the credential ---------------------------------------------------------------


def runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's own directory of running planes (not created here)."""
    env = os.environ if environ is None else environ
    if env.get(RUNTIME_DIR_ENV):
        return Path(env[RUNTIME_DIR_ENV])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "fleetkeeper"
    return Path.home() / ".cache" / "fleetkeeper" / "run"


def _registry_entry(port: int, environ: Mapping[str, str] | None = None) -> Path:
    return runtime_dir(environ) / f"api-{port}.json"


@dataclass(frozen=True)
class Published:
    """The files one run wrote: withdrawn when it stops."""

    credential: LocalCredential
    path: Path
    link: Path


def publish(credential: LocalCredential, state_dir: Path, environ: Mapping[str, str] | None = None) -> Published:
    """Write the credential in the (private) state dir and link it from the user's runtime dir,
    where the CLI looks; CredentialProblem if either cannot be done (the CLI would not find it)."""
    path = private_dir(state_dir) / CREDENTIAL_FILE
    write_private(path, credential.to_json())
    port = urlsplit(credential.api_url).port
    if port is None:
        raise CredentialProblem(f"the API URL {credential.api_url} has no port")
    link = _registry_entry(port, environ)
    try:
        private_dir(link.parent)
        partial = link.with_name(f".{link.name}.{os.getpid()}.partial")
        partial.unlink(missing_ok=True)
        partial.symlink_to(path.resolve())
        partial.replace(link)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise CredentialProblem(
            f"cannot link the credential from {link.parent} ({exc.strerror or exc}): "
            f"set {RUNTIME_DIR_ENV} to a directory of yours"
        ) from None
    return Published(credential, path, link)


def withdraw(published: Published) -> None:
    """Remove what `publish` wrote, unless a newer run has replaced it since."""
    try:
        if published.link.readlink() == published.path.resolve():
            published.link.unlink()
    except OSError:
        pass
    try:
        current = LocalCredential.from_json(read_private(published.path), published.path)
    except (OSError, CredentialProblem):
        return
    if current.token == published.credential.token:
        published.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether `pid` is a process of ours (a credential outlives a killed server; its pid may be reused
    by someone else's process, which signal 0 tells apart: EPERM)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _load(path: Path) -> LocalCredential | None:
    """The credential at `path` if there is one and its server still runs; CredentialProblem if the
    file is there but must not be trusted."""
    try:
        text = read_private(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CredentialProblem(f"cannot read {path}: {exc.strerror or exc}") from None
    credential = LocalCredential.from_json(text, path)
    return credential if _alive(credential.pid) else None


def running(environ: Mapping[str, str] | None = None) -> list[LocalCredential]:
    """The credentials of this user's running planes, by port."""
    try:
        entries = sorted(runtime_dir(environ).iterdir())
    except OSError:
        return []
    found = (_load(entry) for entry in entries if _REGISTRY_ENTRY.match(entry.name))
    return [credential for credential in found if credential is not None]


def credential_for(api_url: str, environ: Mapping[str, str] | None = None) -> LocalCredential | None:
    """The credential of the running plane at exactly `api_url` (same host, same port), or None.

    Exactly: `localhost` may resolve to ::1, where another process can hold the same port number."""
    port = urlsplit(api_url).port
    credential = _load(_registry_entry(port, environ)) if port is not None else None
    if credential is not None and _origin(credential.api_url) == _origin(api_url):
        return credential
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


# --- the server's checks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, in the api's error shape."""

    status: int
    code: str
    message: str
    field: str
    problem: str

    def body(self) -> dict[str, Any]:
        details = [{"field": self.field, "problem": self.problem}]
        return {"error": {"code": self.code, "message": self.message, "details": details}}

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.status == 401:
            headers["WWW-Authenticate"] = f'{BEARER} realm="fleetkeeper-local"'
        return headers


def forbidden_host(values: Sequence[str], *authorities: str) -> Refusal | None:
    """A Refusal unless the request carries exactly one Host and it is one of `authorities` (the
    server's own `host:port`s, lower-case): what a DNS-rebinding name is refused by here and in the
    local load balancer (fleetkeeper.local.balancer)."""
    if len(values) != 1 or values[0].strip().lower() not in authorities:
        got = ", ".join(repr(v) for v in values) or "none"
        message = f"the Host header must be {' or '.join(authorities)} (got {got})"
        return Refusal(403, "forbidden", message, "Host", "not this server's address")
    return None


def _forbidden_origin(values: list[str], allowed: str | None) -> Refusal | None:
    """No Origin (the CLI, curl, an SDK) or, where `allowed` is given, exactly ours."""
    if not values:
        return None
    if allowed is not None and len(values) == 1 and values[0].strip().lower() == allowed:
        return None
    got = ", ".join(repr(v) for v in values)
    message = f"requests from a web page are refused (Origin {got})"
    return Refusal(403, "forbidden", message, "Origin", "a web page's origin")


class ApiGate:
    """The embedded API's checks, before a byte of the body is read (see the module docstring)."""

    def __init__(self, token: str, host: str, port: int) -> None:
        self._token = token.encode()
        self.authority = f"{host}:{port}".lower()
        self.origin = f"http://{self.authority}"

    def refuse(
        self,
        method: str,
        *,
        host: list[str],
        origin: list[str],
        authorization: list[str],
        content_type: str | None,
        has_body: bool,
        json_body: bool = True,
    ) -> Refusal | None:
        """A Refusal for a request this server must not serve, else None. Host and Origin first: a
        page or a rebinding name learns nothing more than 403. `json_body`: False for a route that
        takes another body (a workdir archive), still behind the credential."""
        refusal = forbidden_host(host, self.authority) or _forbidden_origin(origin, self.origin)
        if refusal is not None:
            return refusal
        if not authorization:
            message = (
                "this API needs the credential of the `fleetkeeper local` run: send Authorization: Bearer <token> "
                f"(the token is in <state dir>/{CREDENTIAL_FILE}; docs/CLI.md)"
            )
            return Refusal(401, "unauthorized", message, "Authorization", "missing")
        if len(authorization) != 1 or not self._token_matches(authorization[0]):
            message = "the credential is not this run's (was the server restarted?)"
            return Refusal(401, "unauthorized", message, "Authorization", "not this run's credential")
        if json_body and has_body and method.upper() in WRITE_METHODS and not _is_json(content_type):
            message = (
                f"request bodies must be JSON: send Content-Type: application/json (got {content_type or 'none'!r})"
            )
            return Refusal(415, "unsupported_media_type", message, "Content-Type", "not application/json")
        return None

    def _token_matches(self, value: str) -> bool:
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != BEARER.lower():
            return False
        return hmac.compare_digest(token.strip().encode(), self._token)


def _is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() == "application/json"


_CREDENTIAL_SCOPE = re.compile(r"Credential=([^/,\s]+)/")


class AwsGate:
    """The in-memory AWS's checks: loopback Host, no browser, and the run's access key id.

    moto does not verify SigV4 signatures, so the access key id a request is signed with is what
    tells this run's own clients (the handlers, the stream pump) from anyone else on the machine; it
    never leaves the process's environment and the 0600 credential file."""

    def __init__(self, access_key_id: str) -> None:
        self._key = access_key_id.encode()
        self.authority = ""  # host:port, once the server is bound

    def refuse(self, *, host: list[str], origin: list[str], authorization: str, query: str) -> Refusal | None:
        refusal = forbidden_host(host, self.authority) or _forbidden_origin(origin, None)
        if refusal is not None:
            return refusal
        match = _CREDENTIAL_SCOPE.search(authorization)
        key = match[1] if match else _query_credential(query)
        if key is None or not hmac.compare_digest(key.encode(), self._key):
            message = "the in-memory AWS serves this `fleetkeeper local` run's own clients only"
            return Refusal(403, "forbidden", message, "Authorization", "not this run's access key id")
        return None


def _query_credential(query: str) -> str | None:
    """A presigned URL's access key id (X-Amz-Credential=<key>/<scope>)."""
    from urllib.parse import parse_qs

    values = parse_qs(query).get("X-Amz-Credential")
    return values[0].split("/", 1)[0] if values else None
