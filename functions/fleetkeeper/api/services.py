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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from fleetkeeper import service_events
from fleetkeeper.errors import (
    Conflict,
    FleetkeeperError,
    Forbidden,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    RequestInProgress,
    ServiceUnavailable,
)
from fleetkeeper.model import Lifecycle, ServiceRecord, ServiceState, VersionState, from_iso, to_iso, utcnow
from fleetkeeper.owners.access import MAX_GRANTS, SYSTEM, Caller, changed_access, describe_change
from fleetkeeper.store import keys
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
    from datetime import datetime

    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig

    from fleetkeeper.api.request_hmac import RequestHmac
    from fleetkeeper.choices import UpdateMode
    from fleetkeeper.model import AccessGrant, VersionRecord
    from fleetkeeper.replicas.secrets import SecretStore
    from fleetkeeper.replicas.workdirs import Upload, WorkdirStore
    from fleetkeeper.service_events import EventRecord
    from fleetkeeper.spec.service import ServiceSpec
    from fleetkeeper.store.commands import CommandStore
    from fleetkeeper.store.table import Table

logger = logging.getLogger(__name__)

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
# An endpoint's requests a second per bucket: (its metric's dimensions, start, end, bucket seconds) ->
# [(bucket start, rate)], oldest first (fleetkeeper.reconciler.metrics.request_series on a CloudWatch client).
RateReader = Callable[[tuple[tuple[str, str], ...], "datetime", "datetime", int], list[tuple["datetime", float]]]
Command = Literal[
    "get", "list", "versions", "events", "create", "update", "rollback", "delete", "access", "terminate a replica"
]
T = TypeVar("T")


def _no_kick(_name: str) -> None:
    return None


def rate_reader() -> RateReader:
    """The endpoints' request rates from this deployment's CloudWatch (client made on first use)."""

    def read(
        dimensions: tuple[tuple[str, str], ...], start: datetime, end: datetime, period: int
    ) -> list[tuple[datetime, float]]:
        from fleetkeeper import aws
        from fleetkeeper.reconciler.metrics import request_series

        return request_series(aws.cloudwatch(), dimensions, start, end, period)

    return read


@dataclass(frozen=True)
class Written:
    """A write's answer: the service as it now is, and whether this request changed it (an update
    identical to the target changes nothing: no version, no generation, no kick)."""

    state: ServiceState
    changed: bool = True


