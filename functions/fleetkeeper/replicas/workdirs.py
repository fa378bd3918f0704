"""The workdir store: packed working directories, content-addressed, per incarnation.

`fleetkeeper up` packs a spec's `workdir` (a deterministic tar.gz: the same files give the same
bytes, hence the same SHA-256) and asks the api where to put it (POST /v1/workdirs). Two places:

    uploads/<sha256>.tar.gz                  what clients upload; kept UPLOAD_DAYS (a lifecycle rule)
    services/_o/<scope>/<name>/<uid>/<sha256>.tar.gz
                                             what replicas read; written by the api when a version
                                             that names the digest is created, deleted by the
                                             cleanup with the incarnation. <scope>: the service
                                             owner's (fleetkeeper.replicas.identity): only that owner's replica
                                             role may read below it. A service without an owner keeps
                                             the legacy services/<name>/<uid>/<sha256>.tar.gz.

Keeping a copy per incarnation makes deletion exact: the cleanup deletes one prefix, and no digest
shared by two services needs counting. A version's digest is checked again where it is used (the api
checks the upload's SHA-256 before adopting it, a replica checks what it downloaded before unpacking).

Two implementations: S3 (a bucket of the stack; the api hands out presigned PUT URLs whose signed
`x-amz-checksum-sha256` header makes S3 refuse any other content, and whose signed `Content-Length`
makes it refuse any other size than the one declared, itself at most MAX_WORKDIR_BYTES) and a local
directory (the embedded mode; the upload URL is the embedded server's `/_local/workdirs/<sha256>`,
which takes exactly the declared size likewise).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlencode

from fleetkeeper import aws
from fleetkeeper.replicas.identity import owner_scope, scope_prefix
from fleetkeeper.settings import DEFAULT_STACK_ID

if TYPE_CHECKING:
    from collections.abc import Iterable

    from mypy_boto3_s3 import S3Client

    from fleetkeeper.settings import Settings

# The stack's id on what it creates (the same key as its instances' tag; fleetkeeper.reconciler.ownership).
STACK_TAG = "fleetkeeper:stack"
# A packed workdir's limit: what a replica downloads and unpacks at every boot.
MAX_WORKDIR_BYTES = 256 * 1024 * 1024
# An upload is adopted by a version within this long (a lifecycle rule deletes it after UPLOAD_DAYS).
UPLOAD_FRESH_SECONDS = 12 * 3600
UPLOAD_DAYS = 1
# How long a presigned upload URL works.
UPLOAD_URL_SECONDS = 900
_CHUNK = 1024 * 1024


class WorkdirMissing(Exception):
    """The digest was never uploaded (or its upload expired)."""


class WorkdirInvalid(Exception):
    """What was uploaded is not what the digest says, or is over the size limit."""


class WorkdirSizeMismatch(WorkdirInvalid):
    """An upload is not the size declared when its URL was asked for (POST /v1/workdirs)."""


@dataclass(frozen=True)
class Upload:
    """Where and how a client uploads an archive: one HTTP request."""

    url: str
    method: str
    headers: dict[str, str]


def hex_of(digest: str) -> str:
    return digest.removeprefix("sha256:")


def upload_key(digest: str) -> str:
    return f"uploads/{hex_of(digest)}.tar.gz"


def incarnation_prefix(service: str, uid: str, owner: str = "") -> str:
    return f"services/{scope_prefix(owner_scope(owner))}{service}/{uid}/"


def service_key(service: str, uid: str, digest: str, owner: str = "") -> str:
    return f"{incarnation_prefix(service, uid, owner)}{hex_of(digest)}.tar.gz"


def declared_key(digest: str) -> str:
    """The embedded store's note of the size declared for an upload (S3 signs it into the URL)."""
    return f"uploads/{hex_of(digest)}.declared"


def checksum_header(digest: str) -> str:
    """The digest as S3's `x-amz-checksum-sha256` (base64 of the 32 bytes)."""
    return base64.b64encode(bytes.fromhex(hex_of(digest))).decode()


class WorkdirStore(Protocol):
    def upload(self, digest: str, size: int, service: str | None, uid: str | None, owner: str = "") -> Upload | None:
        """How to upload `digest`, or None when it is stored already (no upload needed)."""
        ...

    def adopt(self, digest: str, service: str, uid: str, owner: str = "") -> None:
        """Make `digest` available to the incarnation's replicas. Raises WorkdirMissing/WorkdirInvalid."""
        ...

    def forget(self, service: str, uid: str, digests: Iterable[str], owner: str = "") -> None:
        """Delete the incarnation's copies of these digests (versions that named them were pruned)."""
        ...

    def delete_incarnation(self, service: str, uid: str, owner: str = "") -> int:
        """Delete every copy of one incarnation (the cleanup's part); returns how many."""
        ...


