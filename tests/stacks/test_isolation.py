"""Stacks sharing an account and Region never touch each other's resources (invariant 11,
docs/architecture/invariants.md).

Two and three stacks of this template side by side in ONE in-memory AWS (and the strict layer), each
with its own table, queues, load balancer and stack id, each driven through the real handlers: the
api (creates and deletes), the dispatcher (shards and the orphan sweep) and the workers. Services of
the same name in every stack; time is moved past the orphan grace period so that every sweep that
could take another stack's replicas has had its chance.

Then a stack upgraded in place: replicas launched by the release before stack ids (no stack tag, the
token `fk-<uid>-<n>`) are adopted by their own stack without a restart, and by no other, while the
stacks' adoption is on (AdoptUntaggedReplicas=true); with it off (the default), by none.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from unittest import mock

import pytest
import time_machine

from fleetkeeper import aws
from fleetkeeper.local.template import create_queue, create_table
from fleetkeeper.reconciler.balancers import alb as alb_module
from fleetkeeper.reconciler.balancers.alb import balancer as alb_balancer_module
from fleetkeeper.reconciler.driver import (
    MANAGED_TAG,
    REPLICA_TAG,
    STACK_TAG,
    UID_TAG,
    LaunchRequest,
    client_token,
)
from fleetkeeper.reconciler.drivers import ec2 as ec2_driver_module
from fleetkeeper.reconciler.plan import Policy
from tests.strict_aws import active_controller
from tests.support.handler_client import FakeContext, HandlerClient
from tests.support.reconciler_world import make_alb, raw_client, spec_dict, tags

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mypy_boto3_ec2.type_defs import FilterTypeDef, RunInstancesRequestTypeDef

    from tests.support.reconciler_world import ProbeServer

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
# Past the orphan grace period: a sweep may take any orphan it sees.
PAST_GRACE = Policy().orphan_grace + timedelta(minutes=5)
LIVE = ("pending", "running", "stopping", "stopped")


@dataclass
class Stack:
    """One deployed stack: its table, queues and (optionally) load balancer, and the variables
    template.yaml would give its functions."""

    stack_id: str
    env: dict[str, str]
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with mock.patch.dict(os.environ, self.env):
            yield

    def api(self, method: str, path: str, body: Any = None) -> Any:
        with self.active():
            return HandlerClient().call(method, path, body)

    def tick(self) -> None:
        """The schedule: the dispatcher (shards, orphan sweep), then each queue's worker runs."""
        from fleetkeeper.local.reconcile_loop import scheduled_event, sqs_event
        from fleetkeeper.reconciler.handler import dispatch_handler, lambda_handler

        with self.active():
            sqs = aws.sqs()
            self.dispatches.append(dispatch_handler(scheduled_event(), FakeContext()))
            for url in (self.env["FLEETKEEPER_KICK_QUEUE_URL"], self.env["FLEETKEEPER_RECONCILE_QUEUE_URL"]):
                arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
                while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, AttributeNames=["All"]).get(
                    "Messages", []
                ):
                    for message in messages:
                        self.runs.append(lambda_handler(sqs_event(dict(message), arn), FakeContext()))
                        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    def service(self, name: str) -> dict[str, Any]:
        answer = self.api("GET", f"/v1/services/{name}")
        assert answer.status == 200, answer.body
        return dict(answer.body)

    def replica_instances(self, name: str) -> dict[int, str]:
        return {r["replica_id"]: r["instance_id"] for r in self.service(name)["replicas"]}

    def reported(self, key: str) -> list[str]:
        """Every id the runs and sweeps of this stack reported under `key` (their summaries)."""
        sweeps = [d.get("sweep", {}) for d in self.dispatches]
        runs = [run for answer in self.runs for run in answer.get("runs", [])]
        assert len(sweeps) == len(self.dispatches) and all(sweeps), self.dispatches
        assert runs, "no worker ran"
        return [i for report in [*runs, *sweeps] for i in (report.get(key) or [])]


