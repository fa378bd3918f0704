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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

TABLE_NAME_ENV = "TABLE_NAME"
DRIVER_ENV = "FLEETKEEPER_DRIVER"
PROBE_BUDGET_ENV = "FLEETKEEPER_PROBE_BUDGET_SECONDS"
RECONCILER_FUNCTION_ENV = "RECONCILER_FUNCTION_NAME"
KICK_URL_ENV = "FLEETKEEPER_KICK_URL"
SUBNET_IDS_ENV = "FLEETKEEPER_SUBNET_IDS"
SECURITY_GROUP_IDS_ENV = "FLEETKEEPER_SECURITY_GROUP_IDS"
INSTANCE_PROFILE_ENV = "FLEETKEEPER_INSTANCE_PROFILE_ARN"
DEFAULT_IMAGE_PARAMETER_ENV = "FLEETKEEPER_DEFAULT_IMAGE_PARAMETER"
DEFAULT_INSTANCE_TYPE_ENV = "FLEETKEEPER_DEFAULT_INSTANCE_TYPE"
REPLICA_HOST_ENV = "FLEETKEEPER_REPLICA_HOST"
# The workdir store: the stack's bucket (AWS), or a local directory and the embedded server's upload
# URL (embedded mode). Neither: specs with a workdir are refused.
WORKDIR_BUCKET_ENV = "WORKDIR_BUCKET"
WORKDIR_DIR_ENV = "FLEETKEEPER_WORKDIR_DIR"
WORKDIR_UPLOAD_URL_ENV = "FLEETKEEPER_WORKDIR_UPLOAD_URL"

DEFAULT_IMAGE_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
DEFAULT_INSTANCE_TYPE = "t3.small"
DEFAULT_PROBE_BUDGET_SECONDS = 20.0
# The longest readiness probe timeout a spec may ask for (spec.py enforces it: a 400 naming
# `spec.service.readiness_probe.timeout_seconds`), and the headroom a probe needs on top of it
# to start (a worker, a connection) and still finish inside the run's probe budget. A budget below
# their sum is refused: a probe that cannot finish inside the budget would never give a verdict.
MAX_PROBE_TIMEOUT_SECONDS = 15
PROBE_HEADROOM_SECONDS = 5.0
MIN_PROBE_BUDGET_SECONDS = MAX_PROBE_TIMEOUT_SECONDS + PROBE_HEADROOM_SECONDS

DriverKind = Literal["ec2", "process"]


class SettingsError(ValueError):
    """A variable is missing or does not parse: the function cannot run as configured."""


@dataclass(frozen=True)
class Ec2Settings:
    """The ec2 replica driver's configuration (the reconciler function's, in template.yaml)."""

    subnet_ids: tuple[str, ...] = ()  # replicas spread over them
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

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Ec2Settings:
        table = environ.get(TABLE_NAME_ENV)
        return cls(
            workdir_bucket=environ.get(WORKDIR_BUCKET_ENV) or None,
            secrets_prefix=f"/fleetkeeper/{table}" if table else None,
            subnet_ids=_list(environ, SUBNET_IDS_ENV),
            security_group_ids=_list(environ, SECURITY_GROUP_IDS_ENV),
            instance_profile_arn=environ.get(INSTANCE_PROFILE_ENV) or None,
            default_image_parameter=environ.get(DEFAULT_IMAGE_PARAMETER_ENV) or DEFAULT_IMAGE_PARAMETER,
            default_instance_type=environ.get(DEFAULT_INSTANCE_TYPE_ENV) or DEFAULT_INSTANCE_TYPE,
            replica_host=environ.get(REPLICA_HOST_ENV) or None,
        )


@dataclass(frozen=True)
class Settings:
    """Everything the api, reconciler and cleanup functions read from their environment."""

    table_name: str
    # Replica driver: `ec2` (production) or `process` (local processes, embedded mode only).
    driver: DriverKind = "ec2"
    # The reconciler's whole probe phase; each probe is also bounded by its own timeout.
    probe_budget_seconds: float = DEFAULT_PROBE_BUDGET_SECONDS
    # How the api kicks the reconciler after a write: invoke this function (AWS), else POST this
    # URL (embedded mode), else nothing (the schedule picks the change up).
    reconciler_function_name: str | None = None
    kick_url: str | None = None
    ec2: Ec2Settings = field(default_factory=Ec2Settings)
    workdir_bucket: str | None = None
    workdir_dir: str | None = None
    workdir_upload_url: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        table = environ.get(TABLE_NAME_ENV)
        if not table:
            raise SettingsError(f"{TABLE_NAME_ENV} is not set: every fleetkeeper function needs its table")
        return cls(
            table_name=table,
            driver=_driver(environ.get(DRIVER_ENV) or "ec2"),
            probe_budget_seconds=_probe_budget(environ),
            reconciler_function_name=environ.get(RECONCILER_FUNCTION_ENV) or None,
            kick_url=environ.get(KICK_URL_ENV) or None,
            ec2=Ec2Settings.from_env(environ),
            workdir_bucket=environ.get(WORKDIR_BUCKET_ENV) or None,
            workdir_dir=environ.get(WORKDIR_DIR_ENV) or None,
            workdir_upload_url=environ.get(WORKDIR_UPLOAD_URL_ENV) or None,
        )


def _list(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list; blanks dropped (an empty stack parameter joins to "")."""
    return tuple(item.strip() for item in environ.get(name, "").split(",") if item.strip())


def _driver(kind: str) -> DriverKind:
    if kind == "ec2":
        return "ec2"
    if kind == "process":
        return "process"
    raise SettingsError(f"{DRIVER_ENV}={kind!r}: expected 'ec2' or 'process'")


def _probe_budget(environ: Mapping[str, str]) -> float:
    budget = _seconds(environ, PROBE_BUDGET_ENV, DEFAULT_PROBE_BUDGET_SECONDS)
    if budget < MIN_PROBE_BUDGET_SECONDS:
        raise SettingsError(
            f"{PROBE_BUDGET_ENV}={budget:g}: at least {MIN_PROBE_BUDGET_SECONDS:g} seconds, so that a probe "
            f"with the longest timeout a spec may set ({MAX_PROBE_TIMEOUT_SECONDS}s) finishes inside it"
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
