"""SkyPilot's resource requirements as EC2 instance types and root volumes: pure, no AWS call.

`cpus` (`4`, `"4+"`), `memory` (`32`, `"32+"`, GB as SkyPilot writes it, matched against GiB as AWS
states it), `accelerators` (`A10G:1`, `{L4: 1, A10G: 1}`, `{L4, A10g}`) and `any_of` become an ordered
list of candidate instance types from fleetkeeper.catalogue, resolved when the api accepts the spec:

- each alternative (an `any_of` entry over the top-level fields, and each accelerator of a set) is a
  choice; a choice with `instance_type` is that type alone (it wins over requirements beside it, with
  a note when the catalogue knows it does not meet them);
- a count is exact (`A10G:1` is one A10G, not at least one), as in SkyPilot; `4` vCPUs is exactly 4,
  `4+` at least 4; without `memory`, a CPU-only choice gets at least 2 GiB per vCPU asked for;
- candidates are ordered smallest first (catalogue.rank: accelerators, vCPUs, memory, family price);
  explicit instance types come first, in the order written; at most MAX_CANDIDATES are kept;
- a choice AWS cannot satisfy is dropped with a note; when none is left, `Unsatisfiable` says why and
  what AWS has instead.

The reconciler launches the first candidate (fleetkeeper.reconciler.drivers.ec2); walking the others
on capacity refusals is a later slice (docs/ARCHITECTURE.md, "Placement").
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetkeeper import catalogue
from fleetkeeper.catalogue import CATALOGUE, GPU, InstanceType

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

MAX_CANDIDATES = 10
# Without `memory`, a CPU-only choice gets at least this much per vCPU (what compute optimized
# instances carry): `cpus: 2+` is then a c6i.large, not a 0.5 GiB t3.nano.
MIN_GIB_PER_VCPU = 2.0
_BOUND = re.compile(r"^([0-9]{1,5})(\.[0-9]{1,3})?(\+?)$")
_ACCELERATOR = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]{0,39})(?::([0-9]{1,3}))?$")


@dataclass(frozen=True)
class Bound:
    """`4` (exactly 4) or `4+` (at least 4)."""

    value: float
    at_least: bool

    def admits(self, amount: float) -> bool:
        return amount >= self.value if self.at_least else amount == self.value

    def __str__(self) -> str:
        return f"{self.value:g}{'+' if self.at_least else ''}"


def parse_bound(value: Any, what: str) -> Bound:
    """SkyPilot's `cpus`/`memory`: a number, or a number and `+` (at least), as int or text."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number of {what} (e.g. 4) or at least one (e.g. 4+)")
    text = f"{value:g}" if isinstance(value, int | float) else str(value).strip() if isinstance(value, str) else ""
    match = _BOUND.fullmatch(text)
    if not match or float(match.group(1) + (match.group(2) or "")) <= 0:
        raise ValueError(f"expected a number of {what} (e.g. 4) or at least one (e.g. 4+), got {value!r}")
    return Bound(float(match.group(1) + (match.group(2) or "")), bool(match.group(3)))


def parse_accelerators(value: Any) -> list[tuple[str, int]]:
    """`A10G:1`, `A10G` (one), `{L4: 1, A10G: 2}` or `{L4: null, A10g: null}` (YAML's `{L4, A10g}`):
    the accelerators, each an alternative, with their counts (1 when not given)."""
    if isinstance(value, str):
        match = _ACCELERATOR.fullmatch(value.strip())
        if not match:
            raise ValueError(f"expected NAME or NAME:COUNT (e.g. A10G:1), got {value!r}")
        pairs: list[tuple[str, Any]] = [(match.group(1), int(match.group(2) or 1))]
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise ValueError("expected NAME:COUNT (e.g. A10G:1) or a set of them ({L4: 1, A10G: 1})")
    if not pairs:
        raise ValueError("give at least one accelerator, e.g. A10G:1")
    out: list[tuple[str, int]] = []
    for name, count in pairs:
        if not isinstance(name, str) or not _ACCELERATOR.fullmatch(name) or ":" in name:
            raise ValueError(f"{name!r} is not an accelerator name (e.g. A10G, L4, H100)")
        if count is None:
            count = 1
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
            raise ValueError(f"{name}: the count must be a whole number from 1 to 64, got {count!r}")
        out.append((name, count))
    return out


@dataclass(frozen=True)
class Choice:
    """One alternative a spec gives: an instance type, or requirements."""

    instance_type: str | None = None
    cpus: Bound | None = None
    memory: Bound | None = None
    accelerator: tuple[str, int] | None = None

    @property
    def has_requirements(self) -> bool:
        return any(x is not None for x in (self.instance_type, self.cpus, self.memory, self.accelerator))

    def describe(self) -> str:
        """The requirements, as a note names them (`accelerators A10G:1, cpus 4+`)."""
        parts = []
        if self.accelerator is not None:
            parts.append(f"accelerators {self.accelerator[0]}:{self.accelerator[1]}")
        if self.cpus is not None:
            parts.append(f"cpus {self.cpus}")
        if self.memory is not None:
            parts.append(f"memory {self.memory}")
        return ", ".join(parts)


