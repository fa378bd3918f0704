"""Service commands: what the api does, independent of HTTP.

Each command validates, writes target state through the store in one conditional write, and kicks
the reconciler (best-effort). Commands that carry an Idempotency-Key run through Powertools
idempotency, on the command rather than the handler, so a transient fault is never cached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from fleetkeeper.errors import Conflict, IdempotencyMismatch, InvalidRequest, RequestInProgress
from fleetkeeper.model import (
    Lifecycle,
    ServiceRecord,
    ServiceState,
    VersionState,
    to_iso,
    utcnow,
)
from fleetkeeper.spec import parse_spec
from fleetkeeper.store import Raced

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig

    from fleetkeeper.spec import ServiceSpec
    from fleetkeeper.store import Store

# How often an update without If-Match is retried when another writer moved the service under it.
_RACE_RETRIES = 5
IDEMPOTENCY_TTL_SECONDS = 24 * 3600
IDEMPOTENCY_PARTITION = "IDEMPOTENCY#api"

Kick = Callable[[str], None]


def _no_kick(_name: str) -> None:
    return None


@dataclass
class ServiceCommands:
    store: Store
    kick: Kick = _no_kick
    now: Callable[[], str] = field(default=lambda: to_iso(utcnow()))
    _idempotency: tuple[Callable[..., dict[str, Any]], IdempotencyConfig] | None = field(
        default=None, init=False, repr=False
    )

    # -- reads --

    def get(self, name: str) -> ServiceState:
        return self.store.require(name)

    def list_page(self, *, limit: int, next_token: str | None) -> tuple[list[ServiceRecord], str | None]:
        return self.store.list_services(limit=limit, next_token=next_token)

    # -- writes --

    def create(self, name: str, spec_data: Any) -> ServiceState:
        spec = _valid_spec(name, spec_data, "creates")
        state = self.store.create_service(name, spec, spec.update.mode, self.now())
        self.kick(name)
        return state

    def update(self, name: str, spec_data: Any, *, mode: str | None, expected_generation: int | None) -> ServiceState:
        spec = _valid_spec(name, spec_data, "updates")
        for attempt in range(_RACE_RETRIES):
            state = self._require_active(name)
            try:
                updated = self.store.add_version(
                    state, spec, mode or spec.update.mode, self.now(), expected_generation=expected_generation
                )
            except Raced:
                if attempt == _RACE_RETRIES - 1:
                    raise
                continue
            self.kick(name)
            return updated
        raise AssertionError("unreachable")  # pragma: no cover

    def rollback(self, name: str, version: int | None, *, expected_generation: int | None) -> ServiceState:
        for attempt in range(_RACE_RETRIES):
            state = self._require_active(name)
            target = version if version is not None else _previous_usable(state)
            if target is None or target < 1:
                raise InvalidRequest(
                    f"service {name!r} is at version {state.service.target_version}: there is no earlier "
                    "version to roll back to (versions the circuit breaker failed are skipped)",
                    details=[{"field": "version", "problem": "no usable version before the target"}],
                )
            chosen = state.versions.get(target)
            if chosen is not None and chosen.state is VersionState.FAILED:
                # Rolling onto a version the breaker gave up on would stop every replica.
                raise Conflict(
                    f"version {target} of {name!r} failed ({chosen.state_message}); roll back to another "
                    "version or PUT a new one",
                    details=[{"field": "version", "problem": "that version FAILED"}],
                )
            if target == state.service.target_version:
                return state  # already there: nothing to write
            try:
                updated = self.store.set_target(state, target, self.now(), expected_generation=expected_generation)
            except Raced:
                if attempt == _RACE_RETRIES - 1:
                    raise
                continue
            self.kick(name)
            return updated
        raise AssertionError("unreachable")  # pragma: no cover

    def delete(self, name: str) -> ServiceState:
        state = self.store.require(name)
        deleted = self.store.mark_deleting(state, self.now())
        self.kick(name)
        return deleted

    def _require_active(self, name: str) -> ServiceState:
        state = self.store.require(name)
        if state.service.lifecycle is Lifecycle.DELETING:
            raise Conflict(f"service {name!r} is being deleted; it can no longer be changed")
        return state

    # -- idempotency --

    def idempotently(
        self,
        key: str | None,
        request: dict[str, Any],
        execute: Callable[[], dict[str, Any]],
        lambda_context: Any = None,
    ) -> dict[str, Any]:
        """Run `execute` once per Idempotency-Key; a replay returns the first result.

        `request` (operation, name, body) is what a replay must match; the same key with another
        request is refused. Without a key nothing but the service's own items is written.
        """
        if key is None:
            return execute()
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyAlreadyInProgressError,
            IdempotencyValidationError,
        )

        if self._idempotency is None:
            self._idempotency = _idempotent_runner(self.store)
        runner, config = self._idempotency
        if lambda_context is not None:
            # Lets Powertools expire an in-progress record when this invocation times out.
            config.register_lambda_context(lambda_context)
        try:
            result: dict[str, Any] = runner(command={"key": key, "request": request}, execute=execute)
        except IdempotencyValidationError as exc:
            raise IdempotencyMismatch(
                "this Idempotency-Key was already used for a different request; use a new key for a new request",
                details=[{"field": "Idempotency-Key", "problem": "reused with another request"}],
            ) from exc
        except IdempotencyAlreadyInProgressError as exc:
            raise RequestInProgress(
                "a request with this Idempotency-Key is still in progress; retry in a moment"
            ) from exc
        return result


def _valid_spec(name: str, spec_data: Any, verb: str) -> ServiceSpec:
    """The spec of a create or update: valid, named like the service, and launchable on EC2."""
    spec = parse_spec(spec_data)
    if spec.name is not None and spec.name != name:
        raise InvalidRequest(
            f"spec.name is {spec.name!r} but the request {verb} {name!r}; make them match or drop spec.name",
            details=[{"field": "spec.name", "problem": f"does not match name {name!r}"}],
        )
    from fleetkeeper.reconciler.userdata import USER_DATA_LIMIT, user_data

    size = len(user_data(spec))
    if size > USER_DATA_LIMIT:
        # EC2 would refuse every launch of it: refuse it here, where the user can still act.
        raise InvalidRequest(
            f"spec.setup and spec.run make {size} bytes of instance user data even compressed; EC2 takes "
            f"at most {USER_DATA_LIMIT}: move the bulk into a script the image or `setup` fetches",
            details=[{"field": "spec.setup", "problem": "too large"}, {"field": "spec.run", "problem": "too large"}],
        )
    return spec


def _previous_usable(state: ServiceState) -> int | None:
    """The default rollback target: the nearest version below the target that has not FAILED."""
    for number in range(state.service.target_version - 1, 0, -1):
        version = state.versions.get(number)
        if version is not None and version.state is not VersionState.FAILED:
            return number
    return None


def _idempotent_runner(store: Store) -> tuple[Callable[..., dict[str, Any]], IdempotencyConfig]:
    """The Powertools-wrapped executor for one store, built on first use (its import is not free)."""
    from aws_lambda_powertools.utilities.idempotency import (
        DynamoDBPersistenceLayer,
        IdempotencyConfig,
        idempotent_function,
    )

    persistence = DynamoDBPersistenceLayer(
        table_name=store.table_name,
        key_attr="PK",
        sort_key_attr="SK",
        static_pk_value=IDEMPOTENCY_PARTITION,
        expiry_attr="expiration",
        boto3_client=store.client,
    )
    config = IdempotencyConfig(
        event_key_jmespath="key",
        payload_validation_jmespath="request",
        raise_on_no_idempotency_key=True,
        expires_after_seconds=IDEMPOTENCY_TTL_SECONDS,
    )

    @idempotent_function(data_keyword_argument="command", persistence_store=persistence, config=config)
    def run(command: dict[str, Any], execute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        return execute()

    return cast("Callable[..., dict[str, Any]]", run), config
