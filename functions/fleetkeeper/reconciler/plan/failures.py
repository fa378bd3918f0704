"""Whose fault a failure is, from codes alone (never from messages): fleetkeeper's own failure codes,
the launch refusals that are the environment's, the state reasons of a spot reclaim."""

from __future__ import annotations

from fleetkeeper.model import (
    FailureCause,
)

# fleetkeeper's own failure codes, for failures no AWS code describes. All count against the version.
NOT_IN_USE = "Target.NotInUse"  # a READY replica the load balancer took but sends nothing (a zone it lacks)
PROBE_FAILED = "Fleetkeeper.ProbeFailed"  # FAILED_PROBING: failed probes for the consecutive-failure window
INITIAL_DELAY_EXCEEDED = "Fleetkeeper.InitialDelayExceeded"  # FAILED_INITIAL_DELAY
# PREEMPTED: the instance ended with no state reason, or DescribeInstances stopped listing it.
INSTANCE_LOST = "Fleetkeeper.InstanceLost"
# FAILED: the replica's app exited by itself (the process driver's state reason code). A crash of the
# app, the version's fault; not a preemption.
APP_EXITED = "Fleetkeeper.ProcessExited"

# What a replica's boot reports on its port when it failed for the environment (reconciler/
# replica_boot.py sends the code in a header the probe reads: a typed field, never a message). Never
# counted against the version: the version's code never ran.
BOOT_FAILURES = {
    # IMDS gave no credentials, or S3/SSM kept refusing them, for the boot's whole propagation bound:
    # IAM had not made the owner's new role usable (or the role lacks its permissions).
    "Fleetkeeper.BootIdentityNotReady": (
        "its boot waited for the instance role's credentials and permissions (IAM propagation) and gave up"
    ),
    # The secrets parameter is not what fleetkeeper writes (not a SecureString under the stack's
    # key, or names the version does not declare): someone replaced it. Loud: its event says so.
    "Fleetkeeper.SecretsParameterRejected": (
        "its secrets parameter failed verification (not the SecureString under the stack's key with the "
        "version's names that fleetkeeper wrote: replaced outside fleetkeeper?); its values were not used"
    ),
}

# RunInstances refusals that say nothing about the version: the zone is out of capacity or does not
# offer the instance type (the next attempt goes to the next subnet), the account is at a limit, or
# EC2 is having a moment. They are retried with backoff (the status message says why) and never
# count toward the circuit breaker: a capacity blip must not fail a good version. Any other refusal
# (a missing AMI, a bad parameter, a denied permission) is the version's.
ENVIRONMENT_REFUSALS = frozenset(
    {
        "Unsupported",
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientFreeAddressesInSubnet",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "UnfulfillableCapacity",
        "RequestLimitExceeded",
        "ThrottlingException",
        "Throttling",
        "ServiceUnavailable",
        "Unavailable",
        "InternalError",
        # The first spot launch of an account needs EC2's spot service-linked role; the stack may
        # create it (template.yaml, SpotServiceLinkedRole), and an account whose SCP forbids that
        # needs an administrator to create it once: the account's fault, never the version's.
        "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
        # A retried launch's ClientToken names an instance that has ended, or a request with other
        # parameters: about that token, not the version (the next attempt carries a new token).
        "IdempotentInstanceTerminated",
        "IdempotentParameterMismatch",
        # The process driver's (embedded mode): the laptop ran out of ports or could not start bash.
        "NoFreePort",
        "ProcessLaunchFailed",
        # The ec2 driver's (fleetkeeper.replicas.identity.PROFILE_NOT_READY): an owner's instance profile made
        # seconds ago, which EC2 refuses until IAM has propagated it.
        "Fleetkeeper.InstanceProfileNotReady",
        # ...and for an owner's role IAM would not make (denied, or the account's role quota is full).
        "Fleetkeeper.IdentityUnavailable",
        # The ec2 driver's (drivers/ec2.py NO_SERVED_ZONE): no replica subnet is in a zone the
        # stack's load balancer covers; the stack's parameters must change, not the version.
        "Fleetkeeper.NoSubnetInLoadBalancerZones",
    }
)
# StateReason codes of an instance AWS took back because it was spot. Only these make a preemption a
# spot reclaim: an instance that merely *was* spot and ended for another reason is not one.
SPOT_RECLAIMS = frozenset({"Server.SpotInstanceTermination"})
# `Client.*` StateReason codes of an instance EC2 ended during its launch for a reason of the account,
# not of the version (EC2 API reference, StateReason; *Troubleshoot Amazon EC2 instance launch
# issues*, "Instance terminates immediately":
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html). Each says, for
# people, what to fix. Client.InternalError is what an instance gets when its volumes are encrypted
# (EBS encryption by default, or an encrypted image) under a customer managed KMS key the launching
# role may not use: the instance goes pending -> terminated, however good the version.
ENVIRONMENT_TERMINATIONS = {
    "Client.InternalError": (
        "EC2 ended it during launch; with EBS encryption by default (or an encrypted image) under a "
        "customer managed KMS key, the reconciler's role needs that key: the stack's EbsKmsKeyArn "
        "parameter (docs/DEPLOY.md, 'Encrypted volumes')"
    ),
    "Client.VolumeLimitExceeded": (
        "the account's EBS volume or storage quota is reached: raise it in Service Quotas or free volumes"
    ),
}
# How a spot reclaim's status message ends (for people; the breaker reads `cause`).
SPOT_RECLAIMED = "spot instance reclaimed by AWS"


def refusal_cause(code: str) -> FailureCause:
    """Whose fault a refused launch is, from the refusal's error code."""
    return FailureCause.ENVIRONMENT if code in ENVIRONMENT_REFUSALS else FailureCause.VERSION


def termination_cause(code: str) -> FailureCause:
    """Whose fault an instance's end is, from its state reason code: a spot reclaim; `Server.*` (AWS
    ended it: an internal error, no capacity at launch, a retirement) and the account's launch
    failures (ENVIRONMENT_TERMINATIONS: a KMS key the role may not use, the volume quota) are the
    environment's; any other `Client.*` (shut down from inside, through the API, a missing snapshot),
    a driver's own code (the process driver's: the app exited) and fleetkeeper's own are the version's."""
    if code in SPOT_RECLAIMS:
        return FailureCause.SPOT_RECLAIM
    if code.startswith("Server.") or code in ENVIRONMENT_TERMINATIONS:
        return FailureCause.ENVIRONMENT
    return FailureCause.VERSION