def make_stack(stack_id: str, *, balanced: bool, adopt_untagged: bool = False) -> Stack:
    table = f"fleetkeeper-{stack_id}"
    create_table(aws.dynamodb(), table)
    env = {
        "TABLE_NAME": table,
        "FLEETKEEPER_STACK_ID": stack_id,
        "FLEETKEEPER_RECONCILE_QUEUE_URL": create_queue(aws.sqs(), f"{stack_id}-reconcile", "ReconcileQueue"),
        "FLEETKEEPER_KICK_QUEUE_URL": create_queue(aws.sqs(), f"{stack_id}-kicks", "KickQueue"),
        "FLEETKEEPER_REPLICA_HOST": "127.0.0.1",
        "FLEETKEEPER_PROBE_BUDGET_SECONDS": "20",
    }
    if adopt_untagged:  # template.yaml's AdoptUntaggedReplicas=true (fleetkeeper.reconciler.legacy)
        env["FLEETKEEPER_ADOPT_UNTAGGED_REPLICAS"] = "true"
    if balanced:
        alb = make_alb(name=f"fk-{stack_id}-alb")
        env.update(
            {
                "FLEETKEEPER_LOAD_BALANCER": "alb",
                "FLEETKEEPER_ALB_ARN": alb.settings.arn,
                "FLEETKEEPER_ALB_DNS_NAME": alb.settings.dns_name,
                "FLEETKEEPER_ALB_VPC_ID": alb.settings.vpc_id,
                # Each stack's own range, as on one shared ALB they could not be; here they are apart.
                "FLEETKEEPER_ALB_LISTENER_PORTS": "10000-10049",
            }
        )
    return Stack(stack_id=stack_id, env=env)


def instances(*filters: FilterTypeDef) -> list[dict[str, Any]]:
    pages = raw_client("ec2").describe_instances(Filters=[{"Name": "tag-key", "Values": [MANAGED_TAG]}, *filters])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def live_instances_of(stack_id: str) -> dict[str, dict[str, Any]]:
    found = instances({"Name": f"tag:{STACK_TAG}", "Values": [stack_id]})
    return {i["InstanceId"]: i for i in found if i["State"]["Name"] in LIVE}


def converge(stacks: list[Stack], ticks: int = 4) -> None:
    for _ in range(ticks):
        for stack in stacks:
            stack.tick()


@pytest.fixture
def clock(aws: None) -> Iterator[Any]:
    with time_machine.travel(START, tick=True) as traveller:
        yield traveller


@pytest.fixture
def stack_server(server: ProbeServer) -> ProbeServer:
    server.status = 200
    server.requests.clear()
    return server


STACK_IDS = ["0a1b2c3d4e5f", "9f8e7d6c5b4a", "123456abcdef"]


@pytest.mark.parametrize("count", [2, 3])
def test_stacks_side_by_side_keep_their_replicas_and_never_touch_each_others(
    count: int, clock: Any, stack_server: ProbeServer
) -> None:
    stacks = [make_stack(STACK_IDS[n], balanced=False) for n in range(count)]
    for stack in stacks:
        assert stack.api("POST", "/v1/services", {"name": "web", "spec": spec_dict(stack_server.port)}).status == 201
    converge(stacks)
    before = {stack.stack_id: stack.replica_instances("web") for stack in stacks}
    for stack in stacks:
        assert stack.service("web")["status"] == "READY", stack.service("web")
        mine = live_instances_of(stack.stack_id)
        assert sorted(mine) == sorted(before[stack.stack_id].values())
        uid = stack.service("web")["uid"]
        for instance in mine.values():
            # The stack's id on the instance and in its token: nothing of another stack's matches it.
            replica = int(tags(instance)[REPLICA_TAG])
            assert instance["ClientToken"] == client_token(uid, replica, stack=stack.stack_id)

    clock.shift(PAST_GRACE)  # every sweep may now take any orphan it sees
    converge(stacks)

    for stack in stacks:
        assert stack.replica_instances("web") == before[stack.stack_id], "a stack's replicas were replaced"
        assert sorted(live_instances_of(stack.stack_id)) == sorted(before[stack.stack_id].values())
        assert stack.reported("orphans_terminated") == []
        assert stack.reported("adopted_instances") == []
    every = [i for ids in before.values() for i in ids.values()]
    assert len(set(every)) == 2 * count


