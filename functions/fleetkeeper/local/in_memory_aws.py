"""The embedded mode's in-memory AWS: moto's server app on 127.0.0.1, behind `AwsGate`.

moto's own server answers anyone who reaches its port, `/moto-api/data.json` included (every
Parameter Store value, i.e. the services' secrets in clear), and reflects any Origin in CORS
headers. Here its WSGI app is wrapped: a request must carry this run's Host, no browser Origin,
and this run's access key id (fleetkeeper.local.auth.AwsGate), else 403 before moto sees it; and
no `Access-Control-*` header leaves, so no page may read an answer.

DynamoDB's operations are serialised (`serialise_dynamodb`): moto's server answers on many threads
but its DynamoDB is not isolated. A TransactWriteItems whose condition fails restores a copy of the
whole table taken before it began, silently undoing any write another thread made meanwhile (a
reconciler run's superseded transaction undid a concurrent delete of the same service: the service
stayed ACTIVE). DynamoDB never loses an acknowledged write. The stream's reads take the same turn,
so a reader never sees the records of a transaction that is then cancelled.

moto's DynamoDB keeps every stream record, every shard iterator and, through them, every table a
cancelled transaction replaced: `fleetkeeper.local.moto_memory` bounds them (installed at start).
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from fleetkeeper.local import moto_memory
from fleetkeeper.local.auth import AwsGate

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from werkzeug.serving import BaseWSGIServer

StartResponse = Any  # WSGI's start_response callable
WsgiApp = Any  # WSGI's (environ, start_response) -> iterable of bytes


class GuardedApp:
    """A WSGI app: `gate`'s refusal, or `app`'s answer without CORS headers."""

    def __init__(self, app: WsgiApp, gate: AwsGate) -> None:
        self.app = app
        self.gate = gate

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        refusal = self.gate.refuse(
            host=[environ["HTTP_HOST"]] if "HTTP_HOST" in environ else [],
            origin=[environ["HTTP_ORIGIN"]] if "HTTP_ORIGIN" in environ else [],
            authorization=str(environ.get("HTTP_AUTHORIZATION", "")),
            query=str(environ.get("QUERY_STRING", "")),
        )
        if refusal is not None:
            payload = json.dumps(refusal.body()).encode()
            headers = [*refusal.headers().items(), ("Content-Length", str(len(payload)))]
            start_response(f"{refusal.status} {HTTPStatus(refusal.status).phrase}", headers)
            return [payload]

        def without_cors(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")]
            return start_response(status, kept, exc_info)  # type: ignore[no-any-return]

        return self.app(environ, without_cors)  # type: ignore[no-any-return]


_SERIALISED = (
    "put_item",
    "get_item",
    "query",
    "scan",
    "update_item",
    "delete_item",
    "transact_write_items",
    "transact_get_items",
    "batch_write_item",
    "batch_get_item",
)
_SERIALISED_STREAMS = ("describe_stream", "get_shard_iterator", "get_records")
_serialised = False


def serialise_dynamodb() -> None:
    """Run moto's DynamoDB reads and writes one at a time in this process (idempotent)."""
    global _serialised
    if _serialised:
        return
    import functools

    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend

    for backend, names in ((DynamoDBBackend, _SERIALISED), (DynamoDBStreamsBackend, _SERIALISED_STREAMS)):
        for name in names:
            original = getattr(backend, name, None)
            if original is None:
                continue

            @functools.wraps(original)
            def serialised(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
                with moto_memory.DYNAMODB_LOCK:
                    return __original(*args, **kwargs)

            setattr(backend, name, serialised)
    _serialised = True


class InMemoryAws:
    """moto's server app, guarded, on a free port of 127.0.0.1, in a thread of this process."""

    def __init__(self, host: str, access_key_id: str) -> None:
        self.host = host
        self.gate = AwsGate(access_key_id)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the in-memory AWS is not started")
        return f"http://{self.gate.authority}"

    def start(self) -> str:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        moto_memory.install()
        serialise_dynamodb()
        app = GuardedApp(DomainDispatcherApplication(create_backend_app), self.gate)
        self._server = make_server(self.host, 0, app, threaded=True, request_handler=MotoRequestHandler)
        host, port = self._server.server_address[:2]
        self.gate.authority = f"{host!s}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="in-memory-aws", daemon=True)
        self._thread.start()
        return self.endpoint

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None
