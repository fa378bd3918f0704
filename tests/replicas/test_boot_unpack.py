"""The workdir archive is unpacked member by member, each checked against the directory as it is
then: a symbolic link unpacked earlier cannot redirect a later entry out of it, and the unpacked size
and the number of entries are capped. Both with Python's "data" extraction filter and without it
(a replica image's older python3): the fallback is forced by removing `tarfile.data_filter`."""

from __future__ import annotations

import hashlib
import stat
import tarfile
from typing import TYPE_CHECKING

import pytest

from fleetkeeper.reconciler import replica_boot
from tests.replicas.test_boot import file_entry, tarball

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(params=["data_filter", "fallback"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.delattr(tarfile, "data_filter")
    else:
        assert hasattr(tarfile, "data_filter"), "this Python has no extraction filters"
    return str(request.param)


def _unpack(data: bytes, dest: Path) -> None:
    replica_boot.unpack(data, "sha256:" + hashlib.sha256(data).hexdigest(), dest)


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


def test_a_symlink_chain_cannot_lead_out_of_the_directory(python: str, tmp_path: Path) -> None:
    """`a` -> `.` and then `a/b` -> `..` each look inside when checked before anything exists; once
    `a` is unpacked, `a/b` is the directory's parent, and `a/b/escaped.txt` would be written there."""
    data = tarball([_link("a", "."), _link("a/b", ".."), file_entry("a/b/escaped.txt", b"owned")])
    with pytest.raises(replica_boot.BootError, match=r"'a/b'"):
        _unpack(data, tmp_path / "w")
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "w" / "b").is_symlink()


def test_a_later_entry_through_an_earlier_link_is_checked_where_it_lands(python: str, tmp_path: Path) -> None:
    """A link pointing inside is fine, and so is a file written through it."""
    data = tarball([file_entry("real/x.txt", b"1"), _link("alias", "real"), file_entry("alias/y.txt", b"2")])
    _unpack(data, tmp_path / "w")
    assert (tmp_path / "w" / "real" / "y.txt").read_bytes() == b"2"


def test_an_absolute_link_is_refused(python: str, tmp_path: Path) -> None:
    with pytest.raises(replica_boot.BootError, match="links out"):
        _unpack(tarball([_link("etc", str(tmp_path))]), tmp_path / "w")


@pytest.mark.parametrize(
    ("kind", "what"),
    [(tarfile.CHRTYPE, "a device file"), (tarfile.BLKTYPE, "a device file"), (tarfile.FIFOTYPE, "a FIFO")],
)
def test_devices_and_fifos_are_refused(python: str, tmp_path: Path, kind: bytes, what: str) -> None:
    info = tarfile.TarInfo("dev")
    info.type = kind
    with pytest.raises(replica_boot.BootError, match=what):
        _unpack(tarball([(info, None)]), tmp_path / "w")
    assert not (tmp_path / "w" / "dev").exists()


def test_a_hard_link_is_refused(python: str, tmp_path: Path) -> None:
    info = tarfile.TarInfo("shadow")
    info.type, info.linkname = tarfile.LNKTYPE, "/etc/shadow"
    with pytest.raises(replica_boot.BootError, match="a hard link"):
        _unpack(tarball([(info, None)]), tmp_path / "w")


def test_the_unpacked_size_is_capped(python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Zeros compress a thousandfold: the cap is on what the headers say will be written, checked
    before each file is written."""
    monkeypatch.setattr(replica_boot, "MAX_UNPACKED_BYTES", 1024 * 1024)
    data = tarball([file_entry("small", b"0" * 1000), file_entry("bomb", bytes(2 * 1024 * 1024))])
    assert len(data) < 20_000
    with pytest.raises(replica_boot.BootError, match=f"more than {1024 * 1024} bytes"):
        _unpack(data, tmp_path / "w")
    assert not (tmp_path / "w" / "bomb").exists()


def test_the_number_of_entries_is_capped(python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_boot, "MAX_MEMBERS", 10)
    data = tarball([file_entry(f"f{n}", b"") for n in range(11)])
    with pytest.raises(replica_boot.BootError, match="more than 10 entries"):
        _unpack(data, tmp_path / "w")
    _unpack(tarball([file_entry(f"f{n}", b"") for n in range(10)]), tmp_path / "ok")


def test_modes_keep_the_executable_bit_and_drop_setuid_and_group_write(python: str, tmp_path: Path) -> None:
    run, data = file_entry("bin/run.sh", b"#!/bin/sh\n")
    run.mode = 0o6777
    plain, text = file_entry("README", b"hi")
    plain.mode = 0o664
    _unpack(tarball([(run, data), (plain, text)]), tmp_path / "w")
    assert stat.S_IMODE((tmp_path / "w" / "bin" / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "w" / "README").stat().st_mode) == 0o644
