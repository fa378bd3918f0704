"""The CLI against the real api handler over real HTTP (the embedded bridge, moto in-process).

These need no reconciler: they prove what the API accepts and refuses reaches the user intact.
"""

from __future__ import annotations

import io
import json
import time
from typing import TYPE_CHECKING

import pytest

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.cli.main import run
from tests.support.local_process import serving_bridge

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SPEC = """\
name: web
service:
  readiness_probe: /health
  replicas: 2
envs:
  GREETING: {greeting}
run: python3 -m http.server $PORT
"""


@pytest.fixture
def api_url(table: str, tmp_path: Path) -> Iterator[str]:
    with serving_bridge(
        lambda_handler, tmp_path / "state", on_kick=lambda _n: None, logs_dir=tmp_path / "logs"
    ) as server:
        yield server.url


def spec_file(tmp_path: Path, greeting: str = "v1", text: str | None = None) -> str:
    path = tmp_path / f"spec-{greeting}.yaml"
    path.write_text(text if text is not None else SPEC.format(greeting=greeting))
    return str(path)


def cli(api_url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run([*argv, "--api-url", api_url], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_up_then_status_versions_update_rollback_down(api_url: str, tmp_path: Path) -> None:
    code, out, _ = cli(api_url, "up", spec_file(tmp_path))
    assert code == 0 and "created web (v1" in out

    code, out, _ = cli(api_url, "status", "web", "-o", "json")
    shown = json.loads(out)
    assert code == 0 and shown["name"] == "web" and shown["spec"]["envs"] == {"GREETING": "v1"}

    assert cli(api_url, "update", "web", spec_file(tmp_path, "v2"))[0] == 0
    code, out, _ = cli(api_url, "versions", "web", "-o", "json")
    versions = json.loads(out)
    assert code == 0 and versions["target_version"] == 2
    assert [v["version"] for v in versions["versions"]] == [1, 2]

    code, out, _ = cli(api_url, "versions", "web")
    assert "* v2" in out and "  v1" in out

    code, out, _ = cli(api_url, "rollback", "web", "-o", "json")
    assert code == 0 and json.loads(out)["target_version"] == 1

    code, out, _ = cli(api_url, "status")
    assert code == 0 and out.splitlines()[0].split() == [
        "NAME",
        "STATUS",
        "VERSION",
        "LIFECYCLE",
        "ENDPOINT",
        "MESSAGE",
    ]

    code, out, _ = cli(api_url, "down", "web")
    assert code == 0 and "SHUTTING_DOWN" in out


def test_a_spec_with_a_bad_field_exits_2_with_the_apis_message(api_url: str, tmp_path: Path) -> None:
    text = SPEC.format(greeting="x") + "file_mounts:\n  /data: s3://bucket\n"
    code, out, err = cli(api_url, "up", spec_file(tmp_path, text=text))
    assert code == 2 and out == ""
    assert "spec.file_mounts" in err and "file mounts and bucket mounts are not supported" in err


def test_a_duplicate_up_exits_2_with_the_apis_message(api_url: str, tmp_path: Path) -> None:
    assert cli(api_url, "up", spec_file(tmp_path))[0] == 0
    code, _, err = cli(api_url, "up", spec_file(tmp_path))
    assert code == 2
    assert (
        err
        == "service 'web' already exists; change it with `fleetkeeper update web SPEC.yaml` (PUT /v1/services/web)\n"
    )


def test_an_update_of_a_missing_service_exits_2_with_the_apis_message(api_url: str, tmp_path: Path) -> None:
    text = SPEC.format(greeting="x").replace("name: web\n", "")
    code, _, err = cli(api_url, "update", "ghost", spec_file(tmp_path, text=text))
    assert code == 2 and "ghost" in err and "does not exist" in err


def test_status_of_a_missing_service_exits_2(api_url: str) -> None:
    code, _, err = cli(api_url, "status", "ghost")
    assert code == 2 and "ghost" in err


def test_logs_prints_each_replicas_log_file(api_url: str, tmp_path: Path) -> None:
    assert cli(api_url, "up", spec_file(tmp_path))[0] == 0
    uid = json.loads(cli(api_url, "status", "web", "-o", "json")[1])["uid"]
    # A deleted incarnation of the same name left its own logs: never shown for this one.
    stale = tmp_path / "logs" / "web" / "0000old"
    stale.mkdir(parents=True)
    (stale / "replica-1.log").write_text("the old run's line\n")
    folder = tmp_path / "logs" / "web" / uid
    folder.mkdir(parents=True)
    (folder / "replica-1.log").write_text("one\n")
    (folder / "replica-2.log").write_text("two")
    (folder / "replica-3.log").write_text("three\n")
    (folder / "replica-4.log").write_text("Error: four\n")
    # The service has no replicas (no reconciler here) and is not READY: the newest three it no
    # longer has are shown, as a failed replica's log is why a service is not READY.
    code, out, err = cli(api_url, "logs", "web")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"==> replica 2, no longer in the service ({folder / 'replica-2.log'}) <==",
        "two",
        f"==> replica 3, no longer in the service ({folder / 'replica-3.log'}) <==",
        "three",
        f"==> replica 4, no longer in the service ({folder / 'replica-4.log'}) <==",
        "Error: four",
    ]
    code, out, _ = cli(api_url, "logs", "web", "--all")
    assert code == 0
    assert out.splitlines()[:4] == [
        f"==> replica 1, no longer in the service ({folder / 'replica-1.log'}) <==",
        "one",
        f"==> replica 2, no longer in the service ({folder / 'replica-2.log'}) <==",
        "two",
    ]
    assert cli(api_url, "logs", "web", "2")[1] == "two\n"
    assert cli(api_url, "logs", "web", "1", "--tail", "0")[1] == ""
    (folder / "replica-1.log").write_text("a\nb\nc\n")
    assert cli(api_url, "logs", "web", "1", "--tail", "2")[1] == "b\nc\n"
    assert cli(api_url, "logs", "web", "5")[0] == 2
    # --since: from where the log was at the last mark (the driver's, once a second) before then.
    now = int(time.time())
    (folder / "replica-1.log.times").write_text(f"{now - 3600} 2\n{now - 700} 4\n")
    assert cli(api_url, "logs", "web", "1", "--since", "10m")[1] == "c\n"
    assert cli(api_url, "logs", "web", "1", "--since", "2h")[1] == "a\nb\nc\n"
    assert "the old run's line" not in cli(api_url, "logs", "web", "--all")[1]


def test_logs_prints_a_replicas_output_without_terminal_escapes(api_url: str, tmp_path: Path) -> None:
    assert cli(api_url, "up", spec_file(tmp_path))[0] == 0
    uid = json.loads(cli(api_url, "status", "web", "-o", "json")[1])["uid"]
    folder = tmp_path / "logs" / "web" / uid
    folder.mkdir(parents=True)
    (folder / "replica-1.log").write_bytes(b"\x1b[2J\x1b[Hclean\x1b]0;title\x07\ttab\r\nnext \x1b[1A\x00line\n")
    code, out, _ = cli(api_url, "logs", "web", "1")
    assert code == 0
    assert out == "clean\ttab\nnext line\n"


def test_logs_of_a_missing_service_exits_2_with_the_apis_message(api_url: str, tmp_path: Path) -> None:
    (tmp_path / "logs" / "ghost").mkdir(parents=True)  # files left behind do not make it exist
    code, out, err = cli(api_url, "logs", "ghost")
    assert code == 2 and out == ""
    assert "ghost" in err and "does not exist" in err


def test_a_name_is_one_path_segment_never_another_route(api_url: str) -> None:
    code, _, err = cli(api_url, "status", "web/versions")
    assert code == 2 and "is invalid" in err
