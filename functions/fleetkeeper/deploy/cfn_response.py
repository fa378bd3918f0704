"""Answering a CloudFormation custom resource request: the one PUT of its response object to the
request's pre-signed S3 URL. The stack's custom-resource functions (the load balancer zone check,
fleetkeeper.deploy.zone_check; the uninstall cleanup, fleetkeeper.uninstall.handler) answer through it.

CloudFormation's ResponseURL "identifies a presigned S3 bucket that receives responses": an HTTPS URL
of S3 (virtual-hosted or path style, any Region's endpoint). Anything else is not CloudFormation's,
and whoever may invoke the function must not make it PUT there (an internal address, another
service): the response is dropped and logged (CloudFormation's own request always passes).
https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/crpg-ref-requests.html
https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/crpg-ref-responses.html
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Mapping

logger = logging.getLogger(__name__)

# CloudFormation's limit on a whole response object (custom resource responses, 4,096 bytes); the
# reason is cut well inside it.
REASON_LIMIT = 1500
_S3_HOST = re.compile(r"(?:[a-z0-9][a-z0-9.-]*\.)?s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com(?:\.cn)?")


def response_url_problem(url: str) -> str | None:
    """Why `url` cannot be CloudFormation's presigned S3 response URL (None: it can)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "it is not a URL"
    if parts.scheme != "https":
        return "it is not HTTPS"
    if port not in (None, 443) or parts.username or parts.password:
        return "it names a port or credentials"
    if not _S3_HOST.fullmatch(parts.hostname or ""):
        return f"its host {parts.hostname!r} is not Amazon S3's"
    return None


def send(event: Mapping[str, Any], *, succeeded: bool, reason: str, physical_id: str, timeout: float) -> bool:
    """PUT the response to the request's ResponseURL when that is an S3 URL; whether it was sent."""
    url = str(event.get("ResponseURL", ""))
    problem = response_url_problem(url)
    if problem is not None:
        logger.error("not answering: the ResponseURL is not CloudFormation's (not an https URL of S3: %s)", problem)
        return False
    body = json.dumps(
        {
            "Status": "SUCCESS" if succeeded else "FAILED",
            "Reason": reason[:REASON_LIMIT],
            "PhysicalResourceId": event.get("PhysicalResourceId") or physical_id,
            "StackId": event.get("StackId", ""),
            "RequestId": event.get("RequestId", ""),
            "LogicalResourceId": event.get("LogicalResourceId", ""),
        }
    ).encode()
    import urllib.request  # only here: most importers of the functions' modules are tests of their verdicts

    # The presigned URL is signed without a content type: send none (an empty header, as AWS's
    # cfn-response module does).
    request = urllib.request.Request(
        url, data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:  # https to S3 only: checked above
        answer.read()
    return True
