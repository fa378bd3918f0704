"""The ec2 replica driver: one instance per replica, found by tag, launched idempotently.

Configured by `fleetkeeper.settings.Ec2Settings` (subnets, security groups, instance profile,
default image parameter and instance type, and the test-only replica host), which template.yaml
sets from stack parameters.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.aws import partitions
from fleetkeeper.aws.parsing import only
from fleetkeeper.aws.partitions import DEFAULT_DNS_SUFFIX
from fleetkeeper.model import Market, to_iso
from fleetkeeper.reconciler.balancer import served_subnets
from fleetkeeper.reconciler.driver import (
    MANAGED_TAG,
    MANAGED_VALUE,
    REPLICA_TAG,
    SERVICE_TAG,
    STACK_TAG,
    UID_TAG,
    VERSION_TAG,
    Instance,
    InstanceState,
    LaunchRefused,
    LaunchRequest,
)
from fleetkeeper.reconciler.ownership import is_ours
from fleetkeeper.reconciler.userdata import BootSource, log_stream, user_data
from fleetkeeper.replicas.identity import (
    IDENTITY_UNAVAILABLE,
    PROFILE_NOT_READY,
    OwnerProfiles,
    Profile,
    owner_scope,
)
from fleetkeeper.settings import DEFAULT_IMAGE_PARAMETER, DEFAULT_INSTANCE_TYPE, DEFAULT_STACK_ID
from fleetkeeper.spec import images, task_variables
from fleetkeeper.spec.service import root_device_of_parameter
from fleetkeeper.store.identities import IdentityRecords
from fleetkeeper.store.table import Table

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType, VolumeTypeType
    from mypy_boto3_ec2.type_defs import (
        EbsBlockDeviceTypeDef,
        FilterTypeDef,
        InstanceMarketOptionsRequestTypeDef,
        InstanceTypeDef,
        RunInstancesRequestTypeDef,
        TagTypeDef,
    )

    from fleetkeeper.settings import Ec2Settings

# Refusal code of a disk_size/disk_tier launch whose image's root device cannot be known (counts against the
# version: the spec must change).
UNKNOWN_ROOT_DEVICE = "Fleetkeeper.UnknownRootDevice"
# Refusal code of a launch whose stored spec no AWS instance type satisfies (counts against the version).
NO_INSTANCE_TYPE = "Fleetkeeper.NoInstanceType"
# Refusal code of a launch, without image_id, of an accelerated type no Deep Learning AMI drives (p3dn).
NO_IMAGE = "Fleetkeeper.NoImage"
# Refusal code of a launch when no replica subnet is in a zone the stack's load balancer is enabled
# in: the stack's configuration, never the version's (plan.ENVIRONMENT_REFUSALS).
NO_SERVED_ZONE = "Fleetkeeper.NoSubnetInLoadBalancerZones"
# A subnet's zone never changes (EC2 CreateSubnet fixes it), so what DescribeSubnets said about a
# set of subnets holds for the function instance's life: one call per cold start, not per run.
_served_subnets: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}
_MANAGED_FILTER: FilterTypeDef = {"Name": f"tag:{MANAGED_TAG}", "Values": [MANAGED_VALUE]}
_PAGE_SIZE = 1000
# EC2's limit on filter values per Describe call, less the managed tag's one value (a listing by uid
# carries no stack filter: it must see this stack's replicas from before stacks had ids).
_UIDS_PER_CALL = 200 - 1
# What `_instance` reads of a DescribeInstances answer: the only members parsed (aws.parsing.only).
# Most of an instance's description (network interfaces, block devices...) is never parsed.
_DESCRIBED: dict[str, frozenset[str]] = {
    "DescribeInstancesResult": frozenset({"Reservations", "NextToken"}),
    "Reservation": frozenset({"Instances"}),
    "Instance": frozenset(
        {
            "InstanceId",
            "State",
            "Tags",
            "PrivateIpAddress",
            "InstanceLifecycle",
            "StateReason",
            "LaunchTime",
            "ClientToken",
            "InstanceType",
        }
    ),
}
_TERMINATE_CHUNK = 500
# How RunInstances buys each market (None: on demand, its default); tests/test_choices.py holds it to
# one per Market. A spot instance is a one-time request AWS terminates when it takes the capacity back.
MARKET_OPTIONS: Mapping[Market, InstanceMarketOptionsRequestTypeDef | None] = {
    Market.ON_DEMAND: None,
    Market.SPOT: {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
    },
}
_LIVE_STATES = ["pending", "running", "stopping", "stopped"]
# Errors that are about this request at this moment, not about the launch: botocore already retried
# them; let them fail the run (the next run retries) rather than count as a refusal of the version.
_TRANSIENT = {
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
}


@dataclass
class Ec2Driver:
    subnet_ids: list[str] = field(default_factory=list)
    # The load balancer's subnets: replicas launch only in the replica subnets of zones these cover.
    load_balancer_subnet_ids: list[str] = field(default_factory=list)
    security_group_ids: list[str] = field(default_factory=list)
    instance_profile_arn: str | None = None
    default_image_parameter: str = DEFAULT_IMAGE_PARAMETER
    default_instance_type: str = DEFAULT_INSTANCE_TYPE
    replica_host: str | None = None
    workdir_bucket: str | None = None
    secrets_prefix: str | None = None
    # The key the boot requires the secrets parameter under, and the partition's endpoint suffix.
    secrets_key_id: str | None = None
    dns_suffix: str = DEFAULT_DNS_SUFFIX
    replica_log_group: str | None = None
    stack_id: str = DEFAULT_STACK_ID
    # Replica identity "owner": the owners' profiles as the dispatcher recorded them
    # (fleetkeeper.replicas.identity; the reconciler makes no IAM call). None: every replica runs with
    # `instance_profile_arn` (identity "shared", and services without an owner in either mode).
    identities: OwnerProfiles | None = None
    # Per run (a driver lives for one run): AMI id -> root device name.
    _root_devices: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, settings: Ec2Settings) -> Ec2Driver:
        return cls(
            subnet_ids=list(settings.subnet_ids),
            load_balancer_subnet_ids=list(settings.load_balancer_subnet_ids),
            security_group_ids=list(settings.security_group_ids),
            instance_profile_arn=settings.instance_profile_arn,
            default_image_parameter=settings.default_image_parameter,
            default_instance_type=settings.default_instance_type,
            replica_host=settings.replica_host,
            workdir_bucket=settings.workdir_bucket,
            secrets_prefix=settings.secrets_prefix,
            secrets_key_id=settings.secrets_key_id,
            dns_suffix=partitions.dns_suffix(settings.region),
            replica_log_group=settings.replica_log_group,
            stack_id=settings.stack_id,
            identities=(
                OwnerProfiles(settings.stack_id, IdentityRecords(Table(settings.table_name)))
                if settings.replica_identity == "owner" and settings.replica_policy_arn and settings.table_name
                else None
            ),
        )

    @property
    def ec2(self) -> EC2Client:
        return aws.ec2()

    # -- observe --

    @property
    def _stack_filter(self) -> FilterTypeDef:
        return {"Name": f"tag:{STACK_TAG}", "Values": [self.stack_id]}

    def list_instances(self, uids: Sequence[str] | None = None) -> list[Instance]:
        """ONE paginated DescribeInstances on the managed and stack tags (the same test the IAM
        policy applies before it lets an instance be terminated), or on the managed and uid tags for
        some services.

        By uid, without the stack tag: the uids are this stack's own (its table's), and its replicas
        launched before stacks had ids carry no stack tag yet; the caller keeps only its own
        (fleetkeeper.reconciler.ownership), adopting those.

        EC2 takes at most 200 filter values a call (FilterLimitExceeded): more uids than fit beside
        the managed tag's value are described in as many calls as they need (a shard never needs two).
        """
        if uids is None:
            return self._describe([_MANAGED_FILTER, self._stack_filter])
        wanted = sorted(set(uids))
        instances: list[Instance] = []
        for start in range(0, len(wanted), _UIDS_PER_CALL):
            chunk = wanted[start : start + _UIDS_PER_CALL]
            instances.extend(self._describe([_MANAGED_FILTER, {"Name": f"tag:{UID_TAG}", "Values": chunk}]))
        return instances

    def find_instance(self, uid: str, replica_id: int) -> Instance | None:
        found = self._describe(
            [
                _MANAGED_FILTER,
                {"Name": f"tag:{UID_TAG}", "Values": [uid]},
                {"Name": f"tag:{REPLICA_TAG}", "Values": [str(replica_id)]},
                {"Name": "instance-state-name", "Values": _LIVE_STATES},
            ]
        )
        # An instance someone else tagged as this replica's is not it (plan.launched_by_fleetkeeper),
        # nor one of another stack's (the uid is this stack's own: its own legacy replica is).
        ours = [i for i in found if is_ours(i, self.stack_id, {uid})]
        return min(ours, key=lambda i: (i.launched_at or "", i.instance_id), default=None)

    def instance(self, instance_id: str) -> Instance | None:
        """The managed instance `instance_id`, whichever stack's (the caller asks ownership)."""
        try:
            found = self._describe([_MANAGED_FILTER], instance_ids=[instance_id])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound":
                return None  # gone, or not visible yet
            raise
        return found[0] if found else None

    def _describe(self, filters: list[FilterTypeDef], instance_ids: list[str] | None = None) -> list[Instance]:
        instances: list[Instance] = []
        kwargs: dict[str, Any] = {"Filters": filters}
        if instance_ids:
            kwargs["InstanceIds"] = instance_ids  # EC2 refuses MaxResults beside InstanceIds
        else:
            kwargs["MaxResults"] = _PAGE_SIZE
        while True:
            with only(_DESCRIBED):
                page = self.ec2.describe_instances(**kwargs)
            for reservation in page.get("Reservations", []):
                instances.extend(_instance(raw) for raw in reservation.get("Instances", []))
            token = page.get("NextToken")
            if not token:
                return instances
            kwargs["NextToken"] = token

    # -- act --

    def adopt(self, instance_ids: Sequence[str]) -> None:
        """Tag this stack's replicas from before stacks had ids with its id (CreateTags takes up to
        1000 resources; the IAM policy lets it add this one tag only to managed instances without it)."""
        ids = list(dict.fromkeys(instance_ids))
        for start in range(0, len(ids), _TERMINATE_CHUNK):
            self.ec2.create_tags(
                Resources=ids[start : start + _TERMINATE_CHUNK], Tags=[{"Key": STACK_TAG, "Value": self.stack_id}]
            )

    def pool_count(self, request: LaunchRequest) -> int:
        try:
            types = len(self._instance_types(request))
        except LaunchRefused:
            return 1  # no instance type at all: the one launch attempt says why (NO_INSTANCE_TYPE)
        try:
            subnets = len(self.launch_subnets())
        except LaunchRefused:
            return 1  # no subnet at all: the one launch attempt says why (NO_SERVED_ZONE)
        return types * max(subnets, 1)

    def launch_subnets(self) -> list[str]:
        """The replica subnets a launch may use: those in a zone the load balancer is enabled in.

        A target in a zone the ALB has no subnet in is registered but `unused` with reason
        `Target.NotInUse`: it would serve nothing (Elastic Load Balancing, "Target health status").
        The deployment refuses such a stack (fleetkeeper.deploy.zone_check, a custom resource); the driver
        keeps the guard for a stack deployed before that check, from one DescribeSubnets per cold
        start. Without a load balancer, or when it shares the replicas'
        subnets, every replica subnet serves and nothing is asked.
        """
        if not self.subnet_ids or not self.load_balancer_subnet_ids:
            return self.subnet_ids
        if set(self.subnet_ids) <= set(self.load_balancer_subnet_ids):
            return self.subnet_ids
        key = (tuple(self.subnet_ids), tuple(self.load_balancer_subnet_ids))
        served = _served_subnets.get(key)
        if served is None:
            served = self._subnets_in_balancer_zones()
            _served_subnets[key] = served
        if not served:
            raise LaunchRefused(
                NO_SERVED_ZONE,
                f"no replica subnet ({', '.join(self.subnet_ids)}) is in a zone the load balancer is enabled in: "
                "give the stack's LoadBalancerSubnetIds a subnet in each zone of ReplicaSubnetIds",
            )
        return list(served)

    def _subnets_in_balancer_zones(self) -> tuple[str, ...]:
        subnets = sorted(set(self.subnet_ids) | set(self.load_balancer_subnet_ids))
        described = self.ec2.describe_subnets(SubnetIds=subnets).get("Subnets", [])
        zone = {s["SubnetId"]: s["AvailabilityZone"] for s in described if "SubnetId" in s and "AvailabilityZone" in s}
        return tuple(served_subnets(self.subnet_ids, self.load_balancer_subnet_ids, zone))

    def pool(self, request: LaunchRequest) -> tuple[str, str | None]:
        """The capacity pool (instance type, subnet) launch attempt `request.attempt` goes to.

        The subnets (zones) are walked first, starting from one that depends on the replica id (so
        replicas spread over the zones), then the next candidate instance type. A refusal is nearly
        always about one instance type in one zone (InsufficientInstanceCapacity, Unsupported), so the
        same type elsewhere is the likeliest to succeed, and the smallest type is preferred.
        """
        types = self._instance_types(request)
        subnets = self.launch_subnets()
        attempt = request.attempt
        if not subnets:
            return types[attempt % len(types)], None
        subnet = subnets[(request.replica_id + attempt) % len(subnets)]
        return types[(attempt // len(subnets)) % len(types)], subnet

    def launch(self, request: LaunchRequest) -> Instance:
        profile = self._owner_profile(request)
        try:
            response = self.ec2.run_instances(**self._run_instances_args(request, profile))
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "Unknown"))
            if code in _TRANSIENT:
                raise
            if code == "InvalidParameterValue" and profile is not None and self._profile_unsettled(request, profile):
                # IAM is eventually consistent: EC2 refuses a profile made seconds ago as invalid.
                # The profile's recorded age decides (a fact), not the message; a later refusal is the version's.
                raise LaunchRefused(
                    PROFILE_NOT_READY,
                    f"instance profile {profile.name} was just made and is not usable yet; the next run "
                    f"retries ({error.get('Message', '')})",
                ) from exc
            raise LaunchRefused(code, str(error.get("Message", ""))) from exc
        return _instance(response["Instances"][0])

    def _owner_profile(self, request: LaunchRequest) -> Profile | None:
        """The owner's instance profile as the dispatcher recorded it, None for the shared one. An owner
        whose identity is not recorded yet is not launched: the environment's delay, never the version's."""
        scope = owner_scope(request.owner)
        if self.identities is None or scope is None:
            return None
        profile = self.identities.profile(scope)
        if profile is None:
            raise LaunchRefused(
                IDENTITY_UNAVAILABLE,
                f"the replica identity of owner {request.owner} is not made yet: the dispatcher makes it "
                "within a period (its log says why when IAM refuses); the next run retries",
            )
        return profile

    def _profile_unsettled(self, request: LaunchRequest, profile: Profile) -> bool:
        """Whether EC2's refusal of the owner's profile can be IAM's propagation: the profile is young,
        or the record changed since the run read it (removed, or made again, meanwhile)."""
        now = self._now()
        if profile.young(now):
            return True
        scope = owner_scope(request.owner)
        assert self.identities is not None and scope is not None
        current = self.identities.recheck(scope)
        return current is None or current.created_at != profile.created_at or current.young(now)

    def _now(self) -> float:
        return self.identities.now() if self.identities is not None else 0.0

    def _run_instances_args(self, request: LaunchRequest, profile: Profile | None = None) -> RunInstancesRequestTypeDef:
        resources = request.spec.resources
        tags: list[TagTypeDef] = [
            {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
            {"Key": STACK_TAG, "Value": self.stack_id},
            {"Key": SERVICE_TAG, "Value": request.service},
            {"Key": UID_TAG, "Value": request.uid},
            {"Key": VERSION_TAG, "Value": str(request.version)},
            {"Key": REPLICA_TAG, "Value": str(request.replica_id)},
            {"Key": "Name", "Value": f"fleetkeeper-{request.service}-{request.replica_id}"},
        ]
        instance_type, subnet = self.pool(request)
        image_id = self._image(instance_type, resources.image_id)
        task = task_variables.variables(
            request.service, request.uid, request.version, request.replica_id, instance_type
        )
        args: RunInstancesRequestTypeDef = {
            "ImageId": image_id,
            "InstanceType": cast("InstanceTypeType", instance_type),
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": request.client_token(self.stack_id),
            # Bytes as they are: botocore base64-encodes them; a str would be re-encoded as UTF-8,
            # which corrupts gzipped user data.
            "UserData": cast("str", user_data(request.spec, self._boot_source(request), task)),
            # IMDSv2 only, and a hop limit of 1: the token's PUT answer dies at the first network hop,
            # so a container or a forwarding process on the replica cannot fetch the instance role's
            # credentials (AL2023's AMIs default to 2: docs/architecture/stacks-and-security.md,
            # "Instance metadata").
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        }
        if subnet is not None:
            args["SubnetId"] = subnet
        if self.security_group_ids:
            args["SecurityGroupIds"] = self.security_group_ids
        if profile is not None:
            args["IamInstanceProfile"] = {"Name": profile.name}
        elif self.instance_profile_arn:
            args["IamInstanceProfile"] = {"Arn": self.instance_profile_arn}
        market_options = MARKET_OPTIONS[request.market]
        if market_options is not None:
            # A copy: each call's arguments are its own (the table is shared by every launch).
            args["InstanceMarketOptions"] = copy.deepcopy(market_options)
        volume = resources.root_volume
        if volume is not None:
            ebs: EbsBlockDeviceTypeDef = {
                "VolumeSize": volume.size_gib,
                "VolumeType": cast("VolumeTypeType", volume.volume_type),
                "DeleteOnTermination": True,
            }
            if volume.iops is not None:
                ebs["Iops"] = volume.iops
            if volume.throughput is not None:
                ebs["Throughput"] = volume.throughput
            args["BlockDeviceMappings"] = [{"DeviceName": self._root_device(image_id), "Ebs": ebs}]
        return args

    def _instance_types(self, request: LaunchRequest) -> tuple[str, ...]:
        """The spec's candidate instance types, smallest first (its instance_type, or the types meeting
        its cpus/memory/accelerators: fleetkeeper.spec.placement), else the stack's default."""
        placed = request.spec.resources.placement
        if placed.instance_types:
            return placed.instance_types
        if any(c.has_requirements for c in request.spec.resources.choices()):
            # A stored spec the catalogue no longer satisfies (the api refuses new ones).
            raise LaunchRefused(NO_INSTANCE_TYPE, "; ".join(placed.notes) or "no AWS instance type fits the spec")
        return (self.default_instance_type,)

    def _boot_source(self, request: LaunchRequest) -> BootSource:
        """Where this replica's workdir and secrets are (read at boot with the replica's own role)."""
        from fleetkeeper.replicas.secrets import SecretStore
        from fleetkeeper.replicas.workdirs import service_key

        spec = request.spec
        key = service_key(request.service, request.uid, spec.workdir.digest, request.owner) if spec.workdir else None
        parameter = None
        if request.secrets_ref and self.secrets_prefix:
            parameter = SecretStore(self.secrets_prefix).parameter_name(
                request.service, request.uid, request.secrets_ref, request.owner
            )
        stream = (
            log_stream(request.service, request.uid, request.replica_id, request.owner)
            if self.replica_log_group
            else None
        )
        return BootSource(
            bucket=self.workdir_bucket,
            workdir_key=key,
            parameter=parameter,
            kms_key=self.secrets_key_id,
            log_group=self.replica_log_group,
            log_stream=stream,
            dns_suffix=self.dns_suffix,
        )

    def _image(self, instance_type: str, image: str | None) -> str:
        """The ImageId to launch `instance_type` with (fleetkeeper.spec.images): the spec's AMI id or
        `resolve:ssm:` parameter, else the type's Deep Learning AMI parameter, else the stack's
        default parameter, as `resolve:ssm:`. EC2 resolves parameters itself, so the reconciler makes
        no SSM call (the shipped network has no SSM endpoint unless asked for one). A stored spec
        whose accelerated type no DLAMI drives is refused (the api refuses new ones)."""
        try:
            return images.image_for(instance_type, image, self.default_image_parameter)
        except images.NoImage as exc:
            raise LaunchRefused(NO_IMAGE, str(exc)) from exc

    def _root_device(self, image_id: str) -> str:
        """The root device name to size for disk_size/disk_tier, never a guess.

        A parameter's image is known only to EC2 at launch: its family's device (spec/service.py knows AWS's
        public families; the api refuses other parameters with disk_size) or a refusal with the
        reason. An AMI id is described; a throttled DescribeImages fails this service's run (the next
        run retries) instead of defaulting to a device the image may not have.
        """
        if image_id.startswith("resolve:ssm:"):
            device = root_device_of_parameter(image_id)
            if device is None:
                raise LaunchRefused(
                    UNKNOWN_ROOT_DEVICE,
                    f"disk_size needs the root device of {image_id}, which fleetkeeper cannot know before "
                    "EC2 resolves the parameter: give resources.image_id as an AMI id",
                )
            return device
        if image_id not in self._root_devices:
            try:
                images = self.ec2.describe_images(ImageIds=[image_id]).get("Images", [])
            except ClientError as exc:
                error = exc.response.get("Error", {})
                code = str(error.get("Code", "Unknown"))
                if code in _TRANSIENT:
                    raise
                raise LaunchRefused(code, f"image {image_id}: {error.get('Message', '')}") from exc
            device = images[0].get("RootDeviceName") if images else None
            if not device:
                raise LaunchRefused("InvalidAMIID.NotFound", f"image {image_id} not found or has no root device")
            self._root_devices[image_id] = str(device)
        return self._root_devices[image_id]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(instance_ids))
        for start in range(0, len(ids), _TERMINATE_CHUNK):
            chunk = ids[start : start + _TERMINATE_CHUNK]
            try:
                self.ec2.terminate_instances(InstanceIds=chunk)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                    raise
                for instance_id in chunk:  # one of them is gone already: the others still go
                    self._terminate_one(instance_id)

    def _terminate_one(self, instance_id: str) -> None:
        try:
            self.ec2.terminate_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidInstanceID.NotFound":
                raise

    def base_url(self, instance: Instance, port: int) -> str | None:
        host = self.replica_host or instance.private_ip
        return f"http://{host}:{port}" if host else None


