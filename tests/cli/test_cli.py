"""The CLI on its own: arguments, API URL resolution, signing, --wait verdicts, exit codes."""

from __future__ import annotations

import io
import json
import os
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.stub import Stubber

from fleetkeeper.cli import render
from fleetkeeper.cli.args import build_parser
from fleetkeeper.cli.http import (
    ApiClient,
    ApiError,
    SigV4Signer,
    Unreachable,
    UsageError,
    is_loopback,
    resolve_api_url,
)
from fleetkeeper.cli.main import run
from fleetkeeper.cli.waiting import Goal, Progress, judge, wait_for
from fleetkeeper.local.auth import RUNTIME_DIR_ENV, LocalCredential, new_token, publish, withdraw
from fleetkeeper.local.server import parser as local_parser

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

# --- a scripted API ------------------------------------------------------------------------------------


class FakeResponse:
    def __init__(self, body: Any) -> None:
        self.body = body
        self.status = 200
        self.headers: dict[str, str] = {}


class ScriptedClient(ApiClient):
    """Answers each request from a script: a list of bodies (or exceptions) per (method, path)."""

    def __init__(self, script: dict[tuple[str, str], list[Any]], *, embedded: bool = True) -> None:
        super().__init__("http://127.0.0.1:1" if embedded else "https://abc.execute-api.eu-west-1.amazonaws.com/api")
        self.script = script
        self.sent: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None, *, raw: bool = False) -> Any:
        self.sent.append((method, path, body))
        answers = self.script[(method, path)]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return FakeResponse(answer)


def view(
    status: str = "READY",
    *,
    target: int = 1,
    observed: int = 1,
    generation: int = 1,
    ready: int = 2,
    replicas: int = 2,
    uid: str = "u1",
    message: str = "",
) -> dict[str, Any]:
    return {
        "name": "web",
        "uid": uid,
        "status": status,
        "status_message": message,
        "lifecycle": "ACTIVE",
        "target_version": target,
        "latest_version": target,
        "generation": generation,
        "observed_generation": observed,
        "created_at": "2026-01-01T00:00:00.000Z",
        "updated_at": "2026-01-01T00:00:00.000Z",
        "replicas": [
            {
                "replica_id": i,
                "version": target,
                "status": "READY" if i <= ready else "STARTING",
                "status_message": "",
                "instance_id": f"local-{i}-pid{100 + i}",
                "url": f"http://127.0.0.1:{9000 + i}",
                "created_at": "2026-01-01T00:00:00.000Z",
                "updated_at": "2026-01-01T00:00:00.000Z",
            }
            for i in range(1, replicas + 1)
        ],
        "spec": {"service": {"replicas": replicas, "readiness_probe": {"path": "/health"}}, "run": "x"},
        "mode": "rolling",
    }


def not_found() -> ApiError:
    return ApiError(404, "service 'web' does not exist", {"error": {"code": "not_found"}})


def cli(argv: list[str], client: ApiClient) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run(argv, out=out, err=err, client_factory=lambda _url: client)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "service.yaml"
    path.write_text(
        "name: web\nservice:\n  readiness_probe: /health\n  replicas: 2\nrun: python3 -m http.server $PORT\n"
    )
    return path


@pytest.fixture(autouse=True)
def no_api_url_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETKEEPER_API_URL", raising=False)


@pytest.fixture(autouse=True)
def running_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCredential]:
    """As if the user's `fleetkeeper local` ran at the default address: the CLI finds it on its own
    (this process stands in for the server: its pid is alive)."""
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "run"))
    credential = LocalCredential("http://127.0.0.1:8470", new_token(), os.getpid())
    published = publish(credential, tmp_path / "state")
    yield credential
    withdraw(published)


