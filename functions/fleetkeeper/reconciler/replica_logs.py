"""A replica's log shipper: its setup and run output (the two units' journal) to CloudWatch Logs.

The user data writes this file beside replica_boot.py (whose IMDSv2 credentials and SigV4 signer it
uses) and runs it as the `fleetkeeper-logs` unit, started before setup so that setup's output is
shipped too. It follows `journalctl -o json` of the units in UNITS (setup, run, and the failure
report of a boot that failed for the environment), resuming from a cursor file after a restart, and
sends what it reads with PutLogEvents to the stack's log group (at `logs.<region>.<DNS suffix>`,
the partition's suffix the user data names), in the stream its user data names
(`_o/<owner scope>/<service>/<uid>/<replica id>`, or `<service>/<uid>/<replica id>` for a service
without an owner: fleetkeeper.replicas.identity), created if
missing, at most every 2 seconds.

It needs python3, journalctl (systemd 242+: `--cursor-file`) and a route to CloudWatch Logs: in the
NAT-less network (infra/network.yaml) the `logs` interface endpoint. No agent, no AWS CLI. The
role needs logs:CreateLogStream and logs:PutLogEvents on its stream (an owner's role: its own
scope's streams, ReplicaOwnerPolicy; the shared role: ReplicaAccessPolicy). When it
cannot send (no endpoint, no permission) it keeps retrying with a bounded buffer, dropping the
oldest lines first, and never touches the units it reads: a replica serves the same without it.

Written for Python 3.8+ (the images' python3), the standard library only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.error
from collections import deque
from typing import TYPE_CHECKING

try:
    from fleetkeeper.reconciler import replica_boot
except ImportError:  # on the instance: replica_boot.py is beside this file
    import replica_boot  # type: ignore[no-redef,import-not-found,unused-ignore]

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

# The units whose journal is shipped, and the label their lines carry: the boot's failure report
# (replica_boot.serve_report, started only when the boot failed for the environment) says why.
UNITS = {
    "fleetkeeper-setup.service": "setup",
    "fleetkeeper-replica.service": "run",
    "fleetkeeper-boot-report.service": "boot",
}
# PutLogEvents' limits: 10,000 events and 1,048,576 bytes a call (each event counts 26 bytes more),
# 256 KB an event.
MAX_EVENTS = 10_000
MAX_BATCH_BYTES = 1_048_576
MAX_EVENT_BYTES = 256 * 1024 - 26
EVENT_OVERHEAD = 26
# "A batch of log events in a single request cannot span more than 24 hours" (PutLogEvents): a
# journal that resumes from an old cursor can hold days of lines.
MAX_BATCH_SPAN_MS = 24 * 3600 * 1000 - 1
# PutLogEvents answers these 400s for a request that may succeed when sent again (throttled, the
# stream or its sequence moved, credentials rotated): the batch is kept. Any other 400 is about the
# batch itself (InvalidParameterException, a malformed event): sending it again would fail forever
# and block every later line, so it is dropped with a message.
RETRIED_ERRORS = (
    b"ThrottlingException",
    b"ServiceUnavailableException",
    b"ResourceNotFoundException",
    b"ExpiredToken",
    b"UnrecognizedClientException",
    b"InvalidSignatureException",
    b"AccessDenied",
)
BUFFER_LINES = 50_000
FLUSH_SECONDS = 2.0
CREDENTIALS_SECONDS = 900.0


def log_event(line: str) -> dict[str, object] | None:
    """A journal entry (one line of `journalctl -o json`) as a CloudWatch Logs event, or None."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # the journal's bytes for a message that is not UTF-8
        message = bytes(b for b in message if isinstance(b, int)).decode("utf-8", "replace")
    if not isinstance(message, str):
        return None
    unit = UNITS.get(str(entry.get("_SYSTEMD_UNIT") or entry.get("UNIT") or ""))
    if unit in ("setup", "boot"):
        message = f"[{unit}] " + message
    encoded = message.encode("utf-8")
    if len(encoded) > MAX_EVENT_BYTES:
        message = encoded[:MAX_EVENT_BYTES].decode("utf-8", "ignore")
    try:
        timestamp = int(entry["__REALTIME_TIMESTAMP"]) // 1000
    except (KeyError, ValueError, TypeError):
        timestamp = int(time.time() * 1000)
    return {"timestamp": timestamp, "message": message}


def _timestamp(event: dict[str, object]) -> int:
    return int(str(event["timestamp"]))


def batches(events: Iterable[dict[str, object]]) -> Iterator[list[dict[str, object]]]:
    """Events in PutLogEvents-sized batches, each in time order and spanning at most 24 hours (as
    the API requires)."""
    ordered = sorted(events, key=_timestamp)
    batch: list[dict[str, object]] = []
    size = 0
    for event in ordered:
        cost = len(str(event["message"]).encode("utf-8")) + EVENT_OVERHEAD
        too_long = batch and _timestamp(event) - _timestamp(batch[0]) > MAX_BATCH_SPAN_MS
        if batch and (len(batch) >= MAX_EVENTS or size + cost > MAX_BATCH_BYTES or too_long):
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += cost
    if batch:
        yield batch


