"""A replica's first-boot fetch: its version's workdir (S3) and secrets (SSM), with its own role.

The ec2 user data writes this file to the instance and runs it before `setup`. It needs python3 and
nothing else (Ubuntu, the Deep Learning AMIs and Amazon Linux have it; no AWS CLI, no boto3): it
takes the instance role's credentials from IMDSv2, signs its two kinds of requests with SigV4
itself, checks the archive's SHA-256 before unpacking it (safely: no absolute paths, no `..`, no
links out of the directory) and writes the secrets to a root-only systemd EnvironmentFile, after
checking the parameter is the one fleetkeeper wrote (`verified_secrets`). Nothing it fetches is
printed.

Network calls are retried (a booting instance's network may take a moment), and so, for up to
`--propagation-seconds`, are the answers IAM's eventual consistency explains (`NOT_YET`): a role
made seconds before the launch may not give credentials or permissions yet. A failure that is the
environment's (`EnvironmentFailure`: IAM never caught up, or the secrets parameter failed
verification) is written to `--report` with its code and served on the replica's port
(`serve_report`), where the reconciler's readiness probe reads it: the replica fails without
counting against the version. Any other failure exits non-zero, so the replica's units never start
and the reconciler sees a replica that never gets READY.

The embedded mode's process driver imports `unpack` from here, so a local replica gets its workdir
the same way, minus the network.

Written for Python 3.8+ (the images' python3), the standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import io
import json
import os
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:
    from collections.abc import Callable
    from http.server import ThreadingHTTPServer

IMDS = os.environ.get("FLEETKEEPER_BOOT_IMDS", "http://169.254.169.254")
ATTEMPTS = 6
# The DNS suffix of AWS's endpoints in the instance's partition (amazonaws.com.cn in China): the
# user data passes the reconciler's (botocore's partition data); this is the commercial default.
DEFAULT_DNS_SUFFIX = "amazonaws.com"

# --- IAM's eventual consistency ---------------------------------------------------------------------
# An owner's role and instance profile may be made seconds before the launch
# (fleetkeeper/replicas/identity.py), and IAM is eventually consistent
# (https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html#troubleshoot_general_eventual-consistency):
# for a while IMDS may have no credentials for the role (404) and S3 and SSM may refuse them. Those
# answers are retried with a backoff for at most the boot's propagation bound, one budget for the
# whole boot (the user data passes min(PROPAGATION_SECONDS, half the probe's initial delay), so the
# report is up before the initial delay ends); past it, the environment failed, not the version.
PROPAGATION_SECONDS = 240
BACKOFF_FIRST_SECONDS = float(os.environ.get("FLEETKEEPER_BOOT_BACKOFF_SECONDS", "1"))  # tests shorten it
BACKOFF_MAX_SECONDS = 15.0
# (HTTP status, error code) pairs propagation explains, per endpoint. The code is AWS's own typed
# field (S3's <Code>, the JSON protocols' __type), never its message. S3 answers AccessDenied (and
# InvalidAccessKeyId for credentials it does not know yet) with 403; SSM AccessDeniedException (its
# own or KMS's, behind it) and UnrecognizedClientException with 400.
NOT_YET_CREDENTIALS = frozenset({(404, "")})
NOT_YET_S3 = frozenset({(403, "AccessDenied"), (403, "InvalidAccessKeyId")})
NOT_YET_JSON = frozenset({(400, "AccessDeniedException"), (400, "UnrecognizedClientException")})

# Failure codes the boot reports (fleetkeeper/reconciler/plan/failures.py names the same): both are
# the environment's and never count against the version.
IDENTITY_NOT_READY = "Fleetkeeper.BootIdentityNotReady"  # IAM did not catch up within the bound
SECRETS_REJECTED = "Fleetkeeper.SecretsParameterRejected"  # the parameter failed verification
# The report's HTTP answer: every request to the replica's port gets 503 with this header.
REPORT_HEADER = "Fleetkeeper-Boot-Failure"


class BootError(Exception):
    pass


class EnvironmentFailure(BootError):
    """A boot failure that is the environment's, with the code the reconciler reads (typed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Propagation:
    """The boot's one budget for waiting on IAM: each `wait` sleeps the next backoff, or raises
    EnvironmentFailure once the budget is spent."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.delay = BACKOFF_FIRST_SECONDS
        self.waited = 0

    def wait(self, what: str, answer: str) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise EnvironmentFailure(
                IDENTITY_NOT_READY,
                f"{what}: {answer} for {self.seconds:g}s after {self.waited} retries: the instance role's "
                "credentials or permissions never arrived (IAM propagation, or a role without them)",
            )
        self.waited += 1
        time.sleep(min(self.delay, left))
        self.delay = min(self.delay * 2, BACKOFF_MAX_SECONDS)


# The boot's budget, set by `main` (the log shipper, which retries by itself, waits for nothing).
_propagation = Propagation(0)


def _request(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 10.0,
) -> bytes:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        content: bytes = answer.read()
        return content


def error_code(exc: urllib.error.HTTPError, body: bytes) -> str:
    """AWS's error code of an error answer: the JSON protocols' `__type` (or x-amzn-ErrorType), S3's
    `<Code>`; "" when there is none (IMDS)."""
    header = exc.headers.get("x-amzn-ErrorType", "") if exc.headers else ""
    if not header and body.lstrip().startswith(b"{"):
        try:
            header = str(json.loads(body).get("__type", ""))
        except ValueError:
            header = ""
    if header:
        return header.split(":")[0].rsplit("#", 1)[-1]
    start, end = body.find(b"<Code>"), body.find(b"</Code>")
    return body[start + 6 : end].decode(errors="replace") if 0 <= start < end else ""


def _retried(what: str, call: Callable[[], bytes], not_yet: frozenset[tuple[int, str]] = frozenset()) -> bytes:
    """`call`, retried: a network error or 5xx/408/429 up to ATTEMPTS times, an answer in `not_yet`
    (propagation) until the boot's budget is spent; any other error answer at once."""
    attempt = 0
    while True:
        try:
            return call()
        except urllib.error.HTTPError as exc:
            body = exc.read()[:2000]
            code = error_code(exc, body)
            if (exc.code, code) in not_yet:
                _propagation.wait(what, f"HTTP {exc.code} {code}".rstrip())
                continue
            if exc.code < 500 and exc.code not in (408, 429):
                detail = body[:300].decode(errors="replace")
                raise BootError(f"{what}: HTTP {exc.code}: {detail}") from None
            error = f"HTTP {exc.code}"
        except OSError as exc:
            error = str(exc)
        attempt += 1
        if attempt == ATTEMPTS:
            raise BootError(f"{what}: {error} (after {ATTEMPTS} attempts)")
        time.sleep(min(2**attempt, 20))