class Unsatisfiable(ValueError):
    """No choice of a spec exists on AWS: the message names each and says what AWS has."""


@dataclass(frozen=True)
class Placement:
    """Candidate instance types, first launched first; empty: the stack's default instance type."""

    instance_types: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def resolve(choices: Sequence[Choice]) -> Placement:
    """The candidates of these choices, and a note for each choice AWS cannot satisfy.

    Raises Unsatisfiable when choices with requirements are given and none can be satisfied.
    """
    wanted = [c for c in choices if c.has_requirements]
    if not wanted:
        return Placement()
    explicit: list[str] = []
    matched: list[InstanceType] = []
    refusals: list[str] = []
    for choice in dict.fromkeys(wanted):
        if choice.instance_type is not None:
            explicit.append(choice.instance_type)
            continue
        found, reason = _match(choice)
        if found:
            matched.extend(found)
        else:
            refusals.append(reason)
    names = list(dict.fromkeys([*explicit, *(t.name for t in sorted(set(matched), key=catalogue.rank))]))
    if not names:
        raise Unsatisfiable("; ".join(refusals))
    notes = [f"dropped: {reason}" for reason in refusals] + _overruled(wanted, explicit)
    if len(names) > MAX_CANDIDATES:
        notes.append(
            f"{len(names)} instance types match; the {MAX_CANDIDATES} smallest are the candidates "
            f"(up to {names[MAX_CANDIDATES - 1]}): narrow cpus or memory to choose others"
        )
    return Placement(tuple(names[:MAX_CANDIDATES]), tuple(notes))


def _fits(choice: Choice, t: InstanceType) -> bool:
    if choice.cpus is not None and not choice.cpus.admits(t.vcpus):
        return False
    if choice.memory is not None:
        return choice.memory.admits(t.memory_gib)
    if choice.accelerator is None and choice.cpus is not None:
        return t.memory_gib >= MIN_GIB_PER_VCPU * choice.cpus.value
    return True


def _overruled(choices: Sequence[Choice], explicit: Sequence[str]) -> list[str]:
    """A note for each explicit instance type the catalogue knows does not meet the requirements
    written beside it (any one of a set of accelerators will do): it is launched all the same."""
    notes = []
    for name in dict.fromkeys(explicit):
        known = catalogue.BY_NAME.get(name)
        beside = [c for c in choices if c.instance_type == name and c.describe()]
        if known is not None and beside and not any(_carries(c, known) for c in beside):
            wanted = " or ".join(dict.fromkeys(c.describe() for c in beside))
            notes.append(f"instance_type {name} wins over {wanted} beside it: it has {_has(known)}")
    return notes


def _carries(choice: Choice, t: InstanceType) -> bool:
    """Whether an instance type meets a choice's requirements (its accelerator, by any spelling)."""
    if choice.accelerator is not None:
        device = catalogue.accelerator(choice.accelerator[0])
        if device is None or (t.accelerator, t.accelerator_count) != (device.name, choice.accelerator[1]):
            return False
    if choice.cpus is not None and not choice.cpus.admits(t.vcpus):
        return False
    return choice.memory is None or choice.memory.admits(t.memory_gib)


def _has(t: InstanceType) -> str:
    accelerators = f"{t.accelerator_count} {t.accelerator}" if t.accelerator else "no accelerators"
    return f"{t.vcpus} vCPUs, {t.memory_gib:g} GiB and {accelerators}"


def _match(choice: Choice) -> tuple[list[InstanceType], str]:
    """The catalogue's instance types that satisfy a choice, or none and the reason, for people."""
    if choice.accelerator is None:
        found = [t for t in CATALOGUE if t.accelerator is None and _fits(choice, t)]
        if found:
            return found, ""
        plain = [t for t in CATALOGUE if t.accelerator is None]
        return [], f"no AWS instance type without accelerators has {_cpu_memory(choice)}{_closest(choice, plain)}"
    name, count = choice.accelerator
    device = catalogue.accelerator(name)
    if device is None:
        known = [a.name for a in catalogue.ACCELERATORS]
        close = difflib.get_close_matches(name.upper(), [k.upper() for k in known], n=1, cutoff=0.6)
        hint = f"did you mean {known[[k.upper() for k in known].index(close[0])]}? " if close else ""
        return [], f"no AWS instance type has {name}: {hint}AWS has {_listed(known, 'and')}"
    carrying = [t for t in CATALOGUE if t.accelerator == device.name]
    counted = [t for t in carrying if t.accelerator_count == count]
    if not counted:
        by_count: dict[int, str] = {}
        for t in sorted(carrying, key=catalogue.rank):
            by_count.setdefault(t.accelerator_count, t.name)
        has = ", ".join(f"{n} has {c}" for c, n in sorted(by_count.items()))
        return [], f"no AWS instance type has {count} {device.name}; {has}{_suggest(device.name, device.kind, count)}"
    found = [t for t in counted if _fits(choice, t)]
    if found:
        return found, ""
    return [], f"no AWS instance type has {count} {device.name} with {_cpu_memory(choice)}{_closest(choice, counted)}"


