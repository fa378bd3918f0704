"""What `fleetkeeper local` keeps of earlier runs in its directory (`.fleetkeeper/` by default).

Its services live in the in-memory AWS, so when a run ends every service incarnation it had is gone,
but their replicas' folders stay: `work/<service>/<uid>/` (a replica's working directory: its
unpacked workdir, what `setup` downloaded) and `logs/<service>/<uid>/`. No later run can use a
working directory (uids are never reused): each start removes them all. Logs are what a person
reads after a crash: an earlier run's are kept `LOG_DAYS` days after they were last written, then
removed, so the directory stays bounded by what a week of use writes. A directory another running
`fleetkeeper local` uses (its credential names a live pid) is left alone.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

LOG_DAYS = 7


def prune_earlier_runs(local_dir: Path, *, now: float | None = None, log_days: float = LOG_DAYS) -> list[Path]:
    """Remove the earlier runs' working directories, and their logs older than `log_days`; returns
    what was removed. Call before this run starts any replica."""
    removed: list[Path] = []
    work = local_dir / "work"
    for service in _folders(work):
        for incarnation in _folders(service):
            shutil.rmtree(incarnation, ignore_errors=True)
            removed.append(incarnation)
        _remove_if_empty(service)
    horizon = (time.time() if now is None else now) - log_days * 86_400
    for service in _folders(local_dir / "logs"):
        for incarnation in _folders(service):
            if _last_written(incarnation) < horizon:
                shutil.rmtree(incarnation, ignore_errors=True)
                removed.append(incarnation)
        _remove_if_empty(service)
    return removed


def _folders(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _last_written(folder: Path) -> float:
    stamps = [folder.stat().st_mtime]
    for entry in folder.rglob("*"):
        with contextlib.suppress(OSError):
            stamps.append(entry.stat().st_mtime)
    return max(stamps)


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()
