"""Who may use the dashboard: the browser its user opened the printed link in, and nothing else.

The dashboard can read every service its user may read and, with --allow-actions, change them, so it
refuses what another web page, a DNS-rebinding name or another local user could send:

- **Host**: exactly `127.0.0.1:<port>` (fleetkeeper.local.auth.forbidden_host, as the embedded API):
  a rebinding name pointed at 127.0.0.1 is refused before anything is read.
- **The per-run credential** never travels in a URL that stays useful: the printed link carries a
  one-time login code (`/login?code=...`), which the server exchanges, once, for a session cookie
  (HttpOnly: no script reads it; SameSite=Strict: no other site's request carries it) and a redirect
  to `/`. The link that lands in the browser's history or a terminal's scrollback is spent; the server
  writes no access log of query strings.
- **Actions** (POST) need the session, an `Origin` of exactly this server (a page on another port of
  127.0.0.1 is the same *site* for SameSite's rules, but not the same *origin*), and the session's CSRF
  token in the form, compared in constant time.
- **Every answer** carries a strict Content-Security-Policy (scripts, styles and images from this
  server only, no inline script, no framing), and nothing is fetched from anywhere else.

Standard library only (and fleetkeeper.local.auth, which is too).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass, field

from fleetkeeper.local.auth import forbidden_host

# No script but the dashboard's own files, no inline script or style, no framing, no other origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: under no-referrer Chromium sends `Origin: null` with the page's own
    # form posts, which the Origin check must refuse. Other sites get no referrer (and the links to
    # endpoints carry rel=noreferrer).
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
SAFE_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Refused:
    """Why a request is refused: its status and a sentence for the person who sent it."""

    status: int
    message: str


@dataclass
class Gate:
    """This run's login codes and sessions, and the checks every request passes."""

    host: str
    port: int
    _codes: set[str] = field(default_factory=set)
    _sessions: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}".lower()

    @property
    def origin(self) -> str:
        return f"http://{self.authority}"

    @property
    def cookie_name(self) -> str:
        # Cookies are not kept apart by port (RFC 6265, section 8.5): the name is, so two dashboards
        # of one browser do not overwrite each other's session.
        return f"fleetkeeper-dashboard-{self.port}"

    def new_login_code(self) -> str:
        """A code for one login (the printed link): spent on first use."""
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._codes.add(code)
        return code

    def login_url(self) -> str:
        return f"{self.origin}/login?code={self.new_login_code()}"

    def log_in(self, code: str) -> str | None:
        """A new session for a code not used yet (the code is spent), else None."""
        with self._lock:
            match = next((known for known in self._codes if hmac.compare_digest(known, code)), None)
            if match is None:
                return None
            self._codes.discard(match)
            session = secrets.token_urlsafe(32)
            self._sessions.add(session)
            return session

    def session_of(self, cookie: str | None) -> str | None:
        """The session a cookie names, if it is one of this run's."""
        if not cookie:
            return None
        with self._lock:
            return next((known for known in self._sessions if hmac.compare_digest(known, cookie)), None)

    @staticmethod
    def csrf_token(session: str) -> str:
        """The session's CSRF token: derived from it, so it needs no storage and dies with it."""
        return hmac.new(session.encode(), b"fleetkeeper-dashboard-csrf", hashlib.sha256).hexdigest()

    def refuse_host(self, hosts: list[str]) -> Refused | None:
        refusal = forbidden_host(hosts, self.authority)
        return None if refusal is None else Refused(403, refusal.message)

    def refuse_write(self, session: str, origin: list[str], csrf: str | None) -> Refused | None:
        """A Refused for an action that is not this server's own page's, with this session's token."""
        if len(origin) != 1 or origin[0].strip().lower() != self.origin:
            got = ", ".join(repr(o) for o in origin) or "none"
            return Refused(403, f"actions are taken from this dashboard's own pages only (Origin {got})")
        if not csrf or not hmac.compare_digest(csrf, self.csrf_token(session)):
            return Refused(403, "the form's CSRF token is not this session's: reload the page and try again")
        return None