def store_from_settings(settings: Settings) -> WorkdirStore | None:
    """The store this deployment has: S3 (WORKDIR_BUCKET), a local directory (embedded), or none."""
    if settings.workdir_bucket:
        return S3WorkdirStore(settings.workdir_bucket, stack_id=settings.stack_id)
    if settings.workdir_dir:
        return LocalWorkdirStore(Path(settings.workdir_dir), settings.workdir_upload_url or "")
    return None


@dataclass(frozen=True)
class S3WorkdirStore:
    bucket: str  # the stack's own bucket: every key in it is the stack's
    # Tagged on each copy it makes (`fleetkeeper:stack`), as on everything else the stack creates.
    stack_id: str = DEFAULT_STACK_ID

    @property
    def s3(self) -> S3Client:
        return aws.s3()

    def _head(self, key: str) -> dict[str, object] | None:
        from botocore.exceptions import ClientError

        try:
            return dict(self.s3.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise

    def upload(self, digest: str, size: int, service: str | None, uid: str | None, owner: str = "") -> Upload | None:
        if service and uid and self._head(service_key(service, uid, digest, owner)) is not None:
            return None
        head = self._head(upload_key(digest))
        if head is not None and _fresh(head.get("LastModified")):
            return None
        if not 0 < size <= MAX_WORKDIR_BYTES:  # the api's request model refuses these first
            raise WorkdirInvalid(f"it is {size} bytes; the limit is {MAX_WORKDIR_BYTES}")
        # Content-Length is a signed header of the URL: S3 refuses a PUT of any other size
        # (SignatureDoesNotMatch), so an upload is at most the size the api allowed here.
        url = self.s3.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": upload_key(digest),
                "ChecksumSHA256": checksum_header(digest),
                "ContentLength": size,
            },
            ExpiresIn=UPLOAD_URL_SECONDS,
        )
        headers = {"x-amz-checksum-sha256": checksum_header(digest), "content-length": str(size)}
        return Upload(url=url, method="PUT", headers=headers)

    def adopt(self, digest: str, service: str, uid: str, owner: str = "") -> None:
        target = service_key(service, uid, digest, owner)
        if self._head(target) is not None:
            return
        source = upload_key(digest)
        head = self._head(source)
        if head is None:
            raise WorkdirMissing(digest)
        size = int(str(head.get("ContentLength", 0)))
        if size > MAX_WORKDIR_BYTES:
            raise WorkdirInvalid(f"it is {size} bytes; the limit is {MAX_WORKDIR_BYTES}")
        if head.get("ChecksumSHA256") != checksum_header(digest) and self._sha256_of(source) != hex_of(digest):
            # S3 checked a signed checksum at upload; an object without one is hashed here.
            raise WorkdirInvalid("its content does not hash to the digest")
        self.s3.copy_object(
            Bucket=self.bucket,
            Key=target,
            CopySource={"Bucket": self.bucket, "Key": source},
            ChecksumAlgorithm="SHA256",
            Tagging=urlencode({STACK_TAG: self.stack_id}),
            TaggingDirective="REPLACE",
        )

    def _sha256_of(self, key: str) -> str:
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        digest = hashlib.sha256()
        for chunk in iter(lambda: body.read(_CHUNK), b""):
            digest.update(chunk)
        return digest.hexdigest()

    def forget(self, service: str, uid: str, digests: Iterable[str], owner: str = "") -> None:
        keys = [{"Key": service_key(service, uid, d, owner)} for d in sorted(set(digests))]
        for start in range(0, len(keys), 1000):
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[start : start + 1000], "Quiet": True})  # type: ignore[typeddict-item]

    def delete_incarnation(self, service: str, uid: str, owner: str = "") -> int:
        deleted = 0
        paginator = self.s3.get_paginator("list_objects_v2")
        # The owner's scoped prefix and the legacy one: an incarnation of either kind leaves nothing.
        prefixes = dict.fromkeys([incarnation_prefix(service, uid, owner), incarnation_prefix(service, uid)])
        keys = [
            obj["Key"]
            for prefix in prefixes
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix)
            for obj in page.get("Contents", [])
            if "Key" in obj
        ]
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": key} for key in keys[start : start + 1000]]
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})  # type: ignore[typeddict-item]
            deleted += len(chunk)
        return deleted


