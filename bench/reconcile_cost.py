"""What one steady-state reconcile run costs, for S = 1, 10, 100, 1000 services of 2 replicas each.

Everything runs on this machine: AWS is moto in-process, every readiness probe goes to one
`python -m http.server` on 127.0.0.1 (a separate process, so its CPU is not counted), reached
through the driver's FLEETKEEPER_REPLICA_HOST setting. Each S starts from an empty account, is
reconciled until a run changes nothing, and then one more run is measured:

- AWS calls of that run by API (DynamoDB reads and writes, EC2 calls, DescribeInstances pages);
- DynamoDB read request units that run would consume (computed from the items' sizes, as
  DynamoDB bills them: 4 KB per unit for a strongly consistent Query, half for the index);
- CPU ms per service of the reconciler itself: the process's CPU time minus the CPU time moto
  spends answering (moto's request handling is timed separately), and including moto for scale;
- the same run replayed REPLAYS times with moto gone, every request answered with moto's recorded
  answer (class Replay): the least process CPU time of those runs per service, the steadiest figure
  on a shared machine.

Then a monthly cost estimate at rate(1 minute), with the assumptions printed alongside.
Run: .venv/bin/python bench/reconcile_cost.py [S | SxV ...]   (SxV: S services of V versions each)
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "functions"))
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "FLEETKEEPER_REPLICA_HOST": "127.0.0.1",
    }
)
for _var in ("FLEETKEEPER_AWS_ENDPOINT_URL", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
    os.environ.pop(_var, None)

from botocore.awsrequest import AWSResponse  # noqa: E402

from fleetkeeper import aws  # noqa: E402
from fleetkeeper.model import (  # noqa: E402
    Lifecycle,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceStatus,
    VersionRecord,
    VersionState,
    to_iso,
)
from fleetkeeper.reconciler.driver import (  # noqa: E402
    MANAGED_TAG,
    REPLICA_TAG,
    SERVICE_TAG,
    STACK_TAG,
    UID_TAG,
    VERSION_TAG,
    LaunchRequest,
)
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver  # noqa: E402
from fleetkeeper.reconciler.run import Reconciler  # noqa: E402
from fleetkeeper.settings import DEFAULT_STACK_ID, Ec2Settings  # noqa: E402
from fleetkeeper.spec.service import ServiceSpec  # noqa: E402
from fleetkeeper.store.codec import from_raw, replica_item, service_item, to_raw, version_item  # noqa: E402
from fleetkeeper.store.keys import new_uid  # noqa: E402
from fleetkeeper.store.runs import ReconcilerStore  # noqa: E402
from fleetkeeper.store.table import Table  # noqa: E402

TABLE = "fleetkeeper-bench"
REPLICAS = 2
RUNS_PER_MONTH = 730 * 60  # rate(1 minute)
# Replayed runs per S (see Replay); the least CPU of them and the median are reported (the machine is
# shared: the least is the steadiest figure; the median includes the runs a full collection fell in).
REPLAYS = 9

# Prices (us-east-1, on-demand, as published late 2024): assumptions, not quotes.
PRICE_RRU = 0.125 / 1e6  # DynamoDB on-demand read request unit
PRICE_WRU = 0.625 / 1e6
PRICE_GB_S = 0.0000133334  # Lambda arm64 per GB-second
PRICE_REQUEST = 0.20 / 1e6
MEMORY_GB = 0.5  # template.yaml: MemorySize 512
# Latency assumptions for the duration estimate (in-region, sequential calls).
QUERY_MS = 6.0
DESCRIBE_PAGE_MS = 400.0
PROBE_MS = 20.0
PROBE_WORKERS = 32

DYNAMODB_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}


class Meter:
    """Counts AWS calls (botocore hooks) and the CPU moto spends answering them."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.moto_cpu = 0.0
        self.lock = threading.Lock()
        # Moto's answers by request while recording (see Replay).
        self.recording: dict[tuple[str, str, bytes], Any] | None = None
        from moto.core.botocore_stubber import BotocoreStubber

        original = BotocoreStubber.process_request
        meter = self

        def timed(stubber: Any, request: Any) -> Any:
            start = time.thread_time()
            answer = None
            try:
                answer = original(stubber, request)
                return answer
            finally:
                with meter.lock:
                    meter.moto_cpu += time.thread_time() - start
                    if meter.recording is not None and answer is not None:
                        meter.recording[_request_key(request)] = answer

        BotocoreStubber.process_request = timed  # type: ignore[method-assign]

    def hook(self) -> None:
        for client in (aws.dynamodb(), aws.ec2(), aws.ssm()):
            client.meta.events.register("before-call", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        with self.lock:
            self.calls[f"{model.service_model.service_name}:{model.name}"] += 1

    def reset(self) -> None:
        self.calls.clear()
        self.moto_cpu = 0.0

    def mutations(self) -> int:
        return sum(n for api, n in self.calls.items() if _mutating(api))


def _request_key(request: Any) -> tuple[str, str, bytes]:
    body = request.body or b""
    return request.method, request.url, body if isinstance(body, bytes) else str(body).encode()


class Replay:
    """moto's answers to one steady-state run, served again to the same clients with moto gone.

    Subtracting moto's CPU from the process's (the column above) leaves noise: moto holds the GIL,
    and its heap of hundreds of thousands of objects is walked by every full garbage collection the
    reconciler's allocations set off. A replayed run has no moto at all: it runs in a process of its
    own that never imported moto (its heap is about a Lambda's: botocore, pydantic, fleetkeeper), and
    each request gets the answer recorded for it (a steady run asks the same questions every time;
    an unrecorded request fails the benchmark). So the process's CPU time is the reconciler's own:
    botocore's request building, signing and parsing, our decoding, planning and probing (the probe
    server is another process), garbage collection included.
    """

    def __init__(self, answers: dict[tuple[str, str, bytes], Any]) -> None:
        self.answers = answers
        for client in (aws.dynamodb(), aws.ec2()):
            client.meta.events.register("before-send", self._answer)

    def _answer(self, request: Any, **_: Any) -> AWSResponse:
        status, headers, body = self.answers[_request_key(request)]
        return AWSResponse(request.url, status, headers, _Body(body))


class _Body:
    """A recorded body, as the raw stream botocore reads a response from."""

    def __init__(self, data: bytes | str) -> None:
        self.data = data.encode() if isinstance(data, str) else data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.data


def _replayed(answers: dict[tuple[str, str, bytes], Any], after: datetime, services: int) -> list[float]:
    """CPU seconds of each of REPLAYS replayed runs, measured in a fresh process (`--replay`)."""
    with tempfile.NamedTemporaryFile(suffix=".pickle") as recording:
        pickle.dump({"answers": answers, "after": after, "services": services}, recording)
        recording.flush()
        out = subprocess.run(
            [sys.executable, __file__, "--replay", recording.name], check=True, stdout=subprocess.PIPE, text=True
        ).stdout
    seconds: list[float] = json.loads(out)
    return seconds


def replay_main(path: str) -> None:
    """The child's side of `_replayed`: replay the recorded run REPLAYS times, print their CPU seconds."""
    with open(path, "rb") as recording:
        recorded = pickle.load(recording)
    Replay(recorded["answers"])
    clock = [recorded["after"]]
    reconciler = Reconciler(
        store=ReconcilerStore(Table(TABLE)), driver=_driver(), now=lambda: clock[0], probe_budget_seconds=60
    )
    seconds = []
    for _ in range(REPLAYS):
        clock[0] += timedelta(minutes=1)
        reconciler.driver = _driver()
        cpu_start = time.process_time()
        report = reconciler.run_all()
        seconds.append(time.process_time() - cpu_start)
        assert report.services == recorded["services"] and not report.errors and not report.actions, report
        assert not report.unloadable, report.unloadable
    print(json.dumps(seconds))


def _mutating(api: str) -> bool:
    service, operation = api.split(":")
    if service == "dynamodb":
        return operation in DYNAMODB_WRITES
    return not operation.startswith(("Describe", "Get", "List"))


# `python -m http.server`, with a listen backlog for 32 probes connecting at once: its default of 5
# drops connections under a burst, and a dropped SYN is retried only after a second, then three
# more, which on a busy machine outlasts a probe's 5 s timeout (a failed probe, a write, no steady state).
_PROBE_SERVER = """
import functools, http.server, sys
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 1024
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
with Server(("127.0.0.1", int(sys.argv[2])), handler) as server:
    print(f"Serving HTTP on 127.0.0.1 port {server.server_address[1]}", flush=True)
    server.serve_forever()
"""


class ProbeServer:
    """An HTTP file server in its own process: GET /health is a file, so it answers 200."""

    def __init__(self, port: int = 0) -> None:
        self.dir = tempfile.TemporaryDirectory()
        Path(self.dir.name, "health").write_text("ok")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _PROBE_SERVER, self.dir.name, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "Serving HTTP on 127.0.0.1 port NNNNN ..."
        self.port = int(line.split(" port ")[1].split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for _ in range(50):
            try:
                with opener.open(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("probe server did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()
        self.dir.cleanup()


def _spec(port: int) -> ServiceSpec:
    return ServiceSpec.model_validate(
        {
            "service": {
                "readiness_probe": {"path": "/health", "timeout_seconds": 5},
                "replicas": REPLICAS,
                "ports": port,
            },
            "resources": {"instance_type": "t3.micro"},
            "run": "python3 -m http.server $PORT",
            "envs": {"MODEL": "example/model", "LOG_LEVEL": "info"},
        }
    )


def _read_units(table: str) -> float:
    """RRUs of one run's reads: each service Query is strongly consistent (4 KB units, per Query),
    the index pages eventually consistent (half); item size ~ name + value bytes, as DynamoDB counts."""
    client = aws.dynamodb()
    partitions: Counter[str] = Counter()
    listed = 0
    kwargs: dict[str, Any] = {"TableName": table}
    while True:
        page = client.scan(**kwargs)
        for raw in page["Items"]:
            item = from_raw(raw)
            size = sum(len(k) + len(json.dumps(v, default=str)) for k, v in item.items())
            partitions[str(item["PK"])] += size
            if item["SK"] == "META":
                listed += size
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    service_queries = sum(math.ceil(size / 4096) for size in partitions.values())
    index_pages = max(1, math.ceil(listed / (1024 * 1024)))
    return service_queries + 0.5 * sum(math.ceil(min(listed, 1024 * 1024) / 4096) for _ in range(index_pages))


def _versions(name: str, uid: str, spec: ServiceSpec, versions: int, now: str) -> list[VersionRecord]:
    """Versions 1..`versions` of a service, all READY once; beyond one, each spec its own (a build
    number and the service's name in its envs), as a service's history is."""
    if versions == 1:
        return [VersionRecord(name, uid, 1, spec, "rolling", now, VersionState.READY)]
    return [
        VersionRecord(
            name,
            uid,
            number,
            spec.model_copy(update={"envs": {**spec.envs, "SERVICE": name, "BUILD": str(number)}}),
            "rolling",
            now,
            VersionState.READY,
        )
        for number in range(1, versions + 1)
    ]


def _seed(store: ReconcilerStore, services: int, spec: ServiceSpec, now: str, versions: int = 1) -> None:
    """The state the reconciler converges to, written directly: the replicas run the newest version.

    moto copies the whole table on every TransactWriteItems, which makes creating and claiming
    1000 services through the real path take most of an hour here; the run measured afterwards is
    the reconciler's own (the first runs of `measure` still reconcile this seed to a fixed point).
    """
    client, ec2 = aws.dynamodb(), aws.ec2()
    for number in range(services):
        name = f"svc-{number:04d}"
        uid = new_uid()
        history = _versions(name, uid, spec, versions, now)
        version = history[-1]
        replicas = []
        for replica_id in range(REPLICAS):
            tags = [
                {"Key": MANAGED_TAG, "Value": "true"},
                # The stack whose reconciler runs here (no FLEETKEEPER_STACK_ID: the default): an
                # instance of no stack, or another's, is never this reconciler's.
                {"Key": STACK_TAG, "Value": DEFAULT_STACK_ID},
                {"Key": SERVICE_TAG, "Value": name},
                {"Key": UID_TAG, "Value": uid},
                {"Key": VERSION_TAG, "Value": str(version.version)},
                {"Key": REPLICA_TAG, "Value": str(replica_id)},
            ]
            launched = ec2.run_instances(
                ImageId="ami-12345678",
                MinCount=1,
                MaxCount=1,
                # The token fleetkeeper derives for this replica: without it the instance is not ours.
                ClientToken=LaunchRequest(
                    service=name, uid=uid, version=version.version, replica_id=replica_id, spec=version.spec
                ).client_token(DEFAULT_STACK_ID),
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],  # type: ignore[list-item]
            )["Instances"][0]
            replicas.append(
                ReplicaRecord(
                    name=name,
                    uid=uid,
                    replica_id=replica_id,
                    version=version.version,
                    status=ReplicaStatus.READY,
                    created_at=now,
                    updated_at=now,
                    instance_id=launched["InstanceId"],
                    url=f"http://127.0.0.1:{spec.port}",
                    ready_at=now,
                    last_probe_ok_at=now,
                    launched_at=now,
                )
            )
        service = ServiceRecord(
            name=name,
            uid=uid,
            generation=version.version,
            lifecycle=Lifecycle.ACTIVE,
            target_version=version.version,
            latest_version=version.version,
            status=ServiceStatus.READY,
            status_message=f"{REPLICAS}/{REPLICAS} ready",
            observed_generation=version.version,
            created_at=now,
            updated_at=now,
            replica_seq=REPLICAS,
        )
        items = [service_item(service), *(version_item(v) for v in history), *(replica_item(r) for r in replicas)]
        for item in items:
            client.put_item(TableName=store.table.name, Item=to_raw(item))


def _driver() -> Ec2Driver:
    """A driver for one run, as the reconciler builds it (FLEETKEEPER_REPLICA_HOST is set above)."""
    return Ec2Driver.from_settings(Ec2Settings.from_env(os.environ))


def measure(services: int, port: int, meter: Meter, versions: int = 1) -> dict[str, Any]:
    from moto import mock_aws

    from fleetkeeper.local.template import create_table

    with mock_aws():
        aws.reset_clients()
        create_table(aws.dynamodb(), TABLE)
        meter.hook()
        store = ReconcilerStore(Table(TABLE))
        clock = [datetime.now(UTC)]
        _seed(store, services, _spec(port), to_iso(clock[0]), versions)
        reconciler = Reconciler(store=store, driver=_driver(), now=lambda: clock[0], probe_budget_seconds=60)
        runs = 0
        while True:  # reconcile the seed until a run changes nothing
            runs += 1
            if runs > 10:
                raise RuntimeError(f"S={services}: no steady state")
            meter.reset()
            reconciler.driver = _driver()
            reconciler.run_all()
            clock[0] += timedelta(minutes=1)
            if meter.mutations() == 0:
                break
        meter.reset()
        meter.recording = {}
        reconciler.driver = _driver()
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        report = reconciler.run_all()
        cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
        assert not report.errors and meter.mutations() == 0, (report, meter.calls)
        calls, moto_cpu, answers = dict(meter.calls), meter.moto_cpu, meter.recording
        meter.recording = None
        rru = _read_units(TABLE)
    aws.reset_clients()
    replayed = sorted(_replayed(answers, clock[0], services))
    return {
        "services": services,
        "versions": versions,
        "instances": services * REPLICAS,
        "runs_to_converge": runs,
        "calls": calls,
        "rru": rru,
        "cpu_ms_per_service": 1000 * (cpu - moto_cpu) / services,
        "cpu_ms_per_service_with_moto": 1000 * cpu / services,
        "replayed_cpu_ms_per_service": 1000 * replayed[0] / services,
        "replayed_median_cpu_ms_per_service": 1000 * replayed[len(replayed) // 2] / services,
        "wall_s": wall,
    }


def _count(calls: dict[str, int], prefix: str, *, writes: bool | None = None) -> int:
    total = 0
    for api, n in calls.items():
        operation = api.split(":")[1]
        if not api.startswith(prefix):
            continue
        if writes is None or (operation in DYNAMODB_WRITES) == writes:
            total += n
    return total


def _monthly(row: dict[str, Any]) -> tuple[float, float, float]:
    calls = row["calls"]
    pages = calls.get("ec2:DescribeInstances", 0)
    probe_s = math.ceil(row["instances"] / PROBE_WORKERS) * PROBE_MS / 1000
    duration_s = (
        row["replayed_cpu_ms_per_service"] * row["services"] / 1000
        + _count(calls, "dynamodb:") * QUERY_MS / 1000
        + pages * DESCRIBE_PAGE_MS / 1000
        + probe_s
    )
    lambda_cost = RUNS_PER_MONTH * (duration_s * MEMORY_GB * PRICE_GB_S + PRICE_REQUEST)
    dynamodb_cost = RUNS_PER_MONTH * row["rru"] * PRICE_RRU
    return duration_s, lambda_cost, dynamodb_cost


def _size(arg: str) -> tuple[int, int]:
    """`S` (services of one version) or `SxV` (services of V versions each)."""
    services, _, versions = arg.partition("x")
    return int(services), int(versions or 1)


def _label(row: dict[str, Any]) -> str:
    return str(row["services"]) if row["versions"] == 1 else f"{row['services']} ({row['versions']} versions)"


def main(sizes: list[tuple[int, int]]) -> None:
    server = ProbeServer()
    meter = Meter()
    rows = []
    try:
        for services, versions in sizes:
            started = time.perf_counter()
            rows.append(measure(services, server.port, meter, versions))
            print(f"  S={services}x{versions}: measured in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    finally:
        server.close()

    print("Steady-state reconcile run (scheduled run: every service + orphan sweep), 2 replicas per service\n")
    print(
        "| S | instances | DynamoDB reads (Query) | DynamoDB writes | DescribeInstances pages | "
        "other EC2 calls | read units / run | CPU ms / service | CPU ms / service incl. moto | "
        "CPU ms / service, replayed: least | median |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        calls = row["calls"]
        pages = calls.get("ec2:DescribeInstances", 0)
        other_ec2 = _count(calls, "ec2:") - pages + _count(calls, "ssm:")
        print(
            f"| {_label(row)} | {row['instances']} | {_count(calls, 'dynamodb:', writes=False)} | "
            f"{_count(calls, 'dynamodb:', writes=True)} | {pages} | {other_ec2} | {row['rru']:.1f} | "
            f"{row['cpu_ms_per_service']:.2f} | {row['cpu_ms_per_service_with_moto']:.2f} | "
            f"{row['replayed_cpu_ms_per_service']:.2f} | {row['replayed_median_cpu_ms_per_service']:.2f} |"
        )
    print(
        "\nMonthly cost at rate(1 minute) = 43,800 runs "
        "(steady state; launches and probes of a changing fleet not included)\n"
    )
    print("| S | est. run duration | Lambda (512 MB arm64) | DynamoDB reads | total / month |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        duration, lambda_cost, dynamodb_cost = _monthly(row)
        print(
            f"| {_label(row)} | {duration:.2f} s | ${lambda_cost:.2f} | ${dynamodb_cost:.2f} | "
            f"${lambda_cost + dynamodb_cost:.2f} |"
        )
    print(
        "\nAssumptions: us-east-1 on-demand prices: DynamoDB $0.125 per million read request units "
        "(a steady run writes nothing), Lambda arm64 $0.0000133334 per GB-s + $0.20 per million requests; "
        f"duration = measured reconciler CPU (replayed, least) + {QUERY_MS:.0f} ms per DynamoDB call (sequential) + "
        f"{DESCRIBE_PAGE_MS:.0f} ms per DescribeInstances page + probes at {PROBE_MS:.0f} ms each, "
        f"{PROBE_WORKERS} in parallel. EC2 Describe calls, SSM standard parameters and EventBridge "
        "scheduled rules cost nothing; CloudWatch Logs (one line per run) is cents. Read units grow with "
        "the versions a service keeps (each holds its spec); updates keep the newest 50 (plus the target "
        "and versions replicas run)."
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replay"]:
        replay_main(sys.argv[2])
    else:
        main([_size(arg) for arg in sys.argv[1:] or ["1", "10", "100", "1000", "100x50"]])
