"""The habits SkyPilot and kubectl users bring: several names and --all for `down`, `status
--endpoint`, `status --watch`, a name made from the file, `-o yaml`, and help texts that read whole."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkeeper.cli.args import build_parser, summary
from fleetkeeper.cli.main import run
from fleetkeeper.cli.spec_input import derived_name
from fleetkeeper.local.auth import RUNTIME_DIR_ENV
from tests.cli.test_cli import ScriptedClient, not_found, view


@pytest.fixture(autouse=True)
def no_running_local(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `fleetkeeper local` of this user is found (the CLI then takes --local's default address)."""
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "run"))
    monkeypatch.delenv("FLEETKEEPER_API_URL", raising=False)


class Terminal(io.StringIO):
    """A stdin (or stdout) that is a terminal."""

    def isatty(self) -> bool:
        return True


def cli(argv: list[str], client: ScriptedClient, stdin: io.StringIO | None = None) -> tuple[int, str, str]:
    """The CLI against a scripted API (--local: the embedded mode's address, without a credential)."""
    out, err = io.StringIO(), io.StringIO()
    argv = [*argv, "--local"]
    code = run(argv, out=out, err=err, client_factory=lambda _url: client, stdin=stdin or io.StringIO())
    return code, out.getvalue(), err.getvalue()


def named(name: str, **kw: Any) -> dict[str, Any]:
    return {**view(**kw), "name": name, "uid": f"uid-{name}"}


def listing(*names: str) -> dict[tuple[str, str], list[Any]]:
    return {("GET", "/v1/services?limit=100"): [{"services": [named(n) for n in names]}]}


# --- help -------------------------------------------------------------------------------------------------


