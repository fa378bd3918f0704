"""IAM, as AWS does it and moto does not: IAM's name limits, and instance profiles that EC2 cannot use
until IAM has propagated them.

- Eventual consistency. AWS: "changes that you make in IAM ... take time to become visible" and a
  newly created instance profile is refused by RunInstances for a while with
  `InvalidParameterValue` ("Value (...) for parameter iamInstanceProfile.name is invalid. Invalid IAM
  Instance Profile name"). https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html#troubleshoot_general_eventual-consistency
  The layer records when a profile is created, or gets its role, on the layer's clock; the EC2 layer
  refuses a launch naming it until PROPAGATION_SECONDS have passed (`Ec2Layer` asks `usable`).
  Profiles the layer never saw made (created before it was active) are taken as long usable: the
  layer models what the design relies on, youth. A profile named by a launch that does not exist (yet,
  or any more) EC2 answers the same way, `InvalidParameterValue`, where moto would answer IAM's
  `NoSuchEntity`: the layer answers as EC2 does.
- Limits, from botocore's IAM model (the same limits AWS's API reference states): a role name at
  most 64 characters, an instance profile name at most 128, a path at most 512 and made of
  `/`-delimited printable ASCII. botocore checks minimum lengths only; moto checks none; IAM answers
  `ValidationError`.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import TYPE_CHECKING

from tests.strict_aws.wire import Call, Response, request_id

if TYPE_CHECKING:
    from tests.strict_aws.core import StrictAws

# How long after creation (or after getting its role) EC2 refuses an instance profile. AWS gives no
# figure ("a few seconds", eventually consistent); ~10 s is what launches right after creation see.
PROPAGATION_SECONDS = 10.0
_PATH = re.compile(r"^(/|/[\x21-\x7e]+/)$")


@functools.cache
def _limits() -> dict[str, int]:
    """The max lengths of botocore's IAM model, by shape: roleNameType, instanceProfileNameType, pathType.

    Read once per process: a session of its own parses IAM's whole model, which every test's
    controller would otherwise pay for again. Callers copy it (`IamLayer.limits`)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("iam")
    return {
        name: int(model.shape_for(name).metadata["max"])
        for name in ("roleNameType", "instanceProfileNameType", "pathType")
    }


def iam_error(code: str, message: str, *, status: int = 400) -> Response:
    """An error of IAM's query protocol."""
    from xml.sax.saxutils import escape

    body = (
        '<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/">'
        f"<Error><Type>Sender</Type><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
        f"<RequestId>{request_id()}</RequestId></ErrorResponse>"
    )
    return status, {"Content-Type": "text/xml"}, body.encode()


def _exists(name: str) -> bool:
    """Whether moto's IAM (its default account, the only one the suite uses) has the instance profile."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    backend = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
    return any(profile.name == name for profile in backend.instance_profiles.values())


class IamLayer:
    def __init__(self, strict: StrictAws) -> None:
        self._strict = strict
        self.lock = threading.RLock()
        self.limits = dict(_limits())
        # instance profile name -> layer time from which EC2 accepts it
        self.usable_from: dict[str, float] = {}

    def usable(self, profile: str) -> bool:
        """Whether EC2 accepts the instance profile (a name, or an ARN whose last part is the name)."""
        name = profile.rsplit("/", 1)[-1]
        with self.lock:
            ready = self.usable_from.get(name)
        return _exists(name) and (ready is None or self._strict.clock.time() >= ready)

    def settle(self) -> None:
        """Let every profile propagate (the clock moves past the youngest one's propagation)."""
        with self.lock:
            latest = max(self.usable_from.values(), default=0.0)
        now = self._strict.clock.time()
        if latest > now:
            self._strict.clock.advance(latest - now)

    def send(self, call: Call) -> Response:
        with self.lock:
            refusal = self._invalid(call)
            if refusal is not None:
                return refusal
            response = call.send()
            if response[0] == 200 and call.operation in ("CreateInstanceProfile", "AddRoleToInstanceProfile"):
                name = call.param("InstanceProfileName") or ""
                self.usable_from[name] = self._strict.clock.time() + PROPAGATION_SECONDS
            return response

    def _invalid(self, call: Call) -> Response | None:
        checks = {
            "RoleName": self.limits["roleNameType"],
            "InstanceProfileName": self.limits["instanceProfileNameType"],
            "Path": self.limits["pathType"],
            "PathPrefix": self.limits["pathType"],
        }
        for param, limit in checks.items():
            value = call.param(param)
            if value is not None and len(value) > limit:
                return iam_error(
                    "ValidationError",
                    f"1 validation error detected: Value '{value}' at '{param[0].lower()}{param[1:]}' failed to "
                    f"satisfy constraint: Member must have length less than or equal to {limit}",
                )
        path = call.param("Path")
        if path is not None and not _PATH.match(path):
            return iam_error(
                "ValidationError",
                f"The specified value for path is invalid. It must begin and end with / and contain only "
                f"alphanumeric characters and/or / characters: {path!r}",
            )
        return None
