"""The `local` load balancer: embedded mode's stand-in for the stack's ALB, a real HTTP proxy.

One port per service on 127.0.0.1 (its `endpoint`), made by the reconciler through the same
`LoadBalancer` interface as the ALB: `ensure` opens the port, `register`/`deregister` change the
targets, `drain_states` reports each deregistered target's requests in flight, `remove` closes the
port. Like the ALB it

- sends a request to a registered target only (the reconciler registers READY replicas only), by
  the service's policy (`PICKERS`): `least_load` (the target with the fewest requests in flight, ties
  in turn) or `round_robin`;
- serves only requests addressed to it (`Host: 127.0.0.1:<port>` or `localhost:<port>`, else 403):
  a page that rebinds a name of its own to 127.0.0.1 cannot reach the replicas through the browser;
- passes the method, path, query, headers and body on unchanged (hop-by-hop headers aside), adding
  `X-Forwarded-For`, `X-Forwarded-Proto` and `X-Forwarded-Port` as the ALB does; streams the answer
  back as it comes (no buffering: a model server's tokens reach the client one by one), with an
  idle timeout of `idle_timeout` seconds (300 by default, as long streams need);
- drains: a deregistered target gets no new request, its requests in flight finish, and it reports
  DRAINED once none is left;
- answers 503 at once, in fleetkeeper's error shape, when the service has no registered target
  (and 502 when no target could be reached), never queueing a request, and counts no request it
  sent to no target (as the ALB's RequestCount);
- while the reconciler has routed a service to the wake target (`route(waking=True)`: an autoscaled
  service with no replica serving, fleetkeeper.wake.demand), it is that wake target too: a request records
  the demand on the service item and kicks the reconciler (`on_demand`, coalesced), and gets 503
  with `Retry-After`;
- publishes each endpoint's requests as the ALB's CloudWatch metric (`AWS/ApplicationELB`
  `RequestCount`, dimensions LoadBalancer and TargetGroup) into the in-memory AWS, so the autoscaler
  reads one API in both modes.

It runs on aiohttp (an asyncio HTTP server and client), on one event loop thread; the reconciler's
thread calls into it. aiohttp is the embedded mode's dependency only: the Lambda bundle never
imports this module (pyproject.toml's lambda-bundle contract).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from fleetkeeper import aws
from fleetkeeper.choices import LoadBalancingPolicy
from fleetkeeper.local.auth import forbidden_host
from fleetkeeper.model import EndpointRecord
from fleetkeeper.reconciler.balancer import METRIC_NAME, METRIC_NAMESPACE, DrainState, target_group_name

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping, Sequence

    import aiohttp
    from aiohttp import web
    from mypy_boto3_cloudwatch.type_defs import MetricDatumTypeDef

    from fleetkeeper.model import EndpointConfig
    from fleetkeeper.reconciler.balancer import Target
    from fleetkeeper.wake.target import DemandRecorder

logger = logging.getLogger("local.balancer")

LOOPBACK = "127.0.0.1"
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_METRICS_INTERVAL = 60.0
# The LoadBalancer dimension of the metric: an ALB's is app/<name>/<id>.
LOAD_BALANCER_DIMENSION = "app/fleetkeeper-local/0000000000000000"
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Calls from the reconciler's thread wait at most this long for the event loop.
_CALL_TIMEOUT = 30.0


# A target whose connection failed before any answer gets no request for this long (unless every
# target did), as SkyPilot's load balancer drops a replica it cannot reach: the reconciler's next
# probe takes it out of the endpoint for good, and a replica that was only slow is back after it.
UNREACHABLE_SECONDS = 10.0
# Methods whose request may be sent again to another replica after the first one's connection failed
# before any answer (RFC 9110, 9.2.2): the others may have been acted on.
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


@dataclass
class _Target:
    url: str
    in_flight: int = 0
    unreachable_until: float = 0.0  # time.monotonic(): skipped by `pick` until then


def _fewest_in_flight(rotated: Sequence[tuple[str, _Target]]) -> tuple[str, _Target]:
    return min(rotated, key=lambda pair: pair[1].in_flight)


def _next_in_turn(rotated: Sequence[tuple[str, _Target]]) -> tuple[str, _Target]:
    return rotated[0]


# Each policy a load balancer runs (LoadBalancingPolicy.balanced) -> the target it picks among the
# candidates, rotated to start at this request's turn (so ties go in turn); tests/test_choices.py
# holds it to one per policy.
PICKERS: Mapping[LoadBalancingPolicy, Callable[[Sequence[tuple[str, _Target]]], tuple[str, _Target]]] = {
    LoadBalancingPolicy.LEAST_LOAD: _fewest_in_flight,
    LoadBalancingPolicy.ROUND_ROBIN: _next_in_turn,
}


@dataclass
class _Endpoint:
    """One service incarnation's port and targets (touched on the event loop thread only)."""

    service: str
    uid: str
    port: int
    policy: LoadBalancingPolicy
    drain_seconds: int
    server: Any  # asyncio.Server
    handler: Any  # aiohttp.web_server.Server
    targets: dict[str, _Target] = field(default_factory=dict)  # registered: instance id -> target
    draining: dict[str, _Target] = field(default_factory=dict)  # deregistered, maybe still busy
    turn: itertools.count[int] = field(default_factory=itertools.count)
    requests: int = 0  # sent to a target since the last publication
    waking: bool = False  # routed to the wake target (no replica serving an autoscaled service)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def target_group_dimension(self) -> str:
        return f"targetgroup/{target_group_name(self.uid)}/{self.uid[:16]:0>16}"

    def pick(self, tried: set[str]) -> tuple[str, _Target] | None:
        """The next target by the policy, among those not tried for this request yet."""
        candidates = [(key, target) for key, target in self.targets.items() if key not in tried]
        if not candidates:
            return None
        now = time.monotonic()
        candidates = [(k, t) for k, t in candidates if t.unreachable_until <= now] or candidates
        start = next(self.turn) % len(candidates)
        return PICKERS[self.policy](candidates[start:] + candidates[:start])


