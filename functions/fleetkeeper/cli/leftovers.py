"""What a deleted service may have left in the account: `fleetkeeper doctor`'s last check.

Read-only calls with the caller's own credentials (a role with the stack's read rights), each
looking for what the reconciler makes for an incarnation (its uid), named and tagged as
fleetkeeper.reconciler's drivers make them:

- instances: `ec2:DescribeInstances` filtered on the stack's tag and the uids' tags; any instance
  not `terminated` is left (a `shutting-down` one is still on its way: the caller asks again);
- target groups: `elasticloadbalancing:DescribeTargetGroups` by the deterministic name
  `fk-<stack id>-<uid>` (TargetGroupNotFound is the answer wanted);
- routes: on the stack's load balancers (the template's, found by the `LoadBalancerDnsName` output,
  and its pools `fk-<stack id>-<n>`: `DescribeLoadBalancers`), every listener
  (`DescribeListeners`) and every rule of the listeners no service owns (`DescribeRules`), with
  their tags (`DescribeTags`, 20 resources a call): a listener or rule carrying one of the uids, or a
  rule for the host `NAME.<domain>`, is left.

ELB's Describe* actions and ec2:DescribeInstances take no resource-level permissions (Resource "*"):
https://docs.aws.amazon.com/service-authorization/latest/reference/list_awselasticloadbalancingv2.html
and https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.reconciler.balancer import SERVICE_TAG, UID_TAG, pool_number, target_group_name
from fleetkeeper.reconciler.driver import REPLICA_TAG, STACK_TAG

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

# Every state but `terminated` holds (or may still hold) the instance.
_NOT_GONE = ["pending", "running", "shutting-down", "stopping", "stopped"]
_TAGS_PER_CALL = 20  # DescribeTags' ResourceArns limit


class CheckFailed(Exception):
    """A read the check needs was refused or failed; the message names the IAM action."""


@dataclass(frozen=True)
class Made:
    """One incarnation the doctor created."""

    name: str
    uid: str


class AwsLeftovers:
    """The read-only checks above, for one stack (its id, and its template load balancer's DNS name)."""

    def __init__(self, ec2: Any, elbv2: Any, stack_id: str, load_balancer_dns: str | None) -> None:
        self.ec2 = ec2
        self.elbv2 = elbv2
        self.stack_id = stack_id
        self.load_balancer_dns = (load_balancer_dns or "").lower()

    def find(self, made: Sequence[Made]) -> list[str]:
        """Every resource of these incarnations still there, one line each (empty: nothing left)."""
        if not made:
            return []
        return [*self.instances(made), *self.target_groups(made), *self.routes(made)]

    def instances(self, made: Sequence[Made]) -> list[str]:
        names = {m.uid: m.name for m in made}
        filters = [
            {"Name": f"tag:{STACK_TAG}", "Values": [self.stack_id]},
            {"Name": f"tag:{UID_TAG}", "Values": sorted(names)},
            {"Name": "instance-state-name", "Values": _NOT_GONE},
        ]
        left = []
        pages = _pages(self.ec2, "describe_instances", "ec2:DescribeInstances", "Reservations", Filters=filters)
        for reservation in pages:
            for instance in reservation.get("Instances", []):
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                state = instance.get("State", {}).get("Name", "?")
                name = names.get(tags.get(UID_TAG, ""), "?")
                replica = tags.get(REPLICA_TAG, "?")
                left.append(f"instance {instance['InstanceId']} ({state}) of {name} replica {replica}")
        return left

    def target_groups(self, made: Sequence[Made]) -> list[str]:
        left: list[str] = []
        for one in made:
            group = target_group_name(one.uid, self.stack_id)
            try:
                found = self.elbv2.describe_target_groups(Names=[group])["TargetGroups"]
            except ClientError as exc:
                if _code(exc) == "TargetGroupNotFound":
                    continue
                raise _refused("elasticloadbalancing:DescribeTargetGroups", exc) from None
            except BotoCoreError as exc:
                raise _refused("elasticloadbalancing:DescribeTargetGroups", exc) from None
            left.extend(f"target group {g['TargetGroupArn']} of {one.name}" for g in found)
        return left

    def routes(self, made: Sequence[Made]) -> list[str]:
        uids = {m.uid: m.name for m in made}
        hosts = {m.name for m in made}
        left: list[str] = []
        for balancer in self._stack_balancers():
            listeners = list(
                _pages(
                    self.elbv2,
                    "describe_listeners",
                    "elasticloadbalancing:DescribeListeners",
                    "Listeners",
                    LoadBalancerArn=balancer,
                )
            )
            listener_tags = self._tags([str(lst["ListenerArn"]) for lst in listeners])
            shared: list[str] = []
            for listener in listeners:
                arn = str(listener["ListenerArn"])
                tags = listener_tags.get(arn, {})
                if tags.get(UID_TAG) in uids:
                    left.append(f"listener {arn} (port {listener.get('Port')}) of {uids[tags[UID_TAG]]}")
                elif SERVICE_TAG not in tags:
                    shared.append(arn)  # the stack's own (the host rules' listener, the template's)
            for shared_arn in shared:
                described = _pages(
                    self.elbv2, "describe_rules", "elasticloadbalancing:DescribeRules", "Rules", ListenerArn=shared_arn
                )
                rules = [r for r in described if not r.get("IsDefault")]
                rule_tags = self._tags([str(r["RuleArn"]) for r in rules])
                for rule in rules:
                    arn = str(rule["RuleArn"])
                    uid = rule_tags.get(arn, {}).get(UID_TAG)
                    host = next((h for h in _hosts(rule) if h.split(".", 1)[0] in hosts), None)
                    if uid in uids:
                        left.append(f"rule {arn} of {uids[uid]}")
                    elif host is not None:
                        left.append(f"rule {arn} for host {host}")
        return left

    def _stack_balancers(self) -> Iterator[str]:
        """The stack's load balancers: the template's (by its DNS name) and its pools (by name)."""
        for balancer in _pages(
            self.elbv2, "describe_load_balancers", "elasticloadbalancing:DescribeLoadBalancers", "LoadBalancers"
        ):
            name = str(balancer.get("LoadBalancerName", ""))
            dns = str(balancer.get("DNSName", "")).lower()
            if (self.load_balancer_dns and dns == self.load_balancer_dns) or pool_number(name, self.stack_id):
                yield str(balancer["LoadBalancerArn"])

    def _tags(self, arns: list[str]) -> dict[str, dict[str, str]]:
        tags: dict[str, dict[str, str]] = {}
        for start in range(0, len(arns), _TAGS_PER_CALL):
            try:
                described = self.elbv2.describe_tags(ResourceArns=arns[start : start + _TAGS_PER_CALL])
            except (ClientError, BotoCoreError) as exc:
                raise _refused("elasticloadbalancing:DescribeTags", exc) from None
            for entry in described.get("TagDescriptions", []):
                pairs = entry.get("Tags", [])
                tags[str(entry["ResourceArn"])] = {str(t["Key"]): str(t.get("Value", "")) for t in pairs}
        return tags


def _pages(client: Any, operation: str, action: str, key: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every item of a paginated Describe call; a refusal becomes CheckFailed naming the action."""
    try:
        for page in client.get_paginator(operation).paginate(**kwargs):
            yield from page.get(key, [])
    except (ClientError, BotoCoreError) as exc:
        raise _refused(action, exc) from None


def _hosts(rule: dict[str, Any]) -> list[str]:
    hosts: list[str] = []
    for condition in rule.get("Conditions", []):
        if condition.get("Field") == "host-header":
            hosts.extend(condition.get("HostHeaderConfig", {}).get("Values", []) or condition.get("Values", []))
    return [h.lower() for h in hosts]


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _refused(action: str, exc: Exception) -> CheckFailed:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return CheckFailed(f"could not check ({action}): {error.get('Code')}: {error.get('Message')}")
    return CheckFailed(f"could not check ({action}): {exc}")
