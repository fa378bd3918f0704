"""What a stack made outside CloudFormation, found by its own identity and deleted, in passes.

Only what carries this stack's identity is touched (invariant 11: many stacks of the template share
an account and Region): instances tagged `fleetkeeper:managed` and `fleetkeeper:stack` = its id and
launched with a ClientToken it derives (fleetkeeper.reconciler.ownership); load balancers named
`fk-<stack id>-<n>` and tagged with its id; target groups named for it (`fk-<stack id>-*`, the
legacy `fk-<uid>`, `fkwake-<stack id>-<n>`) and tagged with its id; listeners and rules of its own
ALB and listeners that carry the managed tag; alias records in its hosted zone that point at one of
its pools (their DNS names carry its id); roles and instance profiles on its path
`/fleetkeeper/<stack id>/`; parameters under its table's name; objects of its own bucket.

A pass walks the kinds in the order their deletions unblock each other:

    instances        terminated (their owners' roles go below; EC2 stops them in a minute or two)
    routes           the code's listeners on the template's ALB and rules on its listeners: a target
                     group is refused (ResourceInUse) while one forwards to it
    records          before the pools they point at, while their names still say whose they are
    load balancers   the pools (their listeners and rules go with them)
    interfaces       a deleted pool's network interfaces, which AWS releases within minutes: until
                     then the template's security group cannot be deleted (DependencyViolation)
    target groups    the services' and the pools' wake groups, once no route forwards to them
    replica roles    detached from ReplicaOwnerPolicy (which IAM refuses to delete while attached),
                     out of their profiles, both deleted
    parameters       the secrets under /fleetkeeper/<table>/ and the api's HMAC key
    objects          the workdir bucket's (CloudFormation deletes only an empty bucket)

Passes repeat until one finds nothing (the last one only confirms), pausing while something is only
waited for (instances shutting down, interfaces not yet released). Every step is idempotent (what is
gone already is no error), so a pass, an attempt or a whole Delete retried by CloudFormation
continues where an earlier one stopped. Time is bounded by the caller's `remaining` clock: no AWS
call starts with less than `reserve_seconds` left, and the report says what was still there.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.api.request_hmac import key_parameter
from fleetkeeper.reconciler.balancer import (
    MANAGED_TAG,
    MANAGED_VALUE,
    STACK_TAG,
    pool_number,
    wake_group_pool,
)
from fleetkeeper.reconciler.driver import InstanceState
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.reconciler.ownership import is_ours
from fleetkeeper.replicas.identity import ReplicaIdentities
from fleetkeeper.replicas.secrets import parameter_prefix

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

logger = logging.getLogger(__name__)

# AWS's batch sizes: DescribeTags takes 20 ARNs (ELB API reference, DescribeTags), DeleteParameters
# 10 names (SSM API reference), DeleteObjects 1,000 keys (S3 API reference); a Route 53 change batch
# up to 1,000 changes (we send fewer: a failed batch is retried record by record).
_TAGS_PER_CALL = 20
_PARAMETERS_PER_CALL = 10
_OBJECTS_PER_CALL = 1000
_RECORDS_PER_BATCH = 50
_TERMINATE_STATES = {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING, InstanceState.STOPPED}
# A target group named before stacks had ids: fk-<uid>, the uid 16 hex digits (fleetkeeper.model).
_LEGACY_GROUP = re.compile(r"fk-[0-9a-f]{16}")
_GONE = {
    "TargetGroupNotFound",
    "ListenerNotFound",
    "RuleNotFound",
    "LoadBalancerNotFound",
    "InvalidInstanceID.NotFound",
    "NoSuchEntity",
    "NoSuchKey",
}


class OutOfTime(Exception):
    """The attempt's time is up: no further AWS call starts."""