def instance_identity() -> tuple[str, dict[str, str]]:
    """(region, credentials) of this instance, from IMDSv2."""
    token = _retried(
        "IMDS token",
        lambda: _request(
            IMDS + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
        ),
    ).decode()
    headers = {"X-aws-ec2-metadata-token": token}
    region = _retried("region", lambda: _request(IMDS + "/latest/meta-data/placement/region", headers=headers))
    base = IMDS + "/latest/meta-data/iam/security-credentials/"
    # No profile's role yet (404), or none listed: IAM has not propagated the instance profile.
    while True:
        listed = _retried("instance role", lambda: _request(base, headers=headers), NOT_YET_CREDENTIALS).split()
        if listed:
            break
        _propagation.wait("instance role", "no role listed")
    role = listed[0].decode()
    creds = json.loads(
        _retried("role credentials", lambda: _request(base + role, headers=headers), NOT_YET_CREDENTIALS)
    )
    return region.decode(), {"key": creds["AccessKeyId"], "secret": creds["SecretAccessKey"], "token": creds["Token"]}


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sign(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    service: str,
    region: str,
    creds: dict[str, str],
    now: datetime.datetime,
) -> dict[str, str]:
    """`headers` plus SigV4's (Authorization, X-Amz-Date, the session token, S3's payload hash)."""
    parts = urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload = hashlib.sha256(body).hexdigest()
    signed = {k.lower(): str(v).strip() for k, v in headers.items()}
    signed["host"] = parts.netloc
    signed["x-amz-date"] = amz_date
    if creds.get("token"):
        signed["x-amz-security-token"] = creds["token"]
    if service == "s3":
        signed["x-amz-content-sha256"] = payload
    names = sorted(signed)
    query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
        for k, v in sorted((*p.split("=", 1), "")[:2] for p in parts.query.split("&") if p)
    )
    canonical = "\n".join(
        [
            method,
            quote(parts.path or "/", safe="/-_.~%"),
            query,
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            payload,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + creds["secret"]).encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds['key']}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return signed


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017 - Python 3.8 has no datetime.UTC


