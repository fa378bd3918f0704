"""`fleetkeeper access` and the owner in `fleetkeeper status`, against the real api over real HTTP.

Two bridges on one table stand for two teams' CI roles calling one stack: each signs its requests as
its own role (the identity API Gateway would report).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
from typing import TYPE_CHECKING

import pytest

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.cli.main import run
from fleetkeeper.local.http_bridge import local_principal
from tests.support.local_process import serving_bridge

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

TEAM_A = "arn:aws:iam::123456789012:role/team-a-ci"
TEAM_B = "arn:aws:iam::123456789012:role/team-b-ci"
SPEC = "name: web\nservice:\n  readiness_probe: /health\n  replicas: 1\nrun: python3 -m http.server $PORT\n"


@pytest.fixture
def bridge(table: str, tmp_path: Path) -> Iterator[Callable[[str | None], str]]:
    """A bridge signing as the given principal (None: the embedded mode's own user); its URL."""
    numbers = itertools.count()
    with contextlib.ExitStack() as stack:

        def start(principal: str | None) -> str:
            server = stack.enter_context(
                serving_bridge(
                    lambda_handler,
                    tmp_path / f"state-{next(numbers)}",
                    on_kick=lambda _n: None,
                    logs_dir=tmp_path / "logs",
                    principal=principal,
                )
            )
            return str(server.url)

        yield start


def cli(url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run([*argv, "--api-url", url], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def session(role: str) -> str:
    return role.replace(":iam::", ":sts::").replace(":role/", ":assumed-role/") + "/ci-run"


def test_status_shows_the_owner_and_access_grants_and_takes_it_away(
    bridge: Callable[[str | None], str], tmp_path: Path
) -> None:
    a, b = bridge(session(TEAM_A)), bridge(session(TEAM_B))
    spec = tmp_path / "web.yaml"
    spec.write_text(SPEC)
    assert cli(a, "up", str(spec))[0] == 0

    code, out, _ = cli(a, "status", "web")
    assert code == 0
    assert f"  owner: {TEAM_A}" in out.splitlines()
    assert "  access: -" in out.splitlines()

    # Team B sees nothing of it: the very answer a missing service gets.
    code, _, err = cli(b, "status", "web")
    assert (code, err.strip()) == (2, "service 'web' does not exist")
    assert cli(b, "status")[1].strip() == "no services"

    code, out, err = cli(
        a, "access", "web", "--add", f"arn:aws:iam::123456789012:role/ci/{TEAM_B.rsplit('/')[-1]}", "--read-only"
    )
    assert code == 0, err
    assert "web: access changed" in err
    assert f"  read   {TEAM_B}" in out.splitlines()
    code, out, _ = cli(a, "status", "web")
    assert f"  access: {TEAM_B} (read)" in out.splitlines()

    # Read, not write: B's update exits 2 with the API's words, naming the access missing.
    assert cli(b, "status", "web")[0] == 0
    code, _, err = cli(b, "update", "web", str(spec))
    assert code == 2
    assert "needs write access to service web" in err

    code, out, _ = cli(a, "access", "web", "--add", TEAM_B, "-o", "json")
    assert code == 0
    assert json.loads(out) == {
        "name": "web",
        "owner": TEAM_A,
        "access": [{"principal": TEAM_B, "mode": "write"}],
        "changed": True,
    }
    assert cli(b, "update", "web", str(spec))[0] == 0

    code, out, _ = cli(a, "access", "web", "-o", "json")
    assert json.loads(out) == {"name": "web", "owner": TEAM_A, "access": [{"principal": TEAM_B, "mode": "write"}]}

    code, out, err = cli(a, "access", "web", "--remove", TEAM_B)
    assert code == 0 and "no other principals" in out
    assert cli(b, "status", "web")[0] == 2

    # What the events say.
    code, out, _ = cli(a, "events", "web", "-o", "json")
    reasons = [e["reason"] for e in json.loads(out)["events"]]
    assert reasons.count("AccessChanged") == 3


def test_a_bad_principal_exits_2_with_the_apis_message(bridge: Callable[[str | None], str], tmp_path: Path) -> None:
    a = bridge(session(TEAM_A))
    spec = tmp_path / "web.yaml"
    spec.write_text(SPEC)
    cli(a, "up", str(spec))
    code, _, err = cli(a, "access", "web", "--add", "team-b")
    assert code == 2
    assert "add[0].principal" in err and "is not an IAM principal ARN" in err
    code, _, err = cli(a, "access", "web", "--read-only")
    assert code == 2 and "--read-only applies to --add" in err


def test_the_embedded_modes_user_is_an_administrator(
    bridge: Callable[[str | None], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetkeeper.local.options import Options
    from fleetkeeper.local.server import configure_environment
    from fleetkeeper.settings import ADMIN_PRINCIPALS_ENV

    # What `fleetkeeper local` configures: its user is the stack's administrator.
    saved = dict(os.environ)
    try:
        configure_environment(Options(local_dir=tmp_path, table="fleetkeeper-test"))
        admins = os.environ[ADMIN_PRINCIPALS_ENV]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert admins == local_principal()
    assert local_principal().startswith("local:")
    monkeypatch.setenv(ADMIN_PRINCIPALS_ENV, admins)

    team = bridge(session(TEAM_A))
    spec = tmp_path / "web.yaml"
    spec.write_text(SPEC)
    assert cli(team, "up", str(spec))[0] == 0
    local = bridge(None)
    code, out, _ = cli(local, "status", "web", "-o", "json")
    assert code == 0 and json.loads(out)["owner"] == TEAM_A
    assert cli(local, "down", "web")[0] == 0
