"""The stack's key for fingerprinting secret values: an HMAC, so no stored fingerprint reveals them.

An Idempotency-Key record keeps a hash of the request it was first used with, so a replay can be
told from another request under the same key. A request's secret values must count (the same key
with other values is another request), but a plain hash of them in the table would let anyone who
can read the table test guesses of a low-entropy secret offline. So they enter the fingerprint as
HMAC-SHA256 under a key that is not in the table: 32 random bytes, a SecureString of Parameter
Store, `/fleetkeeper-api/<table>/request-hmac-key`, created by the first api invocation that needs
it (PutParameter without overwrite: of two cold starts at once, one creates it and the other reads
the winner's) and read once per execution environment. It is outside `/fleetkeeper/<table>/`, the
path replicas read their secrets under: only the api function's role may read it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetkeeper import aws
from fleetkeeper.settings import DEFAULT_STACK_ID

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetkeeper.settings import Settings

_KEY_BYTES = 32
_cache: dict[str, bytes] = {}
_lock = threading.Lock()


def key_parameter(table_name: str) -> str:
    return f"/fleetkeeper-api/{table_name}/request-hmac-key"


@dataclass(frozen=True)
class RequestHmac:
    """HMAC-SHA256 of secret values under the stack's key (fetched, or created, on first use).

    The parameter is encrypted with the stack's KMS key (`key_id`, as the versions' secrets are), whose
    key policy lets only the api function decrypt it; without one (embedded mode), the account's
    default key."""

    parameter: str
    key_id: str | None = None
    # Tagged on the key's parameter (`fleetkeeper:stack`), as on everything else the stack creates.
    stack_id: str = DEFAULT_STACK_ID

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestHmac:
        return cls(key_parameter(settings.table_name), settings.secrets_key_id, settings.stack_id)

    def digest(self, values: Mapping[str, str]) -> str:
        """The values' HMAC, hex: the same values (in any order) give the same digest."""
        text = json.dumps(dict(sorted(values.items())), separators=(",", ":"), ensure_ascii=False)
        return hmac.new(self._key(), text.encode(), hashlib.sha256).hexdigest()

    def _key(self) -> bytes:
        with _lock:
            key = _cache.get(self.parameter)
            if key is None:
                key = _cache[self.parameter] = self._fetch_or_create()
            return key

    def _fetch_or_create(self) -> bytes:
        ssm = aws.ssm()
        try:
            answer = ssm.get_parameter(Name=self.parameter, WithDecryption=True)
        except ssm.exceptions.ParameterNotFound:
            fresh = base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode()
            request: dict[str, Any] = {
                "Name": self.parameter,
                "Value": fresh,
                "Type": "SecureString",
                "Tier": "Standard",
                "Overwrite": False,
                "Description": "fleetkeeper api: the key of the HMAC of secret values in Idempotency-Key records",
                "Tags": [{"Key": "fleetkeeper:stack", "Value": self.stack_id}],
            }
            if self.key_id:
                request["KeyId"] = self.key_id
            try:
                ssm.put_parameter(**request)
            except ssm.exceptions.ParameterAlreadyExists:
                # Another execution environment created it first: use the winner's.
                answer = ssm.get_parameter(Name=self.parameter, WithDecryption=True)
            else:
                return base64.b64decode(fresh)
        return _checked_key(self.parameter, answer["Parameter"])


class RequestHmacKeyError(RuntimeError):
    """The key's parameter is not one this module made: a SecureString of 32 random bytes."""


def _checked_key(name: str, parameter: Mapping[str, Any]) -> bytes:
    """The key, once its parameter proves to be what the api creates: a SecureString (a plain String
    would have been written by someone else, with a value they know, letting whoever reads the table
    test guesses of secret values against its fingerprints) holding 32 bytes in base64. Anything else
    is refused, naming the parameter, so that an operator deletes it (the api then makes a new one)."""
    kind = parameter.get("Type")
    try:
        key = base64.b64decode(str(parameter.get("Value", "")), validate=True)
    except (ValueError, TypeError):
        key = b""
    if kind != "SecureString" or len(key) != _KEY_BYTES:
        raise RequestHmacKeyError(
            f"parameter {name} is not the api's key (a SecureString of {_KEY_BYTES} bytes in base64; "
            f"found a {kind} of {len(key)} bytes): delete it and the api makes a new one"
        )
    return key


def forget_keys() -> None:
    """Drop the cached keys (tests: a fresh moto account has none)."""
    with _lock:
        _cache.clear()
