"""End to end: `fleetkeeper local` as a subprocess, driven only through the CLI and plain HTTP.

up --wait -> READY with 2 replicas answering on 127.0.0.1 -> rolling update --wait while a poller
sees no failed request -> versions -> rollback --wait -> kill a replica process -> replaced and
READY again -> down --wait -> gone from the API and the table, no replica process left.

Needs the reconciler (fleetkeeper.reconciler.handler) and the cleanup function
(fleetkeeper.cleanup.handler, and its stream event in template.yaml): skipped until both are in.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests import REPO_ROOT
from tests.support.local_process import LocalPlane, eventually, http_get, ok, process_running, start_local

if TYPE_CHECKING:
    from collections.abc import Iterator

EXAMPLE = REPO_ROOT / "examples" / "hello" / "service.yaml"
NAME = "hello-e2e"
WAIT = "60"  # seconds any one --wait may take

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    workdir = tmp_path_factory.mktemp("local")
    plane = start_local(workdir, tick=1.0)
    yield plane
    code = plane.stop()
    assert code == 0, plane.output()


def spec_file(plane: LocalPlane, greeting: str) -> str:
    """The hello example with short probe delays and a greeting that tells versions apart."""
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec.pop("name")
    spec["envs"]["GREETING"] = greeting
    spec["service"]["readiness_probe"].update(initial_delay_seconds=20, timeout_seconds=1)
    path = plane.workdir / f"{greeting}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def ready_replicas(shown: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in shown["replicas"] if r["status"] == "READY"]


def greetings(shown: dict[str, Any]) -> set[str]:
    """What each READY replica answers on GET / (every url is on 127.0.0.1)."""
    answers = set()
    for replica in ready_replicas(shown):
        assert replica["url"].startswith("http://127.0.0.1:"), replica
        status, body = http_get(replica["url"] + "/")
        assert status == 200
        answers.add(body.decode().split(" from ")[0])
    return answers


def pid_of(replica: dict[str, Any]) -> int:
    """The process driver's instance ids end with the replica's pid: local-<n>-pid<pid>."""
    return int(replica["instance_id"].rsplit("pid", 1)[1])


def items_left(plane: LocalPlane, name: str) -> list[dict[str, Any]]:
    """The service's items still in the embedded table (the cleanup deletes them after `down`)."""
    info = plane.info()
    dynamodb = plane.aws_client("dynamodb")
    items: list[dict[str, Any]] = dynamodb.query(
        TableName=info["table"],
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": f"SVC#{name}"}},
        ConsistentRead=True,
    )["Items"]
    return items


class Poller(threading.Thread):
    """Asks the service for an answer every 50 ms through whichever replicas the API calls READY."""

    def __init__(self, plane: LocalPlane) -> None:
        super().__init__(daemon=True)
        self.plane = plane
        self.stop = threading.Event()
        self.rounds = 0
        self.failures: list[str] = []
        self.seen_pids: set[int] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            shown = self.plane.service(NAME)
            ready = ready_replicas(shown)
            self.seen_pids.update(pid_of(r) for r in shown["replicas"] if r.get("instance_id"))
            answered = False
            for replica in ready:
                try:
                    answered = http_get(replica["url"] + "/", timeout=1)[0] == 200
                except OSError:
                    continue
                if answered:
                    break
            self.rounds += 1
            if not answered:
                self.failures.append(f"round {self.rounds}: no READY replica answered ({shown['status']})")
            time.sleep(0.05)