def s3_url(
    bucket: str, key: str, region: str, endpoint: str | None = None, dns_suffix: str = DEFAULT_DNS_SUFFIX
) -> str:
    if endpoint:
        return f"{endpoint.rstrip('/')}/{bucket}/{quote(key)}"
    return f"https://{bucket}.s3.{region}.{dns_suffix}/{quote(key)}"


def get_object(
    bucket: str,
    key: str,
    region: str,
    creds: dict[str, str],
    endpoint: str | None = None,
    dns_suffix: str = DEFAULT_DNS_SUFFIX,
) -> bytes:
    url = s3_url(bucket, key, region, endpoint, dns_suffix)

    def call() -> bytes:
        return _request(url, headers=sign("GET", url, {}, b"", "s3", region, creds, _now()), timeout=120)

    return _retried(f"s3://{bucket}/{key}", call, NOT_YET_S3)


def ssm_url(region: str, endpoint: str | None = None, dns_suffix: str = DEFAULT_DNS_SUFFIX) -> str:
    return (endpoint or f"https://ssm.{region}.{dns_suffix}").rstrip("/") + "/"


# --- the secrets parameter ---------------------------------------------------------------------------
# Names a secret may not have, on the instance and in the api (fleetkeeper/spec/secret_names.py holds
# the same list; a test keeps them equal). Each is read by bash itself, the dynamic loader or a
# language runtime on its own, before or without any code of the version, and its value becomes code
# or chooses which code runs: BASH_ENV and ENV are expanded (command substitution) and sourced by
# every non-interactive shell, BASH_FUNC_* are function bodies, SHELLOPTS (xtrace) with PS4 runs an
# expansion per command, PATH and SHELL choose the programs that run, LD_* the libraries every
# program loads, PYTHON*/PERL*/RUBY*/LUA_*/NODE_OPTIONS/NODE_PATH/the JVM's option variables the
# modules and options an interpreter starts with, OPENSSL_*, GCONV_PATH and LOCPATH modules libc and
# OpenSSL load. Secret values are data written by whoever writes the parameter; under these names
# they would be code run as root. Names only the version's own tools read (PIP_INDEX_URL,
# GIT_ASKPASS, NODE_AUTH_TOKEN...) stay allowed: many are real secrets, and they act only when the
# version's code runs that tool.
REFUSED_SECRET_NAMES = frozenset(
    {
        "ENV",
        "PATH",
        "SHELL",
        "SHELLOPTS",
        "IFS",
        "CDPATH",
        "GLOBIGNORE",
        "EXECIGNORE",
        "POSIXLY_CORRECT",
        "PS0",
        "PS1",
        "PS2",
        "PS3",
        "PS4",
        "PROMPT_COMMAND",
        "NODE_OPTIONS",
        "NODE_PATH",
        "CLASSPATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
    }
)
REFUSED_SECRET_PREFIXES = ("BASH_", "LD_", "PYTHON", "PERL", "RUBY", "LUA_", "OPENSSL_")
_NAME_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_NAME_REST = _NAME_FIRST + "0123456789"


def is_shell_name(name: object) -> bool:
    """A valid shell variable name: letters, digits and _, not first a digit (no newline, no `=`)."""
    return isinstance(name, str) and bool(name) and name[0] in _NAME_FIRST and all(char in _NAME_REST for char in name)


def refused_secret_name(name: str) -> bool:
    return name in REFUSED_SECRET_NAMES or name.startswith(REFUSED_SECRET_PREFIXES)


def check_declared(names: list[str]) -> None:
    """The names the version declares (the user data's): the api refuses bad ones, so one here is a
    version stored before it did; the version's failure."""
    for name in names:
        if not is_shell_name(name):
            raise BootError(f"the version declares a secret name that is not a shell name: {name!r}")
        if refused_secret_name(name):
            raise BootError(f"the version declares the secret {name}, a name that changes how programs run")


