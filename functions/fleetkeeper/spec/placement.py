"""SkyPilot's resource requirements as EC2 instance types and root volumes: pure, no AWS call.

`cpus` (`4`, `"4+"`), `memory` (`32`, `"32+"`, GB as SkyPilot writes it, matched against GiB as AWS
states it), `accelerators` (`A10G:1`; a set `{L4:1, A10G:1}`, `{L4: 1, A10G: 1}`, `{L4, A10g}`; a list
`[L4:1, A10G:1]`), `any_of` and `ordered` become an ordered list of candidate instance types from
fleetkeeper.spec.catalogue, resolved when the api accepts the spec:

- each alternative (an `any_of` or `ordered` entry over the top-level fields, and each accelerator
  of a set or list) is a choice; a choice with `instance_type` is that type alone (it wins over
  requirements beside it, with a note when the catalogue knows it does not meet them);
- a count is exact (`A10G:1` is one A10G, not at least one), as in SkyPilot; `4` vCPUs is exactly 4,
  `4+` at least 4; without `memory`, a CPU-only choice gets at least 2 GiB per vCPU asked for;
- choices are tried in turn where SkyPilot tries them in turn (`ordered` entries, the items of a list
  of accelerators: `Choice.preference`); within one preference (a set, `any_of`), candidates are
  ordered smallest first (catalogue.rank: accelerators, vCPUs, memory, family price), explicit
  instance types first, in the order written; at most MAX_CANDIDATES are kept;
- a choice AWS cannot satisfy is dropped with a note; when none is left, `Unsatisfiable` says why and
  what AWS has instead (for accelerators: every one AWS has, with the counts it comes in).

The reconciler launches the first candidate and walks the others on capacity refusals
(fleetkeeper.reconciler.drivers.ec2; docs/architecture/spec-and-placement.md, "Placement").
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetkeeper.spec import catalogue
from fleetkeeper.spec.catalogue import CATALOGUE, GPU, InstanceType

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

MAX_CANDIDATES = 10
# Without `memory`, a CPU-only choice gets at least this much per vCPU (what compute optimized
# instances carry): `cpus: 2+` is then a c6i.large, not a 0.5 GiB t3.nano.
MIN_GIB_PER_VCPU = 2.0
_BOUND = re.compile(r"^([0-9]{1,5})(\.[0-9]{1,3})?(\+?)$")
_ACCELERATOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")
_COUNT = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3})?$")


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
    """SkyPilot's `accelerators`, in every spelling its docs show, as (name, count) alternatives in the
    order written (duplicates dropped), each name in the catalogue's spelling when AWS has it.

    Mirrors `Resources.from_yaml_config` and `Resources._set_accelerators` (sky/resources.py):

    - a string is one accelerator, `NAME` (count 1) or `NAME:COUNT`;
    - a mapping is a set, each entry `f"{key}:{value}"`, or the key alone when its value is null: so
      YAML's `{L4:1, A10G:1}` (keys "L4:1" with null values), `{L4: 1, A10G: 1}` and `{L4, A10G}` (null
      values: one each) are all {L4:1, A10G:1};
    - a list is alternatives in order of preference, each item a string as above (`[L4:1, A10G:1]`,
      `[L4, A10G]`); a one-entry mapping item (YAML's `[L4: 1]` or `- A10G: 1`), which SkyPilot's
      schema refuses, is taken as NAME: COUNT, what it plainly means;
    - a count is a number SkyPilot reads with float() and keeps whole when it is whole: `L4:1.0` is
      one L4; a fractional count (SkyPilot's Kubernetes GPU sharing) has no AWS instance type.

    Raises ValueError naming the entry at fault. Where SkyPilot answers an empty set with a crash
    (`list(accelerators.items())[0]`), this says to give one.
    """
    if isinstance(value, str):
        entries: list[tuple[Any, Any]] = [(value, None)]
    elif isinstance(value, dict):
        entries = list(value.items())
    elif isinstance(value, list | tuple):
        entries = [_list_item(item) for item in value]
    else:
        raise ValueError(
            "expected NAME:COUNT (e.g. A10G:1), a set of alternatives ({L4:1, A10G:1}) or a list in order of "
            f"preference ([L4:1, A10G:1]), got {value!r}"
        )
    if not entries:
        raise ValueError("give at least one accelerator, e.g. A10G:1")
    out: list[tuple[str, int]] = []
    for key, count in entries:
        name, parsed = _accelerator_entry(key, count)
        device = catalogue.accelerator(name)
        pair = (device.name if device is not None else name, parsed)
        if pair not in out:
            out.append(pair)
    return out


def accelerator_key(text: str) -> str:
    """A key of a per-accelerator `target_qps_per_replica` (`A100`, `a100:1`) as the catalogue spells the
    accelerator: SkyPilot matches a replica's accelerator by the key's name, its count aside."""
    name = text.partition(":")[0].strip()
    device = catalogue.accelerator(name)
    if device is None:
        close = difflib.get_close_matches(name.upper(), [a.name.upper() for a in catalogue.ACCELERATORS], n=1)
        hint = (
            f"did you mean {next(a.name for a in catalogue.ACCELERATORS if a.name.upper() == close[0])}? "
            if close
            else ""
        )
        raise ValueError(f"{text!r} is not an accelerator AWS has: {hint}{accelerators_aws_has()}")
    return device.name


def accelerator_of(instance_type: str) -> str | None:
    """The accelerator an instance type carries (the catalogue's name), None for CPU-only or unknown types."""
    known = catalogue.BY_NAME.get(instance_type)
    return known.accelerator if known is not None else None


def accelerators_in_order(value: Any) -> bool:
    """Whether `accelerators` is SkyPilot's list (tried in the order written) rather than a set."""
    return isinstance(value, list | tuple) and len(value) > 1


def _list_item(item: Any) -> tuple[Any, Any]:
    if isinstance(item, dict) and len(item) == 1:
        ((key, count),) = item.items()
        return key, count
    if isinstance(item, str):
        return item, None
    raise ValueError(f"each item of an accelerators list is NAME or NAME:COUNT (e.g. [L4:1, A10G:1]), got {item!r}")


def _accelerator_entry(key: Any, count: Any) -> tuple[str, int]:
    """One entry: `NAME:COUNT` or `NAME` with a null value, or `NAME` with a numeric value."""
    if not isinstance(key, str):
        raise ValueError(f"{key!r} is not an accelerator name (e.g. A10G, L4, H100)")
    text = key.strip()
    if "," in text:
        raise ValueError(
            f"{key!r} is several accelerators in one string: write a set, {{{text}}}, or a list in order of "
            f"preference, [{text}]"
        )
    if count is None:
        name, colon, written = text.partition(":")
        if not colon:
            written = "1"
        elif ":" in written:
            raise ValueError(f"expected NAME or NAME:COUNT (e.g. A10G:1), got {key!r}")
        count = _count_text(name, written.strip(), key)
    elif ":" in text:
        raise ValueError(f"{key}: {count!r} gives the count twice; write {text} or {text.partition(':')[0]}: {count}")
    else:
        name = text
    name = name.strip()
    if not _ACCELERATOR.fullmatch(name) or ":" in name:
        raise ValueError(f"{name!r} is not an accelerator name (e.g. A10G, L4, H100)")
    if isinstance(count, bool) or not isinstance(count, int | float):
        raise ValueError(f"{name}: the count must be a whole number from 1 to 64, got {count!r}")
    if count != int(count):
        raise ValueError(
            f"{name}: {count:g} is a fraction of an accelerator (SkyPilot shares GPUs only on Kubernetes); "
            "an AWS instance type has whole ones: give a whole number from 1 to 64"
        )
    if not 1 <= count <= 64:
        raise ValueError(f"{name}: the count must be a whole number from 1 to 64, got {count:g}")
    return name, int(count)


def _count_text(name: str, written: str, key: str) -> int | float:
    """A count written after `NAME:`, read as SkyPilot reads it (float(), whole when whole)."""
    if not _COUNT.fullmatch(written):
        raise ValueError(f"expected NAME or NAME:COUNT (e.g. A10G:1), got {key!r}")
    number = float(written)
    return int(number) if number.is_integer() else number


@dataclass(frozen=True)
class Choice:
    """One alternative a spec gives: an instance type, or requirements. `preference` orders the
    alternatives SkyPilot tries in turn (`ordered` entries, a list of accelerators): every candidate
    of preference 0 comes before those of 1; alternatives of one preference are a set, smallest first."""

    instance_type: str | None = None
    cpus: Bound | None = None
    memory: Bound | None = None
    accelerator: tuple[str, int] | None = None
    preference: int = 0

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
    """No choice of a spec exists on AWS: the message names each and says what AWS has.

    `field` is the resources field at fault: `accelerators` when every choice refused asks for one
    (the message then lists the accelerators AWS has, with their counts), else "" (the resources)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Placement:
    """Candidate instance types, first launched first; empty: the stack's default instance type."""

    instance_types: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def resolve(choices: Sequence[Choice]) -> Placement:
    """The candidates of these choices, and a note for each choice AWS cannot satisfy.

    Raises Unsatisfiable when choices with requirements are given and none can be satisfied.
    """
    wanted = list(dict.fromkeys(c for c in choices if c.has_requirements))
    if not wanted:
        return Placement()
    explicit: list[str] = []
    # name -> its place: (preference, explicit first, in the order written, else smallest first)
    places: dict[str, tuple[int, int, int, tuple[Any, ...]]] = {}
    refused: list[tuple[Choice, str]] = []
    asked = {c.accelerator[0] for c in wanted if c.accelerator is not None}
    for index, choice in enumerate(wanted):
        found: list[tuple[str, tuple[int, int, int, tuple[Any, ...]]]]
        if choice.instance_type is not None:
            explicit.append(choice.instance_type)
            found = [(choice.instance_type, (choice.preference, 0, index, ()))]
        else:
            matched, reason = _match(choice, asked)
            if not matched:
                refused.append((choice, reason))
            found = [(t.name, (choice.preference, 1, 0, catalogue.rank(t))) for t in matched]
        for name, place in found:
            places[name] = min(place, places.get(name, place))
    names = sorted(places, key=places.__getitem__)
    if not names:
        accelerated = all(choice.accelerator is not None for choice, _ in refused)
        reasons = "; ".join(reason for _, reason in refused)
        if accelerated:
            raise Unsatisfiable(f"{reasons}; {accelerators_aws_has()}", "accelerators")
        raise Unsatisfiable(reasons)
    notes = [f"dropped: {reason}" for _, reason in refused] + _overruled(wanted, explicit)
    if len(names) > MAX_CANDIDATES:
        which = "smallest" if len({c.preference for c in wanted}) == 1 else "first, in the order asked,"
        notes.append(
            f"{len(names)} instance types match; the {MAX_CANDIDATES} {which} are the candidates "
            f"(up to {names[MAX_CANDIDATES - 1]}): narrow cpus or memory to choose others"
        )
    return Placement(tuple(names[:MAX_CANDIDATES]), tuple(notes))


def accelerators_aws_has() -> str:
    """`AWS has T4 (1 or 4), A10G (1, 4 or 8), ...`: every accelerator of the catalogue, with the
    counts its instance types carry (what a spec may ask for instead)."""
    counts: dict[str, set[int]] = {a.name: set() for a in catalogue.ACCELERATORS}
    for t in CATALOGUE:
        if t.accelerator is not None:
            counts[t.accelerator].add(t.accelerator_count)
    listed = [f"{name} ({_listed([str(n) for n in sorted(found)], 'or')})" for name, found in counts.items() if found]
    return f"AWS has {_listed(listed, 'and')}"


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


def _match(choice: Choice, asked: Collection[str] = ()) -> tuple[list[InstanceType], str]:
    """The catalogue's instance types that satisfy a choice, or none and the reason, for people.
    An unknown name gets a did-you-mean, unless the name meant is `asked` beside it (a set with A10
    and A10G means both: A10 is another cloud's GPU, not a typo)."""
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
        meant = known[[k.upper() for k in known].index(close[0])] if close else None
        hint = f" (did you mean {meant}?)" if meant is not None and meant not in asked else ""
        return [], f"no AWS instance type has {name}{hint}"
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
    """The root EBS volume a spec asks for (docs/architecture/spec-and-placement.md, "Disks": the table)."""

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