class LocalBalancer:
    """LoadBalancer whose endpoints are ports on 127.0.0.1 (see the module docstring)."""

    _shared: ClassVar[LocalBalancer | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()
    # What `shared()` makes: set by the embedded mode from its options.
    idle_timeout_default: ClassVar[float] = DEFAULT_IDLE_TIMEOUT
    metrics_interval_default: ClassVar[float] = DEFAULT_METRICS_INTERVAL

    def __init__(
        self,
        *,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        metrics_interval: float = DEFAULT_METRICS_INTERVAL,
        publisher: Callable[[Sequence[MetricDatumTypeDef]], None] | None = None,
        on_demand: Callable[[str], object] | None = None,
    ) -> None:
        """`publisher` sends RequestCount datapoints (embedded mode: `put_request_counts`, into the
        in-memory AWS); None: they are counted and dropped. `on_demand(service)`: a request reached
        a waking endpoint (embedded mode: `record_wake_demand`); None: nothing is recorded."""
        self.idle_timeout = idle_timeout
        self.metrics_interval = metrics_interval
        self.publisher = publisher
        self.on_demand = on_demand
        self._endpoints: dict[str, _Endpoint] = {}  # by uid
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._publisher: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, name="local-balancer", daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait()
        self._call(self._open())

    @classmethod
    def shared(cls) -> LocalBalancer:
        """The process-wide balancer (the reconciler's `make_balancer()` returns this one)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(
                    idle_timeout=cls.idle_timeout_default,
                    metrics_interval=cls.metrics_interval_default,
                    publisher=put_request_counts,
                    on_demand=record_wake_demand,
                )
            return cls._shared

    @classmethod
    def reset_shared(cls) -> None:
        """Close every endpoint and stop the shared balancer (shutdown, tests)."""
        with cls._shared_lock:
            if cls._shared is not None:
                cls._shared.close()
            cls._shared = None
        reset_wake_demand()

    # -- the LoadBalancer protocol ------------------------------------------------------------------

    def ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        endpoint: _Endpoint = self._call(self._ensure(service, uid, config))
        return EndpointRecord(
            url=endpoint.url,
            config=config,
            target_group=target_group_name(uid),
            route=str(endpoint.port),
            dimensions=(
                ("LoadBalancer", LOAD_BALANCER_DIMENSION),
                ("TargetGroup", endpoint.target_group_dimension),
            ),
        )

    def register(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> Mapping[str, str]:
        for target in targets:
            if target.url is None:
                raise ValueError(f"replica {target.replica_id} has no address to register")
            _loopback_only(target.url)
        self._call(self._register(endpoint, targets))
        return {}  # one host: every target it takes gets requests

    def deregister(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> None:
        self._call(self._deregister(endpoint, targets))

    def drain_states(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> dict[str, DrainState]:
        states: dict[str, DrainState] = self._call(self._drain_states(endpoint, targets))
        return states

    def serves(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> bool:
        # A registered target gets requests at once (no health check of its own here).
        found: bool = self._call(self._serves(endpoint, targets))
        return found

    def route(self, endpoint: EndpointRecord, *, waking: bool) -> None:
        self._call(self._route(endpoint, waking))

    def remove(self, service: str, uid: str, known: EndpointRecord | None) -> None:
        self._call(self._remove(uid))

    def forget(self) -> None:
        return None  # nothing learnt: the local balancer is its own state

    def retire_pools(self, now: datetime) -> list[str]:
        return []  # one local balancer, no quota: never a pool to retire

    # -- embedded mode ------------------------------------------------------------------------------

    def endpoints(self) -> dict[str, str]:
        """Service name -> endpoint URL, for every open endpoint."""
        found: dict[str, str] = self._call(self._endpoints_now())
        return found

    def close(self) -> None:
        """Close every endpoint's port, publish the last counts, stop the event loop."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()

    # -- the event loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        self._loop.run_forever()

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(_CALL_TIMEOUT)

    async def _open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
            auto_decompress=False,
            # Nothing the client did not send: no User-Agent, Accept or Accept-Encoding of aiohttp's.
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=self.idle_timeout),
        )
        self._publisher = asyncio.create_task(self._publish_forever())

    async def _close(self) -> None:
        for uid in list(self._endpoints):
            await self._remove(uid)
        if self._publisher is not None:
            self._publisher.cancel()
        if self._session is not None:
            await self._session.close()

    async def _endpoints_now(self) -> dict[str, str]:
        return {endpoint.service: endpoint.url for endpoint in self._endpoints.values()}

    async def _ensure(self, service: str, uid: str, config: EndpointConfig) -> _Endpoint:
        from aiohttp import web_server

        endpoint = self._endpoints.get(uid)
        if endpoint is not None:
            endpoint.policy, endpoint.drain_seconds = config.policy, config.drain_seconds
            return endpoint
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, 0))
        listener.listen(512)
        port = int(listener.getsockname()[1])
        holder: dict[str, _Endpoint] = {}

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            return await self._proxy(holder["endpoint"], request)

        handler = web_server.Server(handle, access_log=None, keepalive_timeout=self.idle_timeout)
        server = await self._loop.create_server(handler, sock=listener)
        endpoint = _Endpoint(service, uid, port, config.policy, config.drain_seconds, server, handler)
        holder["endpoint"] = endpoint
        self._endpoints[uid] = endpoint
        logger.info("service %s: endpoint %s (%s)", service, endpoint.url, config.policy)
        return endpoint

    def _endpoint_of(self, record: EndpointRecord) -> _Endpoint | None:
        return next((e for e in self._endpoints.values() if str(e.port) == record.route), None)

    async def _register(self, record: EndpointRecord, targets: Sequence[Target]) -> None:
        endpoint = self._endpoint_of(record)
        if endpoint is None:
            raise LookupError(f"no local endpoint on port {record.route}: make it first (ensure)")
        for target in targets:
            existing = endpoint.draining.pop(target.instance_id, None) or endpoint.targets.get(target.instance_id)
            if existing is None or existing.url != target.url:
                existing = _Target(str(target.url), in_flight=existing.in_flight if existing else 0)
            endpoint.targets[target.instance_id] = existing

    async def _serves(self, record: EndpointRecord, targets: Sequence[Target]) -> bool:
        endpoint = self._endpoint_of(record)
        return endpoint is not None and any(target.instance_id in endpoint.targets for target in targets)

    async def _route(self, record: EndpointRecord, waking: bool) -> None:
        endpoint = self._endpoint_of(record)
        if endpoint is None:
            raise LookupError(f"no local endpoint on port {record.route}: make it first (ensure)")
        endpoint.waking = waking

    async def _deregister(self, record: EndpointRecord, targets: Sequence[Target]) -> None:
        endpoint = self._endpoint_of(record)
        if endpoint is None:
            return
        for target in targets:
            gone = endpoint.targets.pop(target.instance_id, None)
            if gone is not None and gone.in_flight > 0:
                endpoint.draining[target.instance_id] = gone

    async def _drain_states(self, record: EndpointRecord, targets: Sequence[Target]) -> dict[str, DrainState]:
        endpoint = self._endpoint_of(record)
        states: dict[str, DrainState] = {}
        for target in targets:
            if endpoint is not None and target.instance_id in endpoint.targets:
                states[target.instance_id] = DrainState.IN_SERVICE
                continue
            busy = endpoint.draining.get(target.instance_id) if endpoint is not None else None
            if busy is not None and busy.in_flight > 0:
                states[target.instance_id] = DrainState.DRAINING
            else:
                states[target.instance_id] = DrainState.DRAINED
        return states

    async def _remove(self, uid: str) -> None:
        endpoint = self._endpoints.pop(uid, None)
        if endpoint is None:
            return
        endpoint.server.close()
        await endpoint.server.wait_closed()
        with contextlib.suppress(Exception):
            await endpoint.handler.shutdown(timeout=1.0)
        await self._publish([endpoint])
        logger.info("service %s: endpoint %s closed", endpoint.service, endpoint.url)

    # -- proxying -----------------------------------------------------------------------------------

    async def _proxy(self, endpoint: _Endpoint, request: web.BaseRequest) -> web.StreamResponse:
        """One request, sent to a registered target picked by the endpoint's policy; one the replica
        never got goes to another target (or a body-less idempotent one the replica dropped)."""
        import aiohttp

        refused = forbidden_host(request.headers.getall("Host", []), *_own_authorities(endpoint.port))
        if refused is not None:
            return _error(refused.status, refused.code, refused.message)
        if not endpoint.targets:
            if endpoint.waking:
                return await self._wake(endpoint)
            return _error(503, "no_ready_replica", f"service {endpoint.service} has no READY replica right now")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        peer = request.remote or ""
        forwarded = request.headers.get("X-Forwarded-For")
        headers += [
            ("X-Forwarded-For", f"{forwarded}, {peer}" if forwarded else peer),
            ("X-Forwarded-Proto", "http"),
            ("X-Forwarded-Port", str(endpoint.port)),
        ]
        body = request.content if request.body_exists else None
        tried: set[str] = set()
        while True:
            picked = endpoint.pick(tried)
            if picked is None:
                return _error(502, "bad_gateway", f"no replica of service {endpoint.service} could be reached")
            key, target = picked
            tried.add(key)
            target.in_flight += 1
            endpoint.requests += 1
            try:
                assert self._session is not None
                try:
                    upstream = await self._session.request(
                        request.method,
                        target.url + request.raw_path,
                        headers=headers,
                        data=body,
                        allow_redirects=False,
                        compress=None,
                    )
                except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    # The replica is not there (refused, or its relay reset the connection): no new
                    # request goes to it for a while, and this one goes to another when it may be
                    # sent again (nothing was sent, or it is idempotent; a body already read cannot).
                    target.unreachable_until = time.monotonic() + UNREACHABLE_SECONDS
                    sent = not isinstance(exc, aiohttp.ClientConnectorError)
                    if (body is not None and body.total_bytes > 0) or (sent and request.method not in _IDEMPOTENT):
                        return _error(502, "bad_gateway", f"replica of service {endpoint.service} failed: {exc!r}")
                    continue
                except (aiohttp.ClientError, TimeoutError) as exc:
                    return _error(502, "bad_gateway", f"replica of service {endpoint.service} failed: {exc!r}")
                target.unreachable_until = 0.0  # it answered
                return await _relay(request, upstream)
            finally:
                target.in_flight -= 1

    async def _wake(self, endpoint: _Endpoint) -> web.Response:
        """The wake target's answer: the demand recorded (off the event loop: a table write and a
        kick), then 503 with Retry-After. The request is not counted: no target served it."""
        from aiohttp import web

        from fleetkeeper.wake.target import waking_body, waking_headers

        on_demand = self.on_demand
        if on_demand is not None:
            try:
                await self._loop.run_in_executor(None, on_demand, endpoint.service)
            except Exception:
                logger.warning("service %s: could not record the demand", endpoint.service, exc_info=True)
        headers = waking_headers()
        content_type = headers.pop("Content-Type")
        return web.Response(status=503, text=waking_body(endpoint.service), content_type=content_type, headers=headers)

    # -- metrics ------------------------------------------------------------------------------------

    async def _publish_forever(self) -> None:
        # As the ALB: one datapoint per interval, stamped with the interval's start, published once
        # it is over. Intervals are aligned to the epoch, so a reader whose window is a multiple of
        # the interval (the autoscaler's, in embedded mode) reads whole intervals only.
        interval = self.metrics_interval
        while True:
            boundary = (math.floor(time.time() / interval) + 1) * interval
            await asyncio.sleep(max(boundary - time.time(), 0.0))
            with contextlib.suppress(Exception):
                await self._publish(list(self._endpoints.values()), stamp=boundary - interval)

    async def _publish(self, endpoints: Sequence[_Endpoint], stamp: float | None = None) -> None:
        data: list[MetricDatumTypeDef] = []
        now = datetime.fromtimestamp(stamp, UTC) if stamp is not None else datetime.now(UTC)
        # Periods under a minute are CloudWatch's for high-resolution metrics only (MetricStat's Period).
        resolution = 1 if self.metrics_interval < 60 else 60
        for endpoint in endpoints:
            if endpoint.requests == 0:
                continue  # as the ALB: no datapoint for a minute without requests
            count, endpoint.requests = endpoint.requests, 0
            data.append(
                {
                    "MetricName": METRIC_NAME,
                    "Dimensions": [
                        {"Name": "LoadBalancer", "Value": LOAD_BALANCER_DIMENSION},
                        {"Name": "TargetGroup", "Value": endpoint.target_group_dimension},
                    ],
                    "Timestamp": now,
                    "Value": float(count),
                    "Unit": "Count",
                    "StorageResolution": resolution,
                }
            )
        publisher = self.publisher
        if data and publisher is not None:
            try:
                await self._loop.run_in_executor(None, publisher, data)
            except Exception:
                logger.warning("could not publish %d RequestCount datapoint(s)", len(data), exc_info=True)

    def publish_now(self) -> None:
        """Publish the counts so far at once (tests; the loop does it every `metrics_interval`)."""
        self._call(self._publish(list(self._endpoints.values())))