def _ssm_call(
    target: str, payload: dict[str, object], region: str, creds: dict[str, str], url: str
) -> dict[str, object]:
    body = json.dumps(payload).encode()
    base = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"AmazonSSM.{target}"}

    def call() -> bytes:
        return _request(
            url, method="POST", headers=sign("POST", url, base, body, "ssm", region, creds, _now()), data=body
        )

    answer: dict[str, object] = json.loads(_retried(f"parameter {payload['Name']}", call, NOT_YET_JSON))
    return answer


# SSM keeps a parameter's last 100 versions; GetParameterHistory pages them by at most 50.
_HISTORY_PAGES = 4


def newest_version(
    name: str, region: str, creds: dict[str, str], endpoint: str | None = None, dns_suffix: str = DEFAULT_DNS_SUFFIX
) -> dict[str, object]:
    """The parameter's newest version as GetParameterHistory describes it: its Type, its KeyId and its
    decrypted Value in one answer (GetParameter does not say the key; DescribeParameters would, in a
    second answer, about a parameter that may have been replaced in between)."""
    url = ssm_url(region, endpoint, dns_suffix)
    newest: dict[str, object] | None = None
    token: object = None
    for _ in range(_HISTORY_PAGES):
        payload: dict[str, object] = {"Name": name, "WithDecryption": True, "MaxResults": 50}
        if token:
            payload["NextToken"] = token
        answer = _ssm_call("GetParameterHistory", payload, region, creds, url)
        entries = answer.get("Parameters")
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and (newest is None or _version(entry) > _version(newest)):
                newest = entry
        token = answer.get("NextToken")
        if not token:
            break
    else:
        # More pages than the 100 versions SSM keeps: the newest may be on one not read.
        raise BootError(f"parameter {name}: its history has more than {_HISTORY_PAGES} pages")
    if newest is None:
        raise BootError(f"parameter {name}: no version in its history")
    return newest


def _version(entry: dict[str, object]) -> int:
    version = entry.get("Version")
    return version if isinstance(version, int) else -1


def _is_key(reported: object, key_id: str) -> bool:
    """Whether SSM's KeyId names the stack's key: its ARN as given, or the key id alone (the ARN's
    last part). Never an alias: an alias can be pointed at another key."""
    if not isinstance(reported, str) or not reported:
        return False
    return reported == key_id or (":" not in reported and "/" not in reported and key_id.endswith(":key/" + reported))


def verified_secrets(name: str, entry: dict[str, object], key_id: str, declared: list[str]) -> dict[str, str]:
    """The values of the parameter's newest version, if it is what fleetkeeper writes: a SecureString
    encrypted under the stack's key, a JSON object of exactly the declared names to text. A principal
    allowed ssm:PutParameter (and DeleteParameter) on the stack's path but no right on its key can
    recreate the parameter as a String or under another key, never under the stack's key; anything
    else is refused (EnvironmentFailure SECRETS_REJECTED), nothing written."""

    def refuse(why: str) -> EnvironmentFailure:
        return EnvironmentFailure(
            SECRETS_REJECTED,
            f"the secrets parameter {name} failed verification: {why}. fleetkeeper never writes such a parameter "
            "(replaced outside fleetkeeper?): its values were not used",
        )

    kind = entry.get("Type")
    if kind != "SecureString":
        raise refuse(f"it is a {kind}, not a SecureString")
    if not _is_key(entry.get("KeyId"), key_id):
        raise refuse(f"it is encrypted under {entry.get('KeyId')!r}, not the stack's key {key_id}")
    try:
        values = json.loads(str(entry.get("Value")))
    except ValueError:
        values = None
    if not isinstance(values, dict):
        raise refuse("its value is not a JSON object")
    undeclared = sorted(repr(key)[:80] for key in values if key not in declared)
    if undeclared:
        raise refuse(f"it holds names the version does not declare: {', '.join(undeclared[:5])}")
    missing = sorted(set(declared) - set(values))
    if missing:
        raise refuse(f"it lacks declared names: {', '.join(missing)}")
    for key, value in values.items():
        if not isinstance(value, str) or "\x00" in value or not _utf8(value):
            raise refuse(f"the value of {key} is not text an environment can hold")
    return dict(values)


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON's \ud800)
        return False
    return True