def _fresh(last_modified: object) -> bool:
    from datetime import UTC, datetime

    if not isinstance(last_modified, datetime):
        return False
    return (datetime.now(UTC) - last_modified).total_seconds() < UPLOAD_FRESH_SECONDS


@dataclass(frozen=True)
class LocalWorkdirStore:
    """The embedded mode's store: the same layout in a directory; uploads go through the embedded
    server (`/_local/workdirs/<sha256>`, which calls `receive`)."""

    root: Path
    upload_base_url: str

    def path(self, key: str) -> Path:
        return self.root / key

    def upload(self, digest: str, size: int, service: str | None, uid: str | None, owner: str = "") -> Upload | None:
        if service and uid and self.path(service_key(service, uid, digest, owner)).is_file():
            return None
        uploaded = self.path(upload_key(digest))
        if uploaded.is_file() and time.time() - uploaded.stat().st_mtime < UPLOAD_FRESH_SECONDS:
            return None
        if not 0 < size <= MAX_WORKDIR_BYTES:  # the api's request model refuses these first
            raise WorkdirInvalid(f"it is {size} bytes; the limit is {MAX_WORKDIR_BYTES}")
        # The size the upload must have, as S3 has it signed into its URL (`receive` checks it).
        declared = self.path(declared_key(digest))
        declared.parent.mkdir(parents=True, exist_ok=True)
        partial = declared.with_name(f".{declared.name}.{os.getpid()}.{time.monotonic_ns()}")
        partial.write_text(str(size))
        partial.replace(declared)
        headers = {"content-length": str(size)}
        return Upload(url=f"{self.upload_base_url}/{hex_of(digest)}", method="PUT", headers=headers)

    def declared_size(self, digest: str) -> int | None:
        """The size declared for an upload of `digest` (POST /v1/workdirs), if one was asked for."""
        try:
            return int(self.path(declared_key(digest)).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def receive(self, digest: str, body: Iterable[bytes], length: int) -> int:
        """Store an upload of `length` bytes (its Content-Length) after checking that it is the size
        declared for it, and its SHA-256 (what S3 checks on AWS)."""
        declared = self.declared_size(digest)
        if declared is None:
            raise WorkdirSizeMismatch("no upload of it was asked for: POST /v1/workdirs with its digest and size first")
        if length != declared:
            raise WorkdirSizeMismatch(f"its Content-Length is {length} bytes, not the {declared} declared for it")
        target = self.path(upload_key(digest))
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{time.monotonic_ns()}")
        hasher = hashlib.sha256()
        size = 0
        try:
            with partial.open("wb") as sink:
                for chunk in body:
                    size += len(chunk)
                    if size > declared:
                        raise WorkdirSizeMismatch(f"it is over the {declared} bytes declared for it")
                    hasher.update(chunk)
                    sink.write(chunk)
            if size != declared:
                raise WorkdirSizeMismatch(f"it is {size} bytes, not the {declared} declared for it")
            if hasher.hexdigest() != hex_of(digest):
                raise WorkdirInvalid("its content does not hash to the digest")
            partial.replace(target)
            with contextlib.suppress(FileNotFoundError):
                self.path(declared_key(digest)).unlink()
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        return size

    def adopt(self, digest: str, service: str, uid: str, owner: str = "") -> None:
        target = self.path(service_key(service, uid, digest, owner))
        if target.is_file():
            return
        source = self.path(upload_key(digest))
        if not source.is_file():
            raise WorkdirMissing(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{time.monotonic_ns()}")
        shutil.copyfile(source, partial)
        partial.replace(target)

    def forget(self, service: str, uid: str, digests: Iterable[str], owner: str = "") -> None:
        for digest in digests:
            with contextlib.suppress(FileNotFoundError):
                self.path(service_key(service, uid, digest, owner)).unlink()

    def delete_incarnation(self, service: str, uid: str, owner: str = "") -> int:
        count = 0
        for prefix in dict.fromkeys([incarnation_prefix(service, uid, owner), incarnation_prefix(service, uid)]):
            folder = self.path(prefix)
            if folder.is_dir():
                count += sum(1 for p in folder.iterdir() if p.is_file())
                shutil.rmtree(folder, ignore_errors=True)
        return count
