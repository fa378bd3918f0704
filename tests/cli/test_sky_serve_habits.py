"""`sky serve` habits (issue 35, Deliver 6): `down NAME --replica-id N`, `logs --sync-down`, resource
overrides on `up`/`update` (--cpus, --memory, --gpus, --use-spot, --instance-type, with --env), and
`status --all` / `-v`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.cli.http import ApiError
from fleetkeeper.cli.spec_input import overridden
from tests.cli.test_cli import ScriptedClient, not_found, view
from tests.cli.test_habits import cli, listing, named, no_running_local  # noqa: F401 - the autouse fixture

SPEC = """\
name: web
service:
  readiness_probe: /health
  replicas: 2
resources:
  cpus: 2+
  accelerators: {L4:1, A10G:1}
  ordered:
    - accelerators: L4:1
    - accelerators: A10G:1
      use_spot: true
run: python3 -m http.server $PORT
"""


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "service.yaml"
    path.write_text(SPEC)
    return path


# --- down --replica-id ----------------------------------------------------------------------------------


def test_down_replica_id_terminates_one_replica() -> None:
    client = ScriptedClient({("DELETE", "/v1/services/web/replicas/1"): [{**view(), "changed": True}]})
    code, out, err = cli(["down", "web", "--replica-id", "1"], client)
    assert (code, err) == (0, "")
    assert out == "terminating replica 1 of web: the reconciler drains it and replaces it\n"
    assert client.sent == [("DELETE", "/v1/services/web/replicas/1", None)]


def test_down_replica_id_of_a_replica_already_going_says_so() -> None:
    client = ScriptedClient({("DELETE", "/v1/services/web/replicas/1"): [{**view(), "changed": False}]})
    assert cli(["down", "web", "--replica-id", "1"], client)[1] == (
        "replica 1 of web is already going; the reconciler replaces it\n"
    )


def test_down_replica_id_of_an_unknown_replica_exits_2_with_the_apis_words() -> None:
    message = "service 'web' has no replica 7 (its replicas: 0, 1); see `fleetkeeper status web`"
    client = ScriptedClient({("DELETE", "/v1/services/web/replicas/7"): [ApiError(404, message, {})]})
    assert cli(["down", "web", "--replica-id", "7"], client) == (2, "", message + "\n")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["down", "--all", "--replica-id", "1"], "give its NAME (and not --all)"),
        (["down", "web", "api", "--replica-id", "1"], "give its NAME"),
        (["down", "web", "--replica-id", "1", "--wait"], "fleetkeeper status web --watch"),
    ],
)
def test_down_replica_id_needs_one_name(argv: list[str], words: str) -> None:
    code, _, err = cli(argv, ScriptedClient({}))
    assert code == 2 and words in err


def test_down_replica_id_must_be_a_number() -> None:
    code, _, err = cli(["down", "web", "--replica-id", "one"], ScriptedClient({}))
    assert code == 2 and "'one' is not a replica id" in err


# --- resource overrides ---------------------------------------------------------------------------------


def test_resource_overrides_are_applied_to_the_spec_before_it_is_sent(spec_file: Path) -> None:
    client = ScriptedClient({("POST", "/v1/services"): [view("NO_REPLICA", observed=0)]})
    argv = ["up", str(spec_file), "--cpus", "4", "--memory", "16+", "--gpus", "A10G:1", "--use-spot"]
    code, _, _ = cli([*argv, "--env", "MODEL=llama"], client)
    assert code == 0
    (_, _, body), *_ = client.sent
    # --gpus is SkyPilot's accelerators, over every alternative: the `ordered` entries lose theirs; the
    # second keeps nothing the flags set (use_spot too), so both are the one choice and `ordered` goes.
    assert body["spec"]["resources"] == {"cpus": "4", "memory": "16+", "accelerators": "A10G:1", "use_spot": True}
    assert body["spec"]["envs"] == {"MODEL": "llama"}


def test_update_takes_the_overrides_too(spec_file: Path) -> None:
    client = ScriptedClient({("PUT", "/v1/services/web"): [{**view(target=2), "mode": "rolling"}]})
    assert cli(["update", "web", str(spec_file), "--instance-type", "g5.xlarge", "--no-use-spot"], client)[0] == 0
    (_, _, body), *_ = client.sent
    resources = body["spec"]["resources"]
    assert (resources["instance_type"], resources["use_spot"]) == ("g5.xlarge", False)
    # An entry keeps what the flags do not set: its accelerators; its use_spot goes (the flag's wins).
    assert resources["ordered"] == [{"accelerators": "L4:1"}, {"accelerators": "A10G:1"}]


def test_without_overrides_the_spec_is_sent_as_written(spec_file: Path) -> None:
    client = ScriptedClient({("POST", "/v1/services"): [view("NO_REPLICA", observed=0)]})
    assert cli(["up", str(spec_file)], client)[0] == 0
    (_, _, body), *_ = client.sent
    assert body["spec"]["resources"]["ordered"][1] == {"accelerators": "A10G:1", "use_spot": True}


def test_overrides_need_resources_as_a_mapping() -> None:
    from fleetkeeper.cli.http import UsageError

    assert overridden({"run": "x"}, {"cpus": "2"}, source="s.yaml") == {"run": "x", "resources": {"cpus": "2"}}
    with pytest.raises(UsageError, match="`resources` must be a mapping"):
        overridden({"resources": "big"}, {"cpus": "2"}, source="s.yaml")


def test_use_spot_and_no_use_spot_are_one_choice(spec_file: Path) -> None:
    code, _, err = cli(["up", str(spec_file), "--use-spot", "--no-use-spot"], ScriptedClient({}))
    assert code == 2 and "not allowed with argument" in err


# --- status --all / -v ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--all", "-a", "-v", "--verbose"])
def test_status_all_shows_every_service_in_full(flag: str) -> None:
    script: dict[tuple[str, str], list[Any]] = {
        **listing("web", "api", "gone"),
        ("GET", "/v1/services/web"): [named("web")],
        ("GET", "/v1/services/api"): [named("api", ready=1)],
        ("GET", "/v1/services/gone"): [not_found()],  # deleted between the list and its read
    }
    code, out, _ = cli(["status", flag], ScriptedClient(script))
    assert code == 0
    assert out.startswith("web  READY  v1 of 1")
    web, api = out.split("\n\napi  READY  v1 of 1")
    assert "REPLICA" in web and "local-1-pid101" in web and "STARTING" not in web
    assert "STARTING" in api  # its replica 2
    assert "gone" not in out


def test_status_all_as_json_lists_the_full_views() -> None:
    import json

    script = {**listing("web"), ("GET", "/v1/services/web"): [named("web")]}
    code, out, _ = cli(["status", "--all", "-o", "json"], ScriptedClient(script))
    assert code == 0 and [len(s["replicas"]) for s in json.loads(out)["services"]] == [2]


# --- logs --sync-down -----------------------------------------------------------------------------------


def test_logs_sync_down_writes_each_replicas_log_to_a_file(tmp_path: Path) -> None:
    base = "/_local/logs/web"
    client = ScriptedClient(
        {
            ("GET", "/v1/services/web"): [view()],
            ("GET", f"{base}?uid=u1"): [{"logs": [{"replica_id": 1, "path": "a"}, {"replica_id": 2, "path": "b"}]}],
            ("GET", f"{base}/1?uid=u1"): ["serving on 8080\n"],
            ("GET", f"{base}/2?uid=u1"): ["loading \x1b[31mweights\n"],
        }
    )
    folder = tmp_path / "logs"
    code, out, _ = cli(["logs", "web", "--sync-down", "--to", str(folder)], client)
    assert code == 0 and out == f"synced down the logs of web's replica(s) 1, 2 to {folder}\n"
    assert (folder / "replica-1.log").read_text() == "serving on 8080\n"
    assert "\x1b" not in (folder / "replica-2.log").read_text()  # nothing a terminal would obey


def test_logs_sync_down_defaults_to_a_folder_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    client = ScriptedClient(
        {
            ("GET", "/v1/services/web"): [view()],
            ("GET", "/_local/logs/web?uid=u1"): [{"logs": [{"replica_id": 1, "path": "a"}]}],
            ("GET", "/_local/logs/web/1?uid=u1"): ["hello\n"],
        }
    )
    assert cli(["logs", "web", "--sync-down"], client)[0] == 0
    (folder,) = (tmp_path / "fleetkeeper-logs").iterdir()
    assert folder.name.startswith("web-") and (folder / "replica-1.log").read_text() == "hello\n"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["logs", "web", "--sync-down", "--follow"], "does not take --follow"),
        (["logs", "web", "--to", "x"], "add --sync-down"),
    ],
)
def test_logs_sync_down_refuses_what_it_cannot_do(argv: list[str], words: str) -> None:
    code, _, err = cli(argv, ScriptedClient({}))
    assert code == 2 and words in err