# What one workdir may unpack to. The packed archive is at most 256 MiB (MAX_WORKDIR_BYTES, checked
# by the api); compressed, zeros take a thousandth of that, so the unpacked size and the number of
# entries are capped on their own: a gzip bomb fills the replica's disk (or its inodes) otherwise.
# `fleetkeeper up` refuses a workdir over either limit before uploading it (cli/workdir.py).
MAX_UNPACKED_BYTES = 4 * 1024 * 1024 * 1024
MAX_MEMBERS = 100_000
# The "data" filter's refusals (absent with the filters: nothing to catch then).
_FILTER_ERROR: type[Exception] | tuple[()] = getattr(tarfile, "FilterError", ())


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _real(base: str, name: str) -> str:
    """Where `name` under `base` is now, every symbolic link on the way followed."""
    return os.path.realpath(Path(base) / name)


def _kind(member: tarfile.TarInfo) -> str:
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a FIFO"
    return "not a file, directory or symbolic link"


def _check(member: tarfile.TarInfo, root: str) -> None:
    """Refuse `member` unless it lands, and (a link) points, inside `root` as the directory is now,
    with the members before it unpacked: a link unpacked earlier may redirect a later path, which a
    check of the names alone (before anything is unpacked) cannot see."""
    name = member.name
    if not (member.isfile() or member.isdir() or member.issym()) or member.issparse():
        raise BootError(f"the workdir archive has an entry that is {_kind(member)}: {name!r}")
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise BootError(f"the workdir archive has an entry outside its directory: {name!r}")
    target = _real(root, name)
    if not _inside(target, root):
        raise BootError(f"the workdir archive has an entry outside its directory: {name!r}")
    if member.issym():
        link = _real(str(Path(target).parent), member.linkname)
        if Path(member.linkname).is_absolute() or not _inside(link, root):
            raise BootError(f"the workdir archive links out of its directory: {name!r}")


def _extract(archive: tarfile.TarFile, member: tarfile.TarInfo, root: str) -> None:
    if member.isdir():
        # Made here rather than by tarfile: its mode would apply at once (a 0555 directory would refuse
        # its own entries); 0755 like every directory `fleetkeeper up` packs.
        Path(_real(root, member.name)).mkdir(mode=0o755, parents=True, exist_ok=True)
    elif hasattr(tarfile, "data_filter"):
        archive.extract(member, root, filter="data")
    else:
        # A Python without the extraction filters (before 3.8.17, 3.9.17, 3.10.12, 3.11.4): what the
        # "data" filter does, by hand: no owner from the archive, no setuid/setgid or group/other
        # write bits. The paths were checked by _check.
        archive.extract(member, root, set_attrs=False)
        if member.isfile():
            (Path(root) / member.name).chmod(member.mode & 0o755)


def unpack(data: bytes, digest: str, dest: str | Path) -> None:
    """Check `data` hashes to `digest` (sha256:<hex>), then unpack it into `dest`, member by member.

    Each member is checked against the directory as it is then (fleetkeeper's own checks, with or
    without Python's "data" filter, which also runs where it exists), and the real path of what it
    made is checked again once it is there. Only files, directories and symbolic links inside the
    directory; at most MAX_MEMBERS entries and MAX_UNPACKED_BYTES of files.
    """
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise BootError(f"the workdir archive is {actual}, not {digest}: refusing to unpack it")
    Path(dest).mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)
    count = total = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive:
            count += 1
            if count > MAX_MEMBERS:
                raise BootError(f"the workdir archive has more than {MAX_MEMBERS} entries: refusing to unpack it")
            total += member.size if member.isfile() else 0
            if total > MAX_UNPACKED_BYTES:
                raise BootError(
                    f"the workdir archive unpacks to more than {MAX_UNPACKED_BYTES} bytes: refusing to unpack it"
                )
            _check(member, root)
            try:
                _extract(archive, member, root)
            except _FILTER_ERROR as exc:  # Python's own filter saw what ours did not
                raise BootError(f"the workdir archive has an unsafe entry {member.name!r}: {exc}") from exc
            made = _real(root, member.name)
            if not _inside(made, root):
                raise BootError(f"the workdir archive's entry {member.name!r} resolves outside its directory")


# Inside double quotes systemd's EnvironmentFile parser and bash both take a backslash before one of
# these four as the character itself, and nothing else in the value is special to either (no
# expansion in systemd's; `$` and backquote escaped for bash): a value reaches the units byte for
# byte, real newlines included, and a file someone sources in bash expands nothing either.
# https://www.freedesktop.org/software/systemd/man/latest/systemd.exec.html#EnvironmentFile=
_ESCAPED = ("\\", '"', "$", "`")


