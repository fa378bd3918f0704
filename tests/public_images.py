"""AWS's public Deep Learning AMI parameters in moto's SSM, which ships only Amazon Linux's
(/aws/service/ami-amazon-linux-latest/...): added the way moto loads those, each naming an AMI moto
has, so a launch with `resolve:ssm:<DLAMI parameter>` resolves on the strict-AWS layer as on AWS."""

from __future__ import annotations

from fleetkeeper.spec.images import GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER


def publish_deep_learning_amis(region: str = "us-east-1") -> dict[str, str]:
    """Parameter name -> the AMI id it names (one of moto's Amazon-owned images)."""
    import boto3
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.core.utils import utcnow
    from moto.ssm.models import Parameter, ssm_backends

    ami = boto3.client("ec2", region_name=region).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    parameters = ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters
    published = {}
    for name in (GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER):
        parameters[name].append(
            Parameter(
                account_id=DEFAULT_ACCOUNT_ID,
                name=name,
                value=ami,
                parameter_type="String",
                description=None,
                allowed_pattern=None,
                keyid=None,
                last_modified_date=utcnow(),
                version=1,
                data_type="aws:ec2:image",
            )
        )
        published[name] = ami
    return published
