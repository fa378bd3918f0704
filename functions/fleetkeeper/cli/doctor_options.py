"""`fleetkeeper doctor`'s options: parsed on every CLI run, so this module stays light (the doctor
itself, fleetkeeper.cli.doctor, and its AWS reads are imported only when it runs)."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

from fleetkeeper.cli.http import UsageError
from fleetkeeper.local.options import seconds

# v2's downscale_to_zero_delay_seconds. It must outlast the time the rollout's own requests take to
# reach the autoscaler, or the service goes to zero while it rolls: on AWS the autoscaler reads the
# ALB's RequestCount over a minute ending a minute back, once a reconciler run (a minute) comes, so
# 180 s; in embedded mode the local balancer's metric is seconds behind (--metrics-interval).
AWS_TO_ZERO_DELAY = 180
EMBEDDED_TO_ZERO_DELAY = 30
# Timeouts (seconds) per step: an EC2 replica boots and passes its probe in a few minutes; going to
# zero waits for the load balancer's metric (a minute behind) and the delay; a wake is one boot.
DEFAULT_TIMEOUTS = {
    "serve": 900.0,
    "update": 900.0,
    "zero": 900.0,
    "wake": 900.0,
    "second": 900.0,
    "delete": 900.0,
    "leftovers": 300.0,
}
ROLE_ARN = re.compile(r"arn:aws(?:-[a-z]+)*:iam::[0-9]{12}:role/(?:[\x21-\x7e]*/)?[\w+=,.@-]+")


@dataclass
class Options:
    """What the doctor is asked to do (the command line, parsed)."""

    to_zero_delay: int = EMBEDDED_TO_ZERO_DELAY
    second_owner_role: str | None = None
    timeouts: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIMEOUTS))
    interval: float = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--second-owner-role",
        metavar="ARN",
        help="an IAM role you may assume (sts:AssumeRole): step 6 creates a service as that role and checks "
        "the API records it as its owner (without it: SKIP)",
    )
    parser.add_argument(
        "--to-zero-delay",
        type=_delay,
        metavar="SECONDS",
        help=f"v2's downscale_to_zero_delay_seconds (default {AWS_TO_ZERO_DELAY} on AWS: longer than the load "
        f"balancer metric's lag; {EMBEDDED_TO_ZERO_DELAY} in embedded mode)",
    )
    timeouts = parser.add_argument_group("per-step timeouts, in seconds")
    for key, flag, what in (
        ("serve", "--serve-timeout", "create, then serve: until the endpoint answers v1"),
        ("update", "--update-timeout", "until the endpoint answers v2"),
        ("zero", "--zero-timeout", "until the service is at zero replicas"),
        ("wake", "--wake-timeout", "from the first request at zero until v2 answers"),
        ("second", "--second-owner-timeout", "until the second owner's service answers"),
        ("delete", "--delete-timeout", "until both services are gone"),
        ("leftovers", "--leftovers-timeout", "until nothing of them is left"),
    ):
        timeouts.add_argument(
            flag,
            dest=f"timeout_{key}",
            type=seconds(86_400),
            default=DEFAULT_TIMEOUTS[key],
            metavar="S",
            help=f"{what} (default {DEFAULT_TIMEOUTS[key]:g})",
        )


def _delay(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 86_400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to 86400")
    return int(text)


def options_from(args: argparse.Namespace, *, embedded: bool = False) -> Options:
    role = args.second_owner_role
    if role is not None and not ROLE_ARN.fullmatch(role):
        raise UsageError(f"--second-owner-role {role!r}: expected an IAM role ARN, arn:aws:iam::ACCOUNT:role/NAME")
    return Options(
        to_zero_delay=args.to_zero_delay
        if args.to_zero_delay is not None
        else (EMBEDDED_TO_ZERO_DELAY if embedded else AWS_TO_ZERO_DELAY),
        second_owner_role=role,
        timeouts={key: getattr(args, f"timeout_{key}") for key in DEFAULT_TIMEOUTS},
    )