# --- arguments and exit code 2 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["up"],
        ["status", "--output", "xml"],
        ["status", "--count", "0"],
        ["rollback", "web", "--to", "two"],
        ["update", "web"],
    ],
)
def test_bad_usage_exits_2_without_calling_the_api(argv: list[str]) -> None:
    client = ScriptedClient({})
    code, out, err = cli(argv, client)
    assert code == 2
    assert "usage:" in err and out == ""
    assert client.sent == []


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["local", "--port", "99999"], "--port"),
        (["local", "--port", "-5"], "--port"),
        (["local", "--port", "http"], "--port"),
        (["local", "--tick", "nan"], "--tick"),
        (["local", "--tick", "inf"], "--tick"),
        (["local", "--tick", "0"], "--tick"),
        (["local", "--tick", "-1"], "--tick"),
        (["local", "--tick", "3601"], "--tick"),
        (["down", "web", "--wait", "--timeout", "nan"], "--timeout"),
        (["down", "web", "--wait", "--timeout", "inf"], "--timeout"),
        (["up", "s.yaml", "--timeout", "0"], "--timeout"),
        (["update", "web", "s.yaml", "--timeout", "-3"], "--timeout"),
    ],
)
def test_out_of_range_numbers_are_refused_by_the_parser(argv: list[str], problem: str) -> None:
    # Checked while parsing: `local` would otherwise start serving (and spin on a NaN tick).
    with pytest.raises(UsageError, match=problem):
        build_parser().parse_args(argv)
    if argv[0] == "local":
        with pytest.raises(SystemExit) as exited:  # `fleetkeeper-local`'s own parser: argparse's exit 2
            local_parser().parse_args(argv[1:])
        assert exited.value.code == 2


def test_numbers_in_range_are_taken() -> None:
    args = build_parser().parse_args(["local", "--port", "0", "--tick", "0.5"])
    assert (args.port, args.tick) == (0, 0.5)
    assert build_parser().parse_args(["local", "--port", "65535", "--tick", "3600"]).port == 65535
    assert build_parser().parse_args(["down", "web", "--wait", "--timeout", "1.5"]).timeout == 1.5


def test_a_missing_spec_file_exits_2(tmp_path: Path) -> None:
    code, _, err = cli(["up", str(tmp_path / "nope.yaml")], ScriptedClient({}))
    assert code == 2 and "cannot read" in err


