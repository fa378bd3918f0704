"""Readable logs for a person at a terminal: one line per record instead of Lambda's JSON.

In AWS the handlers' Powertools loggers write one JSON object per line for CloudWatch. Embedded
mode keeps those loggers and their fields and only changes how a record is printed:

    17:42:07 INFO  ReconcilerFunction  launched replica 3 of hello  service=hello version=1
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import Any

from fleetkeeper.cli.terminal import printable

# Fields every Powertools record carries that say nothing new at a terminal.
_NOISE = {
    "timestamp",
    "service",
    "location",
    "cold_start",
    "function_memory_size",
    "function_arn",
    "function_request_id",
    "xray_trace_id",
    "sampling_rate",
    "level",
    "message",
    "function_name",
    "embedded_function",
    "exception",
    "exception_name",
    "stack_trace",
}


def render(data: dict[str, Any], fallback_name: str = "") -> str:
    """One readable line (plus the traceback, if any) for a structured record."""
    moment = datetime.now().strftime("%H:%M:%S")  # records are rendered as they are emitted
    level = str(data.get("level", "INFO"))
    source = str(data.get("embedded_function") or data.get("function_name") or fallback_name)
    message = data.get("message", "")
    if not isinstance(message, str):
        message = json.dumps(message, default=str)
    extras = " ".join(
        f"{key}={value if isinstance(value, str) and ' ' not in value else json.dumps(value, default=str)}"
        for key, value in data.items()
        if key not in _NOISE and value is not None
    )
    line = f"{moment} {level:<5} {source:<18}  {message}" + (f"  {extras}" if extras else "")
    if data.get("exception"):
        line += "\n" + str(data["exception"])
    # A record can carry text from elsewhere (a replica's error, a request's field): nothing in it
    # may drive the terminal.
    return printable(line, keep_newlines=True)


class PlainFormatter(logging.Formatter):
    """For the embedded mode's own stdlib loggers: the same line shape as the handlers' records."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {"level": record.levelname, "message": record.getMessage()}
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return render(data, record.name)


# The reconciler's summary of every run: one line a tick (or more) at INFO even when nothing happens.
# A person at a terminal sees them with -v only; what the runs change (launches, statuses, endpoints)
# is logged on lines of its own.
ROUTINE_MESSAGES = frozenset({"dispatched", "reconcile run done"})


class _NoRoutine(logging.Filter):
    """Drops the per-run INFO summaries (ROUTINE_MESSAGES); warnings and errors always pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        message = record.msg if isinstance(record.msg, str) else ""
        return message not in ROUTINE_MESSAGES


def _has_powertools_handler(logger: logging.Logger | None) -> bool:
    from aws_lambda_powertools.logging.formatter import BasePowertoolsFormatter

    while logger is not None:
        if any(isinstance(h.formatter, BasePowertoolsFormatter) for h in logger.handlers):
            return True
        logger = logger.parent
    return False


# Embedded mode runs each function's handler on threads named after it (see server.py).
EMBEDDED_FUNCTIONS = frozenset({"ApiFunction", "ReconcilerFunction", "CleanupFunction"})


class _FunctionByThread(logging.Filter):
    """Stamps a record with the function whose thread logged it.

    The three handlers share one Powertools logger (one service name), so the `function_name` its
    Lambda context injection leaves behind is whichever handler ran last; the thread is exact.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.threadName in EMBEDDED_FUNCTIONS:
            record.embedded_function = record.threadName
        return True


class _NotPowertools(logging.Filter):
    """Keeps records that no Powertools handler prints already (they propagate to the root too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _has_powertools_handler(logging.getLogger(record.name))


def make_logs_readable(level: int = logging.INFO, *, routine: bool = True) -> None:
    """Print the embedded mode's own logs and every Powertools logger created so far readably;
    without `routine`, not the reconciler's per-run summaries (ROUTINE_MESSAGES).

    Powertools' formatter keeps building the structured record (its keys, the Lambda context);
    only its serializer changes, from JSON to one line. Call this after the handlers are imported:
    their Loggers are created at import.
    """
    from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

    root = logging.getLogger()
    if not any(isinstance(h.formatter, PlainFormatter) for h in root.handlers):
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(PlainFormatter())
        console.addFilter(_NotPowertools())
        root.addHandler(console)
    root.setLevel(level)
    for name in ("werkzeug", "botocore", "urllib3"):  # moto's server and AWS clients chatter at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    for logger in [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]:
        for handler in logger.handlers:
            if isinstance(handler.formatter, LambdaPowertoolsFormatter):
                handler.formatter.json_serializer = _serialize_readably
                if not any(isinstance(f, _FunctionByThread) for f in handler.filters):
                    handler.addFilter(_FunctionByThread())
                for old in [f for f in handler.filters if isinstance(f, _NoRoutine)]:
                    handler.removeFilter(old)
                if not routine:
                    handler.addFilter(_NoRoutine())
                # Both ways: lower to show INFO, and raise for --quiet (Powertools loggers start at INFO).
                logger.setLevel(level)


def _serialize_readably(log: Any) -> str:
    return render(dict(log)) if isinstance(log, dict) else str(log)