@dataclass(frozen=True)
class StackScope:
    """The stack's identity and its template resources the cleanup works on (the custom resource's
    properties: a property naming a resource is also what makes CloudFormation delete the custom
    resource before it)."""

    stack_id: str
    table_name: str
    workdir_bucket: str
    replica_policy_arn: str
    load_balancer_arn: str = ""
    listener_arns: tuple[str, ...] = ()
    security_group_id: str = ""
    hosted_zone_id: str = ""
    domain_name: str = ""

    def owns_pool_dns(self, dns_name: str) -> bool:
        """Whether an alias target is one of this stack's pools n >= 1: an ALB's DNS name begins with
        its name (`internal-` first for an internal one), and a pool's name carries the stack id."""
        name = dns_name.lower().rstrip(".").removeprefix("dualstack.").removeprefix("internal-")
        return re.match(rf"fk-{re.escape(self.stack_id)}-[1-9][0-9]*-[a-z0-9-]*\.", name) is not None


@dataclass
class Report:
    complete: bool
    passes: int
    deleted: Counter[str] = field(default_factory=Counter)
    # What the last pass found still there (or still waited for) when the time ran out.
    left: Counter[str] = field(default_factory=Counter)
    why: str = ""

    def summary(self) -> str:
        done = _counts(self.deleted) or "nothing"
        if self.complete:
            return f"removed what the stack made outside CloudFormation: {done} ({self.passes} passes)"
        return (
            f"not finished ({self.why or 'time ran out'}): still there: {_counts(self.left) or 'unknown'}; "
            f"removed so far: {done}. Delete the stack again to continue (docs/DEPLOY.md, Uninstall)"
        )


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counter.items()) if n)


