"""A dashboard over the real api handler (moto in-process, the embedded bridge over real HTTP), and a
small HTTP client that can send what a browser would not (another Host, no Origin)."""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import pytest

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.cli.http import ApiClient
from fleetkeeper.dashboard.backend import Backend
from fleetkeeper.dashboard.server import Running, start_in_thread
from fleetkeeper.local.auth import credential_for
from tests.support.local_process import serving_bridge

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    text: str


@dataclass
class Visitor:
    """One browser's view of a dashboard: its cookie, sent back; any Host or Origin it is told to send."""

    base: str
    cookie: str | None = None
    sent: list[tuple[str, str]] = field(default_factory=list)

    @property
    def authority(self) -> str:
        return urlsplit(self.base).netloc

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> Answer:
        parts = urlsplit(self.base)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        wanted = {"Host": self.authority, **(headers or {})}
        if self.cookie and "Cookie" not in wanted:
            wanted["Cookie"] = self.cookie
        body = urlencode(form).encode() if form is not None else None
        if body is not None:
            wanted.setdefault("Content-Type", "application/x-www-form-urlencoded")
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in wanted.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body or b"")))
        connection.endheaders(body)
        answer = connection.getresponse()
        text = answer.read().decode()
        connection.close()
        return Answer(answer.status, answer.headers, text)

    def get(self, path: str, **headers: str) -> Answer:
        return self.request("GET", path, headers={k.replace("_", "-"): v for k, v in headers.items()})

    def log_in(self, login_url: str) -> Answer:
        parts = urlsplit(login_url)
        answer = self.get(f"{parts.path}?{parts.query}")
        set_cookie = answer.headers.get("Set-Cookie") or ""
        match = re.match(r"([^=]+)=([^;]+)", set_cookie)
        if match:
            self.cookie = f"{match[1]}={match[2]}"
        return answer

    def post(self, path: str, form: dict[str, str], origin: str | None = "self") -> Answer:
        headers = {} if origin is None else {"Origin": self.base if origin == "self" else origin}
        return self.request("POST", path, form, headers)


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF token in the page"
    return match[1]


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


def hello(replicas: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "service": {"readiness_probe": "/health", "replicas": replicas, "ports": 8080},
        "resources": {"instance_type": "t3.micro"},
        "run": "python3 -m http.server $PORT",
        **extra,
    }
