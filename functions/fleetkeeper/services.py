"""Service commands: what the api does, independent of HTTP routing.

Each command checks its input, writes target state through the store in one conditional write, and
kicks the reconciler (best-effort). Commands that carry an Idempotency-Key run through Powertools
idempotency, on the command rather than the handler, so a transient fault is never cached.

The store reports refusals as typed facts (fleetkeeper.store.errors); `_as_api_errors` is the one
place that turns them into the api's errors and the words a person reads. The status messages a
write leaves on the service are chosen here too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from fleetkeeper.errors import (
    Conflict,
    FleetkeeperError,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    RequestInProgress,
    ServiceUnavailable,
)
from fleetkeeper.model import Lifecycle, ServiceRecord, ServiceState, VersionState, to_iso, utcnow
from fleetkeeper.store.commands import VERSION_HISTORY_LIMIT
from fleetkeeper.store.errors import (
    Contention,
    Deleting,
    GenerationMismatch,
    MalformedPageToken,
    Raced,
    Recreated,
    ServiceExists,
    ServiceMissing,
    StoreError,
    UidCollision,
    VersionMissing,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig

    from fleetkeeper.model import VersionRecord
    from fleetkeeper.spec import ServiceSpec
    from fleetkeeper.store.commands import CommandStore
    from fleetkeeper.store.table import Table

# How many times a write without If-Match is tried when another writer moves the service under it.
_RACE_ATTEMPTS = 5
# How many times a command is tried when DynamoDB reports contention that a retry can outlast (a
# cancelled transaction's TransactionConflict, a torn read: nothing was written either way), with
# pauses of CONTENTION_PAUSE_SECONDS * 2**n between them. Throttling is not retried here: botocore
# already retried it 5 times (fleetkeeper.aws), and more attempts would only add to the load.
CONTENTION_ATTEMPTS = 3
CONTENTION_PAUSE_SECONDS = 0.05
# Retry-After (seconds) of the 503 a contention becomes: a conflict clears in milliseconds,
# throttling takes DynamoDB's capacity to catch up.
RETRY_AFTER_CONFLICT = 1
RETRY_AFTER_THROTTLED = 5
IDEMPOTENCY_TTL_SECONDS = 24 * 3600
DELETING_MESSAGE = "deleting: terminating every replica"

Kick = Callable[[str], None]
Command = Literal["get", "list", "versions", "create", "update", "rollback", "delete"]
T = TypeVar("T")


def _no_kick(_name: str) -> None:
    return None


@dataclass
class ServiceCommands:
    store: CommandStore
    kick: Kick = _no_kick
    now: Callable[[], str] = field(default=lambda: to_iso(utcnow()))
    sleep: Callable[[float], None] = time.sleep
    _idempotency: tuple[Callable[..., dict[str, Any]], IdempotencyConfig] | None = field(
        default=None, init=False, repr=False
    )

    # -- reads --

    def get(self, name: str) -> ServiceState:
        with _as_api_errors("get"):
            return self._contended(lambda: self.store.require(name))

    def list_page(self, *, limit: int, next_token: str | None) -> tuple[list[ServiceRecord], str | None]:
        with _as_api_errors("list"):
            return self._contended(lambda: self.store.list_services(limit=limit, next_token=next_token))

    def versions_page(
        self, name: str, *, limit: int, next_token: str | None
    ) -> tuple[ServiceRecord, list[VersionRecord], str | None]:
        """The service item and a page of its versions (oldest first)."""

        def read() -> tuple[ServiceRecord, list[VersionRecord], str | None]:
            service = self.store.service(name)
            versions, token = self.store.versions_page(service, limit=limit, next_token=next_token)
            return service, versions, token

        with _as_api_errors("versions"):
            return self._contended(read)

    # -- writes --

    def create(self, name: str, spec: ServiceSpec) -> ServiceState:
        _check_spec(name, spec, "creates")
        waiting = f"waiting for the reconciler to launch {spec.target_replicas} replica(s)"
        with _as_api_errors("create"):
            state = self._contended(
                lambda: self.store.create_service(name, spec, spec.update.mode, self.now(), status_message=waiting)
            )
        self.kick(name)
        return state

    def update(
        self, name: str, spec: ServiceSpec, *, mode: str | None, expected_generation: int | None
    ) -> ServiceState:
        _check_spec(name, spec, "updates")

        def add_version(state: ServiceState) -> ServiceState:
            return self.store.add_version(
                state, spec, mode or spec.update.mode, self.now(), expected_generation=expected_generation
            )

        with _as_api_errors("update"):
            return self._contended(lambda: self._write_on_latest(name, add_version))

    def rollback(self, name: str, version: int | None, *, expected_generation: int | None) -> ServiceState:
        def set_target(state: ServiceState) -> ServiceState | None:
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
                return None  # already there: nothing to write
            return self.store.set_target(state, target, self.now(), expected_generation=expected_generation)

        with _as_api_errors("rollback"):
            return self._contended(lambda: self._write_on_latest(name, set_target))

    def delete(self, name: str) -> ServiceState:
        def mark() -> ServiceState:
            state = self.store.require(name)
            return self.store.mark_deleting(state, self.now(), status_message=DELETING_MESSAGE)

        with _as_api_errors("delete"):
            deleted = self._contended(mark)
        self.kick(name)
        return deleted

    def _contended(self, command: Callable[[], T]) -> T:
        """Run `command` (reads, then at most one conditional write), again on a contention a retry
        can outlast: such a contention wrote nothing, and the retry re-reads before it writes."""
        for attempt in range(1, CONTENTION_ATTEMPTS + 1):
            try:
                return command()
            except Contention as exc:
                if exc.throttled or attempt == CONTENTION_ATTEMPTS:
                    raise
                self.sleep(CONTENTION_PAUSE_SECONDS * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _write_on_latest(self, name: str, write: Callable[[ServiceState], ServiceState | None]) -> ServiceState:
        """Read the ACTIVE service and `write` on it (None: nothing to write), then kick.

        A write that lost a race (Raced: another writer moved the service between our read and our
        write, and no If-Match pinned the generation) is tried again on a fresh read.
        """
        for attempt in range(1, _RACE_ATTEMPTS + 1):
            state = self._require_active(name)
            try:
                written = write(state)
            except Raced:
                if attempt == _RACE_ATTEMPTS:
                    raise
                continue
            if written is None:
                return state
            self.kick(name)
            return written
        raise AssertionError("unreachable")  # pragma: no cover

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
            IdempotencyPersistenceLayerError,
            IdempotencyValidationError,
        )

        if self._idempotency is None:
            self._idempotency = _idempotent_runner(self.store.table)
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
        except IdempotencyPersistenceLayerError as exc:
            # Powertools could not read or write its record (throttling past botocore's retries, a
            # conflict): the command did not run, or its result could not be kept. Retry the request.
            raise ServiceUnavailable(
                "the request's Idempotency-Key record could not be read or written; retry the request "
                "with the same key",
                retry_after=RETRY_AFTER_CONFLICT,
            ) from exc
        return result


# --- the store's facts, in the api's words -----------------------------------------------------------


@contextlib.contextmanager
def _as_api_errors(command: Command) -> Iterator[None]:
    try:
        yield
    except StoreError as exc:
        error = api_error(exc, command)
        if error is None:
            raise  # no words for it: an internal error, logged as such
        raise error from exc


def api_error(fact: StoreError, command: Command) -> FleetkeeperError | None:
    """The api's error for a fact the store reported while running `command`."""
    match fact:
        case ServiceMissing(name=name):
            return NotFound(f"service {name!r} does not exist")
        case ServiceExists(name=name, deleting=True):
            return Conflict(f"service {name!r} is still being deleted; create it again once it is gone")
        case ServiceExists(name=name):
            return Conflict(f"service {name!r} already exists; use PUT /v1/services/{name} to update it")
        case UidCollision(name=name):
            return Conflict(f"could not create {name!r} (incarnation id collision); retry the request")
        case Recreated(name=name) if command == "delete":
            return Conflict(f"service {name!r} was re-created while this request ran; retry to delete the new one")
        case Recreated(name=name):
            return Conflict(f"service {name!r} was deleted and re-created while this request ran; retry it")
        case Deleting(name=name):
            return Conflict(f"service {name!r} is being deleted; wait for it to go, then create it again")
        case GenerationMismatch(name=name, current=current, expected=expected):
            return PreconditionFailed(
                f"service {name!r} is at generation {current}, not {expected} "
                "(If-Match); fetch it again and retry with the current generation"
            )
        case Raced(name=name):
            return Conflict(f"service {name!r} was changed by another request at the same time; retry")
        case VersionMissing(name=name, version=version, latest=latest):
            return NotFound(
                f"service {name!r} has no version {version} (latest is {latest}; "
                f"the newest {VERSION_HISTORY_LIMIT} are kept)"
            )
        case Contention(throttled=True):
            return ServiceUnavailable(
                "the service's table is throttling requests; retry after the Retry-After seconds",
                retry_after=RETRY_AFTER_THROTTLED,
            )
        case Contention():
            return ServiceUnavailable(
                "another request was changing this service at the same moment; retry after the Retry-After seconds",
                retry_after=RETRY_AFTER_CONFLICT,
            )
        case MalformedPageToken(problem=problem):
            return InvalidRequest(
                "next_token is not a token this API issued; pass back `next_token` from the previous page as is",
                details=[{"field": "next_token", "problem": problem}],
            )
    return None


# --- input ---------------------------------------------------------------------------------------------


def _check_spec(name: str, spec: ServiceSpec, verb: str) -> None:
    """The spec of a create or update (already valid): named like the service, and launchable on EC2."""
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


def _previous_usable(state: ServiceState) -> int | None:
    """The default rollback target: the nearest version below the target that has not FAILED."""
    for number in range(state.service.target_version - 1, 0, -1):
        version = state.versions.get(number)
        if version is not None and version.state is not VersionState.FAILED:
            return number
    return None


def _idempotent_runner(table: Table) -> tuple[Callable[..., dict[str, Any]], IdempotencyConfig]:
    """The Powertools-wrapped executor for one table, built on first use (its import is not free)."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

    from fleetkeeper.store.idempotency import persistence_layer

    persistence = persistence_layer(table)
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
