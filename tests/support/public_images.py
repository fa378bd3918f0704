"""The public image parameters fleetkeeper launches with, in moto's SSM, which ships only Amazon Linux's
(/aws/service/ami-amazon-linux-latest/...): Canonical's Ubuntu (the default image, amd64 and arm64:
fleetkeeper.spec.images.for_architecture) and AWS's Deep Learning AMIs, so a launch with
`resolve:ssm:<parameter>` resolves on the strict-AWS layer as on AWS.

`install` (tests/conftest.py, before any mock starts) makes every moto SSM backend load them the way
it loads Amazon Linux's, lazily on the first look-up under their prefixes, each naming the AMI
moto's own Amazon Linux 2023 parameter of the same architecture names in that region (an image moto's
EC2 has). `publish_deep_learning_amis` publishes a newer version of the DLAMI parameters, naming one
of moto's Amazon-owned images, for a test that wants to know which.
"""

from __future__ import annotations

from typing import Any

from fleetkeeper.spec.images import GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER, UBUNTU_PARAMETER, for_architecture

# Each parameter, and the Amazon Linux 2023 parameter whose AMI (one of the same architecture) it names.
_AL2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-"
PUBLISHED = {
    UBUNTU_PARAMETER: _AL2023 + "x86_64",
    for_architecture(UBUNTU_PARAMETER, "m7g.large"): _AL2023 + "arm64",
    GPU_DLAMI_PARAMETER: _AL2023 + "x86_64",
    NEURON_DLAMI_PARAMETER: _AL2023 + "x86_64",
}
_PREFIXES = ("/aws/service/canonical/", "/aws/service/deeplearning/", "/aws/service/neuron/")


def install() -> None:
    """Have moto's SSM backends hold PUBLISHED, loaded with its own Amazon Linux parameters."""
    from moto.ssm.models import Parameter, ParameterDict
    from moto.utilities.utils import load_resource

    original = ParameterDict._check_loading_status
    if getattr(original, "fleetkeeper_public_images", False):
        return

    def _check_loading_status(self: Any, key: str) -> None:
        original(self, key)
        if not str(key or "").startswith(_PREFIXES) or getattr(self, "fleetkeeper_public_loaded", False):
            return
        self.fleetkeeper_public_loaded = True
        try:
            shipped = load_resource(f"ssm/resources/ami-amazon-linux-latest/{self.region_name}.json")
            linux = {p["Name"]: p for p in shipped}
        except FileNotFoundError:
            return
        for name, source in PUBLISHED.items():
            if source in linux:
                self.setdefault(name, []).append(
                    Parameter(
                        account_id=self.account_id,
                        name=name,
                        value=linux[source]["Value"],
                        parameter_type="String",
                        description=None,
                        allowed_pattern=None,
                        keyid=None,
                        last_modified_date=linux[source]["LastModifiedDate"],
                        version=1,
                        data_type="aws:ec2:image",
                    )
                )

    _check_loading_status.fleetkeeper_public_images = True  # type: ignore[attr-defined]
    ParameterDict._check_loading_status = _check_loading_status  # type: ignore[method-assign]


def publish_deep_learning_amis(region: str = "us-east-1") -> dict[str, str]:
    """Parameter name -> the AMI id it names now (a newer version naming one of moto's Amazon-owned images)."""
    import boto3
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.core.utils import utcnow
    from moto.ssm.models import Parameter, ssm_backends

    ami = boto3.client("ec2", region_name=region).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    parameters = ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters
    published = {}
    for name in (GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER):
        versions = parameters[name]
        versions.append(
            Parameter(
                account_id=DEFAULT_ACCOUNT_ID,
                name=name,
                value=ami,
                parameter_type="String",
                description=None,
                allowed_pattern=None,
                keyid=None,
                last_modified_date=utcnow(),
                version=len(versions) + 1,
                data_type="aws:ec2:image",
            )
        )
        published[name] = ami
    return published
