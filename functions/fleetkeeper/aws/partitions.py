"""Which partition a region is in, and the DNS suffix of its endpoints (amazonaws.com,
amazonaws.com.cn in China...), from botocore's own endpoint data: what a replica's boot and log
shipper build their S3, SSM and CloudWatch Logs URLs with (reconciler/userdata.py)."""

from __future__ import annotations

import re
from functools import cache

DEFAULT_DNS_SUFFIX = "amazonaws.com"


@cache
def dns_suffix(region: str | None) -> str:
    """The DNS suffix of `region`'s partition: the partition listing the region, else the one whose
    region pattern matches it (a region newer than this botocore), else amazonaws.com."""
    if not region:
        return DEFAULT_DNS_SUFFIX
    from botocore.loaders import create_loader

    partitions = create_loader().load_data("endpoints")["partitions"]
    for partition in partitions:
        if region in partition.get("regions", {}):
            return str(partition["dnsSuffix"])
    for partition in partitions:
        pattern = partition.get("regionRegex")
        if pattern and re.match(pattern, region):
            return str(partition["dnsSuffix"])
    return DEFAULT_DNS_SUFFIX
