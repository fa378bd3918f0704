"""The service spec: a subset of SkyPilot's service YAML plus fleetkeeper's `update:` section.

Users bring their SkyPilot YAML; anything we do not support is rejected by name (its dotted path,
e.g. ``spec.file_mounts``) instead of being silently ignored, because a spec field that does nothing
is a production incident waiting to happen.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fleetkeeper.choices import DEFAULT_LOAD_BALANCING_POLICY, DEFAULT_UPDATE_MODE, LoadBalancingPolicy, UpdateMode
from fleetkeeper.errors import InvalidRequest
from fleetkeeper.settings import CONSECUTIVE_FAILURE_SECONDS, MAX_READINESS_TIMEOUT_SECONDS, MAX_SERVICE_NAME_LENGTH

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from fleetkeeper.spec import placement as placing

# Imported where they are used, not here (every handler imports this module, and the api's cold start
# pays for what it imports; docs/PERFORMANCE.md): placement with the instance catalogue, the Deep
# Learning AMI table (images), SkyPilot's field table (skypilot_fields) and the task variables are
# needed only while a spec is validated or placed, so only the invocations that do it load them.

DEFAULT_PORT = 8080
# Ports are SkyPilot's 1-65535: infra/network.yaml opens ReplicaPortFrom (1) to ReplicaPortTo to the
# reconciler's probes, template.yaml the same range to the load balancer; on EC2 the replica's run unit
# (as the `ubuntu` user) holds CAP_NET_BIND_SERVICE, and an embedded replica's own network namespace
# lets its user bind a port below 1024.
MIN_PORT = 1
MAX_PORT = 65535
# AWS's public SSM parameters: the only ones the reconciler's IAM lets EC2 resolve for a spec
# (template.yaml's ResolveImages; the stack's own DefaultImageParameter serves specs without image_id).
PUBLIC_PARAMETERS = "/aws/service/"
_IMAGE = re.compile(r"^(ami-[0-9a-f]{8,17}|resolve:ssm:/[A-Za-z0-9_.\-/]+(:[A-Za-z0-9_.\-]+)?)$")
# Root device names of AWS's public image families, each the same for every image of the family.
# A spec with disk_size must size the root device, and an image named by a parameter is resolved
# by EC2 at launch: fleetkeeper cannot look its root device up (that would be an SSM call, and the
# shipped network has no SSM endpoint), so it knows these families or refuses.
# (parameter prefix, what the rest of the name must contain, root device): Amazon Linux's images
# boot from /dev/xvda, Ubuntu's (Canonical's) from /dev/sda1. AWS's Deep Learning AMIs (GPU and
# Neuron, fleetkeeper.spec.images) are built on one or the other, which their parameter names say
# (`...-ubuntu-22.04`, `.../ubuntu-24.04`, `...-amazon-linux-2023`): an Amazon Linux 2023 DLAMI is
# /dev/xvda, an Ubuntu one /dev/sda1; a DLAMI of another OS (Amazon Linux 2) is not known.
_ROOT_DEVICES = (
    ("/aws/service/ami-amazon-linux-latest/", "", "/dev/xvda"),
    ("/aws/service/canonical/", "", "/dev/sda1"),
    ("/aws/service/deeplearning/ami/", "ubuntu", "/dev/sda1"),
    ("/aws/service/deeplearning/ami/", "amazon-linux-2023", "/dev/xvda"),
    ("/aws/service/neuron/dlami/", "ubuntu", "/dev/sda1"),
    ("/aws/service/neuron/dlami/", "amazon-linux-2023", "/dev/xvda"),
)


def root_device_of_parameter(parameter: str) -> str | None:
    """The root device name of the images an SSM parameter names, when the family is known."""
    name = parameter.removeprefix("resolve:ssm:")
    return next(
        (device for prefix, os, device in _ROOT_DEVICES if name.startswith(prefix) and os in name[len(prefix) :]),
        None,
    )


# The endpoint's load balancing policies, by SkyPilot Serve's names, are fleetkeeper.choices'
# LoadBalancingPolicy (SkyPilot's instance_aware_least_load is balanced as least_load there).
LOAD_BALANCING_POLICIES = tuple(LoadBalancingPolicy)
# How long a replica leaving the endpoint may finish its requests in flight before it is terminated
# (the ALB's deregistration delay; its range is 0-3600 s). SkyPilot's 120 s: a model server's
# streamed answers get two minutes to finish before the replica goes.
DEFAULT_DRAIN_SECONDS = 120
MAX_DRAIN_SECONDS = 3600
# The autoscaler's bounds: its delays (a day keeps the windows' history small) and request rates.
MAX_SCALE_DELAY_SECONDS = 86_400
MAX_TARGET_QPS = 1_000_000.0

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The name rule of services, in regex and in words (a message shows the words, never the regex).
# One DNS label (NAME.<domain> is its host name): settings.MAX_SERVICE_NAME_LENGTH characters at most.
NAME_PATTERN = rf"^[a-z][a-z0-9-]{{0,{MAX_SERVICE_NAME_LENGTH - 1}}}$"
NAME_RULE = f"1 to {MAX_SERVICE_NAME_LENGTH} lower-case letters, digits and dashes, starting with a letter"
# A workdir is stored content-addressed: its archive's SHA-256.
WORKDIR_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# Secrets are kept in one SSM Parameter Store SecureString per version (standard tier: 4 KB).
MAX_SECRETS_BYTES = 4096
# `$NAME` and `${NAME}` in a readiness probe's path, headers and post_data (SkyPilot's substitution).
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")

_STORED = "fleetkeeper.stored"
_NOT_JSON = object()


def _stored(info: ValidationInfo) -> bool:
    """Validating a spec the api accepted earlier (`stored_spec`): the rules that only keep new specs
    out (probe timeout, ports, images) do not apply, or a stricter release would make old services
    unloadable. The reconciler copes with what those rules now refuse."""
    return isinstance(info.context, dict) and bool(info.context.get(_STORED))


def stored_spec(text: str) -> ServiceSpec:
    """A version item's spec (JSON text), as the api accepted it when it was written."""
    return ServiceSpec.model_validate_json(text, context={_STORED: True})


def _port_number(value: Any) -> int | None:
    """A port as SkyPilot writes one: 8080 or "8080" (None when it is neither)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 5:
        return int(value.strip())
    return None


def _one_port(value: Any) -> Any:
    """`service.ports`: the replica's one service port, `8080`, `"8080"` or `[8080]` (SkyPilot's int)."""
    if isinstance(value, list | tuple):
        if len(value) != 1:
            listed = ", ".join(map(str, value))
            raise ValueError(
                f"service.ports is the one port the endpoint serves; got {len(value)} ({listed}): give one, e.g. "
                "`ports: 8080`, and list the others in resources.ports"
            )
        (value,) = value
    number = _port_number(value)
    return value if number is None else number


def _port_entry(value: Any) -> int | str:
    """One entry of `resources.ports`: a port (8080, "8080") or a range ("10020-10040"), as SkyPilot's."""
    number = _port_number(value)
    if number is not None:
        if not MIN_PORT <= number <= MAX_PORT:
            raise ValueError(f"port {number} is not a port: give {MIN_PORT}-{MAX_PORT}")
        return number
    if isinstance(value, str):
        low, dash, high = value.strip().partition("-")
        first, last = _port_number(low), _port_number(high)
        if dash and first is not None and last is not None:
            if not MIN_PORT <= first <= last <= MAX_PORT:
                raise ValueError(f"port range {value.strip()} is not {MIN_PORT}-{MAX_PORT}, lowest first")
            return f"{first}-{last}"
    raise ValueError(f"{value!r} is not a port (8080) or a range of ports (10020-10040)")


