"""The reconciler kick after an api write is best-effort: it is made, and its failure fails nothing."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from fleetkeeper import aws
from tests.conftest import ApiClient, hello_spec


def test_each_write_invokes_the_reconciler_asynchronously_for_that_service(
    api: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECONCILER_FUNCTION_NAME", "fleetkeeper-reconciler")
    invokes: list[dict[str, Any]] = []
    aws.lambda_for_kick().meta.events.register(
        "provide-client-params.lambda.Invoke", lambda params, **_: invokes.append(dict(params))
    )
    # No such function in this AWS: the invoke fails, and the writes must not notice.
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}).status == 200
    assert api.post("/v1/services/web/rollback").status == 200
    assert api.delete("/v1/services/web").status == 202
    assert [(i["FunctionName"], i["InvocationType"], json.loads(i["Payload"])) for i in invokes] == [
        ("fleetkeeper-reconciler", "Event", {"service": "web"})
    ] * 4
    assert api.get("/v1/services/web").body["lifecycle"] == "DELETING"


def test_reads_and_refused_writes_do_not_kick(api: ApiClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILER_FUNCTION_NAME", "fleetkeeper-reconciler")
    invokes: list[object] = []
    aws.lambda_for_kick().meta.events.register(
        "provide-client-params.lambda.Invoke", lambda params, **_: invokes.append(1)
    )
    api.get("/v1/services")
    api.get("/v1/services/nope")
    api.post("/v1/services", {"name": "web", "spec": hello_spec(workdir=".")})
    api.put("/v1/services/nope", {"spec": hello_spec()})
    assert invokes == []


def test_an_unreachable_local_kick_url_fails_nothing(api: ApiClient, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a loopback port with nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("FLEETKEEPER_KICK_URL", f"http://127.0.0.1:{port}/_local/kick")
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.delete("/v1/services/web").status == 202
