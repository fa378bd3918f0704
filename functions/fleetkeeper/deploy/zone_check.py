"""The deploy-time check that the load balancer's zones cover the replicas' (a CloudFormation custom resource).

A target in an Availability Zone the ALB has no subnet in is registered but `unused`, reason
`Target.NotInUse`: the ALB sends it nothing (Elastic Load Balancing, *Target health status*,
https://docs.aws.amazon.com/elasticloadbalancing/latest/application/target-group-health-checks.html).
A stack whose `LoadBalancerSubnetIds` leave out a zone of its `ReplicaSubnetIds` would launch
replicas there that serve nothing, so the deployment refuses it, before anything serves.

CloudFormation `Rules` cannot say this: a rule reads a subnet's zone only from a parameter of an
AWS-specific type (`Fn::ValueOfAll` on `List<AWS::EC2::Subnet::Id>`), and `LoadBalancerSubnetIds`
has to stay a `CommaDelimitedList` to be optional (an AWS-specific list cannot be empty). So a
custom resource asks EC2 (one DescribeSubnets) when the stack is created or either list changes,
and answers FAILED, naming the zones and what to give, which fails and rolls back the deployment.
Deleting it always succeeds: a check must never keep a stack from being deleted.

The reconciler keeps its run-time guard too (`Ec2Driver.launch_subnets`, the same `served_subnets`),
for a stack deployed before this check.

The function's role is created by the same deployment, seconds before CloudFormation invokes it,
and IAM is eventually consistent ("Changes that I make are not always immediately visible":
https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html#troubleshoot_general_eventual-consistency):
a first DescribeSubnets may answer `UnauthorizedOperation` although the role grants it. That is
retried, a bounded number of times within the function's timeout (`PROPAGATION_DELAYS`); a denial
that outlasts them is answered FAILED with EC2's message, as any error.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.deploy import cfn_response
from fleetkeeper.reconciler.balancer import served_subnets

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

# One resource per stack: the same physical id on every update, so CloudFormation never sees a
# replacement (a new id would make it Delete the old one).
PHYSICAL_ID = "fleetkeeper-load-balancer-zones"
# Seconds between DescribeSubnets attempts refused while the new role propagates (60 s in all):
# with the response's PUT (RESPONSE_TIMEOUT_SECONDS) inside template.yaml's Timeout for the function
# (90 s), itself inside the custom resource's ServiceTimeout (120 s).
PROPAGATION_DELAYS = (1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0)
# EC2's code for an action the caller's policies do not allow (what a role not yet visible gets).
_NOT_YET_AUTHORIZED = "UnauthorizedOperation"
RESPONSE_TIMEOUT_SECONDS = 10


def coverage_problem(
    replica_subnets: Sequence[str], balancer_subnets: Sequence[str], zone_of: Mapping[str, str]
) -> str | None:
    """Why the load balancer's subnets do not cover the replicas' zones, or None when they do."""
    unknown = [s for s in (*replica_subnets, *balancer_subnets) if s not in zone_of]
    if unknown:
        return f"EC2 does not know subnet(s) {', '.join(sorted(set(unknown)))} in this Region"
    served = set(served_subnets(replica_subnets, balancer_subnets, zone_of))
    uncovered = [s for s in replica_subnets if s not in served]
    if not uncovered:
        return None
    zones = sorted({zone_of[s] for s in uncovered})
    balancer_zones = sorted({zone_of[s] for s in balancer_subnets})
    return (
        f"ReplicaSubnetIds {', '.join(uncovered)} are in {', '.join(zones)}, where LoadBalancerSubnetIds "
        f"({', '.join(balancer_subnets)}: {', '.join(balancer_zones)}) has no subnet: the load balancer would "
        f"send replicas there no request (Target.NotInUse). Add a subnet of {', '.join(zones)} to "
        "LoadBalancerSubnetIds, or leave those zones out of ReplicaSubnetIds"
    )


def _subnet_list(properties: Mapping[str, Any], name: str) -> list[str]:
    value = properties.get(name, [])
    if isinstance(value, str):
        value = value.split(",")
    return [s.strip() for s in value if isinstance(s, str) and s.strip()]


def check(properties: Mapping[str, Any]) -> str | None:
    """The custom resource's verdict on its properties: None when covered, else the reason."""
    replica = _subnet_list(properties, "ReplicaSubnetIds")
    balancer = _subnet_list(properties, "LoadBalancerSubnetIds")
    if not replica or not balancer:
        return None  # the template creates the resource only when both are given
    described = _describe_subnets(sorted(set(replica) | set(balancer)))
    zone_of = {s["SubnetId"]: s["AvailabilityZone"] for s in described if "SubnetId" in s and "AvailabilityZone" in s}
    return coverage_problem(replica, balancer, zone_of)


def _describe_subnets(subnet_ids: list[str]) -> list[Any]:
    """DescribeSubnets, retried while EC2 answers UnauthorizedOperation (the role propagating)."""
    ec2 = aws.ec2()
    for delay in (*PROPAGATION_DELAYS, None):
        try:
            return list(ec2.describe_subnets(SubnetIds=subnet_ids).get("Subnets", []))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != _NOT_YET_AUTHORIZED or delay is None:
                raise
            logger.warning("DescribeSubnets refused (%s): the role may still be propagating; again in %gs", exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def lambda_handler(event: dict[str, Any], context: object) -> None:
    """CloudFormation's request in, one response PUT to its presigned URL out, whatever happens.

    A custom resource that never answers holds the stack until its ServiceTimeout, so every error
    (a refused DescribeSubnets, an unknown subnet id, a bug) is answered FAILED with its reason.
    """
    reason: str | None
    try:
        reason = None if event.get("RequestType") == "Delete" else check(event.get("ResourceProperties") or {})
    except Exception as exc:  # answered, never raised: see above
        logger.exception("load balancer zone check failed")
        reason = f"the zone check could not run: {type(exc).__name__}: {exc}"
    respond(event, reason)


def respond(event: Mapping[str, Any], reason: str | None) -> None:
    """Answer CloudFormation (fleetkeeper.deploy.cfn_response): FAILED with `reason`, else SUCCESS."""
    cfn_response.send(
        event,
        succeeded=not reason,
        reason=reason or "the load balancer's zones cover every replica subnet",
        physical_id=PHYSICAL_ID,
        timeout=RESPONSE_TIMEOUT_SECONDS,
    )
