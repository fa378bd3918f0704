"""`fleetkeeper logs` against a deployed stack: the replicas' output in CloudWatch Logs.

Each replica ships its setup and run output (its two systemd units' journal) to the stack's log
group, one stream per replica named `<service>/<uid>/<replica id>` (reconciler/replica_logs.py on
the instance). The CLI reads them with the caller's own credentials (logs:FilterLogEvents on the
group; docs/DEPLOY.md), never through the API: log lines can be large and many, and the API's
role has no business reading them.
"""

from __future__ import annotations

import os
import re
import time
from typing import IO, TYPE_CHECKING, Any

from fleetkeeper.cli.http import UsageError
from fleetkeeper.cli.terminal import printable

if TYPE_CHECKING:
    from collections.abc import Callable

LOG_GROUP_ENV = "FLEETKEEPER_LOG_GROUP"
LOG_GROUP_OUTPUT = "ReplicaLogGroup"
_SINCE = re.compile(r"^([0-9]{1,6})([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_seconds(text: str) -> int:
    """`10m`, `2h`, `30s`, `1d` -> seconds (argparse type)."""
    match = _SINCE.fullmatch(text)
    if match is None:
        import argparse

        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30s, 10m, 2h or 1d")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def log_group(
    explicit: str | None,
    stack: str | None,
    *,
    environ: dict[str, str] | os._Environ[str] | None = None,
    cloudformation: Callable[[], Any] | None = None,
) -> str:
    """--log-group, else $FLEETKEEPER_LOG_GROUP, else the --stack's ReplicaLogGroup output."""
    env = os.environ if environ is None else environ
    chosen = explicit or env.get(LOG_GROUP_ENV)
    if chosen:
        return chosen
    if not stack:
        raise UsageError(
            f"which stack's logs? pass --stack NAME (its {LOG_GROUP_OUTPUT} output), --log-group GROUP, "
            f"or set ${LOG_GROUP_ENV}"
        )
    from botocore.exceptions import BotoCoreError, ClientError

    make = cloudformation or (lambda: _client("cloudformation"))
    try:
        stacks = make().describe_stacks(StackName=stack)["Stacks"]
    except (ClientError, BotoCoreError) as exc:
        raise UsageError(f"cannot read stack {stack!r}: {exc}") from exc
    for output in (stacks[0].get("Outputs") or []) if stacks else []:
        if output.get("OutputKey") == LOG_GROUP_OUTPUT:
            return str(output["OutputValue"])
    raise UsageError(f"stack {stack!r} has no {LOG_GROUP_OUTPUT} output: was it deployed before replica logs?")


def stream_prefix(service: str, uid: str, replica: int | None, owner: str = "") -> str:
    """The streams of one incarnation's replicas (or of one replica). A replica's stream name ends
    with its id and a slash-free suffix is never a prefix of another id: `3` would match `30`, so a
    single replica is asked for by its exact name. A service with an owner has its streams under the
    owner's scope (`_o/<scope>/...`, fleetkeeper.replicas.identity), where only its owner's replicas write."""
    from fleetkeeper.replicas.identity import owner_scope, scope_prefix

    base = f"{scope_prefix(owner_scope(owner))}{service}/{uid}/"
    return base if replica is None else f"{base}{replica}"


def _client(service: str) -> Any:
    import boto3

    endpoint = os.environ.get("FLEETKEEPER_AWS_ENDPOINT_URL") or None
    session: Any = boto3.session.Session()
    return session.client(service, endpoint_url=endpoint)


def logs_client() -> Any:
    return _client("logs")


def print_logs(
    client: Any,
    group: str,
    service: str,
    uid: str,
    *,
    replica: int | None,
    since_seconds: int | None,
    follow: bool,
    out: IO[str],
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    still_there: Callable[[], bool] = lambda: True,
    owner: str = "",
) -> int:
    """Print the replicas' log lines, oldest first (`[replica N] line` unless one replica is asked
    for); with `follow`, keep polling every 2 s until the service is gone. Returns lines printed."""
    start = int((now() - since_seconds) * 1000) if since_seconds is not None else 0
    seen: set[str] = set()
    printed = 0
    prefix = stream_prefix(service, uid, replica, owner)
    while True:
        query: dict[str, Any] = {"logGroupName": group, "startTime": start}
        if replica is None:
            query["logStreamNamePrefix"] = prefix
        else:
            query["logStreamNames"] = [prefix]
        newest = start
        while True:
            try:
                page = client.filter_log_events(**query)
            except Exception as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code")
                if code == "ResourceNotFoundException":
                    raise UsageError(
                        f"log group {group!r} does not exist (is it the stack's ReplicaLogGroup?)"
                    ) from exc
                raise
            for event in page.get("events", []):
                if replica is None and not str(event.get("logStreamName", "")).startswith(prefix):
                    continue  # CloudWatch applies the prefix; moto's FilterLogEvents ignores it
                event_id = str(event.get("eventId") or (event["logStreamName"], event["timestamp"], event["message"]))
                newest = max(newest, int(event["timestamp"]))
                if event_id in seen:
                    continue
                seen.add(event_id)
                # One event, one printed line, with nothing a terminal would obey (fleetkeeper.cli.terminal):
                # the text is whatever the service wrote.
                line = str(event["message"]).rstrip("\n").replace("\n", " ")
                if replica is None:
                    line = f"[replica {event['logStreamName'].rsplit('/', 1)[-1]}] {line}"
                out.write(printable(line) + "\n")
                printed += 1
            token = page.get("nextToken")
            if not token:
                break
            query["nextToken"] = token
        out.flush()
        if not follow or not still_there():
            return printed
        # The same millisecond again: a line stamped with it may arrive after this read.
        start = newest
        sleep(2.0)
