"""Running a replica's user data on this machine, as a test may: its absolute paths moved under a
directory of the test's, and the root-only commands it runs (useradd, chown) replaced by stand-ins
that log their arguments, as the systemd commands are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.reconciler import userdata

if TYPE_CHECKING:
    from pathlib import Path

# What the user data writes outside /opt/fleetkeeper, and the directory of the test's each goes to.
_MOVED = {
    userdata.ROOT: "root",
    userdata.HOME: "home",
    "/etc/systemd/system": "units",
    "/etc/sudoers.d": "sudoers.d",
}
FAKES = ("systemctl", "systemd-run", "useradd", "chown")


def relocated(script: str, base: Path) -> str:
    """`script` with its paths under `base` (the directories made), `root/`, `home/`, `units/`, `sudoers.d/`."""
    for path, name in _MOVED.items():
        (base / name).mkdir(exist_ok=True)
        script = script.replace(path, str(base / name))
    return script


def fake_commands(bin_dir: Path, log_dir: Path) -> None:
    """Stand-ins for FAKES in `bin_dir`, each appending its arguments to `<log_dir>/<name>.log`."""
    bin_dir.mkdir(exist_ok=True)
    for fake in FAKES:
        (bin_dir / fake).write_text(f'#!/bin/sh\necho "$@" >> {log_dir}/{fake}.log\n')
        (bin_dir / fake).chmod(0o755)