def test_deleting_a_service_in_one_stack_leaves_the_same_named_service_of_another_alone(
    clock: Any, stack_server: ProbeServer
) -> None:
    a, b = (make_stack(STACK_IDS[n], balanced=True) for n in range(2))
    for stack in (a, b):
        assert stack.api("POST", "/v1/services", {"name": "web", "spec": spec_dict(stack_server.port)}).status == 201
    converge([a, b])
    b_replicas = b.replica_instances("web")
    b_endpoint = b.service("web")["endpoint"]
    elbv2 = raw_client("elbv2")
    groups = {g["TargetGroupName"]: g["TargetGroupArn"] for g in elbv2.describe_target_groups()["TargetGroups"]}
    a_uid, b_uid = a.service("web")["uid"], b.service("web")["uid"]
    # Each stack's target group carries its id in its name and its tag.
    assert set(groups) == {f"fk-{a.stack_id}-{a_uid}", f"fk-{b.stack_id}-{b_uid}"}
    for name, arn in groups.items():
        described = elbv2.describe_tags(ResourceArns=[arn])["TagDescriptions"][0]["Tags"]
        assert {t["Key"]: t["Value"] for t in described}[STACK_TAG] == name.split("-")[1]

    assert a.api("DELETE", "/v1/services/web").status == 202
    clock.shift(PAST_GRACE)
    for _ in range(10):  # a minute a tick, until the drains are over and the service is gone
        converge([a, b], ticks=1)
        if a.api("GET", "/v1/services/web").status == 404:
            break
        clock.shift(timedelta(seconds=61))
    converge([a, b], ticks=2)

    assert a.api("GET", "/v1/services/web").status == 404
    assert live_instances_of(a.stack_id) == {}
    assert b.replica_instances("web") == b_replicas and b.service("web")["status"] == "READY"
    assert sorted(live_instances_of(b.stack_id)) == sorted(b_replicas.values())
    remaining = {g["TargetGroupName"]: g["TargetGroupArn"] for g in elbv2.describe_target_groups()["TargetGroups"]}
    assert set(remaining) == {f"fk-{b.stack_id}-{b_uid}"}
    health = elbv2.describe_target_health(TargetGroupArn=remaining[f"fk-{b.stack_id}-{b_uid}"])
    assert {t["Target"]["Id"] for t in health["TargetHealthDescriptions"]} == set(b_replicas.values())
    assert b.service("web")["endpoint"] == b_endpoint
    listeners = elbv2.describe_listeners(LoadBalancerArn=b.env["FLEETKEEPER_ALB_ARN"])["Listeners"]
    assert len(listeners) == 1


# --- a stack upgraded in place -------------------------------------------------------------------------


class _BeforeStackIds(ec2_driver_module.Ec2Driver):
    """The ec2 driver as the release before stack ids ran it, for the stacks in `OLD`: launches
    without the stack tag and with the token `fk-<uid>-<n>`, lists every managed instance, tags nothing."""

    OLD: set[str] = set()

    @property
    def _old(self) -> bool:
        return self.stack_id in self.OLD

    def list_instances(self, uids: Any = None) -> Any:
        if self._old and uids is None:
            return self._describe([ec2_driver_module._MANAGED_FILTER])
        return super().list_instances(uids)

    def adopt(self, instance_ids: Any) -> None:
        if not self._old:
            super().adopt(instance_ids)

    def _run_instances_args(self, request: LaunchRequest, *rest: Any) -> RunInstancesRequestTypeDef:
        args = super()._run_instances_args(request, *rest)
        if self._old:
            args["ClientToken"] = client_token(request.uid, request.replica_id, request.attempt)
            for spec in args["TagSpecifications"]:
                spec["Tags"] = [t for t in spec["Tags"] if t["Key"] != STACK_TAG]
        return args


class _AlbBeforeStackIds(alb_module.AlbBalancer):
    """The alb balancer as the release before stack ids ran it (for the stacks in _BeforeStackIds.OLD):
    target groups named `fk-<uid>`, nothing tagged with a stack id."""

    def ensure(self, service: str, uid: str, config: Any, known: Any) -> Any:
        if self.settings.stack_id not in _BeforeStackIds.OLD:
            return super().ensure(service, uid, config, known)
        settings, self.settings = self.settings, replace(self.settings, stack_id="")
        try:
            return super().ensure(service, uid, config, known)
        finally:
            self.settings = settings

    def _adopt_recorded(self, arn: str) -> None:
        if self.settings.stack_id not in _BeforeStackIds.OLD:
            super()._adopt_recorded(arn)


