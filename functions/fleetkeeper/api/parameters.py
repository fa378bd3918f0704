"""The api's path and header parameters, and how the headers' values are read.

A path parameter that does not match its declaration is refused by the router's validation and
answered by `fleetkeeper.api.error_replies.validation_error` with the api's own words for it
(`invalid_name`). The headers are declared as text and read here, so their refusals say what the
header must look like.
"""

from __future__ import annotations

from typing import Annotated

from fleetkeeper.api.models import MAX_CLIENT_INTEGER
from fleetkeeper.api.routing import Header, Path
from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec.service import NAME_PATTERN, NAME_RULE

ServiceNameParam = Annotated[str, Path(pattern=NAME_PATTERN, description="the service's name")]
ReplicaIdParam = Annotated[
    int, Path(ge=0, le=MAX_CLIENT_INTEGER, description="the replica's id (`fleetkeeper status NAME` lists them)")
]
IfMatchHeader = Annotated[
    str | None,
    Header(
        alias="If-Match",
        description='the generation (ETag) the write expects, e.g. 7 or "7"; absent or * for any',
    ),
]
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="1 to 255 characters; a replay within 24 h returns the first response",
    ),
]


def invalid_name(name: object) -> InvalidRequest:
    """The refusal of a service name that is not one (what a name must look like)."""
    return InvalidRequest(
        f"service name {name!r} is invalid: use {NAME_RULE}",
        details=[{"field": "name", "problem": f"not {NAME_RULE}"}],
    )


_MAX_CLIENT_DIGITS = len(str(MAX_CLIENT_INTEGER))


def expected_generation(raw: str | None) -> int | None:
    """If-Match as a generation number; None for any generation.

    ASCII digits only (str.isdigit() also takes "¹" and "٣", which int() refuses or reads as
    another digit), at most MAX_CLIENT_INTEGER: checked by length before int() ever sees it, so
    neither Python's 4,300-digit limit nor DynamoDB's 38 digits can turn it into a 500.
    """
    if raw is None or raw.strip() in {"", "*"}:
        return None
    text = raw.strip().removeprefix("W/").strip('"')
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    if not (text.isascii() and text.isdigit()):
        raise InvalidRequest(
            f'If-Match must be the service\'s generation as a number (e.g. 7 or "7"), got {shown!r}',
            details=[{"field": "If-Match", "problem": "not a generation number"}],
        )
    if len(text.lstrip("0")) > _MAX_CLIENT_DIGITS or int(text) > MAX_CLIENT_INTEGER:
        raise InvalidRequest(
            f"If-Match must be a generation of at most {MAX_CLIENT_INTEGER}, got {shown!r}",
            details=[{"field": "If-Match", "problem": f"greater than {MAX_CLIENT_INTEGER}"}],
        )
    return int(text)


def idempotency_key_of(raw: str | None) -> str | None:
    """The Idempotency-Key header's key (surrounding spaces dropped); None without the header."""
    if raw is None:
        return None
    key = raw.strip()
    if not 1 <= len(key) <= 255:
        raise InvalidRequest(
            "Idempotency-Key must be 1 to 255 characters",
            details=[{"field": "Idempotency-Key", "problem": "empty or too long"}],
        )
    return key
