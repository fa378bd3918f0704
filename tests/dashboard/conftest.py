"""A dashboard over the real api handler (moto in-process, the embedded bridge over real HTTP), and a
logged-in visitor of it (tests/support/dashboard.py's Visitor)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.cli.http import ApiClient
from fleetkeeper.dashboard.backend import Backend
from fleetkeeper.dashboard.server import Running, start_in_thread
from fleetkeeper.local.auth import credential_for
from tests.support.dashboard import Visitor
from tests.support.local_process import serving_bridge

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


@pytest.fixture
def api(table: str, tmp_path: Path) -> Iterator[ApiClient]:
    """The real api handler behind the embedded bridge: the dashboard's backend calls it as the CLI does."""
    with serving_bridge(
        lambda_handler, tmp_path / "state", on_kick=lambda _n: None, logs_dir=tmp_path / "logs"
    ) as server:
        credential = credential_for(server.url)
        assert credential is not None
        yield ApiClient(server.url, token=credential.token)


@pytest.fixture
def dashboard(api: ApiClient) -> Iterator[Callable[..., tuple[Running, Visitor]]]:
    """Start a dashboard (read-only unless allow_actions=True) and a logged-in visitor of it."""
    started: list[Running] = []

    def start(*, allow_actions: bool = False, refresh_seconds: float = 0.2) -> tuple[Running, Visitor]:
        running = start_in_thread(
            Backend(api), 0, target="test", allow_actions=allow_actions, refresh_seconds=refresh_seconds
        )
        started.append(running)
        visitor = Visitor(running.url.rstrip("/"))
        assert visitor.log_in(running.login_url()).status == 303
        return running, visitor

    yield start
    for running in started:
        running.stop()