def test_the_whole_lifecycle_through_the_cli(plane: LocalPlane) -> None:
    seen_pids: set[int] = set()

    # up --wait: READY with 2 replicas answering on 127.0.0.1.
    ok(plane.cli("up", spec_file(plane, "v1"), "--name", NAME, "--wait", "--timeout", WAIT))
    shown = json.loads(ok(plane.cli("status", NAME, "--output", "json")))
    assert shown["status"] == "READY" and shown["target_version"] == 1
    assert len(ready_replicas(shown)) == 2
    assert greetings(shown) == {"v1"}
    seen_pids.update(pid_of(r) for r in shown["replicas"])

    # update --wait (rolling): the service answers throughout.
    poller = Poller(plane)
    poller.start()
    try:
        ok(plane.cli("update", NAME, spec_file(plane, "v2"), "--mode", "rolling", "--wait", "--timeout", WAIT))
    finally:
        poller.stop.set()
        poller.join(10)
    assert poller.rounds > 10
    assert poller.failures == []
    seen_pids |= poller.seen_pids
    shown = plane.service(NAME)
    assert shown["target_version"] == 2 and greetings(shown) == {"v2"}
    assert all(r["version"] == 2 for r in ready_replicas(shown))

    # versions
    versions = json.loads(ok(plane.cli("versions", NAME, "-o", "json")))
    assert versions["target_version"] == 2
    assert [v["version"] for v in versions["versions"]] == [1, 2]

    # rollback --wait: back to v1's spec.
    ok(plane.cli("rollback", NAME, "--wait", "--timeout", WAIT))
    shown = plane.service(NAME)
    assert shown["status"] == "READY" and shown["target_version"] == 1
    assert greetings(shown) == {"v1"} and len(ready_replicas(shown)) == 2
    seen_pids.update(pid_of(r) for r in shown["replicas"])

    # kill one replica process: seen as failed, replaced, READY again.
    victim = ready_replicas(shown)[0]
    os.killpg(pid_of(victim), signal.SIGKILL)

    def replaced() -> dict[str, Any] | None:
        now = plane.service(NAME)
        ready = ready_replicas(now)
        fresh = [r for r in ready if r["replica_id"] != victim["replica_id"]]
        return now if now["status"] == "READY" and len(fresh) == 2 else None

    shown = eventually(replaced, timeout=45, what="the killed replica replaced")
    assert greetings(shown) == {"v1"}
    seen_pids.update(pid_of(r) for r in shown["replicas"] if r.get("instance_id"))

    # logs: the replicas' own output, through the CLI.
    logs = ok(plane.cli("logs", NAME))
    assert "serving on 127.0.0.1:" in logs
    one = ready_replicas(shown)[0]["replica_id"]
    assert "serving on 127.0.0.1:" in ok(plane.cli("logs", NAME, "--replica", str(one)))

    # events: what happened to it, newest first, folded, with the killed replica's typed failure.
    events = json.loads(ok(plane.cli("events", NAME, "-o", "json")))["events"]
    reasons = {e["reason"] for e in events}
    assert {"Created", "Updated", "RolledBack", "Claimed", "Launched", "ReplicaReady", "ServiceReady"} <= reasons
    assert any(e["type"] == "Warning" and e.get("replica_id") == victim["replica_id"] and e.get("code") for e in events)
    assert [e["time"] for e in events] == sorted((e["time"] for e in events), reverse=True)
    assert "LAST SEEN" in ok(plane.cli("events", NAME))
    assert "Events (`fleetkeeper events" in ok(plane.cli("status", NAME))

    # down --wait: gone from the API and the table; no replica process left.
    ok(plane.cli("down", NAME, "--wait", "--timeout", WAIT))
    gone = plane.cli("status", NAME)
    assert gone.returncode == 2 and NAME in gone.stderr

    eventually(lambda: items_left(plane, NAME) == [], timeout=20, what="every version and replica item deleted")
    eventually(
        lambda: not any(process_running(pid) for pid in seen_pids),
        timeout=15,
        what="every replica process gone",
    )
    assert len(seen_pids) >= 6  # 2 at v1, 2 at v2, 2 at v1 again, and a replacement


def test_requests_the_api_rejects_exit_2_with_its_message(plane: LocalPlane) -> None:
    bad = plane.workdir / "bad.yaml"
    bad.write_text(EXAMPLE.read_text() + "\nworkdir: ./src\n")
    result = plane.cli("up", str(bad), "--name", "bad")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "fleetkeeper: workdir src does not exist\n"

    ok(plane.cli("up", str(EXAMPLE), "--name", "dup"))
    result = plane.cli("up", str(EXAMPLE), "--name", "dup")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "service 'dup' already exists; change it with `fleetkeeper update dup SPEC.yaml` (PUT /v1/services/dup)"
    )
    ok(plane.cli("down", "dup", "--wait", "--timeout", WAIT))

    # The 409 came from a cancelled transaction; the cleanup still sees later removals.
    ok(plane.cli("up", str(EXAMPLE), "--name", "after-409"))
    ok(plane.cli("down", "after-409", "--wait", "--timeout", WAIT))
    for name in ("dup", "after-409"):
        eventually(lambda name=name: items_left(plane, name) == [], timeout=20, what=f"{name}'s items deleted")

    result = plane.cli("update", "missing", spec_file(plane, "v9"))
    assert result.returncode == 2 and "missing" in result.stderr and "does not exist" in result.stderr


