"""fleetkeeper's response parsing gives botocore's very results: the same timestamps (instant and
tzinfo type), the same DynamoDB items, the same refusals."""

from __future__ import annotations

import base64
import gc
import json
import os
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import botocore.session
import pytest
from botocore.exceptions import ClientError
from botocore.parsers import create_parser
from botocore.utils import parse_timestamp as botocore_parse_timestamp
from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper import aws as clients
from fleetkeeper.aws import parsing as aws_parsing
from fleetkeeper.aws.parsing import ResponseParsers, only, parse_timestamp
from fleetkeeper.reconciler.drivers.ec2 import _DESCRIBED, Ec2Driver, _instance
from tests import REPO_ROOT

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

    monkeypatch.setattr(aws_parsing, "botocore_parse_timestamp", botocore_parser)
    monkeypatch.setattr(aws_parsing, "_utc_by_zone_names", {})
    ec2 = clients.ec2()
    launched = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]
    described = ec2.describe_instances(InstanceIds=[launched["InstanceId"]])["Reservations"][0]["Instances"][0]
    assert len(asked) == 1
    stamp = described["LaunchTime"]
    text = stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert (stamp, repr(stamp)) == (botocore_parse_timestamp(text), repr(botocore_parse_timestamp(text)))


# --- DynamoDB's attribute values ---------------------------------------------------------------------

_QUERY = botocore.session.get_session().get_service_model("dynamodb").operation_model("Query")

_scalars = st.one_of(
    st.builds(lambda text: {"S": text}, st.text(max_size=5)),
    st.builds(lambda number: {"N": str(number)}, st.integers()),
    st.builds(lambda flag: {"BOOL": flag}, st.booleans()),
    st.just({"NULL": True}),
    st.builds(lambda data: {"B": base64.b64encode(data).decode()}, st.binary(max_size=5)),
    st.builds(lambda texts: {"SS": texts}, st.lists(st.text(max_size=3), max_size=3)),
    st.builds(lambda numbers: {"NS": [str(n) for n in numbers]}, st.lists(st.integers(), max_size=3)),
    st.builds(lambda blobs: {"BS": [base64.b64encode(b).decode() for b in blobs]}, st.lists(st.binary(), max_size=2)),
)
# What a well-behaved service never sends, which botocore still decides about in its own way.
_odd = st.sampled_from(
    [None, {}, {"S": None}, {"S": "a", "N": "1"}, {"X": "unknown"}, {"S": "a", "__type": "x"}, {"M": None}, "text"]
)
_values = st.recursive(
    _scalars | _odd,
    lambda inner: st.one_of(
        st.builds(lambda members: {"M": members}, st.dictionaries(st.text(max_size=3), inner, max_size=3)),
        st.builds(lambda items: {"L": items}, st.lists(inner, max_size=3)),
    ),
    max_leaves=8,
)
_items = st.lists(st.dictionaries(st.text(max_size=4), _values, max_size=4), max_size=3)


def _parsed(parser: Any, body: dict[str, Any]) -> Any:
    response = {"status_code": 200, "headers": {}, "body": json.dumps(body).encode()}
    try:
        return parser.parse(response, _QUERY.output_shape)
    except Exception as exc:  # the refusal itself must match too
        return ("refused", type(exc), str(exc))


@given(_items, st.one_of(st.none(), st.dictionaries(st.text(max_size=4), _values, max_size=2)))
def test_a_query_s_items_parse_as_botocore_parses_them(items: list[Any], last_key: dict[str, Any] | None) -> None:
    body: dict[str, Any] = {"Items": items, "Count": len(items), "ScannedCount": len(items)}
    if last_key is not None:
        body["LastEvaluatedKey"] = last_key
    ours = _parsed(ResponseParsers().create_parser("json"), body)
    assert ours == _parsed(create_parser("json"), body)


def test_a_fleetkeeper_item_parses_as_botocore_parses_it() -> None:
    item = {
        "PK": {"S": "SVC#web"},
        "generation": {"N": "3"},
        "ratio": {"N": "0.25"},
        "flag": {"BOOL": False},
        "gone": {"NULL": True},
        "events": {"L": [{"M": {"count": {"N": "2"}, "seen": {"S": "2026-01-01T00:00:00.000Z"}}}]},
        "blob": {"B": base64.b64encode(b"\x00\x01").decode()},
    }
    body = {"Items": [item], "Count": 1, "ScannedCount": 1, "LastEvaluatedKey": {"PK": {"S": "SVC#web"}}}
    ours = _parsed(ResponseParsers().create_parser("json"), body)
    assert ours == _parsed(create_parser("json"), body)
    assert ours["Items"][0]["blob"] == {"B": b"\x00\x01"}


