"""Prints every Lambda handler's cold-start import against a fresh `import boto3`, in the bundle as
Lambda runs it, and what the api's first GET and first POST cost in a fresh interpreter.

Bundles: the wheels of functions/requirements.txt (copied from this venv's installs) and the
fleetkeeper package in a temporary folder, laid out twice: as SAM's Python builder bundles them (no
bytecode at all: it leaves out every .pyc and unpacks wheels without compiling), and as
functions/Makefile does (the same, compiled; its `code` step is run with this interpreter). Each
import runs in a fresh interpreter that sees the bundle and the standard library only (`-S`,
PYTHONPATH) and writes no bytecode (Lambda's /var/task is read-only), so a module without a .pyc is
compiled at every cold start, as on Lambda.

Import ratio: each handler module of template.yaml (every `Handler:` line) against `import boto3`
from the same bundle, the process's wall time, interpreter start included on both sides, median of 9
runs each. The runs are interleaved, round by round, in an order that rotates each round, so that
load from other processes on the machine falls on all alike. Target: at most 1.3 for every handler.

First request: a fresh interpreter imports fleetkeeper.api.handler from the compiled bundle and
answers one request, against a moto server on 127.0.0.1 (in this process): the time of the import,
of that first request (which includes creating the botocore session and the DynamoDB client) and of
a second, warm one. The first GET reads a service created beforehand; the first POST creates a new
one. Median of 9 each. Moving cost from the import into the first request is no win for a route that
every invocation's first request pays, so both are printed.

    .venv/bin/python bench/cold_start.py [--runs 9] [--no-requests]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "functions"))
BASELINE = "import boto3"

# The child that answers the first request: prints {"import", "first", "second", "status"} as JSON.
_FIRST_REQUEST = """
import json, sys, time
t0 = time.perf_counter()
from fleetkeeper.api.handler import lambda_handler
t1 = time.perf_counter()
from fleetkeeper.aws.apigw import rest_event

class Context:
    function_name = "fleetkeeper-api"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:fleetkeeper-api"
    memory_limit_in_mb = 512
    aws_request_id = "bench"
    log_group_name = "/aws/lambda/fleetkeeper-api"
    log_stream_name = "bench"

    @staticmethod
    def get_remaining_time_in_millis():
        return 30_000

method, path, body = json.loads(sys.argv[1])
def event():
    return rest_event(method, path, body=None if body is None else json.dumps(body),
                      principal="arn:aws:sts::123456789012:assumed-role/fleetkeeper-bench/bench")
e = event()
t2 = time.perf_counter()
status = lambda_handler(e, Context())["statusCode"]
t3 = time.perf_counter()
if method == "POST":  # the same body again would be a conflict: a second, warm create of another name
    body = {**body, "name": body["name"] + "-2"}
