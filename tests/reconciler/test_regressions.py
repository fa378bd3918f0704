"""Regressions found by review: each test failed before its fix (see the commit that added it).

Against moto with probes served on 127.0.0.1 (FLEETKEEPER_REPLICA_HOST), plus plan table cases.
"""

from __future__ import annotations

import base64
import gzip
import random
import socket
import threading
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper import aws as aws_clients
from fleetkeeper.errors import Conflict
from fleetkeeper.model import FailureCause, ReplicaRecord, ServiceStatus, VersionState
from fleetkeeper.reconciler.driver import REPLICA_TAG
from fleetkeeper.reconciler.plan import INITIAL_DELAY_EXCEEDED, RecordStatus, TripBreaker, plan
from fleetkeeper.reconciler.userdata import USER_DATA_LIMIT, environment_file, user_data
from fleetkeeper.spec import task_variables
from fleetkeeper.spec.service import ServiceSpec
from tests.support.builders import (
    NOW,
    OK,
    S,
    ago,
    instance,
    launches,
    moved,
    replica,
    state,
    terminate,
    version,
)
from tests.support.handler_client import HandlerClient
from tests.support.reconciler_world import World, instance_state, run_tagged, spec_dict, tags
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    pass


# --- plan -------------------------------------------------------------------------------------------


def test_a_failed_target_never_tears_down_what_still_serves() -> None:
    # v1 READY, v2 FAILED by the breaker, v3 READY on 2 replicas; then the target points at v2.
    current = state(
        [replica(0, v=3), replica(1, v=3)],
        [
            version(1, VersionState.READY),
            version(2, VersionState.FAILED, state_message="version 2 failed"),
            version(3, VersionState.READY),
        ],
        target=2,
        status=ServiceStatus.READY,
    )
    assert plan(current, [instance(0, version=3), instance(1, version=3)], {0: OK, 1: OK}, NOW) == [
        RecordStatus(
            ServiceStatus.FAILED,
            "version 2 failed: launching stopped; update the service or roll back to a READY version",
            1,
        )
    ]


def test_a_running_replica_that_never_gets_a_probe_verdict_still_fails_its_initial_delay() -> None:
    starting = replica(0, S.STARTING, launched_at=ago(7200))
    message = "not ready 600s after launch (never answered a readiness probe)"
    assert plan(state([starting]), [instance(0)], {}, NOW) == [
        moved(
            starting,
            status=S.FAILED_INITIAL_DELAY,
            status_message=message,
            failure_code=INITIAL_DELAY_EXCEEDED,
            cause=FailureCause.VERSION,
        ),
        terminate(("i-0", "replica 0: FAILED_INITIAL_DELAY")),
        *launches(1, 1, 2),
        RecordStatus(
            ServiceStatus.REPLICA_INIT,
            f"0/2 ready; replica 0 FAILED_INITIAL_DELAY: {message}; replica 1 PENDING; replica 2 PENDING",
            1,
        ),
    ]


def test_the_breaker_rolls_back_to_the_version_that_was_serving() -> None:
    # v1 and v2 were both READY; the user rolled back to v1, then v3 fails: back to v1, not v2.
    fails = [replica(i, S.FAILED_INITIAL_DELAY, v=3) for i in (2, 3, 4)]
    current = state(
        [replica(0, v=1), replica(1, v=1), *fails],
        [version(1, VersionState.READY), version(2, VersionState.READY), version(3)],
        target=3,
    )
    assert plan(current, [instance(0), instance(1)], {0: OK, 1: OK}, NOW) == [
        TripBreaker(
            3,
            "version 3 failed: 3 replica failures before any became ready; last: replica 4 FAILED_INITIAL_DELAY",
            rollback_to=1,
        )
    ]


def test_spot_reclaims_do_not_trip_the_breaker_but_crashes_outside_spot_do() -> None:
    def preempted(rid: int, code: str, cause: FailureCause) -> ReplicaRecord:
        message = f"instance i-{rid} is terminated ({code}): why"
        return replica(rid, S.PREEMPTED, status_message=message, failure_code=code, cause=cause)

    reclaimed = [preempted(i, "Server.SpotInstanceTermination", FailureCause.SPOT_RECLAIM) for i in (0, 1, 2)]
    assert plan(state(reclaimed), [], {}, NOW) == [
        *launches(1, 3, 4),
        RecordStatus(
            ServiceStatus.REPLICA_INIT,
            "0/2 ready; "
            + "; ".join(f"replica {i} PREEMPTED: {reclaimed[i].status_message}" for i in (0, 1, 2))
            + "; and 2 more",
            1,
        ),
    ]
    killed = [preempted(i, "Client.UserInitiatedShutdown", FailureCause.VERSION) for i in (0, 1, 2)]
    assert plan(state(killed), [], {}, NOW) == [
        TripBreaker(
            1,
            "version 1 failed: 3 replica failures before any became ready; "
            f"last: replica 2 PREEMPTED: {killed[2].status_message}",
            rollback_to=None,
        )
    ]


