"""One api invocation: who it acts as, and the commands built for it.

The commands are built per invocation from the settings the invocation reads: nothing of one
invocation's configuration (a table, a client of another AWS endpoint) outlives it.

Not imported here: the commands and what they are built from (fleetkeeper.api.services, the store, the
kick, the secret store, the request HMAC, the workdir store). A request refused before any route
(no identity, a body too large or not JSON) needs none of them; build_commands imports them.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from fleetkeeper.errors import Forbidden
from fleetkeeper.owners.access import Caller
from fleetkeeper.owners.principals import PrincipalError, canonical_caller

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fleetkeeper.api.services import ServiceCommands
    from fleetkeeper.settings import Settings


def build_commands(settings: Settings, caller: Caller) -> ServiceCommands:
    """The commands of one invocation, acting as `caller`: cheap (the clients are cached in fleetkeeper.aws)."""
    # Imported on the first invocation that reaches a route, not with the module (see the docstring).
    from fleetkeeper.api.request_hmac import RequestHmac
    from fleetkeeper.api.services import ServiceCommands, rate_reader
    from fleetkeeper.kick import ReconcilerKick
    from fleetkeeper.replicas.secrets import SecretStore
    from fleetkeeper.replicas.workdirs import store_from_settings
    from fleetkeeper.store.commands import CommandStore
    from fleetkeeper.store.table import Table

    return ServiceCommands(
        store=CommandStore(Table(settings.table_name)),
        kick=ReconcilerKick.from_settings(settings),
        secrets=SecretStore.from_settings(settings),
        workdirs=store_from_settings(settings),
        region=settings.region,
        caller=caller,
        fingerprint=RequestHmac.from_settings(settings),
        request_rates=rate_reader(),
        metric_period_seconds=settings.metric_window_seconds,
        simulated_accelerators=settings.driver == "process",
    )


def caller_of(event: dict[str, Any], settings: Settings) -> Caller:
    """Who the request acts as: the canonical principal of the identity API Gateway authenticated
    (`requestContext.identity.userArn`; with AWS_IAM auth every request that reaches the function
    has one), and whether it is one of the stack's administrators. Forbidden without one."""
    identity = (event.get("requestContext") or {}).get("identity") or {}
    user_arn = identity.get("userArn")
    if not isinstance(user_arn, str) or not user_arn:
        raise Forbidden(
            "the request carries no IAM identity: call the API signed with AWS Signature Version 4 "
            "(API Gateway's AWS_IAM auth), as the fleetkeeper CLI does",
            details=[{"field": "identity", "problem": "missing"}],
        )
    try:
        principal = canonical_caller(user_arn)
    except PrincipalError as exc:
        raise Forbidden(str(exc), details=[{"field": "identity", "problem": "not a recognized principal"}]) from exc
    return Caller.of(principal, settings.admin_principals)


# This invocation's commands, set by `acting_with` around each resolve. A context variable (as the
# router's current request is): tests call the handler from many threads at once.
_commands: ContextVar[ServiceCommands] = ContextVar("fleetkeeper_api_commands")


def commands() -> ServiceCommands:
    """This invocation's commands."""
    return _commands.get()


@contextmanager
def acting_with(these: ServiceCommands) -> Iterator[None]:
    """`commands()` answers `these` within the block."""
    token = _commands.set(these)
    try:
        yield
    finally:
        _commands.reset(token)
