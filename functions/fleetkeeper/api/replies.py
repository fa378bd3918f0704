"""What a route answers: a JSON reply, the views of a service and of a write, and their ETag.

The views themselves (which fields, how each is written) are fleetkeeper.api.models'; here they
become replies with the headers that go with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetkeeper.api.models import service_view, target_view
from fleetkeeper.api.routing import Reply

if TYPE_CHECKING:
    from fleetkeeper.api.services import ServiceCommands, Written
    from fleetkeeper.model import ServiceState


def json_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply[Any]:
    return Reply(status, body, headers)


def etag(generation: int) -> str:
    """A generation as HTTP's entity tag: a quoted string (RFC 9110, 8.8.3)."""
    return f'"{generation}"'


def state_view(state: ServiceState, commands: ServiceCommands) -> dict[str, Any]:
    """The service with its replicas, as these commands see the metrics and the accelerators."""
    return service_view(
        state,
        rate_window_seconds=commands.metric_period_seconds,
        simulated_accelerators=commands.simulated_accelerators,
    )


def with_etag(status: int, state: ServiceState, commands: ServiceCommands) -> Reply[Any]:
    """The service's view, with its generation as the ETag."""
    return json_reply(status, state_view(state, commands), {"ETag": etag(state.service.generation)})


def written_view(written: Written) -> dict[str, Any]:
    """A write's view: the service and its target, without replicas, and whether it changed."""
    return {**target_view(written.state), "changed": written.changed}


def written_reply(status: int, written: Written) -> Reply[Any]:
    """A write's answer: its view, with the service's generation as the ETag."""
    return json_reply(status, written_view(written), {"ETag": etag(written.state.service.generation)})