# --- api: rollback never lands on a FAILED version -----------------------------------------------


def test_rollback_skips_and_refuses_versions_the_breaker_failed(world: World) -> None:
    world.create()
    world.converge()
    world.update(envs={"V": "2"})
    current = world.store.require("svc")
    failed = "version 2 failed: 3 replica failures"
    world.reconciler.store.trip_breaker(
        current.service, 2, failed, 1, status_message=f"rolling back to version 1: {failed}"
    )
    world.converge()
    world.update(envs={"V": "3"})
    world.converge()
    commands = world.commands
    with pytest.raises(Conflict, match=r"version 2 .* failed"):
        commands.rollback("svc", 2, expected_generation=None)
    rolled = commands.rollback("svc", None, expected_generation=None)  # the default skips v2
    assert rolled.state.service.target_version == 1
    world.converge()
    after = world.store.require("svc")
    assert after.service.status is ServiceStatus.READY
    assert [i for i in world.instances() if tags(i).get("fleetkeeper:uid") == after.service.uid]


# --- probes --------------------------------------------------------------------------------------


class _GarbageServer:
    """Answers every request with a line that is not HTTP (a broken replica)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"garbage\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def test_one_replica_answering_garbage_fails_its_probe_not_the_run(world: World) -> None:
    garbage = _GarbageServer()
    try:
        world.create("good")
        bad = ServiceSpec.model_validate(spec_dict(garbage.port))
        world.commands.create("bad", bad)
        for _ in range(3):
            report = world.run()
        assert world.store.require("good").service.status is ServiceStatus.READY
        assert report.errors == []
        assert world.store.require("bad").service.status is not ServiceStatus.READY
    finally:
        garbage.close()


# --- launches ------------------------------------------------------------------------------------


def test_gzipped_user_data_reaches_ec2_byte_for_byte(world: World) -> None:
    rnd = random.Random(1)
    big = "\n".join(f"echo {rnd.getrandbits(64):x}" for _ in range(700))  # gzip path, under the limit
    created = world.create(setup=big)
    world.run()
    [launched, *_] = [i for i in world.instances() if tags(i).get("fleetkeeper:uid") == created.service.uid]
    replica_id = int(tags(launched)[REPLICA_TAG])
    task = task_variables.variables("svc", created.service.uid, 1, replica_id, launched["InstanceType"])
    expected = user_data(created.versions[1].spec, task=task)
    assert expected[:2] == b"\x1f\x8b" and len(expected) <= USER_DATA_LIMIT
    attribute = aws_clients.ec2().describe_instance_attribute(InstanceId=launched["InstanceId"], Attribute="userData")
    sent = base64.b64decode(attribute["UserData"]["Value"])
    assert sent == expected
    assert b"set -euo pipefail" in gzip.decompress(sent)


def test_a_capacity_blip_is_retried_and_never_fails_the_version(world: World) -> None:
    world.create(replicas=3)
    blip = {"on": True}

    def refuse(**_: Any) -> None:
        if blip["on"]:
            error = {"Code": "InsufficientInstanceCapacity", "Message": "no capacity in us-east-1a"}
            raise ClientError({"Error": error}, "RunInstances")

    aws_clients.ec2().meta.events.register("before-parameter-build.ec2.RunInstances", refuse)
    try:
        world.run()  # the whole first batch is refused
        after_blip = world.store.require("svc").service
        assert "InsufficientInstanceCapacity" in after_blip.status_message
        world.clock.advance(3600)
        world.run()  # still refused after the backoff: still not the version's fault
    finally:
        blip["on"] = False
        aws_clients.ec2().meta.events.unregister("before-parameter-build.ec2.RunInstances", refuse)
    assert world.store.require("svc").versions[1].state is not VersionState.FAILED
    world.clock.advance(3600)
    world.converge()
    assert world.store.require("svc").service.status is ServiceStatus.READY


def test_a_spec_whose_user_data_ec2_would_refuse_is_a_400(api: HandlerClient) -> None:
    rnd = random.Random(7)
    # Two draws: setup and run share their preamble (fleetkeeper.spec.runtime), so the same text in
    # both would be the same bytes twice, which gzip stores once.
    setup, run = ("".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12_000)) for _ in "ab")
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec(setup=f"echo {setup}", run=f"echo {run}")})
    assert response.status == 400, response.body
    assert "user data" in response.error["message"]
    assert api.get("/v1/services/web").status == 404


# --- the orphan sweep and the IAM policy ---------------------------------------------------------


def test_the_orphan_sweep_only_sees_what_the_iam_policy_lets_it_terminate(world: World) -> None:
    opted_out = run_tagged({"fleetkeeper:managed": "false", "Name": "not-ours"})
    orphan = run_tagged(
        {
            "fleetkeeper:managed": "true",
            "fleetkeeper:stack": "fleetkeeper",
            "fleetkeeper:uid": "deadbeef",
            "fleetkeeper:replica-id": "0",
        },
        client_token="fk-fleetkeeper-deadbeef-0",
    )
    # Another stack's orphan: its own sweep's, never this one's.
    neighbours = run_tagged(
        {
            "fleetkeeper:managed": "true",
            "fleetkeeper:stack": "neighbour",
            "fleetkeeper:uid": "feedbeef",
            "fleetkeeper:replica-id": "0",
        },
        client_token="fk-neighbour-feedbeef-0",
    )

    def iam(params: dict[str, Any], **_: Any) -> None:
        """template.yaml's TerminateOnlyManaged: aws:ResourceTag/fleetkeeper:managed == "true" and
        aws:ResourceTag/fleetkeeper:stack == the stack's id."""
        raw = World._raw_ec2().describe_instances(InstanceIds=params["InstanceIds"])
        for reservation in raw["Reservations"]:
            for found in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in found.get("Tags", [])}
                if tags.get("fleetkeeper:managed") != "true" or tags.get("fleetkeeper:stack") != "fleetkeeper":
                    error = {"Code": "UnauthorizedOperation", "Message": "not authorized"}
                    raise ClientError({"Error": error}, "TerminateInstances")

    aws_clients.ec2().meta.events.register("before-parameter-build.ec2.TerminateInstances", iam)
    try:
        world.clock.advance(3600)  # past the orphan grace period
        world.run()
    finally:
        aws_clients.ec2().meta.events.unregister("before-parameter-build.ec2.TerminateInstances", iam)
    assert instance_state(orphan) != "running"
    assert instance_state(opted_out) == "running"
    assert instance_state(neighbours) == "running"


