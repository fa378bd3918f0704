"""DNS records of services past pool 0: with a domain and a hosted zone, `NAME.<domain>` as an alias
A record to the service's pool (the user's wildcard record points at pool 0, the template's ALB,
only). docs/architecture/load-balancer-pools.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.reconciler.balancer import EndpointRefused
from fleetkeeper.reconciler.balancers.alb.elb import code
from fleetkeeper.reconciler.balancers.alb.pools import Pools

if TYPE_CHECKING:
    from fleetkeeper.reconciler.balancers.alb.pools import AlbPool


class Dns(Pools):
    """The hosted zone's records for the services on pools n >= 1."""

    def _record_name(self, service: str) -> str:
        return f"{service}.{self.settings.domain_name}".lower()

    def _claim_name(self, service: str) -> dict[str, Any] | None:
        """NAME.<domain> must be free in the hosted zone, or this stack's own record (an alias to one
        of its load balancers). A record of another system shadows the wildcard that serves pool 0,
        and UPSERT would overwrite it for a pool past it: a service is not allowed to take over a
        name the zone already gives to something else. Refused before anything is made; else the
        record found (None: the name is free)."""
        record = self._record(service)
        if record is not None and not self._ours_record(record):
            raise EndpointRefused(
                f"the hosted zone {self.settings.hosted_zone_id} already has a record {self._record_name(service)} "
                f"({record.get('Type')}) that is not this stack's: give the service another name, or delete "
                "that record"
            )
        return record

    def _record(self, service: str) -> dict[str, Any] | None:
        """The hosted zone's record named NAME.<domain> (the first of its types), or None."""
        name = self._record_name(service)
        found = (
            aws.route53()
            .list_resource_record_sets(HostedZoneId=self.settings.hosted_zone_id, StartRecordName=name, MaxItems="1")
            .get("ResourceRecordSets", [])
        )
        if found and str(found[0].get("Name", "")).rstrip(".").lower() == name:
            return dict(found[0])
        return None

    def _ours_record(self, record: dict[str, Any]) -> bool:
        """An A alias to one of this stack's load balancers (the template's or a pool)."""
        if record.get("Type") != "A":
            return False
        self._discover()
        ours = {self.settings.dns_name.lower(), *(pool.dns_name.lower() for pool in self._pools.values())}
        return _alias_target(record) in ours - {""}

    def _publish(self, service: str, pool: AlbPool) -> None:
        """NAME.<domain> as an alias A record to the pool (the user's wildcard points at pool 0
        only): UPSERT, so a retry changes nothing (*ChangeResourceRecordSets*). Not called when the
        claim's read found the record naming the pool already: Route 53's request rate is the
        account's, shared with every other caller in it (docs/architecture/load-balancer-pools.md)."""
        comment = f"fleetkeeper {self.settings.stack_id}: service {service} on load balancer pool {pool.number}"
        aws.route53().change_resource_record_sets(
            HostedZoneId=self.settings.hosted_zone_id,
            ChangeBatch={
                "Comment": comment,
                "Changes": [{"Action": "UPSERT", "ResourceRecordSet": self._alias(service, pool)}],
            },
        )

    def _alias(self, service: str, pool: AlbPool) -> dict[str, Any]:
        internet_facing = self.settings.scheme == "internet-facing"
        return {
            "Name": self._record_name(service),
            "Type": "A",
            "AliasTarget": {
                "HostedZoneId": pool.zone_id,
                "DNSName": f"dualstack.{pool.dns_name}" if internet_facing else pool.dns_name,
                "EvaluateTargetHealth": False,
            },
        }

    def _unpublish(self, service: str, pool: AlbPool) -> None:
        """The service's record, if it still names this pool (a DELETE must give the record as it is)."""
        if not self.settings.hosted_zone_id:
            return
        record = self._record(service)
        if not names_pool(record, pool):
            return  # none, or another's (a later incarnation's, on another pool): not this one's to delete
        try:
            aws.route53().change_resource_record_sets(
                HostedZoneId=self.settings.hosted_zone_id,
                ChangeBatch={"Changes": [{"Action": "DELETE", "ResourceRecordSet": record}]},
            )
        except ClientError as exc:
            if code(exc) != "InvalidChangeBatch":  # deleted meanwhile
                raise


def names_pool(record: dict[str, Any] | None, pool: AlbPool) -> bool:
    """Whether a record is the alias A record to this pool."""
    return record is not None and record.get("Type") == "A" and _alias_target(record) == pool.dns_name.lower()


def _alias_target(record: dict[str, Any]) -> str:
    """The load balancer DNS name an alias record points at ("" for a record that is no alias)."""
    target = str((record.get("AliasTarget") or {}).get("DNSName", "")).rstrip(".").lower()
    return target.removeprefix("dualstack.")