# --- a SkyPilot-shaped service: workdir, --env, --secret, a probe header filled from the secret --------

SECRET = "tok-4f2a9c1e7d"
APP = """\
import hashlib, http.server, json, os

PORT = int(os.environ["PORT"])
TOKEN = os.environ.get("API_TOKEN", "")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            # Ready only when the probe carries the secret: the reconciler filled $API_TOKEN.
            self.send_response(200 if self.headers.get("Authorization") == "Bearer " + TOKEN else 401)
            self.end_headers()
            return
        seen = {
            "model": os.environ.get("MODEL"),
            "files": sorted(os.listdir(".")),
            "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest(),
        }
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print(self.command, self.path, flush=True)


print("app listening on", PORT, flush=True)
http.server.ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), PORT), Handler).serve_forever()
"""
SKY_YAML = """\
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 30
    timeout_seconds: 2
    headers:
      Authorization: Bearer $API_TOKEN
  replicas: 1
  ports: [8081]

envs:
  MODEL:

secrets:
  API_TOKEN: null

workdir: app

run: python3 server.py
"""


def everything_stored(plane: LocalPlane) -> str:
    """Every item of the embedded table, as text."""
    info = plane.info()
    dynamodb = plane.aws_client("dynamodb")
    return json.dumps(dynamodb.scan(TableName=info["table"])["Items"])


def secret_parameters(plane: LocalPlane, name: str) -> list[str]:
    """The service's secret parameters, under its owner's scope (`/fleetkeeper/<table>/_o/<scope>/<name>/...`)
    or, for a service without an owner, directly under the table's prefix."""
    info = plane.info()
    ssm = plane.aws_client("ssm")
    found = ssm.get_parameters_by_path(Path=f"/fleetkeeper/{info['table']}", Recursive=True)
    return [p["Name"] for p in found["Parameters"] if f"/{name}/" in p["Name"]]