def put_request_counts(data: Sequence[MetricDatumTypeDef]) -> None:
    """RequestCount datapoints into CloudWatch: the embedded mode's in-memory AWS (aws/__init__.py's endpoint)."""
    aws.cloudwatch().put_metric_data(Namespace=METRIC_NAMESPACE, MetricData=data)


_demand: DemandRecorder | None = None
_demand_lock = threading.Lock()


def record_wake_demand(service: str) -> None:
    """Demand at a waking endpoint, as the ALB's wake target records it: on the service item of the
    in-memory AWS's table, with a kick of the local reconcile loop when the write landed."""
    global _demand
    with _demand_lock:
        if _demand is None:
            from fleetkeeper.kick import ReconcilerKick
            from fleetkeeper.settings import Settings
            from fleetkeeper.store.table import Table
            from fleetkeeper.wake.target import DemandRecorder

            settings = Settings.from_env(os.environ)
            kick = ReconcilerKick.from_settings(settings)
            _demand = DemandRecorder(Table(settings.table_name), lambda name: kick(name))
        recorder = _demand
    recorder(service)


def reset_wake_demand() -> None:
    """Forget the recorder (its table and kick URL belong to one embedded run)."""
    global _demand
    with _demand_lock:
        _demand = None


def _own_authorities(port: int) -> tuple[str, str]:
    """The Host values a request to this endpoint may carry: `127.0.0.1:<port>` and `localhost:<port>`
    (what the endpoint's URL and a developer's own tools send). A web page can make the developer's
    browser send requests to 127.0.0.1 under a name of its own that it points there (DNS rebinding);
    the browser then treats the answers as that page's. Such a request carries the page's name in
    Host and is refused, by the embedded API's own check (fleetkeeper.local.auth.forbidden_host)."""
    return f"{LOOPBACK}:{port}", f"localhost:{port}"