# --- EC2's XML ---------------------------------------------------------------------------------------


def _ec2_answers(ec2: Any) -> list[tuple[Any, dict[str, Any]]]:
    """moto's answers to the calls the driver makes, about instances in every state the reconciler
    meets (tagged, spot, stopped, terminated with a state reason), and to an erroneous call."""
    answers: list[tuple[Any, dict[str, Any]]] = []

    def keep(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
        answers.append((operation_model, dict(response_dict)))

    ec2.meta.events.register("before-parse.ec2.*", keep)
    tags = [
        {"Key": "fleetkeeper:managed", "Value": "true"},
        {"Key": "fleetkeeper:stack", "Value": "fleetkeeper"},
        {"Key": "fleetkeeper:replica-id", "Value": "0"},
    ]
    launched = ec2.run_instances(
        ImageId="ami-12345678",
        MinCount=3,
        MaxCount=3,
        ClientToken="fk-u-0",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"]
    ec2.run_instances(
        ImageId="ami-12345678",
        MinCount=1,
        MaxCount=1,
        InstanceMarketOptions={"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}},
    )
    ec2.stop_instances(InstanceIds=[launched[1]["InstanceId"]])
    ec2.terminate_instances(InstanceIds=[launched[2]["InstanceId"]])
    ec2.describe_instances()
    ec2.describe_instances(Filters=[{"Name": "tag:fleetkeeper:managed", "Values": ["true"]}], MaxResults=5)
    ec2.describe_images(Owners=["amazon"])
    ec2.describe_subnets()
    ec2.describe_security_groups()
    with pytest.raises(ClientError):
        ec2.describe_instances(InstanceIds=["i-00000000000000000"])
    ec2.meta.events.unregister("before-parse.ec2.*", keep)
    assert {model.name for model, _ in answers} >= {"RunInstances", "DescribeInstances", "TerminateInstances"}
    return answers


@pytest.mark.lenient_aws  # moto's own answers: this is about parsing them
def test_ec2_s_answers_parse_as_botocore_parses_them(aws: None) -> None:
    for model, response in _ec2_answers(clients.ec2()):
        ours = ResponseParsers().create_parser("ec2").parse(response, model.output_shape)
        assert ours == create_parser("ec2").parse(response, model.output_shape), model.name


_READ = {"Reservation": {"Instances"}, "Instance": {"InstanceId", "State", "Tags", "LaunchTime"}}


@pytest.mark.lenient_aws
def test_only_parses_the_members_named_each_as_botocore_parses_it(aws: None) -> None:
    """A structure named keeps exactly the members named, as botocore parses them; the others whole."""
    described = [(m, r) for m, r in _ec2_answers(clients.ec2()) if m.name == "DescribeInstances"]
    for model, response in described:
        whole = create_parser("ec2").parse(response, model.output_shape)
        with only(_READ):
            ours = ResponseParsers().create_parser("ec2").parse(response, model.output_shape)
        assert ours.keys() == whole.keys()  # DescribeInstancesResult is not named: whole
        assert len(ours.get("Reservations", [])) == len(whole.get("Reservations", []))
        for mine, theirs in zip(ours.get("Reservations", []), whole.get("Reservations", []), strict=True):
            assert mine.keys() == {"Instances"}
            assert mine["Instances"] == [
                {k: v for k, v in instance.items() if k in _READ["Instance"]} for instance in theirs["Instances"]
            ]
    # Outside the block, and in another thread inside it, answers are parsed whole again.
    model, response = described[0]
    assert ResponseParsers().create_parser("ec2").parse(response, model.output_shape) == create_parser("ec2").parse(
        response, model.output_shape
    )
    elsewhere: list[Any] = []
    with only(_READ):
        worker = threading.Thread(
            target=lambda: elsewhere.append(ResponseParsers().create_parser("ec2").parse(response, model.output_shape))
        )
        worker.start()
        worker.join()
    assert elsewhere == [create_parser("ec2").parse(response, model.output_shape)]


@pytest.mark.lenient_aws
def test_the_driver_reads_of_an_instance_what_it_read_of_the_whole_description(aws: None) -> None:
    """What the ec2 driver reads of DescribeInstances (`_DESCRIBED`) is all `_instance` reads: every
    field of every Instance comes out as it did from botocore's whole answer."""
    ec2 = clients.ec2()
    described = [(m, r) for m, r in _ec2_answers(ec2) if m.name == "DescribeInstances"]
    for model, response in described:
        whole = create_parser("ec2").parse(response, model.output_shape)
        with only(_DESCRIBED):
            ours = ResponseParsers().create_parser("ec2").parse(response, model.output_shape)
        assert ours.get("NextToken") == whole.get("NextToken")
        mine = [_instance(raw) for reservation in ours.get("Reservations", []) for raw in reservation["Instances"]]
        theirs = [_instance(raw) for reservation in whole.get("Reservations", []) for raw in reservation["Instances"]]
        assert mine == theirs
    whole_list = [
        _instance(raw) for reservation in ec2.describe_instances()["Reservations"] for raw in reservation["Instances"]
    ]
    assert sorted(Ec2Driver().list_instances(), key=str) == sorted(
        (i for i in whole_list if i.tags.get("fleetkeeper:managed") == "true"), key=str
    )


# --- the collector's pause ---------------------------------------------------------------------------


@pytest.mark.lenient_aws
def test_an_ec2_answer_is_parsed_with_the_collector_paused_and_it_is_on_again_after(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, response = next((m, r) for m, r in _ec2_answers(clients.ec2()) if m.name == "DescribeInstances")
    during: list[bool] = []

    def timestamp(text: str) -> datetime:
        during.append(gc.isenabled())
        return parse_timestamp(text)

    monkeypatch.setattr(aws_parsing, "parse_timestamp", timestamp)
    assert gc.isenabled()
    ResponseParsers().create_parser("ec2").parse(response, model.output_shape)
    assert during and not any(during)
    assert gc.isenabled()
    gc.disable()  # a process that keeps its collector off keeps it off
    try:
        ResponseParsers().create_parser("ec2").parse(response, model.output_shape)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_on_again_only_when_the_last_thread_is_done_and_after_an_error() -> None:
    pause = aws_parsing._CollectorPause()
    inside, leave = threading.Event(), threading.Event()

    def parse() -> None:
        with pause.paused():
            inside.set()
            leave.wait(5)

    other = threading.Thread(target=parse)
    with pause.paused():
        other.start()
        inside.wait(5)
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread is still parsing
    leave.set()
    other.join()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), pause.paused():
        raise RuntimeError("a parse that fails")
    assert gc.isenabled()


# --- the botocore the functions run is the botocore this suite checked ---------------------------------


def _pins() -> dict[str, str]:

    text = (REPO_ROOT / "functions" / "requirements.txt").read_text(encoding="utf-8")
    pins = {}
    for line in text.splitlines():
        requirement = line.split("#", 1)[0].strip()
        if "==" in requirement:
            name, version = requirement.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def test_the_lambda_bundle_pins_the_botocore_this_suite_runs_and_checked() -> None:
    """Lambda's runtime SDK changes under the functions whenever AWS upgrades it: the bundle pins boto3
    and botocore, the dev install is constrained to the same pins (Makefile), and the parsing shortcuts
    name the release they were compared against. A botocore upgrade changes all three together."""
    import boto3
    import botocore

    pins = _pins()
    assert pins["botocore"] == botocore.__version__ == aws_parsing.CHECKED_BOTOCORE
    assert pins["boto3"] == boto3.__version__


def test_another_botocore_keeps_its_own_parsers(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a botocore the shortcuts were not checked against, clients parse with botocore's own code."""
    import botocore

    clients.reset_clients()
    monkeypatch.setattr(botocore, "__version__", "0.0.1")
    client = clients._client("dynamodb")
    assert not isinstance(client._endpoint._response_parser_factory, ResponseParsers)
    clients.reset_clients()
    monkeypatch.undo()
    client = clients._client("dynamodb")
    assert isinstance(client._endpoint._response_parser_factory, ResponseParsers)
    clients.reset_clients()
