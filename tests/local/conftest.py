"""Fixtures the embedded mode's tests share."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    """make_logs_readable changes process-wide logging: put it all back for the tests that follow."""
    from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    levels = {logger: logger.level for logger in loggers}
    serializers = {
        handler.formatter: handler.formatter.json_serializer
        for logger in loggers
        for handler in logger.handlers
        if isinstance(handler.formatter, LambdaPowertoolsFormatter)
    }
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for logger, previous in levels.items():
        logger.setLevel(previous)
    for formatter, serializer in serializers.items():
        formatter.json_serializer = serializer