def test_the_command_list_shows_each_commands_first_sentence_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert summary("Roll out a new version.\nMore here.") == "Roll out a new version"
    assert summary("Print the logs: the current\nreplicas (all of them). Then") == (
        "Print the logs: the current replicas (all of them)"
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "repeats folded with a count): why it is not READY" in text  # not cut at the line's end
    assert (
        "Print the replicas' logs: the service's current replicas (embedded mode: while it is not READY also "
        "the 3 newest it no longer has, as a failed one's log says why; --all: every one)" in text
    )


def test_down_help_says_it_waits_until_the_services_are_gone(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["down", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "wait until each service is gone" in text
    assert "READY" not in text


# --- down -------------------------------------------------------------------------------------------------


def test_down_takes_several_names_and_tries_each_even_after_a_missing_one() -> None:
    client = ScriptedClient(
        {
            ("DELETE", "/v1/services/web"): [named("web", status="SHUTTING_DOWN")],
            ("DELETE", "/v1/services/ghost"): [not_found()],
            ("DELETE", "/v1/services/api"): [named("api", status="SHUTTING_DOWN")],
        }
    )
    code, out, err = cli(["down", "web", "ghost", "api", "web"], client)
    assert code == 2  # one was refused
    assert out == "deleting web: SHUTTING_DOWN\ndeleting api: SHUTTING_DOWN\n"
    assert err == "service 'web' does not exist\n"  # the API's own words for the missing one
    assert [path for _, path, _ in client.sent] == ["/v1/services/web", "/v1/services/ghost", "/v1/services/api"]


def test_down_of_several_as_json_or_yaml_is_a_list_and_of_one_its_view() -> None:
    script = {
        ("DELETE", "/v1/services/web"): [named("web", status="SHUTTING_DOWN")],
        ("DELETE", "/v1/services/api"): [named("api", status="SHUTTING_DOWN")],
    }
    code, out, _ = cli(["down", "web", "api", "-o", "json"], ScriptedClient(dict(script)))
    assert code == 0 and [s["name"] for s in json.loads(out)["services"]] == ["web", "api"]
    code, out, _ = cli(["down", "web", "-o", "yaml"], ScriptedClient(dict(script)))
    assert code == 0 and yaml.safe_load(out)["name"] == "web"


def test_down_all_without_a_terminal_refuses_without_yes() -> None:
    client = ScriptedClient(listing("web", "api"))
    code, out, err = cli(["down", "--all"], client)
    assert code == 2 and out == ""
    assert err == (
        "fleetkeeper: down --all would delete 2 service(s) (web, api); pass -y (--yes) to confirm: "
        "there is no terminal to ask\n"
    )
    assert all(method == "GET" for method, _, _ in client.sent)


def test_down_all_asks_at_a_terminal_and_deletes_nothing_unless_told_yes() -> None:
    client = ScriptedClient(listing("web"))
    code, _, err = cli(["down", "--all"], client, stdin=Terminal("n\n"))
    assert code == 0 and err == "Delete 1 service(s): web? [y/N] nothing deleted\n"
    assert all(method == "GET" for method, _, _ in client.sent)
    client = ScriptedClient({**listing("web"), ("DELETE", "/v1/services/web"): [named("web", status="SHUTTING_DOWN")]})
    code, out, _ = cli(["down", "--all"], client, stdin=Terminal("y\n"))
    assert code == 0 and out == "deleting web: SHUTTING_DOWN\n"


def test_down_all_yes_deletes_every_service_and_waits_for_each() -> None:
    client = ScriptedClient(
        {
            **listing("web", "api"),
            ("DELETE", "/v1/services/web"): [named("web", status="SHUTTING_DOWN")],
            ("DELETE", "/v1/services/api"): [named("api", status="SHUTTING_DOWN")],
            ("GET", "/v1/services/web"): [not_found()],
            ("GET", "/v1/services/api"): [not_found()],
        }
    )
    code, out, _ = cli(["down", "--all", "-y", "--wait", "--timeout", "5"], client)
    assert code == 0
    assert out.splitlines() == [
        "deleting web: SHUTTING_DOWN",
        "deleting api: SHUTTING_DOWN",
        "web is gone",
        "api is gone",
    ]


def test_down_needs_names_or_all_not_both() -> None:
    assert cli(["down"], ScriptedClient({}))[2] == "fleetkeeper: which service? give one or more names, or --all\n"
    assert (
        cli(["down", "web", "--all"], ScriptedClient({}))[2] == "fleetkeeper: give service names or --all, not both\n"
    )
    code, out, err = cli(["down", "--all", "-y"], ScriptedClient(listing()))
    assert (code, out, err) == (0, "no services to delete\n", "")


# --- status --endpoint, --watch ---------------------------------------------------------------------------


def test_status_endpoint_prints_the_url_alone() -> None:
    ready = {**view(), "endpoint": "http://127.0.0.1:4242"}
    client = ScriptedClient({("GET", "/v1/services/web"): [ready]})
    assert cli(["status", "web", "--endpoint"], client) == (0, "http://127.0.0.1:4242\n", "")
    code, out, _ = cli(["status", "web", "--endpoint", "-o", "json"], client)
    assert code == 0 and json.loads(out) == {"name": "web", "endpoint": "http://127.0.0.1:4242"}


def test_status_endpoint_without_one_yet_exits_1_and_says_why() -> None:
    starting = {**view("REPLICA_INIT", message="0/2 ready"), "endpoint": None}
    code, out, err = cli(["status", "web", "--endpoint"], ScriptedClient({("GET", "/v1/services/web"): [starting]}))
    assert (code, out, err) == (1, "", "web has no endpoint yet (REPLICA_INIT: 0/2 ready)\n")
    assert cli(["status", "--endpoint"], ScriptedClient({}))[0] == 2


def test_status_watch_refreshes_count_times(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("fleetkeeper.cli.commands.status.time.sleep", sleeps.append)
    client = ScriptedClient(
        {("GET", "/v1/services?limit=100"): [{"services": [named("web", status=s)]} for s in ("REPLICA_INIT", "READY")]}
    )
    code, out, _ = cli(["status", "--watch", "--count", "2", "--interval", "0.5"], client)
    assert code == 0 and sleeps == [0.5]
    tables = out.split("\n\n")
    assert len(tables) == 2 and "REPLICA_INIT" in tables[0] and "READY" in tables[1]


def test_status_watch_as_json_is_one_document_a_line_and_ends_when_the_service_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("fleetkeeper.cli.commands.status.time.sleep", lambda _s: None)
    client = ScriptedClient({("GET", "/v1/services/web"): [view("UPDATING"), view("READY"), not_found()]})
    code, out, err = cli(["status", "web", "--watch", "-o", "json"], client)
    assert code == 0 and err == "web is gone\n"
    assert [json.loads(line)["status"] for line in out.splitlines()] == ["UPDATING", "READY"]


def test_status_watch_ends_quietly_on_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("fleetkeeper.cli.commands.status.time.sleep", interrupt)
    client = ScriptedClient(listing("web"))
    code, out, _ = cli(["status", "-w"], client)
    assert code == 0 and "web" in out


# --- names and -o yaml -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("llm/vllm.yaml", "vllm"),
        ("examples/serve/http_server/task.yaml", "http-server"),
        ("fixed_port/service.yaml", "fixed-port"),
        ("2048-game.yml", "svc-2048-game"),
        ("Hello World!.yaml", "hello-world"),
        (f"{'x' * 70}.yaml", "x" * 63),
    ],
)
def test_a_name_is_made_from_the_file_when_the_spec_has_none(path: str, name: str) -> None:
    assert derived_name(Path(path)) == name


def test_every_listing_takes_o_yaml() -> None:
    client = ScriptedClient(listing("web"))
    code, out, _ = cli(["status", "-o", "yaml"], client)
    assert code == 0 and yaml.safe_load(out)["services"][0]["name"] == "web"


# --- progress lines whose counts agree ----------------------------------------------------------------------


def _replica(replica_id: int, version: int, status: str, message: str = "") -> dict[str, Any]:
    return {"replica_id": replica_id, "version": version, "status": status, "status_message": message}


def test_a_progress_line_counts_once_from_the_replicas_not_again_from_a_stale_message() -> None:
    from fleetkeeper.cli.waiting import Goal, progress_line

    goal = Goal("web", "u1", generation=1, target_version=1)
    # The replicas are READY; the status message is of the run before (its own count says 0/3).
    now = {
        **view("REPLICA_INIT", replicas=3, ready=3, message="0/3 ready; replica 1 STARTING: not ready yet"),
        "replicas": [_replica(i, 1, "READY") for i in range(3)],
    }
    assert progress_line(goal, now) == "web: REPLICA_INIT v1: 3/3 ready"


def test_an_update_in_progress_counts_the_old_replicas_still_serving() -> None:
    from fleetkeeper.cli import render
    from fleetkeeper.cli.waiting import Goal, progress_line

    goal = Goal("web", "u1", generation=2, target_version=2)
    message = "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; replica 2 PENDING"
    updating = {
        **view("UPDATING", target=2, observed=2, generation=2, message=message),
        "replicas": [
            _replica(0, 1, "READY"),
            _replica(1, 1, "READY"),
            _replica(2, 2, "STARTING", "not ready yet: connection refused"),
        ],
    }
    assert progress_line(goal, updating) == (
        "web: UPDATING to v2: 0/2 new ready, 2 old serving - replica 2 STARTING: not ready yet: connection refused"
    )
    detail = render.service_detail({**updating, "replicas": [{**r, "instance_id": "i"} for r in updating["replicas"]]})
    assert detail.splitlines()[0] == "web  UPDATING  v2 of 2  (0/2 new ready, 2 old serving, rolling)"
    assert "0/2 new ready, 2 old replica(s) left" not in detail  # one count, not two
    failed = {**updating, "status": "FAILED", "status_message": "version 2 failed: 3 replica failures"}
    assert progress_line(goal, failed).endswith(" - version 2 failed: 3 replica failures")


# --- autoscaling, readable --------------------------------------------------------------------------------


def test_the_autoscaling_line_says_when_there_is_no_reading_and_how_old_one_is() -> None:
    from datetime import UTC, datetime

    from fleetkeeper.cli.render import autoscaling_line

    scaling: dict[str, Any] = {
        "target_replicas": 1,
        "min_replicas": 1,
        "max_replicas": 3,
        "target_qps_per_replica": 2.0,
        "request_rate": None,
        "request_rate_at": None,
        "pending": None,
    }
    now = datetime(2026, 1, 1, 0, 1, 0, tzinfo=UTC)
    assert autoscaling_line(scaling, now) == "  autoscaling: 1 replica(s) (1-3, 2 req/s each); no reading yet"
    reading = {
        **scaling,
        "request_rate": 7.917,
        "request_rate_at": "2026-01-01T00:00:48.000Z",
        "request_rate_window_seconds": 60,
    }
    pending = {"message": "scaling up to 3 in 2m: 7.9 req/s > 2 \N{MULTIPLICATION SIGN} 1"}
    line = autoscaling_line({**reading, "pending": pending}, now)
    # One precision for every rate on the line: the reading's and the reason's.
    assert line == (
        "  autoscaling: 1 replica(s) (1-3, 2 req/s each); 7.9 req/s (60s window, read 12s ago); "
        "scaling up to 3 in 2m: 7.9 req/s > 2 \N{MULTIPLICATION SIGN} 1"
    )
