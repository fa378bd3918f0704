"""Which image a replica boots, by the instance type it is launched as: pure, no AWS call.

A spec's `resources.image_id` wins. Otherwise an instance type with NVIDIA GPUs boots AWS's Deep
Learning AMI (the NVIDIA driver, CUDA, docker and the NVIDIA container toolkit for `--gpus all`), one
with Neuron devices (inf2, trn1) the Neuron Deep Learning AMI, and anything else the stack's default
image: by default Canonical's current Ubuntu LTS (DEFAULT_IMAGE_PARAMETER), as SkyPilot's own images
are Ubuntu, its arm64 build for a Graviton type (`for_architecture`). Each is named by a public SSM
parameter, which EC2 resolves at launch (`resolve:ssm:`): the reconciler makes no SSM call, and a
new release is picked up by the next launch. All three are Ubuntu, whose default user `ubuntu` has
passwordless sudo: the user `setup` and `run` run as (fleetkeeper.spec.runtime).

- Ubuntu: Canonical's "Finding Ubuntu images with the AWS SSM Parameter Store"
  (https://discourse.ubuntu.com/t/finding-ubuntu-images-with-the-aws-ssm-parameter-store/15507)
  gives `/aws/service/canonical/ubuntu/<product>/<release>/stable/current/<arch>/hvm/<volume>/ami-id`,
  `<arch>` amd64 or arm64; 24.04's images are gp3 ones (their AMI names say `hvm-ssd-gp3`), so
  `<volume>` is `ebs-gp3`.

Where the names come from (AWS's documentation, never a guess):

- GPU: "Finding the ID of a DLAMI", https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html
  gives the format `/aws/service/deeplearning/ami/<architecture>/<ami_type>/latest/ami-id`, the
  ami_type being the AMI's name without "Deep", "Learning" and "AMI"; the AMI is "Deep Learning Base
  OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" (the release notes,
  https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html). The page's own
  example shows `.../base-oss-nvidia-driver-ubuntu-22.04/...`, without `gpu`; the rule applied to
  the AMI's current name gives the one below, which public launch scripts use. Its release notes
  list the instance types it supports (`supported_ec2_instances`: G4dn, G5, G6, G6e, P4d, P4de, P5
  among those of fleetkeeper.spec.catalogue; not P3dn, whose V100 no image here serves) and
  `python_location` /usr/bin/python3.10, with docker and the NVIDIA container toolkit installed.
- Neuron: the Neuron DLAMI User Guide, "SSM Parameter Prefix" table
  (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/dlami/index.html, source
  deploy/environments/dlami.rst of aws-neuron/aws-neuron-sdk): `<prefix>/latest/image_id` with the
  prefix `/aws/service/neuron/dlami/multi-framework/ubuntu-24.04` for "Deep Learning AMI Neuron
  (Ubuntu 24.04)", which supports Inf2, Trn1, Trn1n, Trn2 and Trn3. The guide says Ubuntu 22.04
  reached end of support on Neuron (no more 22.04 DLAMIs), hence 24.04 there.

Both DLAMIs are Ubuntu too, whose root device is /dev/sda1 (spec.root_device_of_parameter knows the
DLAMI families). The images' root volumes are larger than a stock Ubuntu's: `Dlami.min_disk_gb` is the
smallest `disk_size` the api accepts for a type that boots one (see
docs/architecture/spec-and-placement.md, "Images (GPU and Neuron)").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetkeeper.spec import catalogue
from fleetkeeper.spec.catalogue import GPU, NEURON

SSM = "resolve:ssm:"
# Canonical's current Ubuntu LTS server image (24.04, Noble), x86_64: the stack's default image
# (template.yaml's DefaultImageParameter).
UBUNTU_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
GPU_DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
NEURON_DLAMI_PARAMETER = "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id"


@dataclass(frozen=True)
class Dlami:
    """A Deep Learning AMI family: its public parameter, what it is called, the instance families it
    supports, and the smallest root volume (GB) fleetkeeper asks for with it."""

    parameter: str
    name: str
    families: frozenset[str]
    min_disk_gb: int


# The smallest disk_size the api accepts with each image. AWS's DLAMI documentation does not state
# the images' root volume (snapshot) sizes, and fleetkeeper cannot look one up before EC2 resolves
# the parameter: these are the sizes public launch scripts and notes report for these images (a
# GPU base DLAMI launched on 75 GB; "the Neuron DLAMI snapshot is 100 GB"), not AWS's figures.
# Should AWS grow an image past them, EC2 refuses the launch itself ("InvalidBlockDeviceMapping:
# Volume of size N GB is smaller than snapshot ..., expect size >= M GB"), and that refusal, with
# its figure, is the version's launch refusal the user sees.
GPU_DLAMI = Dlami(
    GPU_DLAMI_PARAMETER,
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)",
    frozenset({"g4dn", "g5", "g6", "g6e", "p4d", "p4de", "p5"}),
    min_disk_gb=75,
)
NEURON_DLAMI = Dlami(
    NEURON_DLAMI_PARAMETER,
    "Deep Learning AMI Neuron (Ubuntu 24.04)",
    frozenset({"inf2", "trn1"}),
    min_disk_gb=100,
)
_DLAMIS = {GPU: GPU_DLAMI, NEURON: NEURON_DLAMI}


class NoImage(ValueError):
    """An accelerated instance type no image fleetkeeper knows can drive: the spec must name one."""


def dlami_for(instance_type: str) -> Dlami | None:
    """The Deep Learning AMI an instance type boots without `image_id`; None: the stack's default
    (a CPU type, or one fleetkeeper.spec.catalogue does not know). Raises NoImage for an accelerated type
    no DLAMI supports (p3dn's V100)."""
    known = catalogue.BY_NAME.get(instance_type)
    if known is None or known.accelerator is None:
        return None
    device = catalogue.accelerator(known.accelerator)
    dlami = _DLAMIS.get(device.kind) if device is not None else None
    if dlami is None or known.family not in dlami.families:
        raise NoImage(
            f"{instance_type} ({known.accelerator_count} {known.accelerator}) has no Deep Learning AMI fleetkeeper "
            f"can boot ({GPU_DLAMI.name} does not support it): give resources.image_id (an AMI with its driver)"
        )
    return dlami


# An instance type's family: its class letters, its generation, its attributes (`m7gd`: m, 7, gd),
# then an optional `-` part (`u7i-12tb`, `mac2-m2pro`).
_FAMILY = re.compile(r"^([a-z]+)([0-9]+)([a-z0-9]*)")


def is_graviton(instance_type: str) -> bool:
    """Whether an instance type runs on AWS's Graviton (arm64) processors: EC2's naming marks them
    with a `g` among the attributes after the generation (m7g, c7gn, r8gd, t4g, x2gd, im4gn, is4gen,
    g5g), and the first Graviton family is a1. tests/spec/test_images.py holds the rule against every
    type of DescribeInstanceTypes as moto captures it (ProcessorInfo.SupportedArchitectures)."""
    family = instance_type.split(".", 1)[0]
    match = _FAMILY.match(family)
    return family == "a1" or (match is not None and "g" in match.group(3))


# The x86_64 and arm64 spellings of AWS's and Canonical's public image parameters, by family.
_ARM64 = (
    ("/aws/service/canonical/", "/amd64/", "/arm64/"),
    ("/aws/service/ami-amazon-linux-latest/", "-x86_64", "-arm64"),
)


def for_architecture(parameter: str, instance_type: str) -> str:
    """The default image parameter for `instance_type`: the arm64 build of a public Ubuntu or Amazon
    Linux parameter for a Graviton type, else the parameter as given (a stack's own parameter names
    one image, whichever architecture it is)."""
    if not is_graviton(instance_type):
        return parameter
    for prefix, x86, arm in _ARM64:
        if parameter.startswith(prefix) and x86 in parameter:
            return parameter.replace(x86, arm)
    return parameter


def image_for(instance_type: str, spec_image_id: str | None, default_parameter: str) -> str:
    """The ImageId to launch `instance_type` with: the spec's AMI id or `resolve:ssm:` parameter,
    else its Deep Learning AMI's parameter, else the stack's default parameter (its arm64 build for a
    Graviton type), as `resolve:ssm:`."""
    if spec_image_id is not None:
        return spec_image_id
    dlami = dlami_for(instance_type)
    return SSM + (dlami.parameter if dlami is not None else for_architecture(default_parameter, instance_type))