def port_set(value: int | str | list[int | str] | None) -> list[int]:
    """Every port `resources.ports` opens, in order (a range expanded), as SkyPilot's port_ranges_to_set."""
    if value is None:
        return []
    ports: set[int] = set()
    for entry in value if isinstance(value, list) else [value]:
        if isinstance(entry, int):
            ports.add(entry)
        else:
            low, _, high = entry.partition("-")
            ports.update(range(int(low), int(high or low) + 1))
    return sorted(ports)


def _substitute(text: str, values: Mapping[str, str]) -> str:
    """`$NAME` / `${NAME}` replaced by `values[NAME]`; names not in `values` are left as written."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(one, text)


def _substituted(value: Any, values: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return _substitute(value, values)
    if isinstance(value, dict):
        return {_substitute(str(k), values): _substituted(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_substituted(v, values) for v in value]
    return value


def _variables(value: Any) -> set[str]:
    if isinstance(value, str):
        return {m.group(1) or m.group(2) for m in _VARIABLE.finditer(value)}
    if isinstance(value, dict):
        return set().union(*(_variables(str(k)) | _variables(v) for k, v in value.items())) if value else set()
    if isinstance(value, list):
        return set().union(*(_variables(v) for v in value)) if value else set()
    return set()


class _Strict(BaseModel):
    # defer_build: the validators are built on the first validation, not when this module is imported:
    # an api invocation that never sees a spec (a list, a page of events, a refused request) skips them.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


@dataclass(frozen=True)
class ProbeOption:
    """How fleetkeeper treats one field of `ReadinessProbe` beyond validating it."""

    # Its `$NAME`s are filled from the version's envs and secrets (SkyPilot's substitution):
    # `ReadinessProbe.variables` and `resolved` read it.
    substituted: bool = False
    # An ALB health check cannot send it: a probe that sets it (to anything but its default) gets the
    # fallback check (fleetkeeper.reconciler.health_check reads it).
    unsendable_by_alb: bool = False


# Every field of ReadinessProbe, classified (tests/test_choices.py fails while one is missing).
#
# Adding a probe option:
# 1. its field on ReadinessProbe, with a default: stored specs (version items) without it must keep
#    decoding, and read as the default (`stored_spec`); a rule that only keeps new specs out checks
#    `_stored(info)`;
# 2. its entry here;
# 3. its behaviour: what the probe sends is `ReadinessProbe.request` (the reconciler's prober,
#    fleetkeeper.reconciler.probe, and the planner's status messages read it); what a verdict waits
#    for is the planner's (fleetkeeper.reconciler.plan.observe reads `timeout_seconds`,
#    `initial_delay_seconds` and `failure_window_seconds`);
# 4. its words in docs/architecture/spec-and-placement.md ("Probes and updates").
# A probe option is control-plane only (a change takes effect in place: spec/changes.py's
# `readiness_probe`), and the ALB health check's timing follows `timeout_seconds` alone.
PROBE_OPTIONS: dict[str, ProbeOption] = {
    "path": ProbeOption(substituted=True),
    "initial_delay_seconds": ProbeOption(),
    "timeout_seconds": ProbeOption(),
    "headers": ProbeOption(substituted=True, unsendable_by_alb=True),
    "post_data": ProbeOption(substituted=True, unsendable_by_alb=True),
    "consecutive_failure_threshold_timeout": ProbeOption(),
}
_SUBSTITUTED = tuple(name for name, option in PROBE_OPTIONS.items() if option.substituted)


# SkyPilot's `service.readiness_probe`; its options are classified in PROBE_OPTIONS (above), which
# says where a new one goes. (A comment, not a docstring: pydantic would publish a docstring as the
# schema's description in docs/openapi.json.)
class ReadinessProbe(_Strict):
    path: Annotated[str, Field(pattern=r"^/", max_length=2048)]
    # From the end of provisioning: the first run that sees the instance running (SkyPilot's
    # DEFAULT_INITIAL_DELAY_SECONDS, sky/serve/constants.py, is the default).
    initial_delay_seconds: Annotated[int, Field(ge=0, le=86_400)] = 1200
    timeout_seconds: Annotated[int, Field(ge=1)] = 15
    headers: dict[str, str] = Field(default_factory=dict)
    # SkyPilot's YAML reference writes it as a JSON string (`post_data: '{"model_name": "m"}'`), which
    # SkyPilot parses (SkyServiceSpec.from_yaml_config, sky/serve/service_spec.py) and posts as the
    # object: parsed here too (`_json_text`), so both spellings send the same body.
    post_data: dict[str, Any] | list[Any] | str | int | float | bool | None = None
    # How long a READY replica may fail its probes in a row before it is replaced: SkyPilot's
    # `_CONSECUTIVE_FAILURE_THRESHOLD_TIMEOUT` (180 s, sky/serve/replica_managers.py), a field of its
    # readiness probe in later releases. None: that default (CONSECUTIVE_FAILURE_SECONDS).
    consecutive_failure_threshold_timeout: Annotated[int, Field(ge=0, le=86_400)] | None = None

    @property
    def failure_window_seconds(self) -> int:
        """The consecutive-failure window a READY replica is given (SkyPilot's 180 s by default)."""
        window = self.consecutive_failure_threshold_timeout
        return CONSECUTIVE_FAILURE_SECONDS if window is None else window

    @field_validator("post_data", mode="before")
    @classmethod
    def _json_text(cls, value: Any, info: ValidationInfo) -> Any:
        """A string is JSON text, as SkyPilot reads it: its value is what the probe posts. Text that is not
        JSON is refused, as SkyPilot refuses it; a stored one keeps loading as written."""
        if not isinstance(value, str):
            return value
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = _NOT_JSON
        if _stored(info):
            # A spec stored before strings were parsed: its object or array is what SkyPilot would post
            # (a string it decoded to is kept as stored, so a stored value is never decoded twice).
            return parsed if isinstance(parsed, dict | list) else value
        if parsed is not _NOT_JSON:
            return parsed
        raise ValueError(
            "post_data is a string that is not JSON: SkyPilot reads a string as JSON text and posts the "
            "value it holds; write it as a mapping (post_data: {model: m}) or as valid JSON "
            """('{"model": "m"}')"""
        ) from None

    def variables(self) -> set[str]:
        """The `$NAME`s its substituted options (path, headers, post_data) mention (filled from envs
        and secrets)."""
        return set().union(*(_variables(getattr(self, name)) for name in _SUBSTITUTED))

    def resolved(self, values: Mapping[str, str]) -> ReadinessProbe:
        """This probe with `$NAME` and `${NAME}` in its substituted options (path, headers, post_data)
        replaced from `values` (the version's envs and secrets), as SkyPilot fills its service section;
        a name not in `values` stays as written."""
        if not self.variables() & set(values):
            return self
        return self.model_copy(update={name: _substituted(getattr(self, name), values) for name in _SUBSTITUTED})

    def unsendable_by_alb(self) -> list[str]:
        """The options this probe sets that an ALB health check cannot send (PROBE_OPTIONS)."""
        fields = type(self).model_fields
        return [
            name
            for name, option in PROBE_OPTIONS.items()
            if option.unsendable_by_alb and getattr(self, name) != fields[name].get_default(call_default_factory=True)
        ]

    @property
    def method(self) -> str:
        """A POST of `post_data` (as JSON) when it is set, else a GET."""
        return "GET" if self.post_data is None else "POST"

    def request(self) -> tuple[str, dict[str, str], bytes | None]:
        """What the probe sends to `path`: its method, headers and body (`post_data` as JSON, with a
        JSON Content-Type unless its headers give one)."""
        headers = dict(self.headers)
        if self.post_data is None:
            return self.method, headers, None
        if not any(key.lower() == "content-type" for key in headers):
            headers["Content-Type"] = "application/json"
        return self.method, headers, json.dumps(self.post_data).encode()

    @field_validator("timeout_seconds")
    @classmethod
    def _fits_the_probe_budget(cls, value: int, info: ValidationInfo) -> int:
        if value > MAX_READINESS_TIMEOUT_SECONDS and not _stored(info):
            raise ValueError(
                f"{value}s is longer than a probe can take: a probe must end inside one run of the reconciler "
                f"(a Lambda invocation of at most 120 s, with its reads and writes around the probe), so a "
                f"probe's timeout is at most {MAX_READINESS_TIMEOUT_SECONDS}s: probe a path that answers without "
                "the slow work (e.g. /health rather than a generation), or keep the generation short (max_tokens: 1)"
            )
        return value


class ReplicaPolicy(_Strict):
    """SkyPilot Serve's `replica_policy`: autoscaling on the request rate (fleetkeeper.reconciler.autoscale).

    The rate is the endpoint's (the load balancer's RequestCount metric); the target is
    clip(ceil(rate / target_qps_per_replica), min_replicas, max_replicas), changed only once a whole
    upscale or downscale delay of recommendations agrees. `downscale_to_zero_delay_seconds` (not
    SkyPilot's) is how long the rate must stay at zero before the last replica goes.
    """

    min_replicas: Annotated[int, Field(ge=0, le=1000)]
    max_replicas: Annotated[int, Field(ge=0, le=1000)] | None = None
    # One number, or SkyPilot's per-accelerator targets ({A100: 5, L4: 2}: what one replica of each
    # serves; its InstanceAwareRequestRateAutoscaler, fleetkeeper.reconciler.autoscale).
    target_qps_per_replica: (
        Annotated[float, Field(gt=0, allow_inf_nan=False)]
        | dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]]
        | None
    ) = None
    # SkyPilot's extra replicas over the autoscaler's target (get_final_target_num_replicas).
    num_overprovision: Annotated[int, Field(ge=0, le=1000)] | None = None
    upscale_delay_seconds: Annotated[int, Field(ge=0)] = 300
    downscale_delay_seconds: Annotated[int, Field(ge=0)] = 1200
    downscale_to_zero_delay_seconds: Annotated[int, Field(ge=0)] | None = None
    # Spot with on-demand fallback (SkyPilot's names; they need `resources.use_spot: true`): this many
    # replicas always on demand, and with `dynamic_ondemand_fallback` one more on-demand replica for
    # each wanted spot replica that is not READY (retired once spot replicas are READY again).
    base_ondemand_fallback_replicas: Annotated[int, Field(ge=0, le=1000)] | None = None
    dynamic_ondemand_fallback: bool | None = None

    @field_validator("target_qps_per_replica", mode="before")
    @classmethod
    def _targets_per_accelerator(cls, value: Any) -> Any:
        """A per-accelerator target's keys are accelerators (`A100`, `A100:1`, as SkyPilot matches them):
        canonical names, each once."""
        if not isinstance(value, dict):
            return value
        if not value:
            raise ValueError("an empty mapping: give one number, or a target per accelerator ({A100: 5, L4: 2})")
        from fleetkeeper.spec import placement as placing

        out: dict[str, Any] = {}
        for key, target in value.items():
            name = placing.accelerator_key(str(key))
            if name in out:
                raise ValueError(f"{name} is given twice ({key!r}): give each accelerator one target")
            out[name] = target
        return out

    def target_for(self, accelerator: str | None) -> float | None:
        """One replica's target rate on an instance with `accelerator` (its catalogue name; None: CPU only)."""
        target = self.target_qps_per_replica
        if not isinstance(target, dict):
            return target
        return target.get(accelerator) if accelerator is not None else None

    @model_validator(mode="after")
    def _skypilot_rules(self, info: ValidationInfo) -> ReplicaPolicy:
        if self.max_replicas is not None:
            if self.max_replicas < self.min_replicas:
                raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
            if self.max_replicas > self.min_replicas and self.target_qps_per_replica is None:
                raise ValueError("max_replicas > min_replicas requires target_qps_per_replica for autoscaling")
        if _stored(info):
            return self  # what the api accepted before keeps loading; the autoscaler copes
        # A target with min_replicas == max_replicas is SkyPilot's fixed count ("Fixed N replicas"): taken.
        targets = self.target_qps_per_replica
        values = list(targets.values()) if isinstance(targets, dict) else [] if targets is None else [targets]
        if any(value > MAX_TARGET_QPS for value in values):
            raise ValueError(f"target_qps_per_replica must be at most {MAX_TARGET_QPS:g}")
        for name in ("upscale_delay_seconds", "downscale_delay_seconds", "downscale_to_zero_delay_seconds"):
            value = getattr(self, name)
            if value is not None and value > MAX_SCALE_DELAY_SECONDS:
                raise ValueError(f"{name} ({value}) must be at most {MAX_SCALE_DELAY_SECONDS} (a day)")
        if self.downscale_to_zero_delay_seconds is not None and self.min_replicas > 0:
            raise ValueError(
                f"downscale_to_zero_delay_seconds applies only with min_replicas 0 (it is {self.min_replicas})"
            )
        return self


