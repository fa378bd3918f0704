"""The reconciler kick after an api write is best-effort: it is made, and its failure fails nothing."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from fleetkeeper import aws
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec


def kick_queue(monkeypatch: pytest.MonkeyPatch) -> str:
    url = aws.sqs().create_queue(QueueName="fleetkeeper-kicks")["QueueUrl"]
    monkeypatch.setenv("FLEETKEEPER_KICK_QUEUE_URL", url)
    return url


def kicks_on(url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while messages := aws.sqs().receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for message in messages:
            found.append(json.loads(message["Body"]))
            aws.sqs().delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return found


def test_each_write_queues_a_kick_for_that_service(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    url = kick_queue(monkeypatch)
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}).status == 200
    assert api.post("/v1/services/web/rollback").status == 200
    assert api.delete("/v1/services/web").status == 202
    assert kicks_on(url) == [{"service": "web"}] * 4
    assert api.get("/v1/services/web").body["lifecycle"] == "DELETING"


def test_a_kick_that_cannot_be_queued_fails_no_write(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # No such queue in this AWS: the send fails, and the writes must not notice.
    monkeypatch.setenv("FLEETKEEPER_KICK_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/nowhere")
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.delete("/v1/services/web").status == 202


def test_reads_and_refused_writes_do_not_kick(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    url = kick_queue(monkeypatch)
    api.get("/v1/services")
    api.get("/v1/services/nope")
    api.post("/v1/services", {"name": "web", "spec": hello_spec(workdir=".")})
    api.put("/v1/services/nope", {"spec": hello_spec()})
    assert kicks_on(url) == []


def test_an_unreachable_local_kick_url_fails_nothing(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a loopback port with nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("FLEETKEEPER_KICK_URL", f"http://127.0.0.1:{port}/_local/kick")
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.delete("/v1/services/web").status == 202