e = event()
t4 = time.perf_counter()
second = lambda_handler(e, Context())["statusCode"]
t5 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first": t3 - t2, "second": t5 - t4, "status": [status, second]}))
"""


# A small valid spec (tests/support/specs.py's hello_spec; the suite's modules are not imported here:
# tests/conftest.py resets the environment for the tests, the endpoint included).
HELLO_SPEC = {
    "service": {"readiness_probe": "/health", "replicas": 2, "ports": 8080},
    "resources": {"instance_type": "t3.micro"},
    "run": "python3 -m http.server $PORT",
}


def handler_modules() -> list[str]:
    """The modules of template.yaml's `Handler:` lines, each once, in the template's order."""
    text = (ROOT / "template.yaml").read_text()
    modules: list[str] = []
    for handler in re.findall(r"^\s*Handler:\s*(\S+)\s*$", text, flags=re.MULTILINE):
        module = handler.rsplit(".", 1)[0]
        if module not in modules:
            modules.append(module)
    return modules


def _env(bundle: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(bundle),
        "PYTHONDONTWRITEBYTECODE": "1",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
    }
    env.update(extra or {})
    return env


def _distributions() -> list[metadata.Distribution]:
    """functions/requirements.txt's distributions and what they require, as installed here."""
    wanted = [
        Requirement(line.split("#")[0].strip())
        for line in (ROOT / "functions" / "requirements.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    found: dict[str, metadata.Distribution] = {}
    while wanted:
        requirement = wanted.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = requirement.name.lower().replace("_", "-")
        if name in found:
            continue
        found[name] = dist = metadata.distribution(requirement.name)
        wanted.extend(Requirement(r) for r in dist.requires or [])
    return list(found.values())


def make_bundles(root: Path) -> dict[str, Path]:
    """The two bundles, under root: {"SAM's Python builder": ..., "functions/Makefile": ...}."""
    source = root / "no-bytecode"
    source.mkdir()
    for dist in _distributions():
        for file in dist.files or []:
            if file.parts[0] == ".." or "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            target = source / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(str(dist.locate_file(file))), target)
    compiled = root / "bytecode"
    shutil.copytree(source, compiled)
    version = "{}.{}".format(*sys.version_info[:2])
    subprocess.run(
        ["make", "--no-print-directory", "-s", "-C", str(ROOT / "functions"), "code",
         f"ARTIFACTS_DIR={compiled}", f"PYTHON={sys.executable}", f"RUNTIME={version}"],
        check=True,
    )  # fmt: skip
    shutil.copytree(
        ROOT / "functions" / "fleetkeeper", source / "fleetkeeper", ignore=shutil.ignore_patterns("__pycache__")
    )
    return {"SAM's Python builder": source, "functions/Makefile": compiled}


def import_times(bundle: Path, statement: str) -> tuple[float, float]:
    """The wall time and the CPU time (user + system) of a fresh interpreter running `statement`."""
    env = _env(bundle)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-S", "-c", statement], check=True, env=env, cwd=bundle)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def import_ratios(bundles: dict[str, Path], runs: int) -> None:
    statements = [BASELINE] + [f"import {module}" for module in handler_modules()]
    cases = [(layout, statement) for layout in bundles for statement in statements]
    for layout, statement in cases:  # warm the OS file cache once for all
        import_times(bundles[layout], statement)
    times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    cpus: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    load = os.getloadavg()[0]
    for round_ in range(runs):
        shift = round_ % len(cases)
        for layout, statement in cases[shift:] + cases[:shift]:
            wall, cpu = import_times(bundles[layout], statement)
            times[layout, statement].append(wall)
            cpus[layout, statement].append(cpu)
    load = max(load, os.getloadavg()[0])
    print(f"cold-start import, fresh interpreter each, median of {runs}, interleaved (load average up to {load:.1f})")
    worst = 0.0
    for layout in bundles:
        base = statistics.median(times[layout, BASELINE])
        base_cpu = statistics.median(cpus[layout, BASELINE])
        print(f"\nbundled as {layout}")
        print(f"{'module':34} {'wall ms':>8} {'min ms':>7} {'ratio':>6} {'CPU ms':>7} {'CPU ratio':>9}")
        for statement in statements:
            wall, cpu = statistics.median(times[layout, statement]), statistics.median(cpus[layout, statement])
            ratio = wall / base
            if statement != BASELINE and layout == "functions/Makefile":
                worst = max(worst, ratio)
            module = statement.removeprefix("import ")
            print(
                f"{module:34} {wall * 1000:8.0f} {min(times[layout, statement]) * 1000:7.0f} {ratio:6.2f}"
                f" {cpu * 1000:7.0f} {cpu / base_cpu:9.2f}"
            )
    before, after = bundles
    print(f"\n{after} against {before} (wall; CPU)")
    for statement in statements:
        wall = statistics.median(times[after, statement]) / statistics.median(times[before, statement])
        cpu = statistics.median(cpus[after, statement]) / statistics.median(cpus[before, statement])
        print(f"{statement.removeprefix('import '):34} {wall:6.2f} {cpu:6.2f}")
    print(f"highest ratio, as functions/Makefile bundles: {worst:.2f} (wall; target <= 1.3)")


def first_requests(bundle: Path, runs: int) -> None:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        aws_env = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "TABLE_NAME": "fleetkeeper-bench",
            "FLEETKEEPER_AWS_ENDPOINT_URL": endpoint,
        }
        os.environ.update(aws_env)
        for var in ("FLEETKEEPER_KICK_QUEUE_URL", "FLEETKEEPER_KICK_URL"):
            os.environ.pop(var, None)
        from fleetkeeper import aws
        from fleetkeeper.local.template import create_table

        aws.reset_clients()
        assert os.environ["FLEETKEEPER_AWS_ENDPOINT_URL"] == endpoint  # nothing may leave 127.0.0.1
        create_table(aws.dynamodb(), "fleetkeeper-bench")
        env = _env(bundle, aws_env)

        def child(method: str, path: str, body: object) -> dict[str, float]:
            out = subprocess.run(
                [sys.executable, "-S", "-c", _FIRST_REQUEST, json.dumps([method, path, body])],
                check=True,
                env=env,
                cwd=bundle,
                capture_output=True,
                text=True,
            ).stdout
            result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
            return result

        seeded = child("POST", "/v1/services", {"name": "web", "spec": HELLO_SPEC})
        assert seeded["status"] == [201, 201], seeded
        rows: dict[str, list[dict[str, float]]] = {"GET": [], "POST": []}
        for n in range(runs):
            get = child("GET", "/v1/services/web", None)
            post = child("POST", "/v1/services", {"name": f"svc{n}", "spec": HELLO_SPEC})
            assert get["status"] == [200, 200], get
            assert post["status"] == [201, 201], post
            rows["GET"].append(get)
            rows["POST"].append(post)
    finally:
        server.stop()
    print()
    print(f"api, fresh interpreter per request kind, median of {runs} (ms; the first request creates the client)")
    print(f"{'first request':24} {'import':>7} {'first':>7} {'import+first':>13} {'second (warm)':>14}")
    for label, path in (("GET", "GET /v1/services/NAME"), ("POST", "POST /v1/services")):
        got = rows[label]

        def med(key: str, got: list[dict[str, float]] = got) -> float:
            return statistics.median(r[key] for r in got) * 1000

        total = statistics.median((r["import"] + r["first"]) for r in got) * 1000
        print(f"{path:24} {med('import'):7.0f} {med('first'):7.0f} {total:13.0f} {med('second'):14.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--no-requests", action="store_true", help="only the import ratios")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetkeeper-bundle-") as root:
        bundles = make_bundles(Path(root))
        import_ratios(bundles, args.runs)
        if not args.no_requests:
            first_requests(bundles["functions/Makefile"], args.runs)


if __name__ == "__main__":
    main()