def _int_tag(tags: dict[str, str], key: str) -> int:
    try:
        return int(tags.get(key, ""))
    except ValueError:
        return -1  # a managed instance with a mangled tag: owned by no replica, so it is cleaned up


def _instance(raw: InstanceTypeDef) -> Instance:
    tags = {str(t.get("Key")): str(t.get("Value", "")) for t in raw.get("Tags", [])}
    reason = raw.get("StateReason", {})
    launched = raw.get("LaunchTime")
    return Instance(
        instance_id=raw["InstanceId"],
        state=InstanceState(raw["State"]["Name"]),
        service=tags.get(SERVICE_TAG, ""),
        uid=tags.get(UID_TAG, ""),
        version=_int_tag(tags, VERSION_TAG),
        replica_id=_int_tag(tags, REPLICA_TAG),
        stack=tags.get(STACK_TAG, ""),
        private_ip=raw.get("PrivateIpAddress"),
        spot=raw.get("InstanceLifecycle") == "spot",
        state_reason_code=str(reason.get("Code") or "") or None,
        state_reason=str(reason.get("Message") or reason.get("Code") or "") or None,
        launched_at=to_iso(launched) if launched is not None else None,
        tags=tags,
        client_token=str(raw.get("ClientToken") or "") or None,
        instance_type=str(raw.get("InstanceType") or "") or None,
    )
