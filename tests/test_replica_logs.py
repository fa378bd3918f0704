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
from fleetkeeper.spec import parse_spec
from tests.test_replica_boot import endpoints  # noqa: F401 - the fixture

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
    endpoints: tuple[str, str],  # noqa: F811
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
    assert base64.b64decode(env.split("'")[1]).decode() == f'FK_LOG_GROUP="{GROUP}"\nFK_LOG_STREAM="web/u1/3"\n'
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
