"""A replica's log shipper (reconciler/replica_logs.py) and the user data that installs it.

The shipper sends journal lines to an in-memory AWS's CloudWatch Logs (moto server) over HTTP,
signed with replica_boot's SigV4 and IMDSv2 credentials (a fake IMDS), as on an instance; the CLI's
reader (cli/cloudlogs.py) then reads them back from the same group.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.cli import cloudlogs
from fleetkeeper.reconciler import replica_boot, replica_logs
from fleetkeeper.reconciler.userdata import (
    LARGEST_SOURCE,
    USER_DATA_LIMIT,
    BootSource,
    log_stream,
    render,
    user_data,
)
from fleetkeeper.spec.service import parse_spec

GROUP = "/fleetkeeper/test/replicas"


def entry(message: Any, unit: str = "fleetkeeper-replica.service", micros: int = 1_700_000_000_000_000) -> str:
    return json.dumps({"MESSAGE": message, "_SYSTEMD_UNIT": unit, "__REALTIME_TIMESTAMP": str(micros)})


def test_journal_entries_become_log_events() -> None:
    assert replica_logs.log_event(entry("serving")) == {"timestamp": 1_700_000_000_000, "message": "serving"}
    assert replica_logs.log_event(entry("pip install", "fleetkeeper-setup.service"))["message"] == "[setup] pip install"
    assert replica_logs.log_event(entry([104, 105, 255]))["message"] == "hi\ufffd"  # not UTF-8: bytes
    assert replica_logs.log_event(entry(None)) is None
    assert replica_logs.log_event("not json") is None
    huge = replica_logs.log_event(entry("x" * 300_000))
    assert huge is not None and len(str(huge["message"])) == replica_logs.MAX_EVENT_BYTES


def test_batches_keep_time_order_and_putlogevents_limits() -> None:
    events = [{"timestamp": 10 - n, "message": "m"} for n in range(10)]
    [batch] = replica_logs.batches(events)
    assert [e["timestamp"] for e in batch] == sorted(e["timestamp"] for e in events)
    many = [{"timestamp": n, "message": "y" * 100_000} for n in range(25)]
    sizes = [len(b) for b in replica_logs.batches(many)]
    assert sum(sizes) == 25 and all(s * (100_000 + 26) <= replica_logs.MAX_BATCH_BYTES for s in sizes)


def test_the_shipper_sends_the_journal_to_the_replicas_stream_and_the_cli_reads_it(
    endpoints: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3

    aws_url, imds_url = endpoints
    monkeypatch.setattr(replica_boot, "IMDS", imds_url)
    client = boto3.client(
        "logs", region_name="us-east-1", endpoint_url=aws_url, aws_access_key_id="local", aws_secret_access_key="local"
    )
    client.create_log_group(logGroupName=GROUP)
    stream = log_stream("web", "u1", 3)
    shipper = replica_logs.Shipper(GROUP, stream, endpoint=aws_url)
    base = int(time.time() * 1_000_000) - 60_000_000  # a minute ago: CloudWatch refuses old events
    lines = [
        entry("installing", "fleetkeeper-setup.service", base),
        entry("serving on 8080", micros=base + 1000),
        "garbage",
    ]
    assert replica_logs.ship(iter(lines), shipper, flush_seconds=0.05) == 2
    # A second run of the shipper (a restart) finds its stream made already.
    again = replica_logs.Shipper(GROUP, stream, endpoint=aws_url)
    assert replica_logs.ship(iter([entry("still serving", micros=base + 2000)]), again, flush_seconds=0.05) == 1

    out = io.StringIO()
    cloudlogs.print_logs(client, GROUP, "web", "u1", replica=None, since_seconds=None, follow=False, out=out)
    assert out.getvalue().splitlines() == [
        "[replica 3] [setup] installing",
        "[replica 3] serving on 8080",
        "[replica 3] still serving",
    ]


def _spec(**overrides: Any) -> Any:
    data = {"service": {"readiness_probe": "/health", "replicas": 1}, "run": "python3 -m http.server $PORT"}
    data.update(overrides)
    return parse_spec(data)


def test_the_user_data_installs_the_shipper_first_and_is_valid_bash(tmp_path: Path) -> None:
    source = BootSource(log_group=GROUP, log_stream=log_stream("web", "u1", 3))
    script = render(_spec(), source)
    units = "/etc/systemd/system/fleetkeeper-"
    assert script.index(units + "logs.service") < script.index(units + "setup.service")
    assert "cat > /opt/fleetkeeper/replica_logs.py <<'FLEETKEEPER_SCRIPT_END'" in script
    path = tmp_path / "user-data.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    # The scripts as written to the instance still compile (docstrings stripped, code intact).
    shipped = script.split("cat > /opt/fleetkeeper/replica_logs.py <<'FLEETKEEPER_SCRIPT_END'\n")[1]
    compile(shipped.split("FLEETKEEPER_SCRIPT_END")[0], "replica_logs.py", "exec")
    [env] = [line for line in script.splitlines() if line.endswith("> /opt/fleetkeeper/logs.env")]
    assert base64.b64decode(env.split("'")[1]).decode() == (
        f'FK_LOG_GROUP="{GROUP}"\nFK_LOG_STREAM="web/u1/3"\nFK_DNS_SUFFIX="amazonaws.com"\n'
    )
    assert "fleetkeeper-logs" not in render(_spec(), None)  # no group: nothing shipped, as before


def test_shipping_logs_fits_in_the_user_data_or_is_left_out() -> None:
    small = user_data(_spec(), LARGEST_SOURCE)
    assert len(small) <= USER_DATA_LIMIT and b"replica_logs.py" in gzip.decompress(small)
    import random

    rnd = random.Random(3)
    noise = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12_000))
    big = _spec(setup=f"echo {noise}")
    assert len(user_data(big)) <= USER_DATA_LIMIT  # fits alone (the api accepts it)
    with_logs = user_data(big, BootSource(log_group=GROUP, log_stream=log_stream("web", "u1", 3)))
    assert len(with_logs) <= USER_DATA_LIMIT and b"replica_logs.py" not in gzip.decompress(with_logs)


# --- PutLogEvents' refusals and the bounded buffer (issue 24's log shipper findings) -------------------


def test_a_batch_never_spans_more_than_24_hours() -> None:
    """PutLogEvents refuses a batch whose events span more than 24 hours: a journal resumed from an old
    cursor holds days of lines, in one PutLogEvents-sized group by count and bytes."""
    day = 24 * 3600 * 1000
    events = [{"timestamp": t, "message": "m"} for t in (0, day - 1, day, 2 * day + 5, 3 * day)]
    spans = [[e["timestamp"] for e in batch] for batch in replica_logs.batches(events)]
    assert spans == [[0, day - 1], [day], [2 * day + 5, 3 * day]]
    assert all(b[-1] - b[0] <= replica_logs.MAX_BATCH_SPAN_MS for b in spans)


def test_requeued_lines_keep_the_newest_when_the_buffer_is_full() -> None:
    from collections import deque

    pending: deque[dict[str, object]] = deque(({"timestamp": t, "message": "new"} for t in (10, 11, 12)), maxlen=4)
    replica_logs.requeue(pending, [{"timestamp": t, "message": "old"} for t in (1, 2, 3)])
    # The buffer holds 4: the two oldest unsent lines go, every newer line stays, in time order.
    assert [e["timestamp"] for e in pending] == [3, 10, 11, 12]


class _Answers:
    """CloudWatch Logs' answers to each call, in order: bytes for a 200, (status, body) for an error."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(
        self, url: str, method: str = "GET", headers: Any = None, data: Any = None, timeout: float = 0
    ) -> bytes:
        import urllib.error

        lowered = {str(name).lower(): value for name, value in (headers or {}).items()}
        target = str(lowered.get("x-amz-target", "")).rsplit(".", 1)[-1]
        self.calls.append((target, json.loads(data or b"{}")))
        answer = self.answers.pop(0) if self.answers else b"{}"
        if isinstance(answer, tuple):
            status, body = answer
            raise urllib.error.HTTPError(url, status, "error", {}, io.BytesIO(body))  # type: ignore[arg-type]
        return bytes(answer)