class ServiceSection(_Strict):
    # SkyPilot's default: GET / (`readiness_probe: /`).
    readiness_probe: ReadinessProbe = Field(default_factory=lambda: ReadinessProbe(path="/"))
    replicas: Annotated[int, Field(ge=0, le=1000)] | None = None
    replica_policy: ReplicaPolicy | None = None
    ports: Annotated[int, Field(ge=1, le=65535)] | None = None
    # None: the defaults (DEFAULT_LOAD_BALANCING_POLICY, DEFAULT_DRAIN_SECONDS); kept out of stored
    # specs that do not set them, so a spec reads back as it was written.
    load_balancing_policy: str | None = None
    drain_seconds: Annotated[int, Field(ge=0, le=MAX_DRAIN_SECONDS)] | None = None

    @field_validator("ports", mode="before")
    @classmethod
    def _one_port(cls, value: Any) -> Any:
        return _one_port(value)

    @field_validator("load_balancing_policy")
    @classmethod
    def _known_policy(cls, value: str | None) -> str | None:
        if value is not None and value not in LOAD_BALANCING_POLICIES:
            raise ValueError(f"{value!r} is not a load balancing policy: use {LoadBalancingPolicy.in_words()}")
        return value

    @field_validator("readiness_probe", mode="before")
    @classmethod
    def _path_shorthand(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _replicas_xor_policy(self) -> ServiceSection:
        if self.replicas is not None and self.replica_policy is not None:
            raise ValueError("give either `replicas` or `replica_policy`, not both")
        return self


_INSTANCE_TYPE = r"^[a-z0-9][a-z0-9-]*\.[a-z0-9]+$"
Cpus = int | float | str


class _Placed(_Strict):
    """What chooses where a replica runs: an instance type, or SkyPilot's requirements
    (fleetkeeper.spec.placement), and the cloud, region and zone they are asked in."""

    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    # SkyPilot's `cloud[/region[/zone]]` in one field (`aws`, `aws/us-east-1`), held to the same rules.
    infra: str | None = None
    instance_type: Annotated[str, Field(pattern=_INSTANCE_TYPE)] | None = None
    cpus: Cpus | None = None
    memory: Cpus | None = None
    # Kept as written (a stored spec reads back as it came): `A10G:1`; a set `{L4:1, A10G:1}` (YAML's
    # keys "L4:1" with null values), `{L4: 1, A10G: 1}` or `{L4, A10g}`; a list in order of preference
    # `[L4:1, A10G:1]`. placement.parse_accelerators reads every form.
    accelerators: str | dict[str, int | float | None] | list[str | dict[str, int | float | None]] | None = None

    @field_validator("cloud")
    @classmethod
    def _aws_only(cls, value: str | None) -> str | None:
        if value is not None and value.strip().lower() != "aws":
            raise ValueError(
                f"fleetkeeper runs on AWS only: cloud {value!r} is not AWS; remove `cloud` or set it to aws"
            )
        return value

    @field_validator("region")
    @classmethod
    def _aws_region(cls, value: str | None) -> str | None:
        from fleetkeeper.spec.catalogue import REGION

        if value is not None and not REGION.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an AWS region name (e.g. us-east-1): fleetkeeper runs on AWS only, "
                "in its stack's region"
            )
        return value

    @field_validator("zone")
    @classmethod
    def _aws_zone(cls, value: str | None) -> str | None:
        if value is None:
            return value
        _no_zone(value)
        return value

    @field_validator("infra")
    @classmethod
    def _aws_infra(cls, value: str | None) -> str | None:
        """SkyPilot's `infra: aws/us-east-1` is `cloud: aws` and `region: us-east-1` (a `*` is any)."""
        from fleetkeeper.spec.catalogue import REGION

        if value is None:
            return value
        cloud, _, rest = value.strip().partition("/")
        region, _, zone = rest.partition("/")
        if cloud != "*" and cloud.strip().lower() != "aws":
            raise ValueError(
                f"fleetkeeper runs on AWS only: infra {value!r} is not AWS; remove `infra` or set it to aws"
            )
        if region and region != "*" and not REGION.fullmatch(region):
            raise ValueError(f"{region!r} in {value!r} is not an AWS region name (e.g. aws/us-east-1)")
        if zone:
            _no_zone(zone)
        return value

    @property
    def infra_region(self) -> str | None:
        """The region `infra` names (`aws/us-east-1`), if any."""
        region = (self.infra or "").partition("/")[2].partition("/")[0]
        return region if region and region != "*" else None

    @field_validator("cpus", "memory", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("expected a number (e.g. 4) or at least one (e.g. 4+), not true or false")
        return value

    @field_validator("cpus", "memory")
    @classmethod
    def _bound(cls, value: Cpus | None, info: ValidationInfo) -> Cpus | None:
        from fleetkeeper.spec import placement as placing

        if value is not None:
            placing.parse_bound(value, "vCPUs" if info.field_name == "cpus" else "GB of memory")
        return value

    @field_validator("accelerators", mode="before")
    @classmethod
    def _accelerators(cls, value: Any) -> Any:
        from fleetkeeper.spec import placement as placing

        if value is not None:
            placing.parse_accelerators(value)  # every form's own message, before the union's
        return value


def _no_zone(value: str) -> None:
    from fleetkeeper.spec.catalogue import ZONE

    if not ZONE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an AWS availability zone name (e.g. us-east-1a): fleetkeeper runs on AWS only"
        )
    raise ValueError("zones come from the stack's subnets (replicas are spread over them); remove the zone")


