"""Every consumer of each extensible choice (fleetkeeper.choices) has a behaviour for every member.

A member added to an enum without its behaviour somewhere fails here, not in the reconciler after
the api took a spec naming it. And every field of the readiness probe is classified
(spec.service.PROBE_OPTIONS), so a new probe option cannot be forgotten by the prober's substitution
or by the ALB's health check.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.choices import (
    DEFAULT_LOAD_BALANCING_POLICY,
    DEFAULT_UPDATE_MODE,
    Isolation,
    LoadBalancingPolicy,
    Market,
    UpdateMode,
    values,
)
from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec.service import PROBE_OPTIONS, MarketPolicy, ReadinessProbe, parse_spec, stored_spec
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from enum import StrEnum

BALANCED = set(LoadBalancingPolicy.balanced())


def _with_service(**fields: Any) -> dict[str, Any]:
    return hello_spec(service={**hello_spec()["service"], **fields})


def _refusal(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec(data)
    (detail,) = caught.value.details
    return detail


def _listed_in_order(problem: str, names: list[str]) -> bool:
    at = [problem.find(name) for name in names]
    return all(i >= 0 for i in at) and at == sorted(at)


# --- load-balancing policies ----------------------------------------------------------------------


def test_every_policy_is_balanced_as_one_each_adapter_runs() -> None:
    assert DEFAULT_LOAD_BALANCING_POLICY in BALANCED
    assert {policy.balanced_as for policy in LoadBalancingPolicy} == BALANCED
    assert LoadBalancingPolicy.INSTANCE_AWARE_LEAST_LOAD.balanced_as is LoadBalancingPolicy.LEAST_LOAD


def test_the_alb_has_an_algorithm_for_every_balanced_policy() -> None:
    from fleetkeeper.reconciler.balancers.alb import ALGORITHMS

    assert set(ALGORITHMS) == BALANCED


def test_the_local_balancer_has_a_picker_for_every_balanced_policy() -> None:
    from fleetkeeper.local.balancer import PICKERS

    assert set(PICKERS) == BALANCED


@pytest.mark.parametrize("policy", list(LoadBalancingPolicy))
def test_the_spec_takes_every_policy_and_the_endpoint_gets_one_the_adapters_run(policy: LoadBalancingPolicy) -> None:
    from fleetkeeper.local.balancer import PICKERS
    from fleetkeeper.reconciler.balancers.alb import ALGORITHMS
    from fleetkeeper.reconciler.plan.endpoints import endpoint_config
    from fleetkeeper.store.codec import endpoint_from_item, endpoint_item

    spec = parse_spec(_with_service(load_balancing_policy=policy.value))
    assert spec.to_json_dict()["service"]["load_balancing_policy"] == policy.value  # kept as written
    config = endpoint_config(spec)
    assert config.policy is policy.balanced_as
    assert config.policy in ALGORITHMS
    assert config.policy in PICKERS
    # And the service item's endpoint map decodes to the same policy.
    from fleetkeeper.model import EndpointRecord

    record = EndpointRecord(url="http://x", config=config, target_group="tg", route="r")
    assert endpoint_from_item(endpoint_item(record)).config.policy is config.policy


def test_an_unknown_policy_is_refused_listing_every_policy_in_order() -> None:
    detail = _refusal(_with_service(load_balancing_policy="random"))
    assert detail["field"] == "spec.service.load_balancing_policy"
    assert "'random' is not a load balancing policy: use least_load (the default: " in detail["problem"]
    assert _listed_in_order(detail["problem"], values(LoadBalancingPolicy))
    assert detail["problem"].endswith(f" or {list(LoadBalancingPolicy)[-1]}")


# --- update modes --------------------------------------------------------------------------------


def test_the_planner_rolls_out_every_update_mode() -> None:
    from fleetkeeper.reconciler.plan.replicas import ROLLOUTS

    assert set(ROLLOUTS) == set(UpdateMode)
    assert DEFAULT_UPDATE_MODE in ROLLOUTS


@pytest.mark.parametrize("mode", list(UpdateMode))
def test_the_spec_the_api_and_the_store_take_every_update_mode(mode: UpdateMode) -> None:
    from fleetkeeper.api.models import UpdateServiceRequest
    from fleetkeeper.model import VersionRecord
    from fleetkeeper.store.codec import version_from_item, version_item

    spec = parse_spec(hello_spec(update={"mode": mode.value}))
    assert spec.update.mode is mode
    assert spec.to_json_dict()["update"]["mode"] == mode.value
    assert UpdateServiceRequest.model_validate({"spec": hello_spec(), "mode": mode.value}).mode is mode
    record = VersionRecord(name="web", uid="u" * 32, version=1, spec=spec, mode=mode, created_at="t")
    item = version_item(record)
    assert item["mode"] == mode.value
    assert version_from_item({**item, "PK": "SVC#web", "SK": "x"}).mode is mode


def test_an_unknown_update_mode_is_refused_listing_every_mode_in_order() -> None:
    detail = _refusal(hello_spec(update={"mode": "sideways"}))
    assert detail["field"] == "spec.update.mode"
    assert detail["problem"].startswith("'sideways' is not one of 'rolling'")
    assert _listed_in_order(detail["problem"], values(UpdateMode))


def _option_choices(parser: argparse.ArgumentParser, *path: str, option: str) -> list[str]:
    """The `choices` of `option` on the (sub)command `path` of an argparse parser."""
    for name in path:
        (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = subparsers.choices[name]
    (action,) = [a for a in parser._actions if option in a.option_strings]
    return list(action.choices or [])


def test_the_cli_offers_every_update_mode() -> None:
    from fleetkeeper.cli.main import build_parser

    assert _option_choices(build_parser(), "update", option="--mode") == values(UpdateMode)


# --- markets -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "markets",
    [None, MarketPolicy(spot=False), MarketPolicy(spot=True), MarketPolicy(True, 1, dynamic_fallback=True)],
)
def test_the_planner_counts_every_market(markets: MarketPolicy | None) -> None:
    from fleetkeeper.reconciler.plan.markets import wanted_by_market

    wanted = wanted_by_market(markets, wanted=3, spot_ready=1)
    assert set(wanted) == set(Market)
    assert next(iter(wanted)) is Market.SPOT  # the order the planner scales markets down in


def test_the_ec2_driver_buys_every_market() -> None:
    from fleetkeeper.reconciler.drivers.ec2 import MARKET_OPTIONS

    assert set(MARKET_OPTIONS) == set(Market)
    assert MARKET_OPTIONS[Market.ON_DEMAND] is None  # RunInstances' default
    spot = MARKET_OPTIONS[Market.SPOT]
    assert spot is not None
    assert spot["MarketType"] == "spot"


@pytest.mark.parametrize("market", list(Market))
def test_the_store_keeps_every_market(market: Market) -> None:
    from fleetkeeper.model import ReplicaRecord, ReplicaStatus
    from fleetkeeper.store.codec import replica_from_item, replica_item

    record = ReplicaRecord("web", "u" * 32, 1, 1, ReplicaStatus.PENDING, "t", "t", market=market)
    item = replica_item(record)
    assert item["market"] == market.value
    assert replica_from_item({**item, "PK": "SVC#web", "SK": "x"}).market is market


# --- isolations ----------------------------------------------------------------------------------


def test_the_process_driver_resolves_every_isolation() -> None:
    from fleetkeeper.local.process_driver import RESOLVED

    assert set(RESOLVED) == set(Isolation)


@pytest.mark.parametrize("isolation", list(Isolation))
def test_every_isolation_resolves_to_one_replicas_run_in(isolation: Isolation) -> None:
    from fleetkeeper.local.process_driver import _resolve_isolation

    resolved, note = _resolve_isolation(isolation.value)
    assert resolved in {Isolation.NETNS, Isolation.SHARED}
    assert note


def test_an_unknown_isolation_is_refused_listing_every_isolation() -> None:
    from fleetkeeper.local.process_driver import _resolve_isolation

    with pytest.raises(ValueError, match=r"'vm': use one of auto, netns, shared$") as caught:
        _resolve_isolation("vm")
    assert _listed_in_order(str(caught.value), values(Isolation))


def test_fleetkeeper_local_offers_every_isolation() -> None:
    from fleetkeeper.local.options import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert _option_choices(parser, option="--isolation") == values(Isolation)
    assert parser.parse_args([]).isolation == Isolation.AUTO


# --- readiness-probe options ---------------------------------------------------------------------

# A value of each option that is not its default, with `$TOKEN` in it where the option is substituted.
EXAMPLES: dict[str, Any] = {
    "path": "/health/$TOKEN",
    "initial_delay_seconds": 30,
    "timeout_seconds": 5,
    "headers": {"Authorization": "Bearer $TOKEN"},
    "post_data": {"model": "$TOKEN"},
    "consecutive_failure_threshold_timeout": 60,
}


def test_every_probe_field_is_classified_and_has_an_example() -> None:
    assert list(PROBE_OPTIONS) == list(ReadinessProbe.model_fields)
    assert list(EXAMPLES) == list(PROBE_OPTIONS)


@pytest.mark.parametrize("name", list(PROBE_OPTIONS))
def test_each_probe_option_is_substituted_as_classified(name: str) -> None:
    probe = ReadinessProbe.model_validate({"path": "/", name: EXAMPLES[name]})
    substituted = PROBE_OPTIONS[name].substituted
    assert probe.variables() == ({"TOKEN"} if substituted else set())
    resolved = probe.resolved({"TOKEN": "t0k3n"})
    assert ("t0k3n" in repr(getattr(resolved, name))) is substituted
    assert "$TOKEN" not in repr(resolved.model_dump())


@pytest.mark.parametrize("name", list(PROBE_OPTIONS))
def test_each_probe_option_gets_the_alb_check_it_is_classified_for(name: str) -> None:
    from fleetkeeper.reconciler.health_check import alb_check

    probe = ReadinessProbe.model_validate({"path": "/", name: EXAMPLES[name]})
    check = alb_check(probe, {"TOKEN": "t"} if name == "path" else {})
    assert check.fallback is PROBE_OPTIONS[name].unsendable_by_alb
    assert probe.unsendable_by_alb() == ([name] if PROBE_OPTIONS[name].unsendable_by_alb else [])


def test_every_probe_option_but_the_path_has_a_default() -> None:
    """A new option must have one: version items written before it existed have no value for it."""
    assert [name for name, field in ReadinessProbe.model_fields.items() if field.is_required()] == ["path"]


@pytest.mark.parametrize("name", [name for name in PROBE_OPTIONS if name != "path"])
def test_a_stored_spec_without_a_probe_option_reads_it_as_its_default(name: str) -> None:
    stored = parse_spec(hello_spec()).to_json_dict()
    stored["service"]["readiness_probe"].pop(name, None)
    spec = stored_spec(json.dumps(stored))
    default = ReadinessProbe.model_fields[name].get_default(call_default_factory=True)
    assert getattr(spec.service.readiness_probe, name) == default


def test_the_prober_sends_what_the_probe_requests() -> None:
    probe = ReadinessProbe(path="/v1/ready", post_data={"model": "m"}, headers={"X-Key": "k"})
    assert probe.request() == (
        "POST",
        {"X-Key": "k", "Content-Type": "application/json"},
        b'{"model": "m"}',
    )
    assert ReadinessProbe(path="/", headers={"content-type": "text/plain"}, post_data=[1]).request()[1] == {
        "content-type": "text/plain"
    }
    assert ReadinessProbe(path="/").request() == ("GET", {}, None)


# Every value a released fleetkeeper could have stored: the store decodes each into its enum (choices.py,
# "Removing or renaming a choice"). Add a new member's value here once it is released.
RELEASED = {
    LoadBalancingPolicy: ("least_load", "round_robin", "instance_aware_least_load"),
    UpdateMode: ("rolling", "blue_green"),
    Market: ("on-demand", "spot"),
}


@pytest.mark.parametrize("choice", list(RELEASED), ids=lambda choice: choice.__name__)
def test_no_stored_choice_loses_a_released_value(choice: type[StrEnum]) -> None:
    gone = [value for value in RELEASED[choice] if value not in values(choice)]
    assert gone == [], f"{choice.__name__} no longer has {gone}: items stored with them could not be read"