def _shipper(monkeypatch: pytest.MonkeyPatch, answers: _Answers) -> replica_logs.Shipper:
    monkeypatch.setattr(replica_boot, "_request", answers)
    monkeypatch.setattr(
        replica_boot, "instance_identity", lambda: ("us-east-1", {"key": "a", "secret": "b", "token": "c"})
    )
    monkeypatch.setattr(replica_logs.time, "sleep", lambda seconds: None)
    shipper = replica_logs.Shipper(GROUP, "web/u1/0", endpoint="http://127.0.0.1:9")
    shipper.stream_made = True
    return shipper


def test_a_batch_refused_for_what_it_holds_is_dropped_not_retried_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 400 about the batch (InvalidParameterException) would fail the same way every time: dropped
    with a message, and the lines after it are still shipped."""
    message = b"Log events in a single PutLogEvents request must be in chronological order."
    refused = (400, b'{"__type":"InvalidParameterException","message":"' + message + b'"}')
    answers = _Answers([refused, b"{}"])
    shipper = _shipper(monkeypatch, answers)
    base = 1_700_000_000_000_000
    day_micros = 25 * 3600 * 1_000_000
    lines = [entry("old", micros=base), entry("new", micros=base + day_micros)]
    assert replica_logs.ship(iter(lines), shipper, flush_seconds=0.01) == 1
    assert [[e["message"] for e in call["logEvents"]] for _, call in answers.calls] == [["old"], ["new"]]


def test_a_throttled_or_missing_stream_batch_is_kept_and_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    throttled = (400, b'{"__type":"ThrottlingException","message":"Rate exceeded"}')
    gone = (400, b'{"__type":"ResourceNotFoundException","message":"The specified log stream does not exist."}')
    answers = _Answers([throttled, gone, b"{}", b"{}"])
    shipper = _shipper(monkeypatch, answers)
    assert replica_logs.ship(iter([entry("serving")]), shipper, flush_seconds=0.01) == 1
    # Throttled: sent again; the stream gone: made again, then sent.
    assert [target for target, _ in answers.calls] == [
        "PutLogEvents",
        "PutLogEvents",
        "CreateLogStream",
        "PutLogEvents",
    ]
