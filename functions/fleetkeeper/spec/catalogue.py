"""The EC2 instance types fleetkeeper chooses among, with what each carries: pure data, no AWS call.

A spec's `cpus`, `memory` and `accelerators` are resolved against this table when the api accepts it
(fleetkeeper.spec.placement), so the answer is immediate and the same on every run.

Where the figures come from: AWS's instance type specifications (Amazon EC2 documentation, "Amazon
EC2 instance types" specification pages, docs.aws.amazon.com/ec2/latest/instancetypes/) and the AWS
Neuron documentation for inf2/trn1 ("Trn1/Trn1n Architecture", "Inf2 Architecture",
awsdocs-neuron.readthedocs-hosted.com). Every row is checked by tests/spec/test_placement.py against
DescribeInstanceTypes as moto ships it (moto/ec2/resources/instance_types.json.gz, a capture of
AWS's own answer: VCpuInfo.DefaultVCpus, MemoryInfo.SizeInMiB / 1024, GpuInfo / NeuronInfo counts).
That check took out what AWS does not list: there is no 32xlarge of m7i/c7i/r7i, and of the V100
family only p3dn.24xlarge (8 V100) is listed, not p3.2xlarge/8xlarge/16xlarge. Metal sizes are left
out (a replica never needs one). An `instance_type` the table does not know is still launched as
written (it wins over requirements).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GPU = "gpu"
NEURON = "neuron"


@dataclass(frozen=True)
class Accelerator:
    name: str  # SkyPilot's spelling, the one shown in messages
    kind: str  # GPU or NEURON
    current: bool  # a current-generation device: what a suggestion offers
    aliases: tuple[str, ...] = ()


# Every accelerator AWS has in the families below, by SkyPilot's names (matched case-insensitively).
ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("T4", GPU, current=False),
    Accelerator("A10G", GPU, current=True),
    Accelerator("L4", GPU, current=True),
    Accelerator("L40S", GPU, current=True),
    Accelerator("V100", GPU, current=False),
    Accelerator("A100", GPU, current=True),
    Accelerator("A100-80GB", GPU, current=True),
    Accelerator("H100", GPU, current=True),
    Accelerator("Inferentia2", NEURON, current=True, aliases=("inf2",)),
    Accelerator("Trainium", NEURON, current=True, aliases=("trainium1", "trn1")),
)
_BY_NAME = {n.lower(): a for a in ACCELERATORS for n in (a.name, *a.aliases)}


def accelerator(name: str) -> Accelerator | None:
    """The accelerator a spec names (any case, SkyPilot's name or an alias), or None: AWS has none."""
    return _BY_NAME.get(name.strip().lower())


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: float
    accelerator: str | None = None  # Accelerator.name
    accelerator_count: int = 0
    burstable: bool = False

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


# Families in the order a tie (same accelerators, vCPUs and memory) is broken: cheaper first by AWS's
# on-demand list price for the same size; burstable t3 after the fixed-performance families.
FAMILY_RANK: tuple[str, ...] = (
    "c6i", "c7i", "m6i", "m7i", "r6i", "r7i", "t3",
    "g4dn", "g6", "g5", "g6e", "p3dn", "p4d", "p4de", "p5", "inf2", "trn1",
)  # fmt: skip

_SIZES_XEON = (
    ("large", 2),
    ("xlarge", 4),
    ("2xlarge", 8),
    ("4xlarge", 16),
    ("8xlarge", 32),
    ("12xlarge", 48),
    ("16xlarge", 64),
    ("24xlarge", 96),
    ("32xlarge", 128),
)
# The 7th generation has no 32xlarge; it has a 48xlarge.
_SIZES_7 = (*_SIZES_XEON[:-1], ("48xlarge", 192))


def _xeon(family: str, gib_per_vcpu: int, sizes: tuple[tuple[str, int], ...]) -> list[InstanceType]:
    return [InstanceType(f"{family}.{size}", vcpus, float(vcpus * gib_per_vcpu)) for size, vcpus in sizes]


def _accelerated(family: str, accel: str, rows: tuple[tuple[str, int, float, int], ...]) -> list[InstanceType]:
    return [InstanceType(f"{family}.{size}", vcpus, gib, accel, count) for size, vcpus, gib, count in rows]


# (size, vCPUs, memory GiB, accelerators)
_G5_SIZES = (
    ("xlarge", 4, 16, 1),
    ("2xlarge", 8, 32, 1),
    ("4xlarge", 16, 64, 1),
    ("8xlarge", 32, 128, 1),
    ("16xlarge", 64, 256, 1),
    ("12xlarge", 48, 192, 4),
    ("24xlarge", 96, 384, 4),
    ("48xlarge", 192, 768, 8),
)

CATALOGUE: tuple[InstanceType, ...] = (
    # General purpose (4 GiB per vCPU), compute optimized (2), memory optimized (8): Intel Xeon.
    *_xeon("m6i", 4, _SIZES_XEON),
    *_xeon("m7i", 4, _SIZES_7),
    *_xeon("c6i", 2, _SIZES_XEON),
    *_xeon("c7i", 2, _SIZES_7),
    *_xeon("r6i", 8, _SIZES_XEON),
    *_xeon("r7i", 8, _SIZES_7),
    # Burstable general purpose.
    InstanceType("t3.nano", 2, 0.5, burstable=True),
    InstanceType("t3.micro", 2, 1.0, burstable=True),
    InstanceType("t3.small", 2, 2.0, burstable=True),
    InstanceType("t3.medium", 2, 4.0, burstable=True),
    InstanceType("t3.large", 2, 8.0, burstable=True),
    InstanceType("t3.xlarge", 4, 16.0, burstable=True),
    InstanceType("t3.2xlarge", 8, 32.0, burstable=True),
    # NVIDIA T4.
    *_accelerated(
        "g4dn",
        "T4",
        (
            ("xlarge", 4, 16, 1),
            ("2xlarge", 8, 32, 1),
            ("4xlarge", 16, 64, 1),
            ("8xlarge", 32, 128, 1),
            ("16xlarge", 64, 256, 1),
            ("12xlarge", 48, 192, 4),
        ),
    ),
    # NVIDIA A10G and L4: the same sizes.
    *_accelerated("g5", "A10G", _G5_SIZES),
    *_accelerated("g6", "L4", _G5_SIZES),
    # NVIDIA L40S.
    *_accelerated(
        "g6e",
        "L40S",
        (
            ("xlarge", 4, 32, 1),
            ("2xlarge", 8, 64, 1),
            ("4xlarge", 16, 128, 1),
            ("8xlarge", 32, 256, 1),
            ("16xlarge", 64, 512, 1),
            ("12xlarge", 48, 384, 4),
            ("24xlarge", 96, 768, 4),
            ("48xlarge", 192, 1536, 8),
        ),
    ),
    # NVIDIA V100 (32 GB): eight to an instance.
    InstanceType("p3dn.24xlarge", 96, 768.0, "V100", 8),
    # NVIDIA A100 40 GB / 80 GB and H100: eight to an instance, no smaller size.
    InstanceType("p4d.24xlarge", 96, 1152.0, "A100", 8),
    InstanceType("p4de.24xlarge", 96, 1152.0, "A100-80GB", 8),
    InstanceType("p5.48xlarge", 192, 2048.0, "H100", 8),
    # AWS Inferentia2 and Trainium (Neuron devices).
    *_accelerated(
        "inf2",
        "Inferentia2",
        (("xlarge", 4, 16, 1), ("8xlarge", 32, 128, 1), ("24xlarge", 96, 384, 6), ("48xlarge", 192, 768, 12)),
    ),
    *_accelerated("trn1", "Trainium", (("2xlarge", 8, 32, 1), ("32xlarge", 128, 512, 16))),
)
BY_NAME: dict[str, InstanceType] = {t.name: t for t in CATALOGUE}


def rank(instance_type: InstanceType) -> tuple[int, int, float, int, str]:
    """The candidates' order, smallest (so cheapest) first: accelerators, then vCPUs, then memory,
    then the family's rank (FAMILY_RANK)."""
    family = FAMILY_RANK.index(instance_type.family) if instance_type.family in FAMILY_RANK else len(FAMILY_RANK)
    return (
        instance_type.accelerator_count,
        instance_type.vcpus,
        instance_type.memory_gib,
        family,
        instance_type.name,
    )


# AWS's region and zone names: a partition's geography, a direction, a number; a zone adds a letter
# (us-east-1a), a Local Zone a location code (us-west-2-lax-1a). A pattern rather than a list, so a
# region AWS opens later is still a region; GCP's (us-central1) and Azure's (eastus) names never match.
_REGION = r"(?:us-gov|us|af|ap|ca|cn|eu|il|me|mx|sa)-(?:north|south|east|west|central|northeast|northwest|southeast|southwest)-\d{1,2}"  # noqa: E501
REGION = re.compile(rf"^{_REGION}$")
ZONE = re.compile(rf"^{_REGION}(?:[a-z]|-[a-z]{{3}}-\d[a-z])$")
