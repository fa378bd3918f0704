"""fleetkeeper's configuration: every environment variable a function reads, parsed in one place.

Each handler reads `Settings.from_env(os.environ)` once per invocation (never at import, so the
embedded mode and tests can set variables between invocations) and passes what it parsed down.
template.yaml sets the variables from stack parameters; the embedded mode (fleetkeeper.local)
sets them in its own process. Cheap to import: the standard library only (the api's cold start).

fleetkeeper.aws still reads AWS_REGION and FLEETKEEPER_AWS_ENDPOINT_URL itself: its clients are
created lazily from anywhere (handlers, the CLI, the embedded server, tests) and cached per
(region, endpoint), and botocore reads the rest of AWS_* from the environment anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

TABLE_NAME_ENV = "TABLE_NAME"
# The stack's identity (docs/architecture/stacks-and-security.md, "Stacks sharing an account"):
# template.yaml derives it from AWS::StackId; the embedded mode sets its own. Every AWS resource the
# stack creates carries it.
STACK_ID_ENV = "FLEETKEEPER_STACK_ID"
# Whether the reconciler adopts this stack's replicas from before stacks had ids (template.yaml's
# AdoptUntaggedReplicas, "false" by default; fleetkeeper.reconciler.legacy, removed in 0.2.0).
ADOPT_UNTAGGED_REPLICAS_ENV = "FLEETKEEPER_ADOPT_UNTAGGED_REPLICAS"
DRIVER_ENV = "FLEETKEEPER_DRIVER"
PROBE_BUDGET_ENV = "FLEETKEEPER_PROBE_BUDGET_SECONDS"
KICK_QUEUE_URL_ENV = "FLEETKEEPER_KICK_QUEUE_URL"
KICK_URL_ENV = "FLEETKEEPER_KICK_URL"
# The embedded mode's API credential, which its kick URL requires (fleetkeeper.local.auth).
KICK_TOKEN_ENV = "FLEETKEEPER_KICK_TOKEN"
SUBNET_IDS_ENV = "FLEETKEEPER_SUBNET_IDS"
# The subnets the stack's load balancer is enabled in (its zones): replicas launch only in zones it covers.
LOAD_BALANCER_SUBNET_IDS_ENV = "FLEETKEEPER_LOAD_BALANCER_SUBNET_IDS"
SECURITY_GROUP_IDS_ENV = "FLEETKEEPER_SECURITY_GROUP_IDS"
INSTANCE_PROFILE_ENV = "FLEETKEEPER_INSTANCE_PROFILE_ARN"
DEFAULT_IMAGE_PARAMETER_ENV = "FLEETKEEPER_DEFAULT_IMAGE_PARAMETER"
DEFAULT_INSTANCE_TYPE_ENV = "FLEETKEEPER_DEFAULT_INSTANCE_TYPE"
REPLICA_HOST_ENV = "FLEETKEEPER_REPLICA_HOST"
REPLICA_LOG_GROUP_ENV = "FLEETKEEPER_REPLICA_LOG_GROUP"
# Replica identity (fleetkeeper.replicas.identity): `owner` (a role per owner, the default in template.yaml) or
# `shared` (every replica runs with INSTANCE_PROFILE_ENV's profile), and the managed policy that is both
# the permissions and the permissions boundary of an owner's role.
REPLICA_IDENTITY_ENV = "FLEETKEEPER_REPLICA_IDENTITY"
REPLICA_POLICY_ARN_ENV = "FLEETKEEPER_REPLICA_POLICY_ARN"
# The scheduled run's fan-out (fleetkeeper.reconciler.fanout): the dispatcher's queue, its
# schedule (the period every shard must fit in), the shard size; a worker's reads and margins.
RECONCILE_QUEUE_URL_ENV = "FLEETKEEPER_RECONCILE_QUEUE_URL"
RECONCILE_SCHEDULE_ENV = "FLEETKEEPER_RECONCILE_SCHEDULE"
SHARD_SIZE_ENV = "FLEETKEEPER_SHARD_SIZE"
READ_CONCURRENCY_ENV = "FLEETKEEPER_READ_CONCURRENCY"
SERVICE_MARGIN_ENV = "FLEETKEEPER_SERVICE_MARGIN_SECONDS"
ACTION_MARGIN_ENV = "FLEETKEEPER_ACTION_MARGIN_SECONDS"
BALANCER_ENV = "FLEETKEEPER_LOAD_BALANCER"
ALB_ARN_ENV = "FLEETKEEPER_ALB_ARN"
ALB_DNS_NAME_ENV = "FLEETKEEPER_ALB_DNS_NAME"
ALB_VPC_ID_ENV = "FLEETKEEPER_ALB_VPC_ID"
ALB_LISTENER_ARN_ENV = "FLEETKEEPER_ALB_LISTENER_ARN"
ALB_LISTENER_PORTS_ENV = "FLEETKEEPER_ALB_LISTENER_PORTS"
# The stack's wake target: a target group of type lambda (template.yaml's WakeTargetGroup) that a
# service's route forwards to while it has no replica (fleetkeeper.wake.demand).
WAKE_TARGET_GROUP_ENV = "FLEETKEEPER_WAKE_TARGET_GROUP_ARN"
# Load-balancer pools (docs/architecture/load-balancer-pools.md): what the reconciler needs to make
# more ALBs like the template's when one is full. Without a security group no pool is made.
ALB_SECURITY_GROUP_ENV = "FLEETKEEPER_ALB_SECURITY_GROUP_ID"
ALB_SCHEME_ENV = "FLEETKEEPER_ALB_SCHEME"
ALB_IDLE_TIMEOUT_ENV = "FLEETKEEPER_ALB_IDLE_TIMEOUT"
WAKE_FUNCTION_ARN_ENV = "FLEETKEEPER_WAKE_FUNCTION_ARN"
# With a domain: the Route 53 hosted zone where the reconciler publishes NAME.<domain> for services
# on pools past the first (the user's wildcard record points at the template's ALB only).
HOSTED_ZONE_ID_ENV = "FLEETKEEPER_HOSTED_ZONE_ID"
DOMAIN_NAME_ENV = "FLEETKEEPER_DOMAIN_NAME"
# The autoscaler's request-rate window (fleetkeeper.reconciler.metrics): its length and how far back
# it ends (the ALB publishes a minute's RequestCount about a minute later).
METRIC_WINDOW_ENV = "FLEETKEEPER_METRIC_WINDOW_SECONDS"
METRIC_LAG_ENV = "FLEETKEEPER_METRIC_LAG_SECONDS"
CERTIFICATE_ARN_ENV = "FLEETKEEPER_CERTIFICATE_ARN"
# The workdir store: the stack's bucket (AWS), or a local directory and the embedded server's upload
# URL (embedded mode). Neither: specs with a workdir are refused.
WORKDIR_BUCKET_ENV = "WORKDIR_BUCKET"
WORKDIR_DIR_ENV = "FLEETKEEPER_WORKDIR_DIR"
WORKDIR_UPLOAD_URL_ENV = "FLEETKEEPER_WORKDIR_UPLOAD_URL"
# The stack's administrators (template.yaml's AdministratorPrincipals): principal ARN patterns,
# comma-separated, that may read and change every service (fleetkeeper.owners.access).
ADMIN_PRINCIPALS_ENV = "FLEETKEEPER_ADMIN_PRINCIPALS"
# The KMS key (id or ARN) the api encrypts secret values with: the stack's SecretsKey. Unset (embedded
# mode, tests): Parameter Store's default, the account's aws/ssm key.
SECRETS_KEY_ID_ENV = "FLEETKEEPER_SECRETS_KEY_ID"

# Canonical's current Ubuntu LTS (fleetkeeper.spec.images.UBUNTU_PARAMETER; its arm64 build for Graviton
# types): SkyPilot's images are Ubuntu, and its YAMLs run `sudo apt-get` as the `ubuntu` user.
DEFAULT_IMAGE_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
DEFAULT_INSTANCE_TYPE = "t3.small"
DEFAULT_PROBE_BUDGET_SECONDS = 20.0
# The longest probe timeout the run's probe phase holds (its budget at least this plus the headroom a
# probe needs to start: a worker, a connection); a probe with a longer timeout than the budget leaves
# is a long probe, run off the run's critical path (reconciler.probing).
MAX_PROBE_TIMEOUT_SECONDS = 15
PROBE_HEADROOM_SECONDS = 5.0
MIN_PROBE_BUDGET_SECONDS = MAX_PROBE_TIMEOUT_SECONDS + PROBE_HEADROOM_SECONDS
# The longest readiness probe timeout a spec may ask for. SkyPilot sets none (a number; its
# controller is resident), but a probe here must end inside one reconciler invocation (template.yaml's
# ReconcilerFunction Timeout, 120 s): a Lambda cannot hold a connection for the next one. A long probe
# (longer than the run's probe budget) starts with the run's probes and is planned in a second pass
# before the invocation ends (reconciler.run). A shard's run has its period (~55 s) for it; one
# whose replica has not answered when that is spent is no verdict, and the replica's service gets a
# follow-up: a run of its own (a kick), which has the whole invocation. So the bound is that run's:
# 120 s, less the worker's service margin (10 s, for the second pass's reads and writes), a probe's
# headroom (5 s) and 15 s for the run's own reads and a cold start: 90 s. spec/service.py refuses
# longer ones with a 400.
MAX_READINESS_TIMEOUT_SECONDS = 90
# How long a READY replica may fail its readiness probes in a row before it is replaced, by default:
# SkyPilot's `_CONSECUTIVE_FAILURE_THRESHOLD_TIMEOUT` (sky/serve/replica_managers.py), 180 s, from its
# first failed probe to the one that ends the window (probed every 10 s meanwhile: the follow-ups).
CONSECUTIVE_FAILURE_SECONDS = 180
DEFAULT_SCHEDULE = "rate(1 minute)"
DEFAULT_SHARD_SIZE = 100  # fleetkeeper.reconciler.fanout says why
MAX_SHARD_SIZE = 199  # EC2's 200 filter values a Describe call, less the managed tag's value (fanout.py)
# Queries in flight per worker: 8 keep a 100-service shard's reads near a second without a burst
# that an on-demand table's new partition would throttle.
DEFAULT_READ_CONCURRENCY = 8
MAX_READ_CONCURRENCY = 64
# fleetkeeper.reconciler.budget says what they are for and why these values.
DEFAULT_SERVICE_MARGIN_SECONDS = 10.0
DEFAULT_ACTION_MARGIN_SECONDS = 5.0
DEFAULT_METRIC_WINDOW_SECONDS = 60
DEFAULT_METRIC_LAG_SECONDS = 60
MAX_METRIC_SECONDS = 3600
# What a stack id may be: it goes into ClientTokens (64 ASCII characters at most) and target group
# names (`fk-<stack id>-<uid>`: 32 characters at most, alphanumerics and hyphens), so it is short and
# has no hyphen (a name's prefix `fk-<stack id>-` then belongs to exactly one stack id). template.yaml
# gives the last 12 hex digits of the stack's UUID.
MAX_STACK_ID_LENGTH = 12
_STACK_ID = re.compile(rf"[a-z0-9]{{1,{MAX_STACK_ID_LENGTH}}}")
# The id when FLEETKEEPER_STACK_ID is unset (tests, and code run outside a stack): template.yaml
# always sets it, and the embedded mode sets `local`.
DEFAULT_STACK_ID = "fleetkeeper"
# The embedded mode's (fleetkeeper.local): one in-memory AWS per process, shared with no other stack.
LOCAL_STACK_ID = "local"
_RATE = re.compile(r"^rate\((?P<count>[1-9][0-9]*) (?P<unit>minute|minutes|hour|hours)\)$")

DriverKind = Literal["ec2", "process"]
ReplicaIdentityKind = Literal["owner", "shared"]
# The endpoint's load balancer: none, the stack's ALB, or embedded mode's local one.
BalancerKind = Literal["none", "alb", "local"]
# A service's name is one DNS label (NAME.<domain>): at most 63 characters (spec/service.py's rule).
MAX_SERVICE_NAME_LENGTH = 63
# With a domain name a service's route is a host rule NAME.<domain>, and an ALB host-header value
# holds at most 128 characters ("The maximum length of each string is 128 characters":
# https://docs.aws.amazon.com/elasticloadbalancing/latest/APIReference/API_HostHeaderConditionConfig.html).
# So the domain leaves room for the longest name and its dot: template.yaml's DomainName MaxLength.
MAX_HOST_HEADER_LENGTH = 128
MAX_DOMAIN_NAME_LENGTH = MAX_HOST_HEADER_LENGTH - 1 - MAX_SERVICE_NAME_LENGTH
# Without a domain name each service gets a listener port of its own on the ALB, from this range
# (template.yaml's ServiceListenerPortFrom; 50 ports: the ALB's listener quota).
DEFAULT_LISTENER_PORTS = (10000, 10049)


class SettingsError(ValueError):
    """A variable is missing or does not parse: the function cannot run as configured."""


@dataclass(frozen=True)
class Ec2Settings:
    """The ec2 replica driver's configuration (the reconciler function's, in template.yaml)."""

    subnet_ids: tuple[str, ...] = ()  # replicas spread over them
    # The load balancer's subnets (empty: no load balancer, or not known): a replica launched in a
    # zone none of them is in would be registered but sent nothing (`Target.NotInUse`), so the
    # driver launches only in the replica subnets whose zones these cover.
    load_balancer_subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    instance_profile_arn: str | None = None  # the replicas' instance profile
    default_image_parameter: str = DEFAULT_IMAGE_PARAMETER  # SSM parameter naming the default AMI
    default_instance_type: str = DEFAULT_INSTANCE_TYPE  # when the spec gives none
    # A test and benchmark setting: replaces every replica's address in probe URLs (e.g. 127.0.0.1).
    # Never set it in a deployment.
    replica_host: str | None = None
    # Where replicas fetch their version's workdir (the stack's bucket) and secrets (the parameters'
    # path, /fleetkeeper/<table>): both named in their user data.
    workdir_bucket: str | None = None
    secrets_prefix: str | None = None
    # The stack's KMS key for secrets (its ARN): a replica's boot refuses a parameter under any other.
    secrets_key_id: str | None = None
    # The region replicas launch in (Lambda's AWS_REGION): its partition's DNS suffix goes into their
    # user data (amazonaws.com.cn in China).
    region: str | None = None
    # The stack's CloudWatch Logs group replicas ship their output to (None: they do not).
    replica_log_group: str | None = None
    # The stack's identity: tagged on every instance, part of every ClientToken, filtered on.
    stack_id: str = DEFAULT_STACK_ID
    # Replica identity (fleetkeeper.replicas.identity): a role per owner (`owner`) or the one shared profile.
    replica_identity: ReplicaIdentityKind = "shared"
    # The managed policy of owners' roles (their permissions and their permissions boundary).
    replica_policy_arn: str | None = None
    # The table, where the dispatcher records the owners' identities the driver launches with.
    table_name: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Ec2Settings:
        table = environ.get(TABLE_NAME_ENV)
        return cls(
            table_name=table or None,
            stack_id=stack_id_of(environ),
            replica_identity=_replica_identity(environ),
            replica_policy_arn=environ.get(REPLICA_POLICY_ARN_ENV) or None,
            workdir_bucket=environ.get(WORKDIR_BUCKET_ENV) or None,
            secrets_prefix=f"/fleetkeeper/{table}" if table else None,
            secrets_key_id=environ.get(SECRETS_KEY_ID_ENV) or None,
            region=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or None,
            subnet_ids=_list(environ, SUBNET_IDS_ENV),
            load_balancer_subnet_ids=_list(environ, LOAD_BALANCER_SUBNET_IDS_ENV),
            security_group_ids=_list(environ, SECURITY_GROUP_IDS_ENV),
            instance_profile_arn=environ.get(INSTANCE_PROFILE_ENV) or None,
            default_image_parameter=environ.get(DEFAULT_IMAGE_PARAMETER_ENV) or DEFAULT_IMAGE_PARAMETER,
            default_instance_type=environ.get(DEFAULT_INSTANCE_TYPE_ENV) or DEFAULT_INSTANCE_TYPE,
            replica_host=environ.get(REPLICA_HOST_ENV) or None,
            replica_log_group=environ.get(REPLICA_LOG_GROUP_ENV) or None,
        )


@dataclass(frozen=True)
class AlbSettings:
    """The alb load balancer's configuration: the stack's ALB, from template.yaml."""

    arn: str = ""
    dns_name: str = ""
    vpc_id: str = ""
    # With a domain name: the listener that carries a host rule per service (NAME.<domain>).
    listener_arn: str | None = None
    domain_name: str | None = None
    # HTTPS listeners (the per-service ones, without a domain name) use it.
    certificate_arn: str | None = None
    listener_ports: tuple[int, int] = DEFAULT_LISTENER_PORTS
    # The stack's identity: in its target groups' names, tagged on everything it creates.
    stack_id: str = DEFAULT_STACK_ID
    # The wake target's target group (None: routes stay on the target groups; a service at zero
    # then cannot wake by itself on AWS).
    wake_target_group: str | None = None
    # Pools (fleetkeeper.reconciler.balancers.alb, docs/architecture/load-balancer-pools.md): more
    # ALBs made by the reconciler like the template's. No security group: none is made, and a full
    # ALB refuses the next service (AlbBalancer.pools_enabled). `scheme`: the ALBs' (internal or
    # internet-facing), not the services' URLs' (http or https: AlbBalancer.protocol).
    subnet_ids: tuple[str, ...] = ()
    security_group_id: str | None = None
    scheme: str = "internal"
    idle_timeout: int = 300
    wake_function_arn: str | None = None
    hosted_zone_id: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AlbSettings:
        return cls(
            stack_id=stack_id_of(environ),
            arn=environ.get(ALB_ARN_ENV, ""),
            dns_name=environ.get(ALB_DNS_NAME_ENV, ""),
            vpc_id=environ.get(ALB_VPC_ID_ENV, ""),
            listener_arn=environ.get(ALB_LISTENER_ARN_ENV) or None,
            domain_name=(environ.get(DOMAIN_NAME_ENV) or "").strip(".") or None,
            certificate_arn=environ.get(CERTIFICATE_ARN_ENV) or None,
            listener_ports=_port_range(environ.get(ALB_LISTENER_PORTS_ENV) or ""),
            wake_target_group=environ.get(WAKE_TARGET_GROUP_ENV) or None,
            subnet_ids=_list(environ, LOAD_BALANCER_SUBNET_IDS_ENV),
            security_group_id=environ.get(ALB_SECURITY_GROUP_ENV) or None,
            scheme=_scheme(environ.get(ALB_SCHEME_ENV) or "internal"),
            idle_timeout=int(_seconds(environ, ALB_IDLE_TIMEOUT_ENV, 300)),
            wake_function_arn=environ.get(WAKE_FUNCTION_ARN_ENV) or None,
            hosted_zone_id=environ.get(HOSTED_ZONE_ID_ENV) or None,
        )

    def check(self) -> None:
        """What the alb balancer cannot work without (called when it is chosen)."""
        missing = [name for name, value in ((ALB_ARN_ENV, self.arn), (ALB_VPC_ID_ENV, self.vpc_id)) if not value]
        if self.domain_name and not self.listener_arn:
            missing.append(ALB_LISTENER_ARN_ENV)
        if missing:
            raise SettingsError(f"{BALANCER_ENV}=alb needs {', '.join(missing)}")
        if self.domain_name and len(self.domain_name) > MAX_DOMAIN_NAME_LENGTH:
            raise SettingsError(
                f"{DOMAIN_NAME_ENV}={self.domain_name!r} is {len(self.domain_name)} characters: at most "
                f"{MAX_DOMAIN_NAME_LENGTH}, so that NAME.<domain> of a {MAX_SERVICE_NAME_LENGTH}-character name fits "
                f"the load balancer's {MAX_HOST_HEADER_LENGTH}-character host-header condition"
            )


@dataclass(frozen=True)
class Settings:
    """Everything the api, reconciler and cleanup functions read from their environment."""

    table_name: str
    # The stack's identity (STACK_ID_ENV): a short, stable id of the CloudFormation stack.
    stack_id: str = DEFAULT_STACK_ID
    # Replica driver: `ec2` (production) or `process` (local processes, embedded mode only).
    driver: DriverKind = "ec2"
    # The reconciler's whole probe phase; each probe is also bounded by its own timeout.
    probe_budget_seconds: float = DEFAULT_PROBE_BUDGET_SECONDS
    # How the api kicks the reconciler after a write: send to this queue (AWS), else POST this URL
    # (embedded mode), else nothing (the schedule picks the change up).
    kick_queue_url: str | None = None
    kick_url: str | None = None
    kick_token: str | None = field(default=None, repr=False)  # a credential: never logged
    ec2: Ec2Settings = field(default_factory=Ec2Settings)
    # The dispatcher's: where shards go, how often (seconds between scheduled runs), how big.
    reconcile_queue_url: str | None = None
    period_seconds: int = 60
    shard_size: int = DEFAULT_SHARD_SIZE
    # A worker's: Queries in flight, and its margins (fleetkeeper.reconciler.budget).
    read_concurrency: int = DEFAULT_READ_CONCURRENCY
    service_margin_seconds: float = DEFAULT_SERVICE_MARGIN_SECONDS
    action_margin_seconds: float = DEFAULT_ACTION_MARGIN_SECONDS
    balancer: BalancerKind = "none"
    alb: AlbSettings = field(default_factory=AlbSettings)
    # The autoscaler's request-rate window: its length and how long ago it ends.
    metric_window_seconds: int = DEFAULT_METRIC_WINDOW_SECONDS
    metric_lag_seconds: int = DEFAULT_METRIC_LAG_SECONDS
    workdir_bucket: str | None = None
    workdir_dir: str | None = None
    workdir_upload_url: str | None = None
    secrets_key_id: str | None = None
    # The stack's region (Lambda sets AWS_REGION): a spec may name only this one.
    region: str | None = None
    # Canonical principal patterns of the stack's administrators (empty: none; every service then
    # answers only to its owner and the principals it names).
    admin_principals: tuple[str, ...] = ()
    # The reconciler's: tag this stack's replicas from before stacks had ids with its id and keep them
    # (fleetkeeper.reconciler.legacy). Off (the default): they are left alone, as foreign instances are.
    adopt_untagged_replicas: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        table = environ.get(TABLE_NAME_ENV)
        if not table:
            raise SettingsError(f"{TABLE_NAME_ENV} is not set: every fleetkeeper function needs its table")
        return cls(
            table_name=table,
            stack_id=stack_id_of(environ),
            driver=_driver(environ.get(DRIVER_ENV) or "ec2"),
            probe_budget_seconds=_probe_budget(environ),
            kick_queue_url=environ.get(KICK_QUEUE_URL_ENV) or None,
            kick_url=environ.get(KICK_URL_ENV) or None,
            kick_token=environ.get(KICK_TOKEN_ENV) or None,
            ec2=Ec2Settings.from_env(environ),
            reconcile_queue_url=environ.get(RECONCILE_QUEUE_URL_ENV) or None,
            period_seconds=period_of(environ.get(RECONCILE_SCHEDULE_ENV) or DEFAULT_SCHEDULE),
            shard_size=_integer(environ, SHARD_SIZE_ENV, DEFAULT_SHARD_SIZE, 1, MAX_SHARD_SIZE),
            read_concurrency=_integer(environ, READ_CONCURRENCY_ENV, DEFAULT_READ_CONCURRENCY, 1, MAX_READ_CONCURRENCY),
            service_margin_seconds=_seconds(environ, SERVICE_MARGIN_ENV, DEFAULT_SERVICE_MARGIN_SECONDS),
            action_margin_seconds=_seconds(environ, ACTION_MARGIN_ENV, DEFAULT_ACTION_MARGIN_SECONDS),
            balancer=_balancer(environ.get(BALANCER_ENV) or "none"),
            alb=AlbSettings.from_env(environ),
            metric_window_seconds=_integer(
                environ, METRIC_WINDOW_ENV, DEFAULT_METRIC_WINDOW_SECONDS, 1, MAX_METRIC_SECONDS
            ),
            metric_lag_seconds=_integer(environ, METRIC_LAG_ENV, DEFAULT_METRIC_LAG_SECONDS, 0, MAX_METRIC_SECONDS),
            workdir_bucket=environ.get(WORKDIR_BUCKET_ENV) or None,
            workdir_dir=environ.get(WORKDIR_DIR_ENV) or None,
            workdir_upload_url=environ.get(WORKDIR_UPLOAD_URL_ENV) or None,
            secrets_key_id=environ.get(SECRETS_KEY_ID_ENV) or None,
            region=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or None,
            admin_principals=_principals(environ, ADMIN_PRINCIPALS_ENV),
            adopt_untagged_replicas=_flag(environ, ADOPT_UNTAGGED_REPLICAS_ENV),
        )


def stack_id_of(environ: Mapping[str, str]) -> str:
    """The stack's id from STACK_ID_ENV (DEFAULT_STACK_ID when unset), checked against what the names
    and tokens it goes into allow."""
    raw = environ.get(STACK_ID_ENV)
    if not raw:
        return DEFAULT_STACK_ID
    if _STACK_ID.fullmatch(raw) is None:
        raise SettingsError(
            f"{STACK_ID_ENV}={raw!r}: expected 1 to {MAX_STACK_ID_LENGTH} lower-case letters and digits "
            "(template.yaml gives the last 12 hex digits of the stack's id)"
        )
    return raw


def _replica_identity(environ: Mapping[str, str]) -> ReplicaIdentityKind:
    raw = environ.get(REPLICA_IDENTITY_ENV) or "shared"
    if raw == "owner":
        if not environ.get(REPLICA_POLICY_ARN_ENV):
            raise SettingsError(
                f"{REPLICA_IDENTITY_ENV}=owner needs {REPLICA_POLICY_ARN_ENV}: the owners' roles' policy"
            )
        return "owner"
    if raw == "shared":
        return "shared"
    raise SettingsError(f"{REPLICA_IDENTITY_ENV}={raw!r}: expected 'owner' or 'shared'")


def period_of(schedule: str) -> int:
    """Seconds between the runs of an EventBridge `rate(...)` schedule (template.yaml admits no other)."""
    match = _RATE.fullmatch(schedule.strip())
    if match is None:
        raise SettingsError(
            f"{RECONCILE_SCHEDULE_ENV}={schedule!r}: expected a rate such as 'rate(1 minute)' or 'rate(5 minutes)'"
        )
    count = int(match["count"])
    # EventBridge's own rule: the singular unit for 1, the plural for more (rate(5 minute) is refused
    # at deploy). https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rate-expressions.html
    if (count == 1) != (not match["unit"].endswith("s")):
        raise SettingsError(
            f"{RECONCILE_SCHEDULE_ENV}={schedule!r}: EventBridge takes 'minute' or 'hour' for 1, "
            "'minutes' or 'hours' for more"
        )
    return count * (3600 if match["unit"].startswith("hour") else 60)


def _integer(environ: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a whole number from {low} to {high}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={value}: expected a whole number from {low} to {high}")
    return value


def _list(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list; blanks dropped (an empty stack parameter joins to "")."""
    return tuple(item.strip() for item in environ.get(name, "").split(",") if item.strip())


