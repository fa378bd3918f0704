"""The immediate reconciler kick after an api write. Best-effort: the schedule is the backstop.

In AWS the reconciler function is invoked asynchronously for the one service; in embedded mode a
loopback URL wakes the local reconciler loop. Neither may fail or slow an api request noticeably.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request

logger = logging.getLogger(__name__)

RECONCILER_FUNCTION_ENV = "RECONCILER_FUNCTION_NAME"
KICK_URL_ENV = "FLEETKEEPER_KICK_URL"


def kick_reconciler(name: str) -> None:
    payload = json.dumps({"service": name}).encode()
    try:
        function = os.environ.get(RECONCILER_FUNCTION_ENV)
        url = os.environ.get(KICK_URL_ENV)
        if function:
            from fleetkeeper import aws

            aws.lambda_().invoke(FunctionName=function, InvocationType="Event", Payload=payload)
        elif url:
            request = urllib.request.Request(
                url, data=payload, method="POST", headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=1):
                pass
    except Exception:  # a kick must never fail the write it follows
        logger.warning(
            "could not kick the reconciler for %s; the schedule will pick it up", name, exc_info=True
        )