def systemd_quote(value: str) -> str:
    for char in _ESCAPED:
        value = value.replace(char, "\\" + char)
    return f'"{value}"'


def environment_file(values: dict[str, str]) -> str:
    """A systemd EnvironmentFile of `values` (double-quoted; newlines kept as they are). Names must
    be shell names: one with a newline or `=` would start a line of its own."""
    bad = sorted(repr(key)[:80] for key in values if not is_shell_name(key))
    if bad:
        raise BootError(f"not shell names: {', '.join(bad)}")
    return "".join(f"{key}={systemd_quote(value)}\n" for key, value in sorted(values.items()))


def _write_private(path: Path, text: str) -> None:
    """`text` into a root-only file, whole or not at all (written beside it, then renamed)."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(text)
    partial.replace(path)


def write_report(path: str, failure: EnvironmentFailure) -> None:
    Path(path).write_text(json.dumps({"code": failure.code, "message": str(failure)}))


def report_server(path: str, port: int, host: str = "") -> ThreadingHTTPServer:
    """A server answering every request with 503 and the failure's code in REPORT_HEADER (its
    message, for people, in the body): what the reconciler's readiness probe reads to fail the
    replica as the environment's (fleetkeeper/reconciler/probe.py)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    report = json.loads(Path(path).read_text())
    code, message = str(report["code"]), str(report["message"])

    class Report(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = (message + "\n").encode()
            self.send_response(503)
            self.send_header(REPORT_HEADER, code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_HEAD = _answer

        def log_message(self, *_args: object) -> None:
            pass

    print(f"fleetkeeper: replica boot failed ({code}): {message}", flush=True)
    return ThreadingHTTPServer((host, port), Report)


def serve_report(path: str, port: int) -> None:
    """The report on the replica's port for ever, on every address (the probe comes to the private
    IP): the transient unit the user data starts when the boot failed for the environment."""
    report_server(path, port).serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fleetkeeper replica boot: fetch the workdir and secrets")
    parser.add_argument("--bucket")
    parser.add_argument("--key")
    parser.add_argument("--digest")
    parser.add_argument("--dest", default="/home/ubuntu/sky_workdir")  # SkyPilot's ~/sky_workdir
    parser.add_argument("--parameter")
    parser.add_argument("--kms-key", default="alias/aws/ssm", help="the key the parameter must be encrypted under")
    parser.add_argument("--secret-names", default="", help="the names the version declares, comma-separated")
    parser.add_argument("--env-file", default="/opt/fleetkeeper/secrets.env")
    parser.add_argument("--dns-suffix", default=DEFAULT_DNS_SUFFIX)
    parser.add_argument("--propagation-seconds", type=float, default=PROPAGATION_SECONDS)
    parser.add_argument("--report", help="where an environment failure is written (code and message)")
    parser.add_argument("--serve-report", help="serve this report on --port, for ever")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    if args.serve_report:
        serve_report(args.serve_report, args.port)
        return 0
    global _propagation
    _propagation = Propagation(args.propagation_seconds)
    endpoint = os.environ.get("FLEETKEEPER_BOOT_ENDPOINT") or None  # tests: one local endpoint for both
    try:
        names = [name for name in args.secret_names.split(",") if name]
        if args.parameter:
            check_declared(names)
        region, creds = instance_identity()
        if args.key:
            data = get_object(args.bucket, args.key, region, creds, endpoint, args.dns_suffix)
            unpack(data, args.digest, args.dest)
            print(f"fleetkeeper: workdir {args.digest} unpacked into {args.dest}", flush=True)
        if args.parameter:
            entry = newest_version(args.parameter, region, creds, endpoint, args.dns_suffix)
            values = verified_secrets(args.parameter, entry, args.kms_key, names)
            env = Path(args.env_file)
            _write_private(env, environment_file(values))
            print(f"fleetkeeper: {len(values)} secret(s) written to {env}", flush=True)
    except EnvironmentFailure as exc:
        print(f"fleetkeeper: replica boot failed ({exc.code}): {exc}", file=sys.stderr, flush=True)
        if args.report:
            write_report(args.report, exc)
        return 3
    except (BootError, KeyError, ValueError, OSError, tarfile.TarError) as exc:
        print(f"fleetkeeper: replica boot failed: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
