"""The dashboard's web server (aiohttp) on 127.0.0.1: pages, fragments, actions, its own assets.

One process serves one user: the one whose credentials the backend calls the API with (the embedded
run's token, or their AWS identity). A background task refreshes what every page shows (the services,
each one's view and request rate) every `refresh_seconds`, so page loads are cheap and the
replicas-by-status history fills as it runs (fleetkeeper.dashboard.history); a service's versions,
events and logs are read when its page (or fragment) is.

Every request passes the gate (fleetkeeper.dashboard.gate) before any handler: the Host, then the
session cookie (but for /login and the static assets), then for an action the Origin and the CSRF
token, and only with --allow-actions. No access log is written (a login link's code would be in it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from fleetkeeper.cli.http import ApiError, Unreachable
from fleetkeeper.dashboard import plots, render
from fleetkeeper.dashboard.backend import ActionRefused, Backend
from fleetkeeper.dashboard.gate import SAFE_METHODS, SECURITY_HEADERS, Gate
from fleetkeeper.dashboard.history import History

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

logger = logging.getLogger("fleetkeeper.dashboard")

LOOPBACK = "127.0.0.1"
# `fleetkeeper local` serves its dashboard on the port after its API's (8470 -> 8471).
DEFAULT_LOCAL_OFFSET = 1
PLOT_WINDOW_SECONDS = 30 * 60
METRICS_MINUTES = 30
# Action forms are small; anything larger is not ours.
MAX_FORM_BYTES = 16 * 1024
STATIC_FILES = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
# The request's session (set by the gate for every page and action).
SESSION = web.RequestKey("session", str)
NOTICES = {
    "rollback": "rolled back to v{version}",
    "scale": "scaled to {replicas} replica(s)",
    "terminate": "terminating replica {replica}: the reconciler drains it and replaces it",
    "terminate-going": "replica {replica} is already going; the reconciler replaces it",
}


@dataclass
class Snapshot:
    """What the last refresh read."""

    summaries: list[dict[str, Any]] = field(default_factory=list)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics_read_at: dict[str, float] = field(default_factory=dict)
    problem: str | None = None
    at: float = 0.0


class Dashboard:
    """The application: its gate, its backend, its refresh loop."""

    def __init__(
        self,
        backend: Backend,
        gate: Gate,
        *,
        target: str,
        allow_actions: bool = False,
        refresh_seconds: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.gate = gate
        self.allow_actions = allow_actions
        self.refresh_seconds = refresh_seconds
        self.frame = render.Frame(target, allow_actions, refresh_seconds)
        self.clock = clock
        self.history = History()
        self.snapshot = Snapshot()
        self._refreshed = asyncio.Event()

    # -- the application --

    def app(self, *, refresh_in_background: bool = True) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_FORM_BYTES)
        app.router.add_get("/login", self.login)
        app.router.add_get("/static/{file}", self.static)
        app.router.add_get("/", self.services_page)
        app.router.add_get("/fragments/services", self.services_fragment)
        app.router.add_get("/services/{name}", self.service_page)
        app.router.add_get("/services/{name}/diff", self.diff_page)
        app.router.add_get("/services/{name}/logs", self.logs_page)
        app.router.add_get("/fragments/services/{name}/state", self.state_fragment)
        app.router.add_get("/fragments/services/{name}/plots", self.plots_fragment)
        app.router.add_get("/fragments/services/{name}/events", self.events_fragment)
        app.router.add_get("/fragments/services/{name}/logs", self.logs_fragment)
        app.router.add_post("/services/{name}/rollback", self.rollback)
        app.router.add_post("/services/{name}/scale", self.scale)
        app.router.add_post("/services/{name}/terminate", self.terminate)
        if refresh_in_background:
            app.cleanup_ctx.append(self._refresh_loop)
        return app

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        refused = self.gate.refuse_host(request.headers.getall("Host", []))
        if refused is not None:
            return _secured(web.Response(status=refused.status, text=refused.message + "\n"))
        if request.path != "/login" and not request.path.startswith("/static/"):
            session = self.gate.session_of(request.cookies.get(self.gate.cookie_name))
            if session is None:
                words = (
                    "this dashboard needs its login link: open the URL `fleetkeeper dashboard` (or `fleetkeeper "
                    "local`) printed when it started; each link works once"
                )
                return _secured(self._html(render.message_page(self.frame, "not logged in", words), status=401))
            request[SESSION] = session
            if request.method not in SAFE_METHODS:
                refusal = await self._refuse_action(request, session)
                if refusal is not None:
                    return _secured(refusal)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            # Raised on (aiohttp answers a raised one as it answers a returned one; returning one is deprecated).
            _secured(exc)
            raise
        except ApiError as exc:
            status = exc.status if 400 <= exc.status < 600 else 502
            response = self._html(
                render.message_page(self.frame, f"the API answered {exc.status}", exc.message), status=status
            )
        except Unreachable as exc:
            response = self._html(render.message_page(self.frame, "the API is unreachable", str(exc)), status=502)
        except ActionRefused as exc:
            response = self._html(render.message_page(self.frame, "not done", str(exc)), status=409)
        return _secured(response)

    async def _refuse_action(self, request: web.Request, session: str) -> web.Response | None:
        if not self.allow_actions:
            words = (
                "this dashboard is read-only: start it with --allow-actions to roll back, scale or terminate "
                "a replica from it"
            )
            return self._html(render.message_page(self.frame, "read-only", words), status=403)
        content_type = request.content_type
        if content_type != "application/x-www-form-urlencoded":
            return self._html(
                render.message_page(self.frame, "refused", f"actions are forms, not {content_type}"), status=415
            )
        form = await request.post()
        csrf = form.get("csrf")
        refused = self.gate.refuse_write(
            session, request.headers.getall("Origin", []), csrf if isinstance(csrf, str) else None
        )
        if refused is not None:
            return self._html(render.message_page(self.frame, "refused", refused.message), status=refused.status)
        return None

    def _html(self, text: str, status: int = 200) -> web.Response:
        return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")

    # -- the refresh loop --

    async def _refresh_loop(self, _app: web.Application) -> Any:
        task = asyncio.create_task(self._keep_refreshing())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _keep_refreshing(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_seconds)

    async def refresh(self) -> None:
        """Read the services, each one's view, and (at most once a metric period) its request rate."""
        now = self.clock()
        try:
            summaries = await asyncio.to_thread(self.backend.services)
        except (ApiError, Unreachable) as exc:
            self.snapshot.problem = f"could not list the services: {exc}"
            self._refreshed.set()
            return
        limit = asyncio.Semaphore(8)

        async def read(name: str) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
            async with limit:
                try:
                    view = await asyncio.to_thread(self.backend.service, name)
                except ApiError as exc:
                    if exc.status == 404:
                        return name, None, None
                    raise
                metrics = None
                previous = self.snapshot.metrics.get(name)
                period = float((previous or {}).get("period_seconds") or 0)
                if previous is None or now - self.snapshot.metrics_read_at.get(name, 0) >= max(
                    period / 2, self.refresh_seconds
                ):
                    with contextlib.suppress(ApiError):
                        metrics = await asyncio.to_thread(self.backend.metrics, name, METRICS_MINUTES)
                return name, view, metrics

        problem = None
        try:
            results = await asyncio.gather(*(read(str(s["name"])) for s in summaries))
        except (ApiError, Unreachable) as exc:
            results = []
            problem = f"could not read every service: {exc}"
        views: dict[str, dict[str, Any]] = {}
        for name, view, metrics in results:
            if view is None:
                continue
            views[name] = view
            self.history.record(view, now)
            if metrics is not None:
                self.snapshot.metrics[name] = metrics
                self.snapshot.metrics_read_at[name] = now
        self.history.forget_others(set(views) | {str(s["name"]) for s in summaries})
        self.snapshot.summaries = summaries
        self.snapshot.views = views if results or not summaries else self.snapshot.views
        self.snapshot.problem = problem
        self.snapshot.at = now
        self._refreshed.set()

    async def _fresh(self) -> None:
        """Wait for the first refresh (a page loaded right after the start shows something)."""
        if not self._refreshed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refreshed.wait(), timeout=10)

    async def _view(self, name: str) -> dict[str, Any]:
        """The service's view now (a page and its fragments show the newest), recorded in its history."""
        view = await asyncio.to_thread(self.backend.service, name)
        self.history.record(view, self.clock())
        return view

    # -- pages --

    async def login(self, request: web.Request) -> web.StreamResponse:
        session = self.gate.log_in(request.query.get("code", ""))
        if session is None:
            words = (
                "this login link was used already or is not this run's: each link works once; "
                "start the dashboard again for a new one"
            )
            return self._html(render.message_page(self.frame, "login link spent", words), status=403)
        response = web.HTTPSeeOther("/")
        response.set_cookie(self.gate.cookie_name, session, httponly=True, samesite="Strict", path="/")
        raise response

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["file"]
        if name not in STATIC_FILES:
            raise web.HTTPNotFound()
        data = resources.files("fleetkeeper.dashboard").joinpath("static", name).read_bytes()
        return web.Response(body=data, content_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"})

    def _listing(self, request: web.Request) -> tuple[str, bool, str]:
        sort = request.query.get("sort", "name")
        sort = sort if sort in render.SORT_KEYS else "name"
        return sort, request.query.get("order") == "desc", request.query.get("q", "")[:200]

    def _table(self, sort: str, descending: bool, words: str) -> str:
        now = self.clock()
        rows = [
            render.Row.of(
                s,
                self.snapshot.views.get(str(s["name"])),
                render.latest_rate(self.snapshot.metrics.get(str(s["name"])), now),
            )
            for s in self.snapshot.summaries
        ]
        return render.services_table(rows, sort, descending, words, now, self.snapshot.problem)

    async def services_page(self, request: web.Request) -> web.StreamResponse:
        await self._fresh()
        sort, descending, words = self._listing(request)
        return self._html(
            render.services_page(self.frame, self._table(sort, descending, words), sort, descending, words)
        )

    async def services_fragment(self, request: web.Request) -> web.StreamResponse:
        sort, descending, words = self._listing(request)
        return self._html(self._table(sort, descending, words))

    async def service_page(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        view = await self._view(name)
        versions, events = await asyncio.gather(
            asyncio.to_thread(self.backend.versions, name), asyncio.to_thread(self.backend.events, name)
        )
        now = self.clock()
        csrf = self.gate.csrf_token(request[SESSION]) if self.allow_actions else None
        notice = _notice(request.query)
        plots_html = await self._plots(name, events)
        return self._html(
            render.service_page(
                self.frame,
                view,
                render.state_fragment(view, now),
                plots_html,
                render.events_fragment(events, now),
                versions,
                csrf,
                notice,
            )
        )

    async def _plots(self, name: str, events: list[dict[str, Any]] | None = None) -> str:
        now = self.clock()
        if events is None:
            events = await asyncio.to_thread(self.backend.events, name)
        metrics = self.snapshot.metrics.get(name)
        if metrics is None or now - self.snapshot.metrics_read_at.get(name, 0) >= max(
            float(metrics.get("period_seconds") or 0) / 2, self.refresh_seconds
        ):
            metrics = await asyncio.to_thread(self.backend.metrics, name, METRICS_MINUTES)
            self.snapshot.metrics[name] = metrics
            self.snapshot.metrics_read_at[name] = now
        samples = self.history.of(name)
        return plots.rate_plot(metrics, samples, now, PLOT_WINDOW_SECONDS) + plots.replicas_plot(
            samples, events, now, PLOT_WINDOW_SECONDS
        )

    async def state_fragment(self, request: web.Request) -> web.StreamResponse:
        view = await self._view(request.match_info["name"])
        return self._html(render.state_fragment(view, self.clock()))

    async def plots_fragment(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        await self._view(name)  # a sample now: the plot moves with each refresh of the page
        return self._html(await self._plots(name))

    async def events_fragment(self, request: web.Request) -> web.StreamResponse:
        events = await asyncio.to_thread(self.backend.events, request.match_info["name"])
        return self._html(render.events_fragment(events, self.clock()))

    async def _log_text(self, request: web.Request) -> str:
        name = request.match_info["name"]
        try:
            replica = int(request.query.get("replica", ""))
        except ValueError:
            raise web.HTTPBadRequest(text="replica: a replica id (a whole number)") from None
        view = await self._view(name)
        return await asyncio.to_thread(self.backend.log_tail, view, replica, render.LOG_LINES)

    async def logs_fragment(self, request: web.Request) -> web.StreamResponse:
        return self._html(render.log_fragment(await self._log_text(request)))

    async def logs_page(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        text = render.log_fragment(await self._log_text(request))
        crumbs = f'<a href="/">services</a> / <a href="/services/{quote(name)}">{render.e(name)}</a>'
        body = f'<nav class="crumbs">{crumbs}</nav><pre class="log">{text}</pre>'
        return self._html(render.page(self.frame, f"{name} logs", body))

    async def diff_page(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        try:
            older, newer = int(request.query.get("from", "")), int(request.query.get("to", ""))
        except ValueError:
            raise web.HTTPBadRequest(text="from and to: version numbers") from None
        versions = {int(v["version"]): v for v in await asyncio.to_thread(self.backend.versions, name)}
        missing = [n for n in (older, newer) if n not in versions]
        if missing:
            words = f"{name} has no version {missing[0]}"
            return self._html(
                render.message_page(self.frame, "no such version", words, f"/services/{quote(name)}"), status=404
            )
        return self._html(render.diff_page(self.frame, name, versions[older], versions[newer]))

    # -- actions: confirmed, then sent with If-Match of the generation the user saw --

    async def rollback(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        form = await request.post()
        version, generation = _number(form.get("version")), _number(form.get("generation"))
        if version is None or generation is None:
            raise web.HTTPBadRequest(text="version and generation: whole numbers")
        if form.get("confirmed") != "yes":
            view = await self._view(name)
            question = f"Roll {name} back from v{view['target_version']} to v{version}?"
            fields = {"version": str(version), "generation": str(generation)}
            return self._html(
                render.confirm_page(
                    self.frame, name, "rollback", question, fields, self.gate.csrf_token(request[SESSION])
                )
            )
        await asyncio.to_thread(self.backend.rollback, name, version, generation)
        logger.warning("dashboard: rolled %s back to version %d", name, version)
        raise web.HTTPSeeOther(f"/services/{quote(name)}?done=rollback&version={version}")

    async def scale(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        form = await request.post()
        replicas, generation = _number(form.get("replicas")), _number(form.get("generation"))
        if replicas is None or generation is None or replicas > 1000:
            raise web.HTTPBadRequest(text="replicas (0 to 1000) and generation: whole numbers")
        if form.get("confirmed") != "yes":
            view = await self._view(name)
            now = len(view.get("replicas") or [])
            question = f"Scale {name} to {replicas} replica(s)? (it has {now} now)"
            fields = {"replicas": str(replicas), "generation": str(generation)}
            return self._html(
                render.confirm_page(self.frame, name, "scale", question, fields, self.gate.csrf_token(request[SESSION]))
            )
        await asyncio.to_thread(self.backend.scale, name, replicas, generation)
        logger.warning("dashboard: scaled %s to %d replica(s)", name, replicas)
        raise web.HTTPSeeOther(f"/services/{quote(name)}?done=scale&replicas={replicas}")

    async def terminate(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        form = await request.post()
        replica, uid = _number(form.get("replica")), form.get("uid")
        if replica is None or not isinstance(uid, str) or not uid:
            raise web.HTTPBadRequest(text="replica: a replica id (a whole number); uid: the service's")
        if form.get("confirmed") != "yes":
            view = await self._view(name)
            shown = next((r for r in view.get("replicas") or [] if int(r["replica_id"]) == replica), None)
            if shown is None:
                ids = ", ".join(str(int(r["replica_id"])) for r in view.get("replicas") or []) or "none"
                words = f"{name} has no replica {replica} (its replicas: {ids})"
                return self._html(
                    render.message_page(self.frame, "no such replica", words, f"/services/{quote(name)}"), status=404
                )
            question = (
                f"Terminate replica {replica} of {name} (v{int(shown['version'])}, {shown['status']})? "
                "The reconciler drains it and launches its replacement."
            )
            fields = {"replica": str(replica), "uid": uid}
            return self._html(
                render.confirm_page(
                    self.frame, name, "terminate", question, fields, self.gate.csrf_token(request[SESSION])
                )
            )
        answer = await asyncio.to_thread(self.backend.terminate, name, replica, uid)
        done = "terminate" if answer.get("changed") is not False else "terminate-going"
        logger.warning("dashboard: asked for replica %d of %s to go", replica, name)
        raise web.HTTPSeeOther(f"/services/{quote(name)}?done={done}&replica={replica}")


def _number(value: Any) -> int | None:
    text = value if isinstance(value, str) else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None


def _notice(query: Any) -> str | None:
    template = NOTICES.get(str(query.get("done", "")))
    if template is None:
        return None
    values = {k: _number(query.get(k)) for k in ("version", "replicas", "replica")}
    if any(f"{{{k}}}" in template and v is None for k, v in values.items()):
        return None
    return template.format(**values)


def _secured(response: web.StreamResponse) -> web.StreamResponse:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    response.headers.setdefault("Cache-Control", "no-store")
    return response


# --- running it ---------------------------------------------------------------------------------------


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1 (port 0: any free one): the dashboard listens nowhere else."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


@dataclass
class Running:
    """A dashboard serving in a thread of its own (fleetkeeper local's)."""

    gate: Gate
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    stopped: asyncio.Event

    @property
    def url(self) -> str:
        return self.gate.origin + "/"

    def login_url(self) -> str:
        return self.gate.login_url()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopped.set)
        self.thread.join(timeout=10)


def start_in_thread(
    backend: Backend, port: int, *, target: str, allow_actions: bool, refresh_seconds: float
) -> Running:
    """Serve the dashboard from a thread with its own event loop; OSError if the port is taken."""
    sock = bind(port)
    gate = Gate(LOOPBACK, sock.getsockname()[1])
    loop = asyncio.new_event_loop()
    stopped = asyncio.Event()
    started = threading.Event()
    failure: list[BaseException] = []

    async def main() -> None:
        dashboard = Dashboard(
            backend, gate, target=target, allow_actions=allow_actions, refresh_seconds=refresh_seconds
        )
        runner = web.AppRunner(dashboard.app(), access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        started.set()
        await stopped.wait()
        await runner.cleanup()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # reported to the starter if it fails before serving
            failure.append(exc)
            started.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="dashboard", daemon=True)
    thread.start()
    started.wait(timeout=30)
    if failure:
        raise failure[0]
    return Running(gate, thread, loop, stopped)


def serve(
    backend: Backend, port: int, *, target: str, allow_actions: bool, refresh_seconds: float, say: Callable[[str], None]
) -> int:
    """`fleetkeeper dashboard`: serve until Ctrl-C; returns the exit code."""
    try:
        sock = bind(port)
    except OSError as exc:
        say(f"fleetkeeper dashboard: cannot listen on {LOOPBACK}:{port}: {exc.strerror or exc}")
        return 2
    gate = Gate(LOOPBACK, sock.getsockname()[1])
    dashboard = Dashboard(backend, gate, target=target, allow_actions=allow_actions, refresh_seconds=refresh_seconds)

    async def main() -> None:
        runner = web.AppRunner(dashboard.app(), access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        say(f"fleetkeeper dashboard of {target}, {'actions allowed' if allow_actions else 'read-only'}")
        say(f"  open (this link works once): {gate.login_url()}")
        say("Ctrl-C stops it.")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0