def test_an_upgraded_stack_adopts_its_own_replicas_without_a_restart_and_no_other_stack_does(
    clock: Any, stack_server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ec2_driver_module, "Ec2Driver", _BeforeStackIds)
    monkeypatch.setattr(alb_module, "AlbBalancer", _AlbBeforeStackIds)
    tags_of = alb_balancer_module.service_tags
    monkeypatch.setattr(
        alb_balancer_module,
        "service_tags",
        lambda *args: [t for t in tags_of(*args) if t["Key"] != STACK_TAG or t["Value"]],
    )
    # Both deployed with the adoption on: the upgraded stack's own are adopted, the other takes none.
    old, new = (make_stack(STACK_IDS[n], balanced=True, adopt_untagged=True) for n in range(2))
    _BeforeStackIds.OLD = {old.stack_id}
    # The old release ran under the old release's template, whose grants the strict layer does not
    # have: its calls are not judged. From the upgrade on, every call is.
    controller = active_controller()
    old_release = controller.calling_as(None) if controller is not None else contextlib.nullcontext()
    old_release.__enter__()
    for stack in (old, new):
        assert stack.api("POST", "/v1/services", {"name": "web", "spec": spec_dict(stack_server.port)}).status == 201
    # A service the old stack deleted before the upgrade whose replica outlived it (its item gone).
    assert old.api("POST", "/v1/services", {"name": "gone", "spec": spec_dict(stack_server.port, 1)}).status == 201
    converge([old, new])
    gone_uid = old.service("gone")["uid"]
    (leftover,) = old.replica_instances("gone").values()
    with old.active():
        aws.dynamodb().delete_item(TableName=old.env["TABLE_NAME"], Key={"PK": {"S": "SVC#gone"}, "SK": {"S": "META"}})
    legacy = old.replica_instances("web")
    for instance_id in [*legacy.values(), leftover]:
        (described,) = instances({"Name": "instance-id", "Values": [instance_id]})
        assert STACK_TAG not in tags(described) and described["ClientToken"].startswith("fk-")
        assert not described["ClientToken"].startswith(f"fk-{old.stack_id}-")
    groups = raw_client("elbv2").describe_target_groups()["TargetGroups"]
    old_group = next(g for g in groups if g["TargetGroupName"] == f"fk-{old.service('web')['uid']}")

    # The new stack ran beside the old release all along, past the grace period: it took nothing.
    clock.shift(PAST_GRACE)
    converge([new])
    assert all(
        instances({"Name": "instance-id", "Values": [i]})[0]["State"]["Name"] == "running" for i in legacy.values()
    )

    # The upgrade: the same stack, the code that knows stack ids. No restart of any replica.
    old_release.__exit__(None, None, None)
    _BeforeStackIds.OLD = set()
    for stack in (old, new):
        stack.runs.clear()
        stack.dispatches.clear()
    converge([old, new])
    assert old.replica_instances("web") == legacy and old.service("web")["status"] == "READY"
    assert sorted(live_instances_of(old.stack_id)) == sorted(legacy.values())
    assert sorted(old.reported("adopted_instances")) == sorted(legacy.values())
    assert old.reported("orphans_terminated") == []
    assert new.reported("adopted_instances") == []
    assert new.reported("orphans_terminated") == []
    # Its target group (named before stack ids) is tagged before anything changes it (a steady state
    # changes nothing): an update's replicas register with it, the old ones leave it.
    assert old.api("PUT", "/v1/services/web", {"spec": spec_dict(stack_server.port, 3)}).status == 200
    for _ in range(8):
        converge([old, new], ticks=1)
        clock.shift(timedelta(seconds=61))
    assert old.service("web")["status"] == "READY" and old.service("web")["endpoint"] is not None
    health = raw_client("elbv2").describe_target_health(TargetGroupArn=old_group["TargetGroupArn"])
    registered = {t["Target"]["Id"] for t in health["TargetHealthDescriptions"]}
    assert set(old.replica_instances("web").values()) <= registered
    assert len(old.replica_instances("web")) == 3
    group_tags = raw_client("elbv2").describe_tags(ResourceArns=[old_group["TargetGroupArn"]])["TagDescriptions"][0]
    assert {t["Key"]: t["Value"] for t in group_tags["Tags"]}.get(STACK_TAG) == old.stack_id
    # The leftover of the service deleted before the upgrade: nothing proves whose it is, so no stack
    # adopts or sweeps it (docs/architecture/stacks-and-security.md, "A stack upgraded in place",
    # says what the operator does with it).
    (described,) = instances({"Name": "instance-id", "Values": [leftover]})
    assert described["State"]["Name"] == "running" and STACK_TAG not in tags(described)
    assert tags(described)[UID_TAG] == gone_uid