@pytest.mark.parametrize(("text", "problem"), [("service: [unclosed", "not valid YAML"), ("- a\n- b\n", "mapping")])
def test_a_spec_that_is_not_a_yaml_mapping_exits_2(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, _, err = cli(["up", str(path)], ScriptedClient({}))
    assert code == 2 and problem in err


def test_up_names_a_spec_without_a_name_after_its_file(tmp_path: Path) -> None:
    path = tmp_path / "My_App.v2.yaml"
    path.write_text("service:\n  readiness_probe: /\nrun: x\n")
    client = ScriptedClient({("POST", "/v1/services"): [view("NO_REPLICA", observed=0)]})
    code, _, err = cli(["up", str(path)], client)
    assert code == 0
    assert err.startswith(f"no name in {path}: the service is my-app-v2 (--name NAME chooses another)")
    (_, _, body), *_ = client.sent
    assert body["name"] == "my-app-v2"
    nameless = tmp_path / "___.yaml"
    nameless.write_text("service:\n  readiness_probe: /\nrun: x\n")
    code, _, err = cli(["up", str(nameless)], ScriptedClient({}))
    assert code == 2 and "--name" in err


def test_up_sends_the_yaml_spec_and_the_name_overrides_the_specs(spec_file: Path) -> None:
    client = ScriptedClient({("POST", "/v1/services"): [view("NO_REPLICA", observed=0)]})
    code, out, _ = cli(["up", str(spec_file), "--name", "other"], client)
    assert code == 0 and "created" in out
    (_, _, body), *_ = client.sent
    assert body["name"] == "other"
    assert "name" not in body["spec"]
    assert body["spec"]["service"] == {"readiness_probe": "/health", "replicas": 2}


def test_a_request_the_api_rejects_exits_2_with_its_message_as_is(spec_file: Path) -> None:
    message = "service 'web' already exists; change it with `fleetkeeper update web SPEC.yaml` (PUT /v1/services/web)"
    client = ScriptedClient({("POST", "/v1/services"): [ApiError(409, message, {})]})
    code, out, err = cli(["up", str(spec_file)], client)
    assert (code, out, err) == (2, "", message + "\n")


def test_a_server_error_or_an_unreachable_api_exits_1() -> None:
    client = ScriptedClient({("GET", "/v1/services/web"): [ApiError(500, "internal error", {})]})
    assert cli(["status", "web"], client)[0] == 1
    client = ScriptedClient({("GET", "/v1/services/web"): [Unreachable("cannot reach")]})
    assert cli(["status", "web"], client)[0] == 1


def test_an_unreachable_embedded_api_is_reported_with_its_url() -> None:
    client = ApiClient("http://127.0.0.1:9", retries=1)  # the discard port: nothing listens
    code, _, err = cli(["status"], client)
    assert code == 1 and "cannot reach the fleetkeeper API at http://127.0.0.1:9" in err


def test_nothing_at_the_default_address_suggests_starting_fleetkeeper_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETKEEPER_API_URL", raising=False)
    out, err = io.StringIO(), io.StringIO()
    code = run(
        ["status"],
        out=out,
        err=err,
        client_factory=lambda url: ScriptedClient(
            {("GET", "/v1/services?limit=100"): [Unreachable(f"cannot reach the fleetkeeper API at {url}")]}
        ),
    )
    assert code == 1
    assert err.getvalue().splitlines()[-1] == (
        "fleetkeeper: nothing answers at the embedded mode's address: start it with `fleetkeeper local` "
        "(in another terminal), or point at a deployed stack with --stack NAME or --api-url URL"
    )
    # Another address: no such hint (the user chose it).
    code = run(
        ["status", "--api-url", "http://127.0.0.1:9", "--local"],
        out=out,
        err=(other := io.StringIO()),
        client_factory=lambda url: ScriptedClient({("GET", "/v1/services?limit=100"): [Unreachable("x")]}),
    )
    assert code == 1 and "fleetkeeper local" not in other.getvalue()


def test_version_and_every_commands_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("fleetkeeper ")
    for command in ("up", "update", "status", "versions", "rollback", "down", "events", "logs", "local"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = capsys.readouterr().out
        assert "examples:\n  fleetkeeper " + command in text, text
    up_help = build_parser()._subparsers._group_actions[0].choices["up"].format_help()  # type: ignore[union-attr]
    assert "--secret NAME[=VALUE]" in up_help and "--env-file FILE" in up_help


def test_logs_on_aws_needs_the_stacks_log_group_and_says_where_to_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETKEEPER_LOG_GROUP", raising=False)
    client = ScriptedClient({}, embedded=False)
    code, _, err = cli(["logs", "web", "--api-url", API_GW], client)
    assert code == 2 and "--stack NAME" in err and "--log-group" in err
    assert client.sent == []  # said before any request


def test_events_lists_them_oldest_first_and_status_shows_the_last_few() -> None:
    events = [
        {
            "time": "2026-01-01T00:02:00.000Z",
            "first_seen": "2026-01-01T00:00:00.000Z",
            "count": 3,
            "type": "Warning",
            "reason": "LaunchRefused",
            "message": "replica 0 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity",
            "replica_id": 0,
            "version": 1,
            "code": "InsufficientInstanceCapacity",
        },
        {
            "time": "2026-01-01T00:00:00.000Z",
            "first_seen": "2026-01-01T00:00:00.000Z",
            "count": 1,
            "type": "Normal",
            "reason": "Created",
            "message": "service created at version 1",
            "version": 1,
        },
    ]
    client = ScriptedClient(
        {
            ("GET", "/v1/services/web/events?limit=100"): [{"events": events, "next_token": None}],
            ("GET", "/v1/services/web/events?limit=5"): [{"events": events, "next_token": None}],
            ("GET", "/v1/services/web"): [view()],
        }
    )
    code, out, _ = cli(["events", "web"], client)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:4] == ["LAST", "SEEN", "TYPE", "REASON"]
    assert "Created" in lines[1] and "LaunchRefused" in lines[2] and " 3 " in lines[2]
    code, out, _ = cli(["events", "web", "-o", "json"], client)
    assert code == 0 and json.loads(out) == {"events": events}
    code, out, _ = cli(["status", "web"], client)
    assert code == 0 and "Events (`fleetkeeper events web` for more):" in out and "LaunchRefused" in out


def test_events_follow_prints_each_new_or_repeated_event_once_until_the_service_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fleetkeeper.cli.commands.read as events_command

    monkeypatch.setattr(events_command.time, "sleep", lambda _s: None)

    def event(reason: str, count: int = 1, when: str = "2026-01-01T00:00:00.000Z") -> dict[str, Any]:
        first = "2026-01-01T00:00:00.000Z"
        return {"time": when, "first_seen": first, "count": count, "type": "Normal", "reason": reason, "message": "m"}

    created, refused = event("Created"), event("LaunchRefused")
    client = ScriptedClient(
        {
            ("GET", "/v1/services/web/events?limit=100"): [{"events": [created], "next_token": None}],
            ("GET", "/v1/services/web/events?limit=20"): [
                {"events": [refused, created], "next_token": None},
                {"events": [refused, created], "next_token": None},  # nothing new: nothing printed
                {"events": [event("LaunchRefused", 2, "2026-01-01T00:01:00.000Z"), created], "next_token": None},
                not_found(),
            ],
        }
    )
    code, out, err = cli(["events", "web", "--follow"], client)
    assert code == 0 and "gone" in err
    lines = out.splitlines()
    assert [line.split()[2] for line in lines] == ["Created:", "LaunchRefused:", "LaunchRefused:"]
    assert lines[-1].endswith("(x2)")


# --- JSON output ------------------------------------------------------------------------------------------


def test_status_json_is_the_apis_service_view() -> None:
    client = ScriptedClient({("GET", "/v1/services/web"): [view()]})
    code, out, _ = cli(["status", "web", "--output", "json"], client)
    assert code == 0 and json.loads(out) == view()


def test_status_of_all_services_follows_every_page() -> None:
    first = {"services": [{"name": "a"}], "next_token": "tok/en+="}
    second = {"services": [{"name": "b"}], "next_token": None}
    client = ScriptedClient(
        {
            ("GET", "/v1/services?limit=100"): [first],
            ("GET", "/v1/services?limit=100&next_token=tok%2Fen%2B%3D"): [second],
        }
    )
    code, out, _ = cli(["status", "-o", "json"], client)
    assert code == 0 and json.loads(out) == {"services": [{"name": "a"}, {"name": "b"}]}


def test_json_mode_keeps_stdout_for_json_only(spec_file: Path) -> None:
    client = ScriptedClient(
        {("POST", "/v1/services"): [view("NO_REPLICA", observed=0)], ("GET", "/v1/services/web"): [view()]}
    )
    code, out, err = cli(["up", str(spec_file), "--wait", "-o", "json"], client)
    assert code == 0
    assert json.loads(out)["status"] == "READY"
    assert "created web" in err


# --- --wait -------------------------------------------------------------------------------------------


GOAL = Goal(name="web", uid="u1", generation=2, target_version=2)


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (view("READY", target=1, observed=1), None),  # the reconciler has not seen our write
        (view("READY", target=2, observed=2, generation=2), 0),
        (view("UPDATING", target=2, observed=2, ready=1), None),
        (view("READY", target=2, observed=2, ready=1), None),  # READY, but not all replicas at v2
        (view("FAILED", target=2, observed=2, message="replica 4 FAILED_PROVISION"), 1),
        (view("READY", target=1, observed=3, message="v2 failed 3 times; rolled back"), 1),
        (view("UPDATING", target=3, observed=3), 1),  # another change took over
        (view("READY", target=2, observed=2, uid="other"), 1),  # deleted and re-created
        (None, 1),  # deleted
    ],
)
def test_wait_verdicts(current: dict[str, Any] | None, expected: int | None) -> None:
    outcome = judge(GOAL, current)
    assert (outcome.code if outcome else None) == expected