async def _relay(request: web.BaseRequest, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    """Streams the replica's answer to the client: its status and headers (hop-by-hop aside), then its
    body as it comes; a client that leaves, or a replica that goes, ends it as behind the ALB."""
    import aiohttp
    from aiohttp import web

    async with upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                response.headers.add(name, value)
        length = upstream.headers.get("Content-Length")
        if length is None and request.method != "HEAD" and upstream.status not in (204, 304):
            response.enable_chunked_encoding()
        try:
            await response.prepare(request)
        except ConnectionResetError:
            return response  # the client left before the answer's headers: a normal end
        try:
            async for chunk in upstream.content.iter_any():
                try:
                    await response.write(chunk)
                except ConnectionResetError:
                    # The client left mid-answer: stop reading the replica (its
                    # connection is closed with `upstream`: the replica sees it go too).
                    upstream.close()
                    return response
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        except (aiohttp.ClientError, TimeoutError):
            # The replica went away mid-answer: the client sees the connection end, as
            # behind the ALB, never a truncated answer passed off as whole.
            if request.transport is not None:
                request.transport.close()
        return response


def _error(status: int, code: str, message: str) -> web.Response:
    from aiohttp import web

    body = json.dumps({"error": {"code": code, "message": message, "details": []}})
    return web.Response(status=status, text=body, content_type="application/json")


def _loopback_only(url: str) -> None:
    """The local balancer proxies to this machine only (the process driver's replicas)."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if not (host == "localhost" or host.startswith("127.")):
        raise ValueError(f"the local load balancer proxies to 127.0.0.1 only, not to {url}")