def _refused(field: str, reason: str) -> PydanticCustomError:
    """A model-level refusal that names one of the model's fields, `accelerators` or `any_of.0.accelerators`
    (describe_validation_errors appends `ctx.field` to the error's location): pydantic's model
    validators can only name the model."""
    return PydanticCustomError("field_refused", "{reason}", {"reason": reason, "field": field})


class ResourceChoice(_Placed):
    """One entry of `any_of` or `ordered`: an alternative, its fields over the top-level ones."""


class Resources(_Placed):
    image_id: str | None = None
    use_spot: bool = False
    # SkyPilot's ports to open: one (8080, "8080"), a range ("10020-10040") or a list of both. The
    # endpoint serves `service.ports`, or the one port given here (ServiceSpec._one_service_port).
    ports: int | str | list[int | str] | None = None
    disk_size: Annotated[int, Field(ge=8, le=16_384)] | None = None
    disk_tier: Literal["low", "medium", "high", "ultra", "best"] | None = None
    any_of: Annotated[list[ResourceChoice], Field(min_length=1, max_length=16)] | None = None
    # SkyPilot's `ordered`: alternatives tried in the order written (any_of's are a set, smallest first).
    ordered: Annotated[list[ResourceChoice], Field(min_length=1, max_length=16)] | None = None

    @field_validator("ports", mode="before")
    @classmethod
    def _ports_as_skypilot_writes_them(cls, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError("an empty list of ports: give a port (8080), or leave ports out")
            entries = [_port_entry(entry) for entry in value]
            return entries[0] if len(entries) == 1 and isinstance(entries[0], int) else entries
        return _port_entry(value)

    @property
    def opened_ports(self) -> list[int]:
        """Every port `ports` opens (ranges expanded)."""
        return port_set(self.ports)

    @field_validator("image_id", mode="before")
    @classmethod
    def _one_ec2_image(cls, value: Any) -> Any:
        if isinstance(value, dict):
            raise ValueError(
                "images per region are not supported: the stack runs in one region; give that region's AMI id"
            )
        if isinstance(value, str) and value.strip().startswith("docker:"):
            raise ValueError(
                f"{value.strip()} is a container image: fleetkeeper boots EC2 images (AMIs); run the container in "
                f"`run` (docker run --gpus all -p $PORT:... {value.strip().removeprefix('docker:')}; GPU types boot "
                "AWS's Deep Learning AMI, which has docker), or give an AMI id"
            )
        return value

    @field_validator("image_id")
    @classmethod
    def _image_ec2_may_resolve(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if not _IMAGE.fullmatch(value):
            raise ValueError("expected an AMI id (ami-0123456789abcdef0) or resolve:ssm:<parameter>")
        public = value.startswith("resolve:ssm:" + PUBLIC_PARAMETERS)
        if value.startswith("resolve:ssm:") and not public and not _stored(info):
            raise ValueError(
                f"only AWS's public parameters (resolve:ssm:{PUBLIC_PARAMETERS}...) may name an image: "
                "the reconciler may not read any other; give the AMI id instead"
            )
        return value

    @model_validator(mode="after")
    def _disk_size_needs_a_known_root_device(self, info: ValidationInfo) -> Resources:
        image = self.image_id
        sized = self.disk_size is not None or self.disk_tier is not None
        if not sized or image is None or not image.startswith("resolve:ssm:") or _stored(info):
            return self
        if root_device_of_parameter(image) is None:
            what = "`disk_size`" if self.disk_size is not None else "`disk_tier`"
            raise ValueError(
                f"{what} with image_id {image} is not supported: fleetkeeper cannot tell that "
                "image's root device before EC2 resolves it; give the AMI id, or an Amazon Linux "
                "(/aws/service/ami-amazon-linux-latest/...), Ubuntu (/aws/service/canonical/...) or Ubuntu or "
                "Amazon Linux 2023 Deep Learning AMI (/aws/service/deeplearning/ami/..., "
                "/aws/service/neuron/dlami/...) parameter"
            )
        return self

    @model_validator(mode="after")
    def _an_image_for_every_candidate(self, info: ValidationInfo) -> Resources:
        """Without image_id, an accelerated candidate boots its Deep Learning AMI (fleetkeeper.spec.images):
        one no DLAMI drives is refused, and so is a disk_size below the DLAMI's root volume (EC2 would
        refuse every launch). A stored spec keeps loading (the launch is refused instead)."""
        from fleetkeeper.spec import images

        if self.image_id is not None or _stored(info):
            return self
        floors: dict[str, images.Dlami] = {}
        for instance_type in self.placement.instance_types:
            try:
                dlami = images.dlami_for(instance_type)
            except images.NoImage as exc:
                raise ValueError(str(exc)) from None
            if dlami is not None:
                floors[instance_type] = dlami
        small = {t: d for t, d in floors.items() if self.disk_size is not None and self.disk_size < d.min_disk_gb}
        if small:
            least = max(d.min_disk_gb for d in small.values())
            booted = "; ".join(f"{t} boots {d.name} ({d.min_disk_gb} GB)" for t, d in small.items())
            raise ValueError(
                f"disk_size {self.disk_size} is smaller than the root volume of the Deep Learning AMI a candidate "
                f"boots ({booted}): give disk_size {least} or more, or leave it out to get the image's own"
            )
        return self

    @model_validator(mode="after")
    def _alternatives_skypilot_takes(self) -> Resources:
        """SkyPilot's rules between `any_of`, `ordered` and several accelerators (Resources.from_yaml_config,
        sky/resources.py): a set of alternatives has no order to merge with `ordered`, and a list (an
        order) none to keep inside `any_of`. An `any_of` entry's own set is a union, an `ordered` entry's
        own set or list is tried at that entry's turn (SkyPilot's schema takes one accelerator there)."""
        from fleetkeeper.spec import placement as placing

        if self.any_of is not None and self.ordered is not None:
            raise _refused("ordered", "give either `any_of` (a set, smallest first) or `ordered` (in turn), not both")
        several = self.accelerators is not None and len(placing.parse_accelerators(self.accelerators)) > 1
        if several and self.ordered is not None:
            raise _refused(
                "accelerators",
                "several accelerators beside `ordered` have no place in its order: give each its own `ordered` "
                "entry (`- accelerators: L4:1`), or use a set with `any_of`",
            )
        if self.any_of is not None:
            for where, entry in [("", self), *((f"any_of.{i}.", e) for i, e in enumerate(self.any_of))]:
                if entry.accelerators is not None and placing.accelerators_in_order(entry.accelerators):
                    raise _refused(
                        f"{where}accelerators",
                        "a list of accelerators is an order, and `any_of` has none: write them as a set "
                        "({L4:1, A10G:1}), or use `ordered` to try them in turn",
                    )
        return self

    @model_validator(mode="after")
    def _exists_on_aws(self, info: ValidationInfo) -> Resources:
        """A spec none of whose choices AWS has is refused with what AWS has instead; a stored one
        keeps loading (the reconciler refuses its launch, fleetkeeper.reconciler.drivers.ec2)."""
        from fleetkeeper.spec import placement as placing

        if _stored(info):
            return self  # not resolved on every load of every stored version: views and launches do
        try:
            placing.resolve(self.choices())
        except placing.Unsatisfiable as exc:
            if exc.field:
                raise _refused(exc.field, str(exc)) from None
            raise ValueError(str(exc)) from None
        return self

    def choices(self) -> list[placing.Choice]:
        """The alternatives this asks for, as SkyPilot's Resources.from_yaml_config expands them: each
        `any_of` or `ordered` entry over the top-level fields, and each accelerator of a set or list.
        `instance_type` wins over the requirements beside it. Preferences: `ordered` entries and the
        items of a list of accelerators are tried in turn; everything else is one set."""
        from fleetkeeper.spec import placement as placing

        fields = ("instance_type", "cpus", "memory", "accelerators")
        top = {f: getattr(self, f) for f in fields}
        entries = [top] if not (self.any_of or self.ordered) else [
            {**top, **{f: v for f in fields if (v := getattr(entry, f)) is not None}}
            for entry in (self.any_of or self.ordered or [])
        ]  # fmt: skip
        out: list[placing.Choice] = []
        preference = 0
        for entry in entries:
            cpus = None if entry["cpus"] is None else placing.parse_bound(entry["cpus"], "vCPUs")
            memory = None if entry["memory"] is None else placing.parse_bound(entry["memory"], "GB of memory")
            accelerators: list[tuple[str, int] | None] = [None]
            in_turn = False
            if entry["accelerators"] is not None:
                accelerators = [*placing.parse_accelerators(entry["accelerators"])]
                in_turn = placing.accelerators_in_order(entry["accelerators"])
            for accelerator in accelerators:
                out.append(placing.Choice(entry["instance_type"], cpus, memory, accelerator, preference))
                preference += in_turn
            preference += self.ordered is not None and not in_turn
        return out

    def regions_asked(self) -> list[tuple[str, str]]:
        """Each region this asks for, by the field that names it (`region`, `infra`, and any_of's and
        ordered's): the api holds them to the stack's region."""
        asked: list[tuple[str, str]] = []
        for path, placed in [
            ("spec.resources", self),
            *((f"spec.resources.any_of[{i}]", e) for i, e in enumerate(self.any_of or [])),
            *((f"spec.resources.ordered[{i}]", e) for i, e in enumerate(self.ordered or [])),
        ]:
            if placed.region is not None:
                asked.append((f"{path}.region", placed.region))
            if placed.infra_region is not None:
                asked.append((f"{path}.infra", placed.infra_region))
        return asked

    @property
    def placement(self) -> placing.Placement:
        """The candidate instance types (empty: the stack's default) and notes on dropped choices.
        A stored spec AWS no longer satisfies has no candidates and says why in its notes."""
        from fleetkeeper.spec import placement as placing

        try:
            return placing.resolve(self.choices())
        except placing.Unsatisfiable as exc:
            return placing.Placement((), (str(exc),))

    @property
    def root_volume(self) -> placing.RootVolume | None:
        from fleetkeeper.spec import placement as placing

        return placing.root_volume(self.disk_size, self.disk_tier)


class UpdatePolicy(_Strict):
    mode: UpdateMode = DEFAULT_UPDATE_MODE
    max_surge: Annotated[int, Field(ge=0, le=1000)] = 1
    max_unavailable: Annotated[int, Field(ge=0, le=1000)] = 0

    @model_validator(mode="after")
    def _can_make_progress(self) -> UpdatePolicy:
        if self.mode is UpdateMode.ROLLING and self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("a rolling update needs max_surge or max_unavailable above 0 to make progress")
        return self


class Workdir(_Strict):
    """The packed working directory of a version: its archive's digest in the workdir store."""

    digest: str = Field(description="sha256:<64 hex digits> of the archive `fleetkeeper up` packed and uploaded")

    @field_validator("digest")
    @classmethod
    def _sha256(cls, value: str) -> str:
        if not WORKDIR_DIGEST.fullmatch(value):
            raise ValueError("expected sha256: and 64 lower-case hex digits (the archive's SHA-256)")
        return value


def _as_strings(value: Any, what: str) -> Any:
    """SkyPilot's envs and secrets: names are shell names, numbers and booleans become text, and
    a name without a value (`HF_TOKEN:` in YAML) stays None for the caller to fill."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if isinstance(key, str) and not _ENV_NAME.fullmatch(key):
            raise ValueError(
                f"{what} name {key!r} is not a valid shell name (letters, digits and _, not first a digit)"
            )
        if isinstance(item, bool):
            out[key] = "true" if item else "false"
        elif isinstance(item, int | float):
            out[key] = str(item)
        else:
            out[key] = item
    return out


def _unfilled(names: list[str], flag: str) -> str:
    listed = ", ".join(names)
    verb = "has" if len(names) == 1 else "have"
    example = names[0]
    return (
        f"{listed} {verb} no value: pass it with `{flag} {example}` (taken from your environment) or "
        f"`{flag} {example}=VALUE`, or give it a value in the spec"
    )


class ServiceSpec(_Strict):
    name: str | None = None
    # SkyPilot's nodes per replica: a replica is one instance here, so only 1 (kept as written).
    num_nodes: int | None = None
    service: ServiceSection
    resources: Resources = Field(default_factory=Resources)
    workdir: Workdir | None = None
    setup: Annotated[str, Field(max_length=16_384)] | None = None
    run: Annotated[str, Field(min_length=1, max_length=16_384)]
    envs: dict[str, str] = Field(default_factory=dict)
    # Names -> values in a request; a stored spec keeps the names with null values (the values are in
    # SSM Parameter Store, never in the table, a response or a log).
    secrets: dict[str, str | None] = Field(default_factory=dict)
    update: UpdatePolicy = Field(default_factory=UpdatePolicy)

    @field_validator("name")
    @classmethod
    def _name_rule(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(NAME_PATTERN, value):
            raise ValueError(f"{value!r} is not a service name: use {NAME_RULE} (or give one with --name)")
        return value

    @field_validator("num_nodes", mode="before")
    @classmethod
    def _one_node(cls, value: Any) -> Any:
        if (value is not None and value != 1) or isinstance(value, bool):
            raise ValueError(
                f"a replica is one instance: multi-node replicas (num_nodes {value!r}) are not supported; remove "
                "num_nodes, or ask for more accelerators on one instance (e.g. A100:8, a p4d.24xlarge)"
            )
        return value

    @field_validator("workdir", mode="before")
    @classmethod
    def _workdir_is_uploaded(cls, value: Any) -> Any:
        from fleetkeeper.spec import skypilot_fields

        remote = value.get("url") if isinstance(value, dict) else value if isinstance(value, str) else None
        if isinstance(remote, str) and skypilot_fields.remote_workdir(remote):
            ref = value.get("ref") if isinstance(value, dict) else None
            branch = f" --branch {ref}" if isinstance(ref, str) else ""
            raise ValueError(
                f"a remote workdir ({remote.strip()}) is not supported: clone it in `setup` "
                f"(git clone{branch} {remote.strip()} app; a private one with a token from `secrets`), or check it "
                "out and give its local directory to `fleetkeeper up`"
            )
        if isinstance(value, str):
            raise ValueError(
                f"{value!r} is a local directory: `fleetkeeper up` and `fleetkeeper update` pack and upload it; "
                'through the API, upload it with POST /v1/workdirs and send {"digest": "sha256:..."}'
            )
        return value

    @field_validator("envs", mode="before")
    @classmethod
    def _env_values_as_strings(cls, value: Any) -> Any:
        value = _as_strings(value, "environment variable")
        unfilled = sorted(str(k) for k, v in value.items() if v is None) if isinstance(value, dict) else []
        if unfilled:
            raise ValueError(_unfilled(unfilled, "--env"))
        return value

    @field_validator("secrets", mode="before")
    @classmethod
    def _secret_values_as_strings(cls, value: Any) -> Any:
        if isinstance(value, list):
            raise ValueError(
                "give secrets as a mapping of names to values (`HF_TOKEN: null`, filled with --secret HF_TOKEN); "
                "SkyPilot's managed-secret references (secrets:NAME) are not supported"
            )
        return _as_strings(value, "secret")

    @field_validator("secrets")
    @classmethod
    def _secrets_filled(cls, value: dict[str, str | None], info: ValidationInfo) -> dict[str, str | None]:
        if _stored(info):
            return value  # values are never stored
        from fleetkeeper.spec.secret_names import refused_secret_name

        refused = sorted(name for name in value if refused_secret_name(name))
        if refused:
            raise ValueError(
                f"secret {', '.join(refused)}: a secret may not have a name that changes how the shell, the "
                "dynamic loader or an interpreter starts (its value would run as code on every replica); "
                "rename it, and read it under that name in `setup` or `run`"
            )
        unfilled = sorted(k for k, v in value.items() if v is None)
        if unfilled:
            raise ValueError(_unfilled(unfilled, "--secret"))
        size = len(json.dumps(value, separators=(",", ":")).encode())
        if size > MAX_SECRETS_BYTES:
            raise ValueError(
                f"the secrets take {size} bytes as JSON; at most {MAX_SECRETS_BYTES} fit (one SSM SecureString): "
                "keep large files in the workdir or fetch them in `setup` with a secret token"
            )
        return value

    @model_validator(mode="after")
    def _fallback_needs_spot(self, info: ValidationInfo) -> ServiceSpec:
        policy = self.service.replica_policy
        if policy is None or self.resources.use_spot or _stored(info):
            return self
        for name in ("base_ondemand_fallback_replicas", "dynamic_ondemand_fallback"):
            if getattr(policy, name) is not None:
                raise ValueError(
                    f"service.replica_policy.{name} is an on-demand fallback for spot replicas: "
                    "set resources.use_spot: true, or remove it"
                )
        return self

    @model_validator(mode="after")
    def _envs_and_secrets_apart(self) -> ServiceSpec:
        both = sorted(set(self.envs) & set(self.secrets))
        if both:
            raise ValueError(f"{', '.join(both)} is both in `envs` and in `secrets`: keep each name in one of them")
        return self

    @model_validator(mode="after")
    def _task_variables_are_fleetkeepers(self, info: ValidationInfo) -> ServiceSpec:
        """SkyPilot's task variables and fleetkeeper's own are set for every replica
        (fleetkeeper.spec.task_variables): a spec may not set them (a stored one cannot shadow them)."""
        from fleetkeeper.spec import task_variables

        taken = sorted((set(self.envs) | set(self.secrets)) & task_variables.NAMES)
        if taken and not _stored(info):
            raise ValueError(
                f"{', '.join(taken)}: fleetkeeper sets {'these' if len(taken) > 1 else 'this'} for every replica "
                "(SkyPilot's task variables and fleetkeeper's own); remove it from `envs` and `secrets`"
            )
        return self

    @property
    def secret_names(self) -> list[str]:
        return sorted(self.secrets)

    def without_secret_values(self) -> ServiceSpec:
        """The spec as stored and shown: secret names kept, values gone."""
        if all(v is None for v in self.secrets.values()):
            return self
        return self.model_copy(update={"secrets": dict.fromkeys(sorted(self.secrets))})

    def secret_values(self) -> dict[str, str]:
        return {k: v for k, v in sorted(self.secrets.items()) if v is not None}

    def probe_for(self, secrets: Mapping[str, str]) -> ReadinessProbe:
        """The readiness probe with `$NAME`s filled from envs and these secret values."""
        return self.service.readiness_probe.resolved({**self.envs, **secrets})

    @property
    def probe_needs_secrets(self) -> bool:
        return bool(self.service.readiness_probe.variables() & set(self.secrets))

    @model_validator(mode="after")
    def _a_target_for_every_candidate(self, info: ValidationInfo) -> ServiceSpec:
        """A per-accelerator target must cover the accelerator of every candidate instance type, or the
        autoscaler would have no rate for its replicas (SkyPilot falls back to the smallest target)."""
        from fleetkeeper.spec import placement as placing

        policy = self.service.replica_policy
        targets = policy.target_qps_per_replica if policy is not None else None
        if not isinstance(targets, dict) or _stored(info):
            return self
        candidates = self.resources.placement.instance_types
        missing: dict[str, list[str]] = {}
        for instance_type in candidates:
            accelerator = placing.accelerator_of(instance_type)
            if accelerator not in targets:
                missing.setdefault(accelerator or "no accelerator", []).append(instance_type)
        if not candidates or missing:
            what = "; ".join(f"{name} ({', '.join(types)})" for name, types in missing.items())
            what = what or "the stack's default instance type (no accelerator)"
            raise _refused(
                "service.replica_policy.target_qps_per_replica",
                f"a target per accelerator ({', '.join(f'{k}: {v:g}' for k, v in targets.items())}) has none for "
                f"{what}: give each candidate's accelerator a target, or one number for every replica",
            )
        return self

    @model_validator(mode="after")
    def _one_service_port(self) -> ServiceSpec:
        """SkyPilot's rule (serve's _validate_service_task): several ports in `resources.ports` need
        `service.ports`, the one the endpoint serves; the others are opened too."""
        opened = self.resources.opened_ports
        if self.service.ports is None and len(opened) > 1:
            shown = (
                self.resources.ports
                if isinstance(self.resources.ports, str)
                else ", ".join(map(str, self.resources.ports if isinstance(self.resources.ports, list) else []))
            )
            raise _refused(
                "resources.ports",
                f"resources.ports opens {len(opened)} ports ({shown}): set service.ports to the one the endpoint "
                f"serves (e.g. `service: {{ports: {opened[0]}}}`), as SkyPilot asks",
            )
        return self

    @property
    def port(self) -> int:
        """The port a replica serves on: `service.ports`, else the one port of `resources.ports`, else 8080."""
        if self.service.ports is not None:
            return self.service.ports
        opened = self.resources.opened_ports
        return opened[0] if opened else DEFAULT_PORT

    @property
    def load_balancing_policy(self) -> LoadBalancingPolicy:
        """The endpoint's policy: `service.load_balancing_policy` as balanced (instance_aware_least_load
        as least_load), else least_load."""
        policy = LoadBalancingPolicy(self.service.load_balancing_policy or DEFAULT_LOAD_BALANCING_POLICY)
        return policy.balanced_as

    @property
    def drain_seconds(self) -> int:
        """How long a leaving replica may drain: `service.drain_seconds`, else SkyPilot's 120."""
        drain = self.service.drain_seconds
        return DEFAULT_DRAIN_SECONDS if drain is None else drain

    @property
    def target_replicas(self) -> int:
        """Replicas to start with. An autoscaling policy starts at its minimum; the autoscaler
        (fleetkeeper.reconciler.autoscale) moves the target from there."""
        if self.service.replicas is not None:
            return self.service.replicas
        if self.service.replica_policy is not None:
            return self.service.replica_policy.min_replicas
        return 1

    @property
    def min_replicas(self) -> int:
        """SkyPilot's min_replicas: `replicas`, else the policy's minimum, else 1 (a blue-green update
        switches once this many new replicas are READY): the count a service starts with."""
        return self.target_replicas

    @property
    def overprovision(self) -> int:
        """SkyPilot's `num_overprovision`: replicas run over the (autoscaled) target."""
        policy = self.service.replica_policy
        return (policy.num_overprovision or 0) if policy is not None else 0

    @property
    def markets(self) -> MarketPolicy:
        """How this version's replicas are bought (spot, and its on-demand fallback)."""
        policy = self.service.replica_policy
        if not self.resources.use_spot:
            return MarketPolicy(spot=False)
        if policy is None:
            return MarketPolicy(spot=True)
        return MarketPolicy(
            spot=True,
            base_ondemand=policy.base_ondemand_fallback_replicas or 0,
            dynamic_fallback=bool(policy.dynamic_ondemand_fallback),
        )

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class MarketPolicy:
    """`resources.use_spot` and SkyPilot's fallback knobs, as the planner reads them."""

    spot: bool
    base_ondemand: int = 0
    dynamic_fallback: bool = False