def test_a_rollback_by_the_circuit_breaker_says_so() -> None:
    outcome = judge(GOAL, view("READY", target=1, observed=3, message="v2 failed 3 times; rolled back to v1"))
    assert outcome is not None and "rolled back to v1" in outcome.message


def test_waiting_for_down_ends_when_the_service_is_gone() -> None:
    goal = Goal(name="web", uid="u1", generation=3, target_version=None)
    assert judge(goal, view("SHUTTING_DOWN")) is None
    assert judge(goal, None) is not None and judge(goal, None).code == 0  # type: ignore[union-attr]
    assert judge(goal, view("NO_REPLICA", uid="new-incarnation")).code == 0  # type: ignore[union-attr]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_times_out_with_exit_1_and_the_last_state() -> None:
    client = ScriptedClient({("GET", "/v1/services/web"): [view("REPLICA_INIT", target=2, observed=2, ready=0)]})
    clock = Clock()
    outcome = wait_for(
        client, GOAL, timeout=10, progress=Progress(io.StringIO(), tty=False), clock=clock, sleep=clock.sleep
    )
    assert outcome.code == 1
    assert "timed out after 10s" in outcome.message and "REPLICA_INIT" in outcome.message
    assert 10 <= clock.now <= 12


def test_wait_rides_out_an_unreachable_api_until_it_answers() -> None:
    answers: list[Any] = [Unreachable("connection refused"), view("READY", target=2, observed=2)]
    client = ScriptedClient({("GET", "/v1/services/web"): answers})
    clock = Clock()
    outcome = wait_for(
        client, GOAL, timeout=30, progress=Progress(io.StringIO(), tty=False), clock=clock, sleep=clock.sleep
    )
    assert outcome.code == 0