class BatchRefused(Exception):
    """CloudWatch Logs refused a batch for what it holds: sending it again cannot succeed."""


def refused_for_good(status: int, body: bytes) -> bool:
    """Whether an HTTP error answer to PutLogEvents is about the batch itself (drop it) rather than
    a moment of the service, the stream or the credentials (keep it and try again)."""
    if status >= 500 or status in (408, 429):
        return False
    return not any(code in body for code in RETRIED_ERRORS)


def requeue(pending: deque[dict[str, object]], unsent: list[dict[str, object]]) -> None:
    """Put `unsent` back before what came since, in time order, keeping the newest lines when the
    buffer is full (a `deque(maxlen)` drops from the end it is extended at: `extendleft` on a full
    buffer would drop the newest lines instead of the oldest)."""
    kept = unsent + list(pending)
    pending.clear()
    pending.extend(kept)  # extends on the right: a full buffer drops the oldest, on the left


class Shipper:
    """Sends events to one stream with the instance role's credentials (refreshed every 15 min)."""

    def __init__(
        self, group: str, stream: str, endpoint: str | None = None, dns_suffix: str = replica_boot.DEFAULT_DNS_SUFFIX
    ) -> None:
        self.group = group
        self.stream = stream
        self.endpoint = endpoint
        self.dns_suffix = dns_suffix  # amazonaws.com.cn in China (the user data passes the partition's)
        self.region = ""
        self.creds: dict[str, str] = {}
        self.fetched = 0.0
        self.stream_made = False

    def _call(self, target: str, payload: dict[str, object]) -> bytes:
        if time.monotonic() - self.fetched > CREDENTIALS_SECONDS or not self.creds:
            self.region, self.creds = replica_boot.instance_identity()
            self.fetched = time.monotonic()
        url = (self.endpoint or f"https://logs.{self.region}.{self.dns_suffix}").rstrip("/") + "/"
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"Logs_20140328.{target}"}
        signed = replica_boot.sign("POST", url, headers, body, "logs", self.region, self.creds, replica_boot._now())
        return replica_boot._request(url, method="POST", headers=signed, data=body)

    def send(self, batch: list[dict[str, object]]) -> None:
        if not self.stream_made:
            try:
                self._call("CreateLogStream", {"logGroupName": self.group, "logStreamName": self.stream})
            except urllib.error.HTTPError as exc:
                if b"ResourceAlreadyExistsException" not in exc.read():
                    raise
            self.stream_made = True
        try:
            self._call("PutLogEvents", {"logGroupName": self.group, "logStreamName": self.stream, "logEvents": batch})
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if b"ResourceNotFoundException" in body:
                self.stream_made = False  # the stream went (deleted, retention): made again next send
            if b"ExpiredToken" in body or b"UnrecognizedClient" in body:
                self.creds = {}  # fetched again from IMDS on the next call
            if refused_for_good(exc.code, body):
                raise BatchRefused(f"HTTP {exc.code}: {body[:300].decode(errors='replace')}") from None
            raise


def ship(lines: Iterable[str], shipper: Shipper, *, flush_seconds: float = FLUSH_SECONDS) -> int:
    """Read journal lines (a thread), send what has come every `flush_seconds`; returns events sent
    once `lines` ends (journalctl -f never does)."""
    pending: deque[dict[str, object]] = deque(maxlen=BUFFER_LINES)
    lock = threading.Lock()
    done = threading.Event()

    def read() -> None:
        for line in lines:
            event = log_event(line)
            if event is not None:
                with lock:
                    pending.append(event)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    sent = 0
    failures = 0
    while True:
        finished = done.wait(flush_seconds)
        with lock:
            taken = list(pending)
            pending.clear()
        ready = list(batches(taken))
        for number, batch in enumerate(ready):
            try:
                shipper.send(batch)
                sent += len(batch)
                failures = 0
            except BatchRefused as exc:
                print(f"fleetkeeper-logs: dropped {len(batch)} line(s) refused: {exc}", file=sys.stderr, flush=True)
            except (OSError, ValueError, KeyError, replica_boot.BootError) as exc:
                failures += 1
                print(f"fleetkeeper-logs: could not send {len(batch)} line(s): {exc}", file=sys.stderr, flush=True)
                with lock:  # kept (the oldest go first when the buffer is full), tried again later
                    requeue(pending, [event for later in ready[number:] for event in later])
                time.sleep(min(60.0, 2.0**failures))
                break
        if finished and not pending:
            return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fleetkeeper replica logs: the units' journal to CloudWatch Logs")
    parser.add_argument("--group", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--cursor-file", default="/opt/fleetkeeper/logs.cursor")
    parser.add_argument("--dns-suffix", default=replica_boot.DEFAULT_DNS_SUFFIX)
    args = parser.parse_args(argv)
    command = ["journalctl", "-f", "-o", "json", "--cursor-file", args.cursor_file]
    for unit in UNITS:
        command += ["-u", unit]
    journal = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, errors="replace")
    assert journal.stdout is not None
    ship(journal.stdout, Shipper(args.group, args.stream, dns_suffix=args.dns_suffix))
    return journal.wait()


if __name__ == "__main__":
    sys.exit(main())