_LOCATIONS = {"body": "", "query": "query parameter ", "path": "path parameter ", "header": "header "}


def _dotted(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts[-1:] = [f"{parts[-1]}[{part}]"] if parts else [f"[{part}]"]
        elif part.startswith(("function-", "json-or-python", "union[", "nullable[")) or "[" in part:
            continue  # pydantic's internal validator frames, not fields a user wrote
        else:
            parts.append(part)
    return ".".join(parts)


def describe_validation_errors(errors: Sequence[Any], prefix: str = "") -> list[dict[str, str]]:
    """Turn pydantic's (or Powertools') error list into [{field, problem}] a person can act on.

    `loc` is made a dotted path (`spec.service.replicas`); Powertools' leading "body"/"query" is
    turned into words. Unsupported SkyPilot fields get the reason we do not support them.
    """
    details: list[dict[str, str]] = []
    for item in errors:
        loc = tuple(item.get("loc", ()))
        where = ""
        if loc and loc[0] in _LOCATIONS:
            where, loc = _LOCATIONS[str(loc[0])], loc[1:]
        named = str((item.get("ctx") or {}).get("field") or "")  # a model's refusal naming one of its fields
        inner = tuple(int(p) if p.isdigit() else p for p in named.split(".")) if named else ()
        field = _dotted(((prefix,) if prefix else ()) + loc + inner) or "body"
        kind = item.get("type", "")
        if kind == "extra_forbidden":
            problem = _unknown_field(loc, prefix)
        elif kind == "missing":
            problem = "required field is missing"
        elif kind == "json_invalid":
            field, problem = "body", "the body is not valid JSON"
        elif kind == "string_pattern_mismatch" and field.rsplit(".", 1)[-1] in {"name", "service"}:
            problem = f"{item.get('input')!r} is not a service name: use {NAME_RULE}"
        else:
            problem = _in_words(item)
        details.append({"field": f"{where}{field}", "problem": problem})
    return details


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def _in_words(item: Any) -> str:
    """pydantic's refusal of a value, said of the value the user wrote, in the spec's words (never
    "Input should be a valid dictionary or instance of ReadinessProbe")."""
    kind, ctx = str(item.get("type", "")), item.get("ctx") or {}
    got = _shown(item.get("input"))
    plain = {
        "int_parsing": f"{got} is not a whole number",
        "int_type": f"{got} is not a whole number",
        "int_from_float": f"{got} is not a whole number",
        "float_parsing": f"{got} is not a number",
        "float_type": f"{got} is not a number",
        "finite_number": f"{got} is not a finite number",
        "bool_parsing": f"{got} is not true or false",
        "bool_type": f"{got} is not true or false",
        "string_type": f"{got} is not text: quote it",
        "dict_type": f"{got} is not a mapping: give `key: value` lines under it",
        "model_type": f"{got} is not a mapping: give `key: value` lines under it",
        "model_attributes_type": f"{got} is not a mapping: give `key: value` lines under it",
        "list_type": f"{got} is not a list: give `- item` lines under it",
        "greater_than_equal": f"{got} is too small: at least {ctx.get('ge')}",
        "greater_than": f"{got} is too small: it must be above {ctx.get('gt')}",
        "less_than_equal": f"{got} is too large: at most {ctx.get('le')}",
        "less_than": f"{got} is too large: it must be below {ctx.get('lt')}",
        "literal_error": f"{got} is not one of {ctx.get('expected')}",
        "enum": f"{got} is not one of {ctx.get('expected')}",
        "too_short": f"too few entries: at least {ctx.get('min_length')}",
        "too_long": f"too many entries: at most {ctx.get('max_length')}",
        "string_too_short": f"{got} is too short: at least {ctx.get('min_length')} characters",
        "string_too_long": f"{got} is too long: at most {ctx.get('max_length')} characters",
    }.get(kind)
    if plain is not None:
        return plain
    return str(item.get("msg", "invalid value")).removeprefix("Value error, ")


def _model_at(parts: Sequence[int | str]) -> type[BaseModel] | None:
    """The spec model a field path leads to (`service.readiness_probe` -> ReadinessProbe)."""
    model: type[BaseModel] = ServiceSpec
    for part in parts:
        if isinstance(part, int):
            continue  # an entry of a list (`any_of[0]`): the list's model
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        found = _model_in(field.annotation)
        if found is None:
            return None
        model = found
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The spec model an annotation holds (`X | None`, `list[X]`, `Annotated[list[X], ...]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in get_args(annotation) if (m := _model_in(arg)) is not None), None)


def _unknown_field(loc: tuple[int | str, ...], prefix: str) -> str:
    """An unknown field's problem, most specific first: SkyPilot's fields fleetkeeper does not take say
    what to do instead (skypilot_fields); a field of another section says where it belongs; a typo
    gets `did you mean ...?`, from its own section's fields, else from every section's."""
    from fleetkeeper.spec import skypilot_fields

    parts = [p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    if parts and parts[0] in {prefix, "spec"}:  # parse_spec's prefix, or the api body's `spec`
        parts = parts[1:]
    if not parts or not isinstance(parts[-1], str):
        return "unknown field; fleetkeeper does not support it"
    name = parts[-1]
    reason = skypilot_fields.unsupported(_dotted(tuple(parts)))
    if reason is not None:
        return f"unsupported field: {reason}"
    model = _model_at(parts[:-1])
    if model is ResourceChoice and name in Resources.model_fields:
        fields = ", ".join(ResourceChoice.model_fields)
        return (
            f"unsupported field: an `any_of` or `ordered` entry chooses the instance type ({fields}); "
            f"give `{name}` once, beside them in `resources`"
        )
    section = ".".join(str(p) for p in parts[:-1] if isinstance(p, str))
    homes = [home for home in _HOMES.get(name, ()) if home != section]
    if homes:
        where = " or ".join(f"under `{home}`" if home else "at the top level" for home in homes)
        return f"misplaced field: `{name}` belongs {where}; move it there"
    known = list(model.model_fields) if model is not None else []
    close = _near_misses(name, known)
    if close:
        return f"unknown field; did you mean `{close[0]}`?"
    elsewhere = _near_misses(name, list(_HOMES))
    if elsewhere:
        found = _HOMES[elsewhere[0]]
        return f"unknown field; did you mean `{'.'.join(filter(None, (found[0], elsewhere[0])))}`?"
    return "unknown field; fleetkeeper does not support it"


def _near_misses(name: str, known: Sequence[str]) -> list[str]:
    """The fields `name` is a slip of the keyboard for: one letter wrong, missing, extra or swapped
    (two in a name of 12 letters or more). A similar field that is another word (`init_replicas`,
    `min_replicas`) is no near miss: suggesting it would send the user to the wrong field."""
    allowed = 2 if len(name) >= 12 else 1
    scored = sorted((d, field) for field in known if (d := _edits(name.lower(), field.lower())) <= allowed)
    return [field for _, field in scored[:1]]


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) from `a` to `b` (3 for anything further:
    only small counts matter here)."""
    if abs(len(a) - len(b)) > 2:
        return 3
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, previous2[j - 2] + 1)
            current.append(cost)
        previous2, previous = previous, current
    return previous[-1]


def _sections(model: type[BaseModel], path: str) -> dict[str, list[str]]:
    """Every field name of the spec's sections, with the sections it belongs in (`""`: the top)."""
    homes: dict[str, list[str]] = {}
    for name, info in model.model_fields.items():
        homes.setdefault(name, []).append(path)
        inner = _model_in(info.annotation)
        if inner is not None and inner not in {ResourceChoice, Workdir}:  # entries repeat resources'
            for field, where in _sections(inner, f"{path}.{name}".lstrip(".")).items():
                homes.setdefault(field, []).extend(where)
    return homes


_HOMES = _sections(ServiceSpec, "")


def parse_spec(data: Any, *, prefix: str = "spec") -> ServiceSpec:
    """Validate a decoded spec (from JSON or YAML), raising InvalidRequest that names each bad field."""
    if not isinstance(data, dict):
        raise InvalidRequest(
            f"{prefix}: expected a mapping with `service`, `resources`, `run`...",
            details=[{"field": prefix, "problem": f"expected an object, got {type(data).__name__}"}],
        )
    try:
        return ServiceSpec.model_validate(data)
    except ValidationError as exc:
        details = describe_validation_errors(exc.errors(include_url=False), prefix)
        message = "; ".join(f"{d['field']}: {d['problem']}" for d in details)
        raise InvalidRequest(f"invalid service spec: {message}", details=details) from exc
