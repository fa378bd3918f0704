"""Handlers' structured logs, printed one readable line each in embedded mode."""

from __future__ import annotations

import io
import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
from aws_lambda_powertools import Logger

from fleetkeeper.local.context import LocalContext
from fleetkeeper.local.readable_logs import make_logs_readable, render

if TYPE_CHECKING:
    pass


def test_a_powertools_record_becomes_one_line_with_the_function_and_its_keys(
    restore_root_logging: None,
) -> None:
    stream = io.StringIO()
    logger = Logger(service="fk-readable-test", stream=stream)

    @logger.inject_lambda_context
    def handler(event: dict[str, Any], context: Any) -> None:
        logger.info("launched replica", extra={"service_name": "web", "replica_id": 3, "reason": "scale up"})

    make_logs_readable()
    handler({}, LocalContext("ReconcilerFunction", 10))
    (line,) = stream.getvalue().splitlines()
    assert "INFO" in line and "ReconcilerFunction" in line and "launched replica" in line
    assert 'service_name=web replica_id=3 reason="scale up"' in line
    assert "cold_start" not in line and "{" not in line
    with pytest.raises(ValueError):
        json.loads(line)


def test_quiet_leaves_only_the_handlers_warnings_and_errors(restore_root_logging: None) -> None:
    stream = io.StringIO()
    logger = Logger(service="fk-readable-quiet", stream=stream, level="INFO")  # as a handler's logger is
    make_logs_readable(logging.WARNING)  # `fleetkeeper local --quiet`
    logger.info("steady state")
    logger.warning("replica 2 failed its probe")
    (line,) = stream.getvalue().splitlines()
    assert "replica 2 failed its probe" in line


def test_exceptions_keep_their_traceback(restore_root_logging: None) -> None:
    stream = io.StringIO()
    logger = Logger(service="fk-readable-test-2", stream=stream)
    make_logs_readable()
    try:
        raise RuntimeError("probe exploded")
    except RuntimeError:
        logger.exception("run failed")
    text = stream.getvalue()
    assert text.splitlines()[0].endswith("run failed")
    assert "Traceback" in text and "RuntimeError: probe exploded" in text


def test_render_shows_non_string_messages_and_values_as_json(restore_root_logging: None) -> None:
    line = render({"level": "WARNING", "message": {"a": 1}, "counts": [1, 2], "function_name": "CleanupFunction"})
    assert "WARNING" in line and "CleanupFunction" in line
    assert '{"a": 1}' in line and "counts=[1, 2]" in line


def test_the_logging_thread_names_the_function_when_handlers_share_a_logger(
    restore_root_logging: None,
) -> None:
    import threading

    stream = io.StringIO()
    logger = Logger(service="fk-readable-test-3", stream=stream)

    @logger.inject_lambda_context
    def api(event: dict[str, Any], context: Any) -> None:
        logger.info("api ran")

    make_logs_readable()
    api({}, LocalContext("ApiFunction", 10))  # leaves function_name=ApiFunction on the shared logger
    worker = threading.Thread(target=lambda: logger.info("cleaned up"), name="CleanupFunction")
    worker.start()
    worker.join()
    first, second = stream.getvalue().splitlines()
    assert "ApiFunction" in first
    assert "CleanupFunction" in second and "ApiFunction" not in second


def test_rendered_records_carry_no_terminal_escapes() -> None:
    line = render({"level": "INFO", "message": "\x1b[2Jgone\x1b]0;title\x07", "detail": "a\x1b[1Ab"}, "x")
    assert "\x1b" not in line and "\x07" not in line
    assert line.endswith("  gone  detail=ab"), line
    assert render({"message": "m", "exception": "Traceback\n  line\x9b2J"}).endswith("m\nTraceback\n  line")