def test_a_skypilot_shaped_service_runs_with_its_workdir_env_and_secret(plane: LocalPlane) -> None:
    import hashlib

    app = plane.workdir / "sky" / "app"
    app.mkdir(parents=True)
    (app / "server.py").write_text(APP)
    (app / ".gitignore").write_text("*.local\n")
    (app / "notes.local").write_text("left out by .gitignore")
    (plane.workdir / "sky" / "sky.yaml").write_text(SKY_YAML)
    secret_env = {"API_TOKEN": SECRET}

    def sky(*args: str) -> Any:
        return plane.cli(*args, env=secret_env)

    # As `sky serve up -n sky sky.yaml --env MODEL=tiny --secret API_TOKEN`, from the YAML's directory.
    up = subprocess_in(
        plane,
        plane.workdir / "sky",
        "up",
        "-n",
        "sky",
        "sky.yaml",
        "--env",
        "MODEL=tiny",
        "--secret",
        "API_TOKEN",
        "--wait",
        "--timeout",
        WAIT,
        env=secret_env,
    )
    assert up.returncode == 0, up.stderr
    assert "workdir app: 2 files" in up.stderr and ".gitignore applied" in up.stderr
    shown = json.loads(ok(sky("status", "sky", "-o", "json")))
    (replica,) = ready_replicas(shown)
    status, body = http_get(replica["url"] + "/")
    assert status == 200
    seen = json.loads(body)
    assert seen["model"] == "tiny"
    assert seen["files"] == [".gitignore", "server.py"]
    assert seen["token_sha256"] == hashlib.sha256(SECRET.encode()).hexdigest()

    # The secret is in no answer, no stored item, no log line.
    answers = [ok(sky("status", "sky", "-o", "json")), ok(sky("versions", "sky", "-o", "json")), ok(sky("status"))]
    answers += [plane.get("/v1/services/sky")[1].decode(), ok(sky("logs", "sky"))]
    assert all(SECRET not in answer for answer in answers)
    assert SECRET not in everything_stored(plane)
    assert SECRET not in plane.output()
    logs = plane.workdir / "state" / "logs"
    assert all(SECRET not in p.read_text(errors="replace") for p in logs.rglob("*.log"))
    assert len(secret_parameters(plane, "sky")) == 1

    # The same spec, files and values again: nothing changes.
    again = subprocess_in(
        plane,
        plane.workdir / "sky",
        "update",
        "sky",
        "sky.yaml",
        "--env",
        "MODEL=tiny",
        "--secret",
        "API_TOKEN",
        env=secret_env,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout == (
        "sky is unchanged: v1 already runs this spec (same files, same values); nothing to roll out\n"
    )
    versions = json.loads(ok(sky("versions", "sky", "-o", "json")))
    assert [v["version"] for v in versions["versions"]] == [1]
    assert view_of(plane, "sky")["replicas"][0]["replica_id"] == replica["replica_id"]

    ok(sky("down", "sky", "--wait", "--timeout", WAIT))
    eventually(lambda: secret_parameters(plane, "sky") == [], timeout=20, what="the secrets deleted with it")


# --- SkyPilot's layout: HOME of the replica's own, the workdir in ~/sky_workdir, started there -------------

WHERE_APP = """\
import http.server, json, os
from pathlib import Path

PORT = int(os.environ["PORT"])


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        seen = {
            "home": os.environ["HOME"],
            "cwd": os.getcwd(),
            "files": sorted(os.listdir(".")),
            "setup": (Path.home() / "setup.txt").read_text(),
        }
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)


http.server.ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), PORT), Handler).serve_forever()
"""
# As SkyPilot YAMLs write it: setup and run refer to `~` and `~/sky_workdir`.
WHERE_YAML = """\
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 30
  replicas: 1

workdir: app

setup: |
  echo "setup ran in $(pwd)" > ~/setup.txt

run: |
  cd ~/sky_workdir
  python3 where.py
"""


def test_a_replica_runs_in_sky_workdir_under_a_home_of_its_own(plane: LocalPlane) -> None:
    (plane.workdir / "where" / "app").mkdir(parents=True)
    (plane.workdir / "where" / "app" / "where.py").write_text(WHERE_APP)
    (plane.workdir / "where" / "where.yaml").write_text(WHERE_YAML)
    up = subprocess_in(
        plane, plane.workdir / "where", "up", "-n", "where", "where.yaml", "--wait", "--timeout", WAIT, env={}
    )
    assert up.returncode == 0, up.stderr
    shown = json.loads(ok(plane.cli("status", "where", "-o", "json")))
    (replica,) = ready_replicas(shown)
    status, body = http_get(replica["url"] + "/")
    assert status == 200
    seen = json.loads(body)
    # HOME is the replica's own directory in the embedded state, ~/sky_workdir holds the workdir, and
    # setup and run both started there.
    (home,) = (plane.workdir / "state" / "work" / "where").glob(f"*/replica-{replica['replica_id']}")
    assert seen["home"] == str(home)
    assert seen["cwd"] == str(home / "sky_workdir")
    assert seen["files"] == ["where.py"]
    assert seen["setup"] == f"setup ran in {home / 'sky_workdir'}\n"
    ok(plane.cli("down", "where", "--wait", "--timeout", WAIT))


def subprocess_in(plane: LocalPlane, cwd: Any, *args: str, env: dict[str, str]) -> Any:
    """`fleetkeeper ARGS --api-url <plane>` run from `cwd` (a workdir is relative to it, as with sky)."""
    import subprocess
    import sys

    from tests.support.local_process import FLEETKEEPER, clean_env

    return subprocess.run(
        [sys.executable, "-c", FLEETKEEPER, *args, "--api-url", plane.url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean_env(), **plane.env, **env},
        cwd=cwd,
        check=False,
    )


def view_of(plane: LocalPlane, name: str) -> dict[str, Any]:
    status, body = plane.get(f"/v1/services/{name}")
    assert status == 200, body
    shown: dict[str, Any] = json.loads(body)
    return shown


def test_the_messages_a_new_user_meets(plane: LocalPlane) -> None:
    from tests.support.local_process import free_port

    spec = plane.workdir / "typo.yaml"
    spec.write_text("service:\n  readiness_probe: /\n  replica: 2\nrun: python3 -m http.server $PORT\n")
    result = plane.cli("up", "-n", "typo", str(spec))
    assert result.returncode == 2
    assert result.stderr == "invalid request: spec.service.replica: unknown field; did you mean `replicas`?\n"

    result = plane.cli("up", "-n", "Bad_Name", str(EXAMPLE))
    assert result.returncode == 2
    rule = "use 1 to 63 lower-case letters, digits and dashes, starting with a letter"  # not the regex
    assert result.stderr == f"invalid request: name: 'Bad_Name' is not a service name: {rule}\n"

    broken = plane.workdir / "broken.yaml"
    broken.write_text("service: [\n")
    result = plane.cli("up", "-n", "broken", str(broken))
    assert result.returncode == 2
    assert result.stderr.startswith(f"fleetkeeper: {broken}, line 2, column 1: not valid YAML")

    # An app that ignores $PORT is told so, not "connection refused".
    fixed = free_port()
    minimal = plane.workdir / "minimal.yaml"
    minimal.write_text(
        "service:\n  readiness_probe: /\n  replicas: 1\nresources:\n  ports: 8080\n"
        f"run: python3 -m http.server {fixed}\n"
    )
    ok(plane.cli("up", "-n", "fixed-port", str(minimal)))

    def told() -> str | None:
        message = str(view_of(plane, "fixed-port")["status_message"])
        return message if f"listening on {fixed}, " in message else None

    message = eventually(told, timeout=30, what="the $PORT diagnosis")
    if "each in a network namespace of its own" in plane.output():  # $PORT is the spec's 8080
        assert message.endswith(f"set the spec's port to it (`service.ports: {fixed}`), or make the app listen on 8080")
    else:
        assert message.endswith(": make the app listen on $PORT")
    ok(plane.cli("down", "fixed-port", "--wait", "--timeout", WAIT))


def _post(plane: LocalPlane, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        plane.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **plane.auth()},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # 127.0.0.1 only
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_simulated_spot_interruption_is_seen_end_to_end(plane: LocalPlane) -> None:
    """`/_local/interrupt` delivers EC2's warning to the reconciler as the stack's rule would: the
    warned replica is drained and replaced at once, and reclaimed by "AWS" after its notice."""
    name = "spot-e2e"
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec.pop("name")
    spec["service"]["readiness_probe"].update(initial_delay_seconds=20, timeout_seconds=1)
    spec.setdefault("resources", {})["use_spot"] = True
    path = plane.workdir / "spot.yaml"
    path.write_text(yaml.safe_dump(spec))
    ok(plane.cli("up", str(path), "--name", name, "--wait", "--timeout", WAIT))
    _, body = plane.get(f"/v1/services/{name}")
    shown = json.loads(body)
    assert [r["market"] for r in shown["replicas"]] == ["spot", "spot"]
    victim = shown["replicas"][0]
    table = ok(plane.cli("status", name))
    assert "[spot]" in table  # the RESOURCES column marks spot replicas

    url = "/_local/interrupt"
    assert _post(plane, url, {"service": name})[0] == 400
    assert _post(plane, url, {"service": name, "replica": 999})[0] == 404
    code, answer = _post(plane, url, {"service": name, "replica": victim["replica_id"], "notice_seconds": 2})
    assert code == 202, answer
    assert answer["instance_id"] == victim["instance_id"]

    def replaced() -> dict[str, Any] | None:
        now = json.loads(plane.get(f"/v1/services/{name}")[1])
        ids = {r["replica_id"] for r in ready_replicas(now)}
        return now if len(ids) == 2 and victim["replica_id"] not in ids else None

    eventually(replaced, timeout=60, what="the warned replica replaced by a READY one")
    eventually(lambda: not process_running(pid_of(victim)), timeout=30, what="the warned replica's process gone")
    events = json.loads(plane.get(f"/v1/services/{name}/events")[1])["events"]
    assert any(e["reason"] == "Interrupted" for e in events), events
    ok(plane.cli("down", name, "--wait", "--timeout", WAIT))
