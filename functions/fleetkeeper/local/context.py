"""A Lambda context object for handlers invoked in-process by the embedded mode."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fleetkeeper.local.template import resource

DEFAULT_TIMEOUT_SECONDS = 3  # Lambda's own default when neither the function nor Globals set one


class LocalContext:
    """What a handler may read from its context: names, a request id and the time left."""

    def __init__(self, function_name: str, timeout_seconds: float, memory_mb: int = 512) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def function_timeout(template: dict[str, Any], logical_id: str) -> int:
    """The function's Timeout as template.yaml sets it (its own, else Globals, else Lambda's default)."""
    try:
        own = resource(template, logical_id).get("Properties", {}).get("Timeout")
    except KeyError:
        own = None
    if isinstance(own, int):
        return own
    shared = template.get("Globals", {}).get("Function", {}).get("Timeout")
    return shared if isinstance(shared, int) else DEFAULT_TIMEOUT_SECONDS
