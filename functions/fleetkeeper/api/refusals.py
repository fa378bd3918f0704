"""Requests refused before any route runs: a body that is not JSON, over 64 KiB, not UTF-8, or
nested deeper than the parser's stack. They need none of the commands (nothing is built for them),
and are answered as a routed refusal is (fleetkeeper.api.error_replies).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from typing import TYPE_CHECKING, Any

from fleetkeeper.api.error_replies import domain_error, not_json
from fleetkeeper.api.routing import header, is_json
from fleetkeeper.errors import InvalidRequest, PayloadTooLarge

if TYPE_CHECKING:
    from fleetkeeper.errors import FleetkeeperError

MAX_BODY_BYTES = 64 * 1024


def refuse_body(event: dict[str, Any]) -> dict[str, Any] | None:
    """A 415 for a body that is not JSON, 413 over 64 KiB, 400 not UTF-8: before any parsing."""
    raw = (event.get("body") or "").encode()
    if event.get("isBase64Encoded"):
        with contextlib.suppress(binascii.Error, ValueError):  # not base64 after all: measure it as sent
            raw = base64.b64decode(raw, validate=False)
    error: FleetkeeperError | None = None
    content_type = header(event, "Content-Type")
    if raw.strip() and content_type and not is_json(content_type):
        error = not_json(content_type)
    elif len(raw) > MAX_BODY_BYTES:
        error = PayloadTooLarge(f"request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES} (64 KiB)")
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            error = InvalidRequest(
                "request body is not UTF-8 text; send JSON",
                details=[{"field": "body", "problem": "not UTF-8"}],
            )
        else:
            error = _too_deep(text)
    if error is None:
        return None
    return error_response(error)


def error_response(error: FleetkeeperError) -> dict[str, Any]:
    """A refusal answered before any route runs, as a routed one is answered."""
    return domain_error(error).to_proxy()


def _too_deep(text: str) -> InvalidRequest | None:
    """A 400 for JSON nested deeper than the parser's stack ("[[[[..." within 64 KiB): Python's
    json raises RecursionError for it, which would be let out as a 500. Other invalid JSON is left
    to the router's validation (a 400 naming the body)."""
    if not text.strip():
        return None
    try:
        json.loads(text)
    except RecursionError:
        return InvalidRequest(
            "request body is JSON nested too deeply; a spec needs a few levels",
            details=[{"field": "body", "problem": "nested too deeply"}],
        )
    except ValueError:
        return None
    return None
