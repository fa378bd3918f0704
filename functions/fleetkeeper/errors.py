"""Domain errors. Each carries the HTTP status it maps to; the api maps them in one place."""

from __future__ import annotations

from typing import Any, ClassVar


class FleetkeeperError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []

    def headers(self) -> dict[str, str]:
        """Response headers that go with this error (none but for a 503)."""
        return {}

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequest(FleetkeeperError):
    status = 400
    code = "invalid_request"


class Forbidden(FleetkeeperError):
    """The caller may see the service but not do this to it (or its request carries no identity)."""

    status = 403
    code = "forbidden"


class NotFound(FleetkeeperError):
    status = 404
    code = "not_found"


class Conflict(FleetkeeperError):
    status = 409
    code = "conflict"


class PreconditionFailed(FleetkeeperError):
    status = 412
    code = "precondition_failed"


class PayloadTooLarge(FleetkeeperError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(FleetkeeperError):
    status = 415
    code = "unsupported_media_type"


class IdempotencyMismatch(FleetkeeperError):
    """The same Idempotency-Key was sent again with a different request."""

    status = 422
    code = "idempotency_key_reused"


class RequestInProgress(FleetkeeperError):
    """A request with the same Idempotency-Key is still being processed."""

    status = 409
    code = "request_in_progress"


class ServiceUnavailable(FleetkeeperError):
    """DynamoDB was busy (a conflicting transaction, throttling): nothing was written; retry later."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: int = 1, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message, details=details)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}
