"""A replica's first-boot fetch: its version's workdir (S3) and secrets (SSM), with its own role.

The ec2 user data writes this file to the instance and runs it before `setup`. It needs python3 and
nothing else (Amazon Linux, Ubuntu and the Deep Learning AMIs have it; no AWS CLI, no boto3): it
takes the instance role's credentials from IMDSv2, signs its two kinds of requests with SigV4
itself, checks the archive's SHA-256 before unpacking it (safely: no absolute paths, no `..`, no
links out of the directory) and writes the secrets to a root-only systemd EnvironmentFile.
Network calls are retried (a booting instance's network may take a moment). Any failure exits
non-zero, so the replica's units never start and the reconciler sees a replica that never gets
READY. Nothing it fetches is printed.

The embedded mode's process driver imports `unpack` and `environment_file` from here, so a local
replica gets its workdir and secrets the same way, minus the network.

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

IMDS = os.environ.get("FLEETKEEPER_BOOT_IMDS", "http://169.254.169.254")
ATTEMPTS = 6


class BootError(Exception):
    pass


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


def _retried(what: str, call: Callable[[], bytes]) -> bytes:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except urllib.error.HTTPError as exc:
            if exc.code < 500 and exc.code not in (408, 429):
                detail = exc.read()[:300].decode(errors="replace")
                raise BootError(f"{what}: HTTP {exc.code}: {detail}") from None
            error = f"HTTP {exc.code}"
        except OSError as exc:
            error = str(exc)
        if attempt == ATTEMPTS:
            raise BootError(f"{what}: {error} (after {ATTEMPTS} attempts)")
        time.sleep(min(2**attempt, 20))
    raise AssertionError("unreachable")


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
    role = _retried("instance role", lambda: _request(base, headers=headers)).decode().split()[0]
    creds = json.loads(_retried("role credentials", lambda: _request(base + role, headers=headers)))
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


def s3_url(bucket: str, key: str, region: str, endpoint: str | None = None) -> str:
    if endpoint:
        return f"{endpoint.rstrip('/')}/{bucket}/{quote(key)}"
    return f"https://{bucket}.s3.{region}.amazonaws.com/{quote(key)}"


def get_object(bucket: str, key: str, region: str, creds: dict[str, str], endpoint: str | None = None) -> bytes:
    url = s3_url(bucket, key, region, endpoint)

    def call() -> bytes:
        return _request(url, headers=sign("GET", url, {}, b"", "s3", region, creds, _now()), timeout=120)

    return _retried(f"s3://{bucket}/{key}", call)


def get_parameter(name: str, region: str, creds: dict[str, str], endpoint: str | None = None) -> dict[str, str]:
    url = (endpoint or f"https://ssm.{region}.amazonaws.com").rstrip("/") + "/"
    body = json.dumps({"Name": name, "WithDecryption": True}).encode()
    base = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "AmazonSSM.GetParameter"}

    def call() -> bytes:
        return _request(
            url, method="POST", headers=sign("POST", url, base, body, "ssm", region, creds, _now()), data=body
        )

    answer = json.loads(_retried(f"parameter {name}", call))
    values = json.loads(answer["Parameter"]["Value"])
    return {str(k): str(v) for k, v in values.items()}


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


def _systemd_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def environment_file(values: dict[str, str]) -> str:
    """A systemd EnvironmentFile of `values` (double-quoted; newlines kept as they are)."""
    return "".join(f"{key}={_systemd_quote(value)}\n" for key, value in sorted(values.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fleetkeeper replica boot: fetch the workdir and secrets")
    parser.add_argument("--bucket")
    parser.add_argument("--key")
    parser.add_argument("--digest")
    parser.add_argument("--dest", default="/opt/fleetkeeper/work")
    parser.add_argument("--parameter")
    parser.add_argument("--env-file", default="/opt/fleetkeeper/secrets.env")
    args = parser.parse_args(argv)
    endpoint = os.environ.get("FLEETKEEPER_BOOT_ENDPOINT") or None  # tests: one local endpoint for both
    try:
        region, creds = instance_identity()
        if args.key:
            unpack(get_object(args.bucket, args.key, region, creds, endpoint), args.digest, args.dest)
            print(f"fleetkeeper: workdir {args.digest} unpacked into {args.dest}", flush=True)
        if args.parameter:
            values = get_parameter(args.parameter, region, creds, endpoint)
            env = Path(args.env_file)
            env.touch(mode=0o600)
            env.chmod(0o600)
            env.write_text(environment_file(values))
            print(f"fleetkeeper: {len(values)} secret(s) written to {env}", flush=True)
    except (BootError, KeyError, ValueError, OSError, tarfile.TarError) as exc:
        print(f"fleetkeeper: replica boot failed: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