def test_with_the_adoption_off_an_upgraded_stack_leaves_its_replicas_from_before_stack_ids_alone(
    clock: Any, stack_server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ec2_driver_module, "Ec2Driver", _BeforeStackIds)
    # The old release counts its untagged replicas as its own (here: the adoption on, its tagging a no-op).
    old = make_stack(STACK_IDS[0], balanced=False, adopt_untagged=True)
    _BeforeStackIds.OLD = {old.stack_id}
    controller = active_controller()  # the old release's calls are not judged (as above)
    with controller.calling_as(None) if controller is not None else contextlib.nullcontext():
        assert old.api("POST", "/v1/services", {"name": "web", "spec": spec_dict(stack_server.port)}).status == 201
        converge([old])
    legacy = old.replica_instances("web")
    assert legacy and old.service("web")["status"] == "READY"

    # The upgrade, with AdoptUntaggedReplicas at its default, "false": no replica of the old release
    # is tagged, kept or terminated.
    _BeforeStackIds.OLD = set()
    del old.env["FLEETKEEPER_ADOPT_UNTAGGED_REPLICAS"]
    old.runs.clear()
    old.dispatches.clear()
    converge([old])
    assert old.reported("adopted_instances") == []
    assert set(legacy.values()) <= set(old.reported("foreign_instances"))
    assert old.reported("orphans_terminated") == []
    # Its service does not count them: once their instances are lost to it (Policy.lost_instance_grace),
    # their replicas are replaced by instances tagged with its id, and they are still left alone.
    clock.shift(Policy().lost_instance_grace + timedelta(minutes=1))
    converge([old])
    replaced = old.replica_instances("web")
    assert set(replaced.values()).isdisjoint(legacy.values()) and old.service("web")["status"] == "READY"
    assert sorted(live_instances_of(old.stack_id)) == sorted(replaced.values())
    assert old.reported("adopted_instances") == [] and old.reported("orphans_terminated") == []
    for instance_id in legacy.values():
        (described,) = instances({"Name": "instance-id", "Values": [instance_id]})
        assert described["State"]["Name"] == "running" and STACK_TAG not in tags(described)


# --- what else a stack creates ----------------------------------------------------------------------


def test_aws_refuses_a_client_token_over_64_characters(strict_aws: Any) -> None:
    from botocore.exceptions import ClientError

    ec2 = aws.ec2()
    ok = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, ClientToken="t" * 64)
    assert ok["Instances"]
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, ClientToken="t" * 65)


@pytest.mark.usefixtures("aws")
def test_parameters_and_workdir_copies_carry_the_stack_id() -> None:
    import hashlib

    from fleetkeeper.replicas.secrets import SecretStore
    from fleetkeeper.replicas.workdirs import S3WorkdirStore, checksum_header, service_key, upload_key

    SecretStore("/fleetkeeper/t", stack_id="0a1b2c3d4e5f").put("web", "u1", "r1", {"TOKEN": "x"})
    listed = aws.ssm().list_tags_for_resource(ResourceType="Parameter", ResourceId="/fleetkeeper/t/web/u1/r1")
    assert listed["TagList"] == [{"Key": STACK_TAG, "Value": "0a1b2c3d4e5f"}]

    aws.s3().create_bucket(Bucket="workdirs")
    body = b"packed"
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    aws.s3().put_object(Bucket="workdirs", Key=upload_key(digest), Body=body, ChecksumSHA256=checksum_header(digest))
    S3WorkdirStore("workdirs", stack_id="0a1b2c3d4e5f").adopt(digest, "web", "u1")
    tagging = aws.s3().get_object_tagging(Bucket="workdirs", Key=service_key("web", "u1", digest))
    assert tagging["TagSet"] == [{"Key": STACK_TAG, "Value": "0a1b2c3d4e5f"}]