def test_update_wait_returns_0_when_ready_at_the_new_version(spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda _s: None)
    client = ScriptedClient(
        {
            ("PUT", "/v1/services/web"): [view("READY", target=2, observed=1, generation=2)],
            ("GET", "/v1/services/web"): [
                view("READY", target=2, observed=1, generation=2),
                view("UPDATING", target=2, observed=2, generation=2, ready=1),
                view("READY", target=2, observed=2, generation=2),
            ],
        }
    )
    code, out, err = cli(["update", "web", str(spec_file), "--wait", "--mode", "blue_green"], client)
    assert code == 0, err
    assert client.sent[0][2]["mode"] == "blue_green"
    assert "web is READY at v2 (2/2 replicas ready)" in out
    assert len([s for s in client.sent if s[0] == "GET"]) == 3


def test_rollback_wait_exits_1_when_the_service_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda _s: None)
    client = ScriptedClient(
        {
            ("POST", "/v1/services/web/rollback"): [view("READY", target=1, observed=2, generation=3)],
            ("GET", "/v1/services/web"): [view("FAILED", target=1, observed=3, generation=3, message="no good")],
        }
    )
    code, _, err = cli(["rollback", "web", "--to", "1", "--wait"], client)
    assert code == 1 and "FAILED: no good" in err
    assert client.sent[0][2] == {"version": 1}


def test_down_wait_returns_0_once_the_service_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda _s: None)
    client = ScriptedClient(
        {
            ("DELETE", "/v1/services/web"): [view("SHUTTING_DOWN", generation=4)],
            ("GET", "/v1/services/web"): [view("SHUTTING_DOWN", generation=4), not_found()],
        }
    )
    code, _, _ = cli(["down", "web", "--wait"], client)
    assert code == 0