@dataclass
class Uninstall:
    scope: StackScope
    remaining: Callable[[], float]  # seconds this attempt has left
    sleep: Callable[[float], None] = time.sleep
    # No AWS call starts with less than this left (a call with its retries fits in it, and the answer
    # to CloudFormation after it).
    reserve_seconds: float = 30.0
    # Between passes while something is only waited for (an instance shutting down, an interface AWS
    # has not released yet).
    pause_seconds: float = 10.0
    # A pass that finds something makes the next one; this many without settling is a report, not a
    # loop (something comes back as fast as it is deleted: what makes it is still running).
    max_passes: int = 60
    deleted: Counter[str] = field(default_factory=Counter)

    # -- the passes ------------------------------------------------------------------------------------

    def run(self) -> Report:
        passes = 0
        found: Counter[str] = Counter()
        while True:
            passes += 1
            try:
                found, waiting = self._pass()
            except OutOfTime:
                return Report(False, passes, self.deleted, found, "time ran out")
            if not found:
                return Report(True, passes, self.deleted)
            if passes >= self.max_passes:
                return Report(False, passes, self.deleted, found, f"still finding things after {passes} passes")
            if waiting:
                if self.remaining() < self.pause_seconds + self.reserve_seconds:
                    return Report(False, passes, self.deleted, waiting, "time ran out while AWS finished")
                self.sleep(self.pause_seconds)

    def _pass(self) -> tuple[Counter[str], Counter[str]]:
        """One walk over every kind: (what it found, of which what is only waited for)."""
        found: Counter[str] = Counter()
        waiting: Counter[str] = Counter()
        live, going = self.instances()
        found["instances"] += live + going
        waiting["instances"] += live + going
        # Without a load balancer (LoadBalancer none) the code makes no endpoint, and the role has no
        # Elastic Load Balancing permission: nothing of it is looked for.
        if self.scope.load_balancer_arn:
            found["listeners"] += self.template_listeners()
            found["rules"] += self.template_rules()
            if self.scope.hosted_zone_id and self.scope.domain_name:
                found["records"] += self.records()
            found["load balancers"] += len(self.pools())
            interfaces = self.pool_interfaces() if self.scope.security_group_id else 0
            found["network interfaces"] += interfaces
            waiting["network interfaces"] += interfaces
            groups, in_use = self.target_groups()
            found["target groups"] += groups
            waiting["target groups"] += in_use
        found["replica roles"] += self.replica_roles()
        found["parameters"] += self.parameters()
        found["objects"] += self.objects()
        return +found, +waiting

    # -- each kind -------------------------------------------------------------------------------------

    def instances(self) -> tuple[int, int]:
        """Terminate the stack's instances; (terminated now, already shutting down)."""
        self._tick()
        driver = Ec2Driver(stack_id=self.scope.stack_id)
        ours = [i for i in driver.list_instances() if is_ours(i, self.scope.stack_id)]
        live = [i.instance_id for i in ours if i.state in _TERMINATE_STATES]
        going = sum(1 for i in ours if i.state is InstanceState.SHUTTING_DOWN)
        if live:
            self._tick()
            driver.terminate(live)
            self.deleted["instances"] += len(live)
            logger.info("terminated %d instances", len(live))
        return len(live), going

    def template_listeners(self) -> int:
        """The services' own listeners on the template's ALB (it carries them without a domain):
        those with the managed tag (the template's own listeners have none)."""
        elbv2 = aws.elbv2()
        listeners = [str(item["ListenerArn"]) for item in self._pages_of_listeners(self.scope.load_balancer_arn)]
        managed = [arn for arn, tags in self._elb_tags(listeners).items() if tags.get(MANAGED_TAG) == MANAGED_VALUE]
        for arn in managed:
            self._delete("listeners", elbv2.delete_listener, ListenerArn=arn)
        return len(managed)

    def template_rules(self) -> int:
        """The services' host rules on the template's listeners: not default, with the managed tag."""
        elbv2 = aws.elbv2()
        rules: list[str] = []
        for listener in self.scope.listener_arns:
            rules.extend(str(r["RuleArn"]) for r in self._pages_of_rules(listener) if not r.get("IsDefault"))
        managed = [arn for arn, tags in self._elb_tags(rules).items() if tags.get(MANAGED_TAG) == MANAGED_VALUE]
        for arn in managed:
            self._delete("rules", elbv2.delete_rule, RuleArn=arn)
        return len(managed)

    def records(self) -> int:
        """The alias A records under the domain that point at one of the stack's pools (the
        reconciler publishes NAME.<domain> for services past pool 0; the wildcard is the user's)."""
        suffix = "." + self.scope.domain_name.lower().rstrip(".")
        ours = [
            record
            for record in self._record_sets()
            if record.get("Type") == "A"
            and str(record.get("Name", "")).lower().rstrip(".").endswith(suffix)
            and not str(record.get("Name", "")).startswith(("*", "\\052"))
            and self.scope.owns_pool_dns(str((record.get("AliasTarget") or {}).get("DNSName", "")))
        ]
        for start in range(0, len(ours), _RECORDS_PER_BATCH):
            self._delete_records(ours[start : start + _RECORDS_PER_BATCH])
        return len(ours)

    def pools(self) -> list[str]:
        """Delete the load balancers the stack made past its first (their listeners and rules go with
        them: *DeleteLoadBalancer*); the ARNs found."""
        elbv2 = aws.elbv2()
        named: list[str] = []
        kwargs: dict[str, Any] = {"PageSize": 400}
        while True:
            self._tick()
            page = elbv2.describe_load_balancers(**kwargs)
            named.extend(
                str(b["LoadBalancerArn"])
                for b in page.get("LoadBalancers", [])
                if pool_number(str(b.get("LoadBalancerName", "")), self.scope.stack_id) is not None
            )
            if not page.get("NextMarker"):
                break
            kwargs["Marker"] = page["NextMarker"]
        ours = [arn for arn, tags in self._elb_tags(named).items() if self._ours(tags)]
        for arn in ours:
            self._delete("load balancers", elbv2.delete_load_balancer, LoadBalancerArn=arn)
        return ours

    def pool_interfaces(self) -> int:
        """Network interfaces of the stack's (deleted) pools still in the template's security group:
        an ALB's carry the description `ELB app/<name>/<id>`. Only waited for: they are AWS's."""
        self._tick()
        prefix = f"ELB app/fk-{self.scope.stack_id}-"
        found = 0
        kwargs: dict[str, Any] = {"Filters": [{"Name": "group-id", "Values": [self.scope.security_group_id]}]}
        while True:
            page = aws.ec2().describe_network_interfaces(**kwargs)
            for interface in page.get("NetworkInterfaces", []):
                described = str(interface.get("Description", ""))
                if described.startswith(prefix) and pool_number(described.split("/")[1], self.scope.stack_id):
                    found += 1
            if not page.get("NextToken"):
                return found
            self._tick()
            kwargs["NextToken"] = page["NextToken"]

    def target_groups(self) -> tuple[int, int]:
        """Delete the services' target groups and the pools' wake groups (the template's own wake
        group carries no managed tag: CloudFormation's); (found, still in use by a route)."""
        elbv2 = aws.elbv2()
        named: list[str] = []
        kwargs: dict[str, Any] = {"PageSize": 400}
        while True:
            self._tick()
            page = elbv2.describe_target_groups(**kwargs)
            named.extend(str(g["TargetGroupArn"]) for g in page.get("TargetGroups", []) if self._our_group_name(g))
            if not page.get("NextMarker"):
                break
            kwargs["Marker"] = page["NextMarker"]
        ours = [arn for arn, tags in self._elb_tags(named).items() if self._ours(tags)]
        in_use = 0
        for arn in ours:
            try:
                self._delete("target groups", elbv2.delete_target_group, TargetGroupArn=arn)
            except ClientError as exc:
                if _code(exc) != "ResourceInUse":
                    raise
                in_use += 1  # a route not yet gone with its load balancer: the next pass
        return len(ours), in_use

    def replica_roles(self) -> int:
        """The owners' roles and profiles on the stack's path, removed as the dispatcher's sweep does."""
        self._tick()
        identities = ReplicaIdentities(self.scope.stack_id, self.scope.replica_policy_arn)
        scopes = sorted(identities.scopes())
        for scope in scopes:
            self._tick()
            identities.remove(scope)
            self.deleted["replica roles"] += 1
        return len(scopes)

    def parameters(self) -> int:
        """The secrets under /fleetkeeper/<table>/ and the api's HMAC key parameter."""
        ssm = aws.ssm()
        names: list[str] = []
        kwargs: dict[str, Any] = {"Path": parameter_prefix(self.scope.table_name), "Recursive": True, "MaxResults": 10}
        while True:
            self._tick()
            page = ssm.get_parameters_by_path(**kwargs)
            names.extend(str(p["Name"]) for p in page.get("Parameters", []) if "Name" in p)
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
        names.append(key_parameter(self.scope.table_name))
        found = 0
        for start in range(0, len(names), _PARAMETERS_PER_CALL):
            self._tick()
            answer = ssm.delete_parameters(Names=names[start : start + _PARAMETERS_PER_CALL])
            found += len(answer.get("DeletedParameters", []))
        self.deleted["parameters"] += found
        return found

    def objects(self) -> int:
        """Every object of the stack's workdir bucket (the bucket is the stack's own; unversioned)."""
        s3 = aws.s3()
        found = 0
        while True:
            self._tick()
            # Always from the start: what this loop deleted is no longer listed.
            try:
                page = s3.list_objects_v2(Bucket=self.scope.workdir_bucket, MaxKeys=_OBJECTS_PER_CALL)
            except ClientError as exc:
                if _code(exc) == "NoSuchBucket":  # deleted by hand: nothing of it is left
                    return found
                raise
            keys = [{"Key": str(o["Key"])} for o in page.get("Contents", []) if "Key" in o]
            if not keys:
                return found
            self._tick()
            answer = s3.delete_objects(Bucket=self.scope.workdir_bucket, Delete={"Objects": keys, "Quiet": True})  # type: ignore[typeddict-item]
            errors = answer.get("Errors", [])
            if errors:
                first = errors[0]
                raise RuntimeError(
                    f"S3 kept {len(errors)} objects of {self.scope.workdir_bucket}: "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
            found += len(keys)
            self.deleted["objects"] += len(keys)

    # -- helpers ---------------------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.remaining() < self.reserve_seconds:
            raise OutOfTime

    def _delete(self, kind: str, call: Callable[..., Any], **kwargs: Any) -> None:
        """One delete call; what is gone already is no error."""
        self._tick()
        try:
            call(**kwargs)
        except ClientError as exc:
            if _code(exc) not in _GONE:
                raise
            return
        self.deleted[kind] += 1

    def _ours(self, tags: Mapping[str, str]) -> bool:
        return tags.get(MANAGED_TAG) == MANAGED_VALUE and tags.get(STACK_TAG) == self.scope.stack_id

    def _our_group_name(self, group: Mapping[str, Any]) -> bool:
        name = str(group.get("TargetGroupName", ""))
        stack = self.scope.stack_id
        pool = wake_group_pool(name, stack)
        return name.startswith(f"fk-{stack}-") or _LEGACY_GROUP.fullmatch(name) is not None or bool(pool)

    def _elb_tags(self, arns: Sequence[str]) -> dict[str, dict[str, str]]:
        """{arn: its tags}, 20 ARNs a DescribeTags; one gone meanwhile is left out."""
        tags: dict[str, dict[str, str]] = {}
        for start in range(0, len(arns), _TAGS_PER_CALL):
            chunk = list(arns[start : start + _TAGS_PER_CALL])
            self._tick()
            try:
                described = aws.elbv2().describe_tags(ResourceArns=chunk).get("TagDescriptions", [])
            except ClientError as exc:
                if _code(exc) not in _GONE:
                    raise
                described = []
                for arn in chunk:  # one went meanwhile: the others one by one
                    self._tick()
                    try:
                        described.extend(aws.elbv2().describe_tags(ResourceArns=[arn]).get("TagDescriptions", []))
                    except ClientError as again:
                        if _code(again) not in _GONE:
                            raise
            for item in described:
                tags[str(item.get("ResourceArn"))] = {
                    str(t.get("Key")): str(t.get("Value", "")) for t in item.get("Tags", [])
                }
        return tags

    def _pages_of_listeners(self, balancer: str) -> Iterator[dict[str, Any]]:
        return self._elb_pages("describe_listeners", "Listeners", LoadBalancerArn=balancer)

    def _pages_of_rules(self, listener: str) -> Iterator[dict[str, Any]]:
        return self._elb_pages("describe_rules", "Rules", ListenerArn=listener)

    def _elb_pages(self, operation: str, key: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Every item of a paged ELB listing (NextMarker), nothing once its parent is gone."""
        kwargs["PageSize"] = 400
        while True:
            self._tick()
            try:
                page = getattr(aws.elbv2(), operation)(**kwargs)
            except ClientError as exc:
                if _code(exc) in _GONE:
                    return
                raise
            yield from (dict(item) for item in page.get(key, []))
            if not page.get("NextMarker"):
                return
            kwargs["Marker"] = page["NextMarker"]

    def _record_sets(self) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"HostedZoneId": self.scope.hosted_zone_id, "MaxItems": "300"}
        while True:
            self._tick()
            page = aws.route53().list_resource_record_sets(**kwargs)
            yield from (dict(item) for item in page.get("ResourceRecordSets", []))
            if not page.get("IsTruncated"):
                return
            kwargs["StartRecordName"] = page["NextRecordName"]
            kwargs["StartRecordType"] = page["NextRecordType"]
            if page.get("NextRecordIdentifier"):
                kwargs["StartRecordIdentifier"] = page["NextRecordIdentifier"]

    def _delete_records(self, records: list[dict[str, Any]]) -> None:
        """One change batch; if Route 53 refuses it (one record changed or went meanwhile: a batch is
        all or nothing), record by record, a refused one being gone already."""
        route53 = aws.route53()

        def change(batch: list[dict[str, Any]]) -> None:
            self._tick()
            route53.change_resource_record_sets(
                HostedZoneId=self.scope.hosted_zone_id,
                ChangeBatch={
                    "Comment": f"fleetkeeper {self.scope.stack_id}: uninstall",
                    "Changes": [{"Action": "DELETE", "ResourceRecordSet": r} for r in batch],
                },
            )
            self.deleted["records"] += len(batch)

        try:
            change(records)
        except ClientError as exc:
            if _code(exc) != "InvalidChangeBatch" or len(records) == 1:
                if _code(exc) == "InvalidChangeBatch":
                    return
                raise
            for record in records:
                try:
                    change([record])
                except ClientError as each:
                    if _code(each) != "InvalidChangeBatch":
                        raise


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