def _cpu_memory(choice: Choice) -> str:
    parts = []
    if choice.cpus is not None:
        parts.append(f"{choice.cpus} vCPUs")
    if choice.memory is not None:
        parts.append(f"{choice.memory} GiB of memory")
    return " and ".join(parts)


def _closest(choice: Choice, types: Iterable[InstanceType]) -> str:
    """The nearest instance types to what a choice asks for (by vCPUs, then memory)."""
    cpus, memory = choice.cpus, choice.memory

    def distance(t: InstanceType) -> tuple[float, float]:
        return (
            abs(t.vcpus - cpus.value) if cpus is not None else 0.0,
            abs(t.memory_gib - memory.value) if memory is not None else 0.0,
        )

    ranked = sorted(types, key=lambda t: (distance(t), catalogue.rank(t)))
    sizes = ", ".join(f"{t.name} ({t.vcpus} vCPUs, {t.memory_gib:g} GiB)" for t in ranked[:3])
    return f"; AWS has e.g. {sizes}" if sizes else ""


def _suggest(requested: str, kind: str, count: int) -> str:
    """`; for one GPU use A10G:1, L4:1 or L40S:1`: current devices of the same kind with that count."""
    names = sorted(
        {
            t.accelerator
            for t in CATALOGUE
            if t.accelerator is not None and t.accelerator != requested and t.accelerator_count == count
            for a in [catalogue.accelerator(t.accelerator)]
            if a is not None and a.kind == kind and a.current
        }
    )
    if not names:
        return ""
    noun = "GPU" if kind == GPU else "Neuron device"
    amount = f"one {noun}" if count == 1 else f"{count} {noun}s"
    return f"; for {amount} use {_listed([f'{n}:{count}' for n in names], 'or')}"


def _listed(items: Sequence[str], word: str) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


# --- disks ---------------------------------------------------------------------------------------

DISK_TIERS = ("low", "medium", "high", "ultra", "best")
# A disk_tier without disk_size sizes the root volume as SkyPilot's default disk does.
DEFAULT_TIERED_DISK_GB = 256


@dataclass(frozen=True)
class RootVolume:
    """The root EBS volume a spec asks for (docs/ARCHITECTURE.md, "Disks" has the table)."""

    size_gib: int
    volume_type: str
    iops: int | None = None
    throughput: int | None = None  # MiB/s, gp3 only


# tier -> (volume type, IOPS, throughput MiB/s). EBS's limits (EC2 API reference, EbsBlockDevice):
# gp3 3,000-16,000 IOPS (at most 500 per GiB) and 125-1,000 MiB/s (at most 0.25 MiB/s per IOPS);
# io2 100-256,000 IOPS (at most 500 per GiB outside Block Express). `best` is the best gp3 (`high`):
# io2's IOPS are billed each, ~20x gp3's top tier for the same disk, so it is taken only when asked
# for by name (`ultra`).
_TIERS: dict[str, tuple[str, int, int | None]] = {
    "low": ("gp3", 3000, 125),
    "medium": ("gp3", 6000, 250),
    "high": ("gp3", 16000, 1000),
    "ultra": ("io2", 32000, None),
}
_TIERS["best"] = _TIERS["high"]


def root_volume(disk_size: int | None, disk_tier: str | None) -> RootVolume | None:
    """The root volume of `disk_size` GB and `disk_tier`, within EBS's ratios; None: the image's own."""
    if disk_size is None and disk_tier is None:
        return None
    size = disk_size if disk_size is not None else DEFAULT_TIERED_DISK_GB
    if disk_tier is None:
        return RootVolume(size, "gp3")  # gp3's baseline: 3,000 IOPS, 125 MiB/s, as before tiers
    volume_type, iops, throughput = _TIERS[disk_tier]
    iops = max(3000, min(iops, 500 * size)) if volume_type == "gp3" else max(100, min(iops, 500 * size))
    if throughput is not None:
        throughput = max(125, min(throughput, iops // 4))
    return RootVolume(size, volume_type, iops, throughput)
