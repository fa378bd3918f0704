"""Packing a spec's `workdir` as SkyPilot syncs it, into a deterministic archive.

What goes in: every file under the directory except what `.skyignore` excludes when the directory has
one (at its top; `.skyignore` files below it add their own patterns, as SkyPilot reads them), else
what its `.gitignore` files exclude (git's pattern rules; files git tracks are not special-cased),
and never `.git/` (its index changes on every `git status`, which would make every `up` a new
version). Symbolic links are kept as links when they point inside the directory, and refused
otherwise (the replica could not resolve them).

Deterministic: entries sorted, times, owners and permissions normalised (0644, 0755 for executables
and directories), gzip without a timestamp. The same files give the same bytes, hence the same
SHA-256: an `update` whose files did not change names the same digest and makes no new version.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from pathspec import GitIgnoreSpec

from fleetkeeper.cli.http import UsageError
from fleetkeeper.reconciler.replica_boot import MAX_MEMBERS, MAX_UNPACKED_BYTES
from fleetkeeper.replicas.workdirs import MAX_WORKDIR_BYTES

SKYIGNORE = ".skyignore"
GITIGNORE = ".gitignore"
_NEVER = frozenset({".git"})


@dataclass(frozen=True)
class Packed:
    path: Path  # a temporary file: the caller deletes it
    digest: str  # sha256:<hex>
    size: int
    files: int
    ignore_file: str | None  # which rules applied: .skyignore, .gitignore or none


def _patterns(root: Path, name: str) -> list[str]:
    """Every `name` file's patterns under `root`, made relative to `root` (as git reads nested ones)."""
    patterns: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _NEVER)
        if name not in files:
            continue
        relative = PurePosixPath(Path(folder).relative_to(root).as_posix())
        for raw in (Path(folder) / name).read_text(encoding="utf-8", errors="replace").splitlines():
            line = raw.rstrip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            body = line[1:] if negated else line
            if str(relative) not in ("", "."):
                anchored = body.startswith("/") or "/" in body.rstrip("/")
                body = f"{relative}/{body.lstrip('/')}" if anchored else f"{relative}/**/{body}"
            patterns.append(("!" if negated else "") + body)
    return patterns


def ignore_rules(root: Path) -> tuple[GitIgnoreSpec | None, str | None]:
    """The rules that decide what is left out: .skyignore's if the directory has one, else .gitignore's."""
    for name in (SKYIGNORE, GITIGNORE):
        if name == SKYIGNORE and not (root / SKYIGNORE).is_file():
            continue
        patterns = _patterns(root, name)
        if patterns or name == SKYIGNORE:
            return (GitIgnoreSpec.from_lines(patterns) if patterns else None), name
    return None, None


def _entries(root: Path, spec: GitIgnoreSpec | None) -> list[tuple[str, Path]]:
    entries: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder)
        rel_dir = base.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else f"{rel_dir}/"
        kept_dirs = []
        for d in sorted(dirs):
            rel = f"{prefix}{d}"
            if d in _NEVER or (spec is not None and spec.match_file(f"{rel}/")):
                continue
            if (base / d).is_symlink():
                entries.append((rel, base / d))  # a link to a directory: kept as a link, not followed
                continue
            kept_dirs.append(d)
            entries.append((rel, base / d))
        dirs[:] = kept_dirs
        for f in sorted(files):
            rel = f"{prefix}{f}"
            if spec is not None and spec.match_file(rel):
                continue
            entries.append((rel, base / f))
    return sorted(entries)


def _info(rel: str, path: Path, root: Path) -> tuple[tarfile.TarInfo, IO[bytes] | None]:
    info = tarfile.TarInfo(rel)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        target = str(path.readlink())
        resolved = (path.parent / target).resolve()
        if Path(target).is_absolute() or not resolved.is_relative_to(root.resolve()):
            raise UsageError(f"workdir: {rel} links outside the directory ({target}); a replica could not follow it")
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        return info, None
    if stat.S_ISDIR(mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        return info, None
    if not stat.S_ISREG(mode):
        raise UsageError(f"workdir: {rel} is not a file or directory (a socket or device?); add it to {SKYIGNORE}")
    info.mode = 0o755 if mode & stat.S_IXUSR else 0o644
    info.size = path.stat().st_size
    return info, path.open("rb")


def pack(directory: Path, *, limit: int = MAX_WORKDIR_BYTES) -> Packed:
    """Pack `directory` (see the module docstring). Raises UsageError naming what is wrong."""
    root = directory.expanduser()
    if not root.exists():
        raise UsageError(f"workdir {directory} does not exist")
    if not root.is_dir():
        raise UsageError(f"workdir {directory} is a file, not a directory")
    spec, rules = ignore_rules(root)
    handle, name = tempfile.mkstemp(prefix="fleetkeeper-workdir-", suffix=".tar.gz")
    os.close(handle)
    path = Path(name)
    files = entries = unpacked = 0
    try:
        with path.open("wb") as raw:
            gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6)
            with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as archive:
                for rel, entry in _entries(root, spec):
                    info, content = _info(rel, entry, root)
                    try:
                        archive.addfile(info, content)
                    finally:
                        if content is not None:
                            content.close()
                    files += info.isfile()
                    entries += 1
                    unpacked += info.size
                    if entries > MAX_MEMBERS or unpacked > MAX_UNPACKED_BYTES:
                        raise UsageError(_too_many(directory, entries, unpacked, rules))
                    if raw.tell() > limit:
                        raise UsageError(_too_big(directory, raw.tell(), limit, rules))
        size = path.stat().st_size
        if size > limit:
            raise UsageError(_too_big(directory, size, limit, rules))
        digest = hashlib.sha256()
        with path.open("rb") as done:
            for chunk in iter(lambda: done.read(1024 * 1024), b""):
                digest.update(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Packed(path=path, digest=f"sha256:{digest.hexdigest()}", size=size, files=files, ignore_file=rules)


def _too_big(directory: Path, size: int, limit: int, rules: str | None) -> str:
    where = rules or SKYIGNORE
    return (
        f"workdir {directory} packs to more than {limit // (1024 * 1024)} MiB ({size // (1024 * 1024)} MiB so far): "
        f"leave large files out with {where}, or fetch them in `setup`"
    )


def _too_many(directory: Path, entries: int, unpacked: int, rules: str | None) -> str:
    """A replica refuses to unpack more than this (reconciler/replica_boot.py): say so before uploading."""
    where = rules or SKYIGNORE
    if entries > MAX_MEMBERS:
        what = f"more than {MAX_MEMBERS} files, directories and links"
    else:
        what = f"more than {MAX_UNPACKED_BYTES // (1024 * 1024)} MiB unpacked ({unpacked // (1024 * 1024)} MiB so far)"
    return f"workdir {directory} has {what}: leave some out with {where}, or fetch them in `setup`"


def listing(data: bytes) -> list[str]:
    """The names in a packed archive (tests, and `--dry-run`-like checks)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        return archive.getnames()
