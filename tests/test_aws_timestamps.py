"""The fast timestamp parser gives botocore's very result: the same instant, the same tzinfo type."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest
from botocore.utils import parse_timestamp as botocore_parse_timestamp
from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper import aws as clients
from fleetkeeper import aws_timestamps
from fleetkeeper.aws_timestamps import parse_timestamp

if TYPE_CHECKING:
    from collections.abc import Iterator


def _same(text: str) -> None:
    fast, slow = parse_timestamp(text), botocore_parse_timestamp(text)
    assert (fast, repr(fast), fast.utcoffset()) == (slow, repr(slow), slow.utcoffset()), text


@pytest.fixture(params=["UTC", "Europe/London", "America/New_York"])
def local_zone(request: pytest.FixtureRequest) -> Iterator[str]:
    """dateutil's answer for `...Z` depends on the local zone's names (tzlocal() where it is UTC)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    yield request.param
    if before is None:
        os.environ.pop("TZ")
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-30T03:08:45.000Z",  # AWS's usual form
        "2026-11-30T03:08:45Z",
        "2026-06-30T03:08:45.5Z",
        "2024-02-29T23:59:59.999999Z",
        "2026-11-30T03:08:45.1234567Z",  # more digits than a datetime holds: botocore's parser
        "2026-11-30T03:08:45+02:00",
        "2026-11-30T03:08:45",
        "Mon, 30 Nov 2026 03:08:45 GMT",
        "1700000000",
        "1700000000.25",
    ],
)
def test_every_format_parses_as_botocore_parses_it(text: str, local_zone: str) -> None:
    _same(text)


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1)), st.integers(0, 6))
def test_aws_utc_timestamps_parse_as_botocore_parses_them(moment: datetime, digits: int) -> None:
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{moment.microsecond:06d}"[:digits]
    _same(text + "Z")


def test_a_malformed_timestamp_is_refused_as_botocore_refuses_it() -> None:
    for text in ("not a time", "2026-13-45T99:99:99Z"):
        with pytest.raises(ValueError):
            botocore_parse_timestamp(text)
        with pytest.raises(ValueError):
            parse_timestamp(text)


@pytest.mark.lenient_aws  # no describe lag: this is about parsing
def test_the_clients_parse_with_it(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """fleetkeeper's clients parse an instance's timestamps with it: botocore's parser is asked only
    once, for the zone it gives `...Z` times, and the values are what botocore would have made."""
    asked: list[str] = []

    def botocore_parser(text: str) -> datetime:
        asked.append(text)
        return botocore_parse_timestamp(text)

    monkeypatch.setattr(aws_timestamps, "botocore_parse_timestamp", botocore_parser)
    monkeypatch.setattr(aws_timestamps, "_utc_by_zone_names", {})
    ec2 = clients.ec2()
    launched = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]
    described = ec2.describe_instances(InstanceIds=[launched["InstanceId"]])["Reservations"][0]["Instances"][0]
    assert len(asked) == 1
    stamp = described["LaunchTime"]
    text = stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert (stamp, repr(stamp)) == (botocore_parse_timestamp(text), repr(botocore_parse_timestamp(text)))