def test_progress_redraws_one_line_on_a_terminal_and_prints_changes_otherwise() -> None:
    tty = io.StringIO()
    progress = Progress(tty, tty=True)
    progress.show("web: REPLICA_INIT", 1)
    progress.show("web: REPLICA_INIT", 2)
    progress.show("web: READY", 3)
    progress.done()
    assert tty.getvalue().count("\r\x1b[K") == 3 and tty.getvalue().endswith("\n")
    assert tty.getvalue().count("\n") == 1

    plain = io.StringIO()
    progress = Progress(plain, tty=False)
    for line in ["web: REPLICA_INIT", "web: REPLICA_INIT", "web: READY"]:
        progress.show(line, 1)
    progress.done()
    assert "\r" not in plain.getvalue() and plain.getvalue().count("\n") == 2


# --- where the API is, and signing ----------------------------------------------------------------------


def cloudformation_with(outputs: list[dict[str, str]] | None, error: str | None = None) -> Any:
    client = boto3.client("cloudformation", region_name="us-east-1")
    stubber = Stubber(client)
    if error:
        stubber.add_client_error("describe_stacks", service_error_code="ValidationError", service_message=error)
    else:
        stack = {
            "StackName": "fk",
            "CreationTime": "2026-01-01T00:00:00Z",
            "StackStatus": "CREATE_COMPLETE",
            **({"Outputs": outputs} if outputs is not None else {}),
        }
        stubber.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": "fk"})
    stubber.activate()
    return lambda: client


API_GW = "https://abc123.execute-api.eu-west-1.amazonaws.com/api"


def test_api_url_order_flag_then_environment_then_stack_then_embedded(tmp_path: Path) -> None:
    stack = cloudformation_with([{"OutputKey": "ApiUrl", "OutputValue": API_GW}])
    env = {"FLEETKEEPER_API_URL": "https://env.example.com/api/"}
    assert resolve_api_url("https://flag.example.com", "fk", environ=env, cloudformation=stack) == (
        "https://flag.example.com"
    )
    assert resolve_api_url(None, "fk", environ=env, cloudformation=stack) == "https://env.example.com/api"
    assert resolve_api_url(None, "fk", environ={}, cloudformation=stack) == API_GW
    # The user's running `fleetkeeper local` (the fixture's), found on its own; else only with --local.
    assert resolve_api_url(None, None) == "http://127.0.0.1:8470"
    nothing_running = {"FLEETKEEPER_RUNTIME_DIR": str(tmp_path / "empty")}
    with pytest.raises(UsageError, match="no API to talk to"):
        resolve_api_url(None, None, environ=nothing_running)
    assert resolve_api_url(None, None, local=True, environ=nothing_running) == "http://127.0.0.1:8470"


def test_a_stack_without_the_output_or_that_does_not_exist_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no ApiUrl output"):
        resolve_api_url(None, "fk", environ={}, cloudformation=cloudformation_with([]))
    with pytest.raises(UsageError, match="does not exist"):
        resolve_api_url(None, "fk", environ={}, cloudformation=cloudformation_with(None, "Stack fk does not exist"))


def test_plain_http_is_for_loopback_only() -> None:
    with pytest.raises(UsageError, match="https"):
        resolve_api_url("http://api.example.com", None, environ={})
    assert resolve_api_url("http://localhost:9000", None, environ={}) == "http://localhost:9000"
    assert is_loopback("http://[::1]:8080") and not is_loopback(API_GW)


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc", "http://127.0.0.1:99999", "https://api.example.com:-1"])
def test_an_api_url_with_a_bad_port_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError, match="port"):
        resolve_api_url(url, None, environ={})
    out, err = io.StringIO(), io.StringIO()
    assert run(["status", "--api-url", url], out=out, err=err) == 2
    assert "port" in err.getvalue() and "Traceback" not in err.getvalue()


