"""`fleetkeeper local` removes what its earlier runs left: working directories, and logs after a week."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fleetkeeper.local.retention import LOG_DAYS, prune_earlier_runs

if TYPE_CHECKING:
    from pathlib import Path

DAY = 86_400.0


def made(path: Path, age_days: float, now: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    stamp = now - age_days * DAY
    os.utime(path, (stamp, stamp))
    os.utime(path.parent, (stamp, stamp))
    return path


def test_earlier_runs_lose_their_work_dirs_and_their_logs_after_a_week(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    made(tmp_path / "work" / "web" / "u1" / "replica-0" / "model.bin", 0, now)
    recent = made(tmp_path / "logs" / "web" / "u1" / "replica-0.log", 1, now)
    old = made(tmp_path / "logs" / "api" / "u0" / "replica-3.log", LOG_DAYS + 1, now)
    kept_credential = made(tmp_path / "local-api.json", 30, now)

    removed = prune_earlier_runs(tmp_path, now=now)

    assert sorted(removed) == sorted([tmp_path / "work" / "web" / "u1", tmp_path / "logs" / "api" / "u0"])
    assert recent.exists() and kept_credential.exists()
    assert not old.exists() and not (tmp_path / "logs" / "api").exists()
    assert not (tmp_path / "work" / "web").exists()


def test_a_fresh_directory_is_fine(tmp_path: Path) -> None:
    assert prune_earlier_runs(tmp_path / "none-yet") == []
