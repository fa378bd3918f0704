"""Instances EC2 ends during their launch for the account's reasons, through the shell on the strict
layer: the replica is replaced, the circuit breaker never blames the version, and the status says
what to fix.

With EBS encryption by default (or an encrypted image) under a customer managed KMS key the launching
role may not use, EC2 accepts RunInstances and the instance goes pending -> terminated with StateReason
`Client.InternalError` (EC2 API reference, StateReason; *Troubleshoot Amazon EC2 instance launch
issues*, "Instance terminates immediately"). However often it happens, no version is at fault.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper import aws as aws_clients
from fleetkeeper.model import FailureCause, ReplicaStatus, ServiceStatus, VersionState
from tests.support.reconciler_world import World

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import World


@pytest.mark.parametrize(
    ("code", "told"),
    [("Client.InternalError", "EbsKmsKeyArn"), ("Client.VolumeLimitExceeded", "EBS volume or storage quota")],
)
def test_launches_ended_by_the_accounts_kms_key_or_volume_quota_never_fail_the_version(
    world: World, strict_aws: StrictAws, code: str, told: str
) -> None:
    world.create(replicas=1)
    ended = 0
    for _ in range(6):  # twice the breaker's threshold of failures before any replica is ready
        world.run()
        for instance in world.instances():
            strict_aws.ec2.terminate_by_aws(instance["InstanceId"], code)
            ended += 1
    world.run()
    assert ended >= 6
    state = world.store.require("svc")
    assert state.versions[1].state is not VersionState.FAILED
    assert state.service.status is not ServiceStatus.FAILED
    assert state.service.target_version == 1
    preempted = [r for r in state.replicas.values() if r.status is ReplicaStatus.PREEMPTED]
    assert preempted and all(r.cause is FailureCause.ENVIRONMENT and r.failure_code == code for r in preempted)
    assert told in (state.service.status_message or "")
    # And it keeps trying: a replacement is on its way.
    assert world.instances()


# Guards a regression found by review (commit 5faa8d0): capacity and limit refusals tripped the breaker;
# they are retried with backoff.
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
