"""What the dashboard's tests share: a small HTTP client that can send what a browser would not
(another Host, no Origin), the CSRF token of a page, and a service's view as the backend gives it."""

from __future__ import annotations

import http.client
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlencode, urlsplit

from fleetkeeper.model import to_iso
from tests.support.specs import hello_spec


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


NOW = 1_700_000_000.0


def view(uid: str = "u1", *replicas: tuple[int, str], target: int = 2) -> dict[str, object]:
    return {
        "name": "web",
        "uid": uid,
        "target_version": max((v for v, _ in replicas), default=1),
        "spec": hello_spec(replicas=target),
        "autoscaling": None,
        "replicas": [{"replica_id": n, "version": v, "status": s} for n, (v, s) in enumerate(replicas)],
    }


def to_iso_at(at: float) -> str:
    return to_iso(datetime.fromtimestamp(at, UTC))