def test_loopback_urls_are_not_signed_and_aws_urls_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    assert ApiClient.for_url("http://127.0.0.1:8470").signer is None
    client = ApiClient.for_url(API_GW)
    assert client.signer is not None and client.signer.region == "eu-west-1"

    headers = client.signer.sign("POST", API_GW + "/v1/services", {"Content-Type": "application/json"}, b"{}")
    authorization = headers["Authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/execute-api/aws4_request" in authorization
    assert headers["X-Amz-Security-Token"] == "token"
    assert "X-Amz-Date" in headers


def test_signing_without_credentials_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The chain itself is botocore's; what is ours is refusing clearly when it finds nothing.
    monkeypatch.setattr(boto3.session.Session, "get_credentials", lambda _self: None)
    with pytest.raises(UsageError, match="no AWS credentials"):
        SigV4Signer.for_url(API_GW)


def test_a_credential_chain_failure_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import CredentialRetrievalError

    def broken(_self: Any) -> Any:
        raise CredentialRetrievalError(provider="sso", error_msg="token expired")

    monkeypatch.setattr(boto3.session.Session, "get_credentials", broken)
    with pytest.raises(UsageError, match="token expired"):
        SigV4Signer.for_url(API_GW)


def test_up_wait_ends_with_the_services_endpoint(spec_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda _s: None)
    ready = {**view("READY", observed=1), "endpoint": "http://127.0.0.1:40123"}
    client = ScriptedClient(
        {("POST", "/v1/services"): [view("NO_REPLICA", observed=0)], ("GET", "/v1/services/web"): [ready]}
    )
    code, out, err = cli(["up", str(spec_file), "--name", "web", "--wait"], client)
    assert code == 0, err
    assert out.splitlines()[-1] == "web is READY at http://127.0.0.1:40123 at v1 (2/2 replicas ready)"


def test_status_shows_the_endpoint() -> None:
    shown = {**view("READY"), "endpoint": "https://web.svc.example.com", "mode": "rolling", "spec": {}}
    assert "  endpoint: https://web.svc.example.com" in render.service_detail(shown).splitlines()
    table = render.services_table([{**view("READY"), "endpoint": None}])
    assert table.splitlines()[0].split() == ["NAME", "STATUS", "VERSION", "LIFECYCLE", "ENDPOINT", "MESSAGE"]
    assert table.splitlines()[1].split()[4] == "-"


def test_status_shows_the_candidate_instance_types_and_the_notes() -> None:
    placement = {
        "instance_types": ["g6.xlarge", "g5.xlarge"],
        "notes": ["dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8"],
    }
    lines = render.service_detail({**view("READY"), "placement": placement, "spec": {}}).splitlines()
    assert "  instance types: g6.xlarge (launched), g5.xlarge" in lines
    assert "  note: dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8" in lines
    one = {**view("READY"), "placement": {"instance_types": ["t3.micro"], "notes": []}, "spec": {}}
    assert "  instance types: t3.micro (launched)" in render.service_detail(one).splitlines()
    default = {**view("READY"), "placement": {"instance_types": [], "notes": []}, "spec": {}}
    assert "  instance types: the stack's default" in render.service_detail(default).splitlines()


def test_the_first_progress_line_of_an_update_never_shows_the_old_status_as_the_new_versions() -> None:
    from fleetkeeper.cli.waiting import progress_line

    goal = Goal("web", "u1", generation=3, target_version=3)
    # Right after the PUT: target_version is 3, but READY is generation 2's (v2's) status.
    before = view("READY", target=3, observed=2, generation=3)
    assert progress_line(goal, before) == "web: v3 submitted; waiting for the reconciler to act on it"
    assert judge(goal, before) is None
    after = view("UPDATING", target=3, observed=3, generation=3, ready=0)
    assert progress_line(goal, after).startswith("web: UPDATING to v3: 0/2 ready")


def test_an_unchanged_update_says_so_and_exits_0(spec_file: Path) -> None:
    answer = {**view(), "spec": {"service": {"replicas": 2}}, "mode": "rolling", "changed": False}
    client = ScriptedClient({("PUT", "/v1/services/web"): [answer]})
    code, out, _ = cli(["update", "web", str(spec_file)], client)
    assert code == 0
    assert out == "web is unchanged: v1 already runs this spec (same files, same values); nothing to roll out\n"