# --- user data --------------------------------------------------------------------------------------

_SYSTEMD_UNESCAPES = '"\\`$'


def _systemd_env_file(text: str) -> dict[str, str]:
    """The double-quoted-value states of systemd's EnvironmentFile parser (src/basic/env-file.c)."""
    out: dict[str, str] = {}
    key, value, mode = "", "", "PRE_KEY"
    for c in text:
        if mode == "PRE_KEY":
            if not c.isspace():
                key, mode = c, "KEY"
        elif mode == "KEY":
            if c == "=":
                mode, value = "PRE_VALUE", ""
            else:
                key += c
        elif mode == "PRE_VALUE":
            if c == "\n":
                out[key], mode = value, "PRE_KEY"
            elif c == '"':
                mode = "QUOTED"
        elif mode == "QUOTED":
            if c == '"':
                mode = "PRE_VALUE"
            elif c == "\\":
                mode = "ESCAPED"
            else:
                value += c
        elif mode == "ESCAPED":
            mode = "QUOTED"
            if c in _SYSTEMD_UNESCAPES:
                value += c
            elif c != "\n":
                value += "\\" + c
    if mode == "PRE_VALUE":
        out[key] = value
    return out


def test_env_values_reach_the_replica_unchanged() -> None:
    envs = {"PEM": "-----BEGIN KEY-----\nabc\n-----END KEY-----", "Q": 'a "b" \\ $HOME `x`'}
    parsed = _systemd_env_file(environment_file(ServiceSpec.model_validate(hello_spec(envs=envs))))
    assert parsed["PEM"] == envs["PEM"]
    assert parsed["Q"] == envs["Q"]