def _principals(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Principal ARN patterns (fleetkeeper.owners.principals), each checked: a typo must not silently
    leave a stack without the administrators it was deployed with."""
    from fleetkeeper.owners.principals import PrincipalError, canonical_pattern

    patterns = []
    for item in _list(environ, name):
        try:
            patterns.append(canonical_pattern(item))
        except PrincipalError as exc:
            raise SettingsError(f"{name}: {exc}") from None
    return tuple(patterns)


def _flag(environ: Mapping[str, str], name: str) -> bool:
    """ "true" or "false" (a stack parameter's AllowedValues); unset or empty: false."""
    raw = environ.get(name) or "false"
    if raw not in ("true", "false"):
        raise SettingsError(f"{name}={raw!r}: expected 'true' or 'false'")
    return raw == "true"


def _driver(kind: str) -> DriverKind:
    if kind == "ec2":
        return "ec2"
    if kind == "process":
        return "process"
    raise SettingsError(f"{DRIVER_ENV}={kind!r}: expected 'ec2' or 'process'")


def _balancer(kind: str) -> BalancerKind:
    if kind == "none":
        return "none"
    if kind == "alb":
        return "alb"
    if kind == "local":
        return "local"
    raise SettingsError(f"{BALANCER_ENV}={kind!r}: expected 'none', 'alb' or 'local'")


def _scheme(text: str) -> str:
    if text not in ("internal", "internet-facing"):
        raise SettingsError(f"{ALB_SCHEME_ENV}={text!r}: expected 'internal' or 'internet-facing'")
    return text


def _port_range(text: str) -> tuple[int, int]:
    """`FROM-TO` (inclusive), or the default range when empty."""
    if not text:
        return DEFAULT_LISTENER_PORTS
    low, dash, high = text.partition("-")
    try:
        first, last = int(low), int(high if dash else low)
    except ValueError:
        raise SettingsError(f"{ALB_LISTENER_PORTS_ENV}={text!r}: expected FROM-TO, e.g. 10000-10049") from None
    if not 1 <= first <= last <= 65535:
        raise SettingsError(f"{ALB_LISTENER_PORTS_ENV}={text!r}: expected 1 <= FROM <= TO <= 65535")
    return first, last


def _probe_budget(environ: Mapping[str, str]) -> float:
    budget = _seconds(environ, PROBE_BUDGET_ENV, DEFAULT_PROBE_BUDGET_SECONDS)
    if budget < MIN_PROBE_BUDGET_SECONDS:
        raise SettingsError(
            f"{PROBE_BUDGET_ENV}={budget:g}: at least {MIN_PROBE_BUDGET_SECONDS:g} seconds, so that a probe "
            f"of {MAX_PROBE_TIMEOUT_SECONDS}s (SkyPilot's default timeout) finishes inside it"
        )
    return budget


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a number of seconds") from None
