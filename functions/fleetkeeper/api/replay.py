"""Idempotency-Key replays: a write run once per key, its first answer kept and answered again.

Powertools' idempotency (through `ServiceCommands.idempotently`) keeps the record; this module
decides what the record holds (the request, its secrets only as their HMAC; the answer compressed)
and answers a replay byte for byte as the first answer.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import TYPE_CHECKING, Any

from fleetkeeper.api.replies import etag, json_reply, written_view

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetkeeper.api.routing import Reply
    from fleetkeeper.api.services import ServiceCommands, Written


def without_secret_values(body: Any) -> Any:
    """A request body as an Idempotency-Key record may keep it (hashed): secret values replaced by
    null (they count through their HMAC, `replayable`); the values themselves never reach a stored item."""
    if isinstance(body, dict) and isinstance(body.get("body"), dict):  # an update's {"body", "if_match"}
        return {**body, "body": without_secret_values(body["body"])}
    spec = body.get("spec") if isinstance(body, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("secrets"), dict):
        return body
    secrets: dict[str, Any] = spec["secrets"]
    return {**body, "spec": {**spec, "secrets": dict.fromkeys(secrets)}}


def replayable(
    commands: ServiceCommands,
    lambda_context: Any,
    operation: str,
    name: str,
    body: Any,
    execute: Callable[[], Written],
    *,
    key: str | None,
    status: int,
    secret_values: dict[str, str],
) -> Reply[Any]:
    """Run a write command (once per Idempotency-Key) and answer with the service view."""

    def run() -> dict[str, Any]:
        # What Powertools keeps as the record's result, and what a replay answers: the write's view
        # without replicas (so the record never grows with the replica count), as its JSON text
        # compressed. Text, because Powertools stores a cached dict with sorted keys, and a replay of
        # that would not be the first answer byte for byte; compressed, because Powertools stores it
        # with ASCII escapes, where a spec of 64 KiB of 4-byte characters would take 229 KB of the
        # 400 KB item (12 bytes per character, and every backslash doubled).
        written = execute()
        return {"view_z": pack(written_view(written)), "generation": written.state.service.generation}

    request: dict[str, Any] = {"operation": operation, "name": name, "body": without_secret_values(body)}
    if key is not None:
        # The same key with other secret values is another request: the values count, as their HMAC.
        request["secrets_hmac"] = commands.fingerprint_of_secrets(secret_values)
    result = commands.idempotently(key, request, run, lambda_context)
    # The first answer and a replay both answer the cached text parsed back: the same dict, keys
    # in the same order, so the router serializes them to the same bytes.
    return json_reply(status, unpack(result["view_z"]), {"ETag": etag(int(result["generation"]))})


def pack(view: dict[str, Any]) -> str:
    """A view as a record keeps it: its JSON text, compressed, as base64."""
    text = json.dumps(view, separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(zlib.compress(text.encode(), level=6)).decode()


def unpack(packed: str) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(packed)))