@dataclass
class ServiceCommands:
    store: CommandStore
    kick: Kick = _no_kick
    # Where secret values and packed workdirs go (fleetkeeper.replicas.secrets, fleetkeeper.replicas.workdirs);
    # None: this deployment has no such store, and specs that need one are refused.
    secrets: SecretStore | None = None
    workdirs: WorkdirStore | None = None
    now: Callable[[], str] = field(default=lambda: to_iso(utcnow()))
    sleep: Callable[[float], None] = time.sleep
    # The stack's region: a spec's `region` must be it (replicas run in the stack's subnets). None:
    # not known (a test, the CLI's dry checks): not checked.
    region: str | None = None
    # Who the request acts as (fleetkeeper.owners.access): the api handler sets the request's caller.
    caller: Caller = SYSTEM
    # The HMAC of secret values in an Idempotency-Key record's fingerprint (fleetkeeper.api.request_hmac);
    # None: no key store (a request with secrets is refused anyway: there is no secret store).
    fingerprint: RequestHmac | None = None
    # The endpoints' request rates (GET .../metrics) and the bucket they are read in: the autoscaler's
    # window (settings.metric_window_seconds). None: this deployment reads none (answered empty).
    request_rates: RateReader | None = None
    metric_period_seconds: int = 60
    # Replicas are local processes (embedded mode): a spec's accelerators are simulated, and a GET says so.
    simulated_accelerators: bool = False
    _idempotency: tuple[Callable[..., dict[str, Any]], IdempotencyConfig] | None = field(
        default=None, init=False, repr=False
    )

    # -- reads --

    def get(self, name: str) -> ServiceState:
        def read() -> ServiceState:
            state = self.store.require(name)
            self._readable(state.service)
            return state

        with _as_api_errors("get"):
            return self._contended(read)

    def list_page(self, *, limit: int, next_token: str | None) -> tuple[list[ServiceRecord], str | None]:
        """A page of the services the caller may read (fleetkeeper.store.reads says how pages stay
        correct when most services are another team's)."""
        visible = None if self.caller.admin else self.caller.may_read
        with _as_api_errors("list"):
            return self._contended(
                lambda: self.store.list_services(limit=limit, next_token=next_token, visible=visible)
            )

    def versions_page(
        self, name: str, *, limit: int, next_token: str | None
    ) -> tuple[ServiceRecord, list[VersionRecord], str | None]:
        """The service item and a page of its versions (oldest first)."""

        def read() -> tuple[ServiceRecord, list[VersionRecord], str | None]:
            service = self._readable(self.store.service(name))
            versions, token = self.store.versions_page(service, limit=limit, next_token=next_token)
            return service, versions, token

        with _as_api_errors("versions"):
            return self._contended(read)

    def events_page(self, name: str, *, limit: int, next_token: str | None) -> tuple[list[EventRecord], str | None]:
        """A page of the service's newest events, newest first (expired ones skipped)."""

        def read() -> tuple[list[EventRecord], str | None]:
            service = self._readable(self.store.service(name))
            now_epoch = int(from_iso(self.now()).timestamp())
            return self.store.events_page(service, limit=limit, next_token=next_token, now_epoch=now_epoch)

        with _as_api_errors("events"):
            return self._contended(read)

    def request_rate_series(self, name: str, *, minutes: int) -> tuple[ServiceState, list[tuple[datetime, float]]]:
        """The service (if the caller may read it) and its endpoint's requests a second over the last
        `minutes`, one point per metric period with a data point, oldest first; none without an endpoint."""
        state = self.get(name)
        endpoint = state.service.endpoint
        if endpoint is None or not endpoint.dimensions or self.request_rates is None:
            return state, []
        period = self.metric_period_seconds
        now = from_iso(self.now()).timestamp()
        # Buckets start on the period, as CloudWatch's do; the current (partial) one is included.
        end = (int(now) // period + 1) * period
        start = end - max(minutes * 60 // period, 1) * period
        from datetime import UTC
        from datetime import datetime as moment

        begin, finish = moment.fromtimestamp(start, UTC), moment.fromtimestamp(end, UTC)
        try:
            return state, self.request_rates(endpoint.dimensions, begin, finish, period)
        except Exception as exc:  # CloudWatch throttled or failed: the metric is not the service's state
            logger.warning("reading the request rates of %s failed: %s", name, exc)
            raise ServiceUnavailable(
                f"could not read {name}'s request rates from CloudWatch ({type(exc).__name__}); retry later",
                retry_after=RETRY_AFTER_THROTTLED,
            ) from exc

    # -- writes --

    def create(self, name: str, spec: ServiceSpec, owner: str | None = None) -> ServiceState:
        """A new service (its version 1), owned by `owner`: by default the caller's principal (what the
        api passes); the system and tests may name another."""
        owner = self.caller.principal if owner is None else owner
        _check_spec(name, spec, "creates", self.region)
        waiting = f"waiting for the reconciler to launch {spec.target_replicas} replica(s)"
        # The incarnation's uid is chosen here: its workdir copy and secrets are stored under it
        # before the transaction that makes the service exist.
        uid = keys.new_uid()
        stored = spec.without_secret_values()
        try:
            self._adopt_workdir(spec, name, uid, owner)
            ref, _ = self._store_secrets(spec, name, uid, reuse=None, owner=owner)
            with _as_api_errors("create"), self._unseen_name(name):
                state = self._contended(
                    lambda: self.store.create_service(
                        name,
                        stored,
                        spec.update.mode,
                        self.now(),
                        status_message=waiting,
                        uid=uid,
                        secrets_ref=ref,
                        owner=owner,
                    )
                )
        except BaseException:
            # No service item: no cleanup will ever come for this uid. Undo what was stored for it.
            self._forget_incarnation(name, uid, owner)
            raise
        self.kick(name)
        return state

    def workdir_upload(self, digest: str, size: int, service: str | None) -> Upload | None:
        """Where to upload a packed workdir (None: stored already, for this service or recently)."""
        store = self._workdir_store()
        uid, owner = None, ""
        if service is not None:
            with _as_api_errors("get"), contextlib.suppress(ServiceMissing):  # a new service: nothing stored
                found = self._contended(lambda: self.store.service(service))
                # What the service stores is told only to who may read it; to anyone else the
                # answer is a new service's (an upload), so it tells nothing of another team's.
                if self.caller.may_read(found):
                    uid, owner = found.uid, found.owner
        return store.upload(digest, size, service, uid, owner)

    def update(
        self, name: str, spec: ServiceSpec, *, mode: UpdateMode | None, expected_generation: int | None
    ) -> Written:
        """A new version, unless the spec (workdir digest and secret values included) is the target's:
        then nothing is written, as `kubectl apply` of an unchanged object."""
        _check_spec(name, spec, "updates", self.region)
        stored = spec.without_secret_values()
        # The secrets ref of the first attempt (a retry after a lost race keeps it), and whether this
        # request created its parameter (to delete it if no version ever names it).
        secrets: dict[str, tuple[str | None, bool]] = {}

        def add_version(state: ServiceState) -> ServiceState | None:
            if expected_generation is not None and expected_generation != state.service.generation:
                raise PreconditionFailed(_stale(name, state.service.generation, expected_generation))
            target = state.target
            same_values = self._same_secrets(spec, state)
            if target is not None and same_values and _unchanged(target, stored):
                return None
            uid, owner = state.service.uid, state.service.owner
            self._adopt_workdir(spec, name, uid, owner)
            if "ref" not in secrets:
                reuse = target.secrets_ref if target is not None and same_values else None
                secrets["ref"] = self._store_secrets(spec, name, uid, reuse=reuse, owner=owner)
            updated = self.store.add_version(
                state,
                stored,
                mode or spec.update.mode,
                self.now(),
                expected_generation=expected_generation,
                secrets_ref=secrets["ref"][0],
            )
            self._forget_pruned(state, updated)
            return updated

        try:
            with _as_api_errors("update"):
                state, changed = self._contended(lambda: self._write_on_latest(name, add_version, "updating it"))
        except BaseException:
            ref, created = secrets.get("ref", (None, False))
            if ref is not None and created and self.secrets is not None:
                with contextlib.suppress(Exception):
                    service = self.store.service(name)
                    self.secrets.delete(name, service.uid, [ref], service.owner)
            raise
        return Written(state, changed)

    def rollback(self, name: str, version: int | None, *, expected_generation: int | None) -> Written:
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
                    f"version (`fleetkeeper rollback {name} --to N`) or roll out a new one "
                    f"(`fleetkeeper update {name} SPEC.yaml`)",
                    details=[{"field": "version", "problem": "that version FAILED"}],
                )
            if target == state.service.target_version:
                return None  # already there: nothing to write
            return self.store.set_target(state, target, self.now(), expected_generation=expected_generation)

        with _as_api_errors("rollback"):
            return Written(*self._contended(lambda: self._write_on_latest(name, set_target, "rolling it back")))

    def delete(self, name: str) -> Written:
        def mark() -> Written:
            state = self.store.require(name)
            self._writable(state.service, "deleting it")
            deleting = self.store.mark_deleting(state, self.now(), status_message=DELETING_MESSAGE)
            return Written(deleting, deleting.service.generation != state.service.generation)

        with _as_api_errors("delete"):
            deleted = self._contended(mark)
        self.kick(name)
        return deleted

    def terminate_replica(self, name: str, replica_id: int) -> tuple[ServiceState, bool]:
        """Ask for one replica to go (SkyPilot's `sky serve down NAME --replica-id N`): the reconciler
        drains and terminates it, and launches its replacement as for any replica that goes. Returns the
        service (the replica as written) and whether anything was written: a replica already asked
        for, or already leaving, is left as it is."""
        from fleetkeeper.reconciler.plan.lifecycle import LEAVING

        def write() -> tuple[ServiceState, bool]:
            for attempt in range(1, _RACE_ATTEMPTS + 1):
                state = self._require_active(name, "terminating one of its replicas")
                record = state.replicas.get(replica_id)
                if record is None:
                    ids = ", ".join(str(r) for r in sorted(state.replicas)) or "none"
                    raise NotFound(
                        f"service {name!r} has no replica {replica_id} (its replicas: {ids}); "
                        f"see `fleetkeeper status {name}`",
                        details=[{"field": "path parameter replica_id", "problem": f"no replica {replica_id}"}],
                    )
                if record.terminate_requested_at is not None or record.status in LEAVING:
                    return state, False
                try:
                    written = self.store.request_termination(
                        state.service, record, self.now(), by=self.caller.principal
                    )
                except Raced:
                    if attempt == _RACE_ATTEMPTS:
                        raise
                    continue
                return replace(state, replicas={**state.replicas, replica_id: written}), True
            raise AssertionError("unreachable")  # pragma: no cover

        with _as_api_errors("terminate a replica"):
            terminated = self._contended(write)
        if terminated[1]:
            self.kick(name)
        return terminated

    def change_access(self, name: str, add: list[AccessGrant], remove: list[str]) -> tuple[ServiceRecord, bool]:
        """Grant (`add`: a principal already named takes the new mode) and revoke (`remove`) access
        to the service: an owner's write, recorded as an AccessChanged event in the same transaction.
        Returns the service and whether anything changed."""
        both = {g.principal for g in add} & set(remove)
        if both:
            raise InvalidRequest(
                f"{sorted(both)[0]} is both added and removed; do one or the other",
                details=[{"field": "remove", "problem": "also in add"}],
            )

        def write() -> tuple[ServiceRecord, bool]:
            for attempt in range(1, _RACE_ATTEMPTS + 1):
                service = self._writable(self.store.service(name), "changing who may access it")
                if service.lifecycle is Lifecycle.DELETING:
                    raise Conflict(f"service {name!r} is being deleted; it can no longer be changed")
                access = changed_access(service.access, add, remove)
                if len(access) > MAX_GRANTS:
                    raise InvalidRequest(
                        f"service {name!r} would name {len(access)} principals; at most {MAX_GRANTS}: "
                        "grant a pattern (e.g. arn:aws:iam::ACCOUNT:role/team-a-*) rather than each role",
                        details=[{"field": "add", "problem": f"more than {MAX_GRANTS} grants"}],
                    )
                changes = describe_change(service.access, access)
                if not changes:
                    return service, False
                event = service_events.access_changed(self.caller.principal, changes)
                try:
                    return self.store.set_access(service, access, self.now(), event=event), True
                except Raced:
                    if attempt == _RACE_ATTEMPTS:
                        raise
            raise AssertionError("unreachable")  # pragma: no cover

        with _as_api_errors("access"):
            return self._contended(write)

    # -- who may --

    @contextlib.contextmanager
    def _unseen_name(self, name: str) -> Iterator[None]:
        """A create of a name another team's service holds: the name is taken (a create cannot do
        otherwise), but nothing of that service is told, not even how to change it."""
        try:
            yield
        except ServiceExists as exc:
            if exc.existing is None or self.caller.may_read(exc.existing):
                raise
            raise Conflict(
                f"the name {name!r} is taken by a service you may not see; choose another name",
                details=[{"field": "name", "problem": "taken"}],
            ) from exc

    def fingerprint_of_secrets(self, values: dict[str, str]) -> str | None:
        """What an Idempotency-Key record's fingerprint holds of a request's secret values: their
        HMAC under the stack's key (fleetkeeper.api.request_hmac), never the values or a plain hash."""
        if not values:
            return None
        if self.fingerprint is None:
            self._secret_store()  # refused as the command itself would refuse it: no secret store
            raise AssertionError("a deployment with a secret store has a fingerprint key")  # pragma: no cover
        return self.fingerprint.digest(values)

    def _readable(self, service: ServiceRecord) -> ServiceRecord:
        """`service`, if the caller may read it; else it does not exist for the caller (ServiceMissing:
        the very answer an unknown name gets)."""
        if not self.caller.may_read(service):
            raise ServiceMissing(service.name)
        return service

    def _writable(self, service: ServiceRecord, doing: str) -> ServiceRecord:
        """`service`, if the caller may change it: NotFound as `_readable` if it may not even read it,
        Forbidden naming what is missing if it may only read it."""
        self._readable(service)
        if not self.caller.may_write(service):
            name, who = service.name, self.caller.principal
            granter = f"its owner ({service.owner})" if service.owner else "an administrator"
            raise Forbidden(
                f"{who} may read service {name!r} but not change it: {doing} needs write access to "
                f"service {name}; {granter} or one with write access can grant it: "
                f"`fleetkeeper access {name} --add {who}`",
                details=[{"field": "access", "problem": f"write access to service {name}"}],
            )
        return service

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

    def _write_on_latest(
        self, name: str, write: Callable[[ServiceState], ServiceState | None], doing: str
    ) -> tuple[ServiceState, bool]:
        """Read the ACTIVE service and `write` on it (None: nothing to write), then kick.
        Returns the service and whether it was written.

        A write that lost a race (Raced: another writer moved the service between our read and our
        write, and no If-Match pinned the generation) is tried again on a fresh read.
        """
        for attempt in range(1, _RACE_ATTEMPTS + 1):
            state = self._require_active(name, doing)
            try:
                written = write(state)
            except Raced:
                if attempt == _RACE_ATTEMPTS:
                    raise
                continue
            if written is None:
                return state, False
            self.kick(name)
            return written, True
        raise AssertionError("unreachable")  # pragma: no cover

    # -- secrets and workdirs --

    def _workdir_store(self) -> WorkdirStore:
        if self.workdirs is None:
            raise InvalidRequest(
                "this fleetkeeper deployment has no workdir store (its WORKDIR_BUCKET is not set); "
                "deploy the current template, or drop `workdir` and fetch the code in `setup`",
                details=[{"field": "spec.workdir", "problem": "no workdir store"}],
            )
        return self.workdirs

    def _adopt_workdir(self, spec: ServiceSpec, name: str, uid: str, owner: str = "") -> None:
        if spec.workdir is None:
            return
        from fleetkeeper.replicas.workdirs import MAX_WORKDIR_BYTES, WorkdirInvalid, WorkdirMissing

        digest = spec.workdir.digest
        try:
            self._workdir_store().adopt(digest, name, uid, owner)
        except WorkdirMissing as exc:
            raise InvalidRequest(
                f"workdir {digest} was not uploaded (or its upload expired): `fleetkeeper up` and `update` "
                "upload it; through the API, POST /v1/workdirs and PUT the archive where it says first",
                details=[{"field": "spec.workdir.digest", "problem": "not uploaded"}],
            ) from exc
        except WorkdirInvalid as exc:
            raise InvalidRequest(
                f"the upload of workdir {digest} cannot be used: {exc} (at most {MAX_WORKDIR_BYTES} bytes); "
                "upload it again",
                details=[{"field": "spec.workdir.digest", "problem": str(exc)}],
            ) from exc

    def _store_secrets(
        self, spec: ServiceSpec, name: str, uid: str, *, reuse: str | None, owner: str = ""
    ) -> tuple[str | None, bool]:
        """The ref the version's secret values are under, and whether it is new: `reuse` (the
        target's, same values), or a new parameter. (None, False) when the spec has no secrets."""
        values = spec.secret_values()
        if not values:
            return None, False
        if reuse is not None:
            return reuse, False
        from fleetkeeper.replicas.secrets import new_ref

        ref = new_ref()
        self._secret_store().put(name, uid, ref, values, owner)
        return ref, True

    def _secret_store(self) -> SecretStore:
        if self.secrets is None:
            raise InvalidRequest(
                "this fleetkeeper deployment keeps no secrets (no Parameter Store access configured)",
                details=[{"field": "spec.secrets", "problem": "no secret store"}],
            )
        return self.secrets

    def _same_secrets(self, spec: ServiceSpec, state: ServiceState) -> bool:
        """Whether the spec's secret values are the target version's (read back, never hashed)."""
        target = state.target
        values = spec.secret_values()
        if target is None or not values or target.secrets_ref is None:
            return not values and (target is None or target.secrets_ref is None)
        from botocore.exceptions import ClientError

        try:
            service = state.service
            stored = self._secret_store().get(service.name, service.uid, target.secrets_ref, service.owner)
        except ClientError:
            logger.warning("service %s: could not read the target's secrets; writing a new version", state.service.name)
            return False
        return stored == values

    def _forget_incarnation(self, name: str, uid: str, owner: str = "") -> None:
        """Best-effort: a create that wrote no service item leaves nothing under its uid."""
        for store in (self.secrets, self.workdirs):
            if store is not None:
                try:
                    store.delete_incarnation(name, uid, owner)
                except Exception:
                    logger.warning("service %s: could not delete what a failed create stored under %s", name, uid)

    def _forget_pruned(self, before: ServiceState, after: ServiceState) -> None:
        """Best-effort: the secrets and workdir copies only pruned versions named (the cleanup takes
        whatever is left with the incarnation)."""
        pruned = [before.versions[n] for n in before.versions if n not in after.versions]
        if not pruned:
            return
        kept = list(after.versions.values())
        name, uid, owner = after.service.name, after.service.uid, after.service.owner
        refs = {v.secrets_ref for v in pruned if v.secrets_ref} - {v.secrets_ref for v in kept}
        digests = {v.spec.workdir.digest for v in pruned if v.spec.workdir} - {
            v.spec.workdir.digest for v in kept if v.spec.workdir
        }
        try:
            if refs and self.secrets is not None:
                self.secrets.delete(name, uid, sorted(r for r in refs if r), owner)
            if digests and self.workdirs is not None:
                self.workdirs.forget(name, uid, digests, owner)
        except Exception:
            logger.warning("service %s: could not delete what pruned versions stored; the cleanup will", name)

    def _require_active(self, name: str, doing: str) -> ServiceState:
        state = self.store.require(name)
        self._writable(state.service, doing)
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
            # The record's key is the caller's principal and the key: two callers sending the same
            # Idempotency-Key never share a record, never see each other's result.
            command = {"principal": self.caller.principal, "key": key, "request": request}
            result: dict[str, Any] = runner(command=command, execute=execute)
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
            return Conflict(
                f"service {name!r} already exists; change it with `fleetkeeper update {name} SPEC.yaml` "
                f"(PUT /v1/services/{name})"
            )
        case UidCollision(name=name):
            return Conflict(f"could not create {name!r} (incarnation id collision); retry the request")
        case Recreated(name=name) if command == "delete":
            return Conflict(f"service {name!r} was re-created while this request ran; retry to delete the new one")
        case Recreated(name=name):
            return Conflict(f"service {name!r} was deleted and re-created while this request ran; retry it")
        case Deleting(name=name):
            return Conflict(f"service {name!r} is being deleted; wait for it to go, then create it again")
        case GenerationMismatch(name=name, current=current, expected=expected):
            return PreconditionFailed(_stale(name, current, expected))
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


def _check_spec(name: str, spec: ServiceSpec, verb: str, region: str | None) -> None:
    """The spec of a create or update (already valid): named like the service, in the stack's region,
    and launchable on EC2."""
    if spec.name is not None and spec.name != name:
        raise InvalidRequest(
            f"spec.name is {spec.name!r} but the request {verb} {name!r}; make them match or drop spec.name",
            details=[{"field": "spec.name", "problem": f"does not match name {name!r}"}],
        )
    _in_the_region(spec, region)
    from fleetkeeper.reconciler.userdata import LARGEST_TASK, USER_DATA_LIMIT, user_data

    size = len(user_data(spec, task=LARGEST_TASK))
    if size > USER_DATA_LIMIT:
        # EC2 would refuse every launch of it: refuse it here, where the user can still act.
        raise InvalidRequest(
            f"spec.setup and spec.run make {size} bytes of instance user data even compressed; EC2 takes "
            f"at most {USER_DATA_LIMIT}: move the bulk into a script the image or `setup` fetches",
            details=[{"field": "spec.setup", "problem": "too large"}, {"field": "spec.run", "problem": "too large"}],
        )


def _in_the_region(spec: ServiceSpec, region: str | None) -> None:
    """A spec's `region` (`infra`'s, any_of's and ordered's too) must be the stack's: replicas run in its
    subnets. Whether it is an AWS region name at all is the spec's own rule (spec/service.py)."""
    asked = spec.resources.regions_asked()
    details = [
        {
            "field": field,
            "problem": f"the stack runs in {region}: replicas run in its region only; "
            f"remove `{field.rsplit('.', 1)[-1]}` or set its region to {region}",
        }
        for field, value in asked
        if value is not None and region and value != region
    ]
    if details:
        summary = "; ".join(f"{d['field']}: {d['problem']}" for d in details)
        raise InvalidRequest(f"invalid request: {summary}", details=details)


def _stale(name: str, current: int, expected: int) -> str:
    return (
        f"service {name!r} is at generation {current}, not {expected} "
        "(If-Match); fetch it again and retry with the current generation"
    )


def _unchanged(target: VersionRecord, stored: ServiceSpec) -> bool:
    """Whether a new version of `stored` would be the target again (its `name` aside: a spec may or
    may not repeat it). A FAILED target is never unchanged: PUT the same spec to try it again."""
    if target.state is VersionState.FAILED:
        return False
    return target.spec.model_copy(update={"name": None}) == stored.model_copy(update={"name": None})


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
        event_key_jmespath="[principal, key]",
        payload_validation_jmespath="request",
        raise_on_no_idempotency_key=True,
        expires_after_seconds=IDEMPOTENCY_TTL_SECONDS,
    )

    @idempotent_function(data_keyword_argument="command", persistence_store=persistence, config=config)
    def run(command: dict[str, Any], execute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        return execute()

    return cast("Callable[..., dict[str, Any]]", run), config
