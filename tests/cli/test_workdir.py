"""What `fleetkeeper up` does to a spec before sending it: --env/--env-file/--secret, and the workdir
packed as SkyPilot syncs it (.skyignore, else .gitignore; never .git) into a deterministic archive."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from fleetkeeper.cli.http import UsageError
from fleetkeeper.cli.spec_input import apply_values, read_env_file
from fleetkeeper.cli.workdir import listing, pack

if TYPE_CHECKING:
    from pathlib import Path


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def names(root: Path) -> list[str]:
    packed = pack(root)
    try:
        return sorted(n for n in listing(packed.path.read_bytes()) if not (root / n).is_dir())
    finally:
        packed.path.unlink()


def test_gitignore_rules_leave_files_out_and_git_itself_never_goes(tmp_path: Path) -> None:
    root = tree(
        tmp_path / "app",
        {
            "server.py": "",
            ".gitignore": "*.log\n/build/\n!keep.log\n",
            "debug.log": "",
            "keep.log": "",
            "build/out.bin": "",
            "src/build/kept.py": "",  # /build/ is anchored to the top
            "src/.gitignore": "secret.txt\n",
            "src/secret.txt": "",
            "src/app.py": "",
            ".git/index": "changes on every git status",
        },
    )
    assert names(root) == [".gitignore", "keep.log", "server.py", "src/.gitignore", "src/app.py", "src/build/kept.py"]


def test_a_skyignore_replaces_the_gitignore_rules(tmp_path: Path) -> None:
    root = tree(tmp_path / "app", {".skyignore": "data/\n", ".gitignore": "*.py\n", "a.py": "", "data/big.bin": ""})
    packed = pack(root)
    packed.path.unlink()
    assert packed.ignore_file == ".skyignore"
    assert names(root) == [".gitignore", ".skyignore", "a.py"]


def test_the_same_files_give_the_same_digest_whatever_their_times(tmp_path: Path) -> None:
    root = tree(tmp_path / "app", {"a.py": "print(1)\n", "sub/b.txt": "b"})
    first = pack(root)
    os.utime(root / "a.py", (1, 1))
    second = pack(root)
    (root / "a.py").write_text("print(2)\n")
    third = pack(root)
    for packed in (first, second, third):
        packed.path.unlink()
    assert first.digest == second.digest != third.digest
    assert first.files == 2


def test_an_executable_keeps_its_bit_and_links_stay_inside(tmp_path: Path) -> None:
    root = tree(tmp_path / "app", {"run.sh": "#!/bin/sh\n", "conf/a.toml": ""})
    (root / "run.sh").chmod(0o755)
    (root / "current").symlink_to("conf")
    packed = pack(root)
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(packed.path.read_bytes()), mode="r:gz") as archive:
        members = {m.name: m for m in archive.getmembers()}
    packed.path.unlink()
    assert members["run.sh"].mode == 0o755 and members["conf/a.toml"].mode == 0o644
    assert members["current"].issym() and members["current"].linkname == "conf"
    assert {m.mtime for m in members.values()} == {0}

    (root / "escape").symlink_to("/etc")
    with pytest.raises(UsageError, match="links outside the directory"):
        pack(root)


def test_a_workdir_over_the_limit_says_what_to_do(tmp_path: Path) -> None:
    root = tree(tmp_path / "app", {"big.bin": os.urandom(4096).hex()})
    with pytest.raises(UsageError, match=r"packs to more than .* leave large files out with \.skyignore"):
        pack(root, limit=1024)
    with pytest.raises(UsageError, match="does not exist"):
        pack(tmp_path / "missing")
    assert not list(tmp_path.glob("fleetkeeper-workdir-*"))


def test_a_workdir_a_replica_would_refuse_to_unpack_is_refused_before_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica caps the entries and unpacked bytes of a workdir (replica_boot.MAX_MEMBERS,
    MAX_UNPACKED_BYTES); `fleetkeeper up` says so at once instead of a replica failing at boot."""
    from fleetkeeper.cli import workdir

    root = tree(tmp_path / "app", {"a.txt": "x" * 3000, "b.txt": "y", "c.txt": "z"})
    monkeypatch.setattr(workdir, "MAX_MEMBERS", 2)
    with pytest.raises(UsageError, match=r"more than 2 files, directories and links: .*\.skyignore"):
        pack(root)
    monkeypatch.setattr(workdir, "MAX_MEMBERS", 100)
    monkeypatch.setattr(workdir, "MAX_UNPACKED_BYTES", 2048)
    with pytest.raises(UsageError, match=r"more than 0 MiB unpacked"):
        pack(root)
    assert not list(tmp_path.glob("fleetkeeper-workdir-*"))


# --- --env, --env-file, --secret ------------------------------------------------------------------------


def test_values_come_from_the_spec_then_env_files_then_flags(tmp_path: Path) -> None:
    env_file = tmp_path / "prod.env"
    env_file.write_text('# comment\nexport MODEL="llama"\nWORKERS=4\nEMPTY=\n')
    spec = {"envs": {"MODEL": "tiny", "HF_TOKEN": None, "DEBUG": "1"}, "secrets": {"API_KEY": None}}
    environ = {"HF_TOKEN": "hf_from_env", "API_KEY": "key_from_env"}
    out = apply_values(
        spec,
        [env_file],
        ["HF_TOKEN", "DEBUG=0"],
        ["API_KEY", "OTHER=x=y"],
        source="spec.yaml",
        environ=environ,
    )
    assert out["envs"] == {"MODEL": "llama", "HF_TOKEN": "hf_from_env", "DEBUG": "0", "WORKERS": "4", "EMPTY": ""}
    assert out["secrets"] == {"API_KEY": "key_from_env", "OTHER": "x=y"}
    assert spec["envs"]["HF_TOKEN"] is None  # the loaded spec is not changed in place


def test_a_flag_without_value_needs_the_variable_in_the_environment() -> None:
    with pytest.raises(UsageError) as caught:
        apply_values({}, [], [], ["HF_TOKEN"], source="s.yaml", environ={})
    assert (
        str(caught.value)
        == "--secret HF_TOKEN: HF_TOKEN is not set in your environment; set it, or pass --secret HF_TOKEN=VALUE"
    )


def test_an_env_file_line_without_equals_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.env"
    bad.write_text("A=1\njust words\n")
    with pytest.raises(UsageError, match=r"bad.env, line 2: expected NAME=VALUE"):
        read_env_file(bad)
