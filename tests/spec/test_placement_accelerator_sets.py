"""SkyPilot's accelerator sets, in every form its docs show, read as SkyPilot reads them.

Each case is YAML text as a user writes it, parsed by PyYAML (as `fleetkeeper up` does), and pins the
(name, count) alternatives fleetkeeper takes from it, next to what SkyPilot makes of the same input.
SkyPilot's behaviour is read from its source (sky/resources.py at skypilot-org/skypilot):

- `Resources.from_yaml_config`: a string is a set of one; a mapping becomes the set
  `{f"{k}:{v}" if v is not None else k}`; a list stays a list (an order of preference: "List: ask
  SkyPilot to try each one in order", docs/source/.../accelerators); `any_of` entries are a set of
  Resources, `ordered` entries a list; several accelerators with `ordered`, a list of several with
  `any_of`, and `any_of` with `ordered` are refused.
- `Resources._set_accelerators`: `NAME` is one, `NAME:COUNT` is float(COUNT), kept whole when whole.
- `accelerator_registry.canonicalize_accelerator_name`: names are matched case-insensitively.

Where fleetkeeper differs it says so in the case's comment (it is never stricter in what it takes).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec import catalogue
from fleetkeeper.spec.placement import accelerators_in_order, parse_accelerators
from fleetkeeper.spec.service import parse_spec, stored_spec

BASE: dict[str, Any] = {"service": {"readiness_probe": "/health"}, "run": "serve"}
SMALLEST_L4 = ("g6.xlarge", "g6.2xlarge", "g6.4xlarge", "g6.8xlarge", "g6.16xlarge")
SMALLEST_A10G = ("g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.16xlarge")
# A set: the smallest of either first (SkyPilot's optimizer takes the cheapest of a set).
L4_OR_A10G = tuple(t for pair in zip(SMALLEST_L4, SMALLEST_A10G, strict=True) for t in pair)
AWS_HAS = (
    "AWS has T4 (1 or 4), A10G (1, 4 or 8), L4 (1, 4 or 8), L40S (1, 4 or 8), V100 (8), A100 (8), A100-80GB (8), "
    "H100 (8), Inferentia2 (1, 6 or 12) and Trainium (1 or 16)"
)


def resources_of(text: str) -> dict[str, Any]:
    """The `resources:` section a YAML snippet gives, as PyYAML reads it."""
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return dict(loaded)


def placed(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    placement = parse_spec({**BASE, "resources": resources_of(text)}).resources.placement
    return placement.instance_types, placement.notes


def refusal(text: str) -> tuple[list[str], str]:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec({**BASE, "resources": resources_of(text)})
    return [d["field"] for d in caught.value.details], str(caught.value)


# (YAML, what PyYAML reads, the alternatives in order, tried in turn?, what SkyPilot makes of it)
FORMS: list[tuple[str, Any, list[tuple[str, int]], bool, str]] = [
    # from_yaml_config: a dict -> {"L4:1", "A10G:1", "A100:1"} (the keys, the values being null);
    # _set_accelerators splits each at ":". A set: SkyPilot's cheapest of them.
    (
        "accelerators: {L4:1, A10G:1, A100:1}",
        {"L4:1": None, "A10G:1": None, "A100:1": None},
        [("L4", 1), ("A10G", 1), ("A100", 1)],
        False,
        "set {L4:1, A10G:1, A100:1}",
    ),
    # from_yaml_config: f"{k}:{v}" -> {"L4:1", "A10G:1"}.
    ("accelerators: {L4: 1, A10G: 1}", {"L4": 1, "A10G": 1}, [("L4", 1), ("A10G", 1)], False, "set {L4:1, A10G:1}"),
    # from_yaml_config: a null value -> the key alone, {"L4", "A10G"}; _set_accelerators: one each.
    ("accelerators: {L4, A10G}", {"L4": None, "A10G": None}, [("L4", 1), ("A10G", 1)], False, "set {L4:1, A10G:1}"),
    # The block mapping is the same mapping.
    (
        "accelerators:\n  L4: 1\n  A10G: 2\n",
        {"L4": 1, "A10G": 2},
        [("L4", 1), ("A10G", 2)],
        False,
        "set {L4:1, A10G:2}",
    ),
    (
        "accelerators:\n  L4:1:\n  A10G:1:\n",
        {"L4:1": None, "A10G:1": None},
        [("L4", 1), ("A10G", 1)],
        False,
        "set {L4:1, A10G:1}",
    ),
    # from_yaml_config: a list stays a list: tried in the order written.
    ("accelerators: [L4:1, A10G:1]", ["L4:1", "A10G:1"], [("L4", 1), ("A10G", 1)], True, "list [L4:1, A10G:1]"),
    ("accelerators: [L4, A10G]", ["L4", "A10G"], [("L4", 1), ("A10G", 1)], True, "list [L4:1, A10G:1]"),
    ("accelerators:\n  - L4:1\n  - A10G:1\n", ["L4:1", "A10G:1"], [("L4", 1), ("A10G", 1)], True, "list"),
    # SkyPilot's schema takes only strings in the list: `[L4: 1]` (YAML's one-entry mappings) is refused
    # there; fleetkeeper reads it as the NAME: COUNT it plainly means.
    (
        "accelerators: [L4: 1, A10G: 2]",
        [{"L4": 1}, {"A10G": 2}],
        [("L4", 1), ("A10G", 2)],
        True,
        "refused by its schema (array items must be strings)",
    ),
    # from_yaml_config: a string -> {"L4:1"}: one accelerator.
    ("accelerators: L4:1", "L4:1", [("L4", 1)], False, "set {L4:1}"),
    ("accelerators: L4", "L4", [("L4", 1)], False, "set {L4:1}"),
    # _set_accelerators: float("1.0") is whole -> 1.
    ("accelerators: L4:1.0", "L4:1.0", [("L4", 1)], False, "set {L4:1}"),
    # canonicalize_accelerator_name: case-insensitive, the catalogue's spelling; the set dedupes.
    ("accelerators: {l4, a10g, L4}", {"l4": None, "a10g": None, "L4": None}, [("L4", 1), ("A10G", 1)], False, "set"),
    # A list of one is no order: SkyPilot's list of one Resources.
    ("accelerators: [L4:1]", ["L4:1"], [("L4", 1)], False, "list [L4:1]"),
]


@pytest.mark.parametrize(("text", "yaml_reads", "alternatives", "in_turn", "skypilot"), FORMS)
def test_every_form_skypilot_documents_gives_the_same_alternatives(
    text: str, yaml_reads: Any, alternatives: list[tuple[str, int]], in_turn: bool, skypilot: str
) -> None:
    value = resources_of(text)["accelerators"]
    assert value == yaml_reads  # what YAML itself makes of the spelling
    assert parse_accelerators(value) == alternatives, skypilot
    assert accelerators_in_order(value) is in_turn


@pytest.mark.parametrize(
    ("text", "types"),
    [
        # A set (any form): the smallest of any first; A100:1 is not on AWS and is dropped below.
        ("accelerators: {L4:1, A10G:1}", L4_OR_A10G),
        ("accelerators: {L4: 1, A10G: 1}", L4_OR_A10G),
        ("accelerators: {L4, A10G}", L4_OR_A10G),
        ("accelerators:\n  L4:\n  A10G:\n", L4_OR_A10G),
        # A list: every L4 candidate before any A10G one, as SkyPilot tries them in turn.
        ("accelerators: [L4:1, A10G:1]", SMALLEST_L4 + SMALLEST_A10G),
        ("accelerators: [A10G, L4]", SMALLEST_A10G + SMALLEST_L4),
        ("accelerators: L4:1", SMALLEST_L4),
    ],
)
def test_each_form_becomes_its_candidates(text: str, types: tuple[str, ...]) -> None:
    assert placed(text) == (types, ())


def test_skypilots_llm_set_keeps_what_aws_has_and_notes_the_rest() -> None:
    # SkyPilot's LLM serving examples (llm/vllm/service.yaml): names AWS has no instance type for are
    # dropped, each with a note `fleetkeeper status` shows; the spec is accepted on what is left.
    types, notes = placed("accelerators: {L4:1, A10G:1, A10:1, A100:1, A100-80GB:1}")
    assert types == L4_OR_A10G
    assert notes == (
        "dropped: no AWS instance type has A10",  # A10G is in the set too: A10 is not its typo
        "dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1",
        "dropped: no AWS instance type has 1 A100-80GB; p4de.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1",
    )


def test_a_set_none_of_which_aws_has_is_refused_naming_the_field_and_the_alternatives() -> None:
    fields, text = refusal("accelerators: {A10:1, A40:1, A100:1}")
    assert fields == ["spec.resources.accelerators"]
    assert text == (
        "invalid service spec: spec.resources.accelerators: no AWS instance type has A10 (did you mean A10G?); "
        "no AWS instance type has A40; no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use "
        f"A10G:1, L4:1 or L40S:1; {AWS_HAS}"
    )


def test_a_list_is_tried_in_turn_and_what_aws_lacks_is_dropped_in_place() -> None:
    types, notes = placed("accelerators: [A100:1, L4:1, A10G:1]")
    assert types == SMALLEST_L4 + SMALLEST_A10G
    assert notes == (
        "dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1",
    )


# --- inside any_of and ordered ---------------------------------------------------------------------


def test_a_set_inside_any_of_entries_is_a_union_of_sets() -> None:
    # from_yaml_config's _override_resources expands each entry (its accelerators over the top's); the
    # entries are a set. SkyPilot's schema takes one accelerator in an entry; fleetkeeper takes a set.
    types, notes = placed("any_of:\n  - accelerators: {L4:1, A100:1}\n    cpus: 8\n  - accelerators: A10G:1\n")
    assert notes == (
        "dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1",
    )
    assert types == ("g5.xlarge", "g6.2xlarge", *SMALLEST_A10G[1:])


def test_a_top_level_set_applies_to_every_any_of_entry() -> None:
    # from_yaml_config allows a set beside any_of: each entry gets each accelerator.
    types, _ = placed("accelerators: {L4, A10G}\nany_of:\n  - cpus: 8\n  - cpus: 16\n")
    assert types == ("g6.2xlarge", "g5.2xlarge", "g6.4xlarge", "g5.4xlarge")


def test_ordered_entries_are_tried_in_turn_each_set_smallest_first() -> None:
    # SkyPilot's `ordered`: a list of Resources, tried in order. An entry's own set is taken at its
    # turn, smallest first (SkyPilot's schema takes one accelerator in an entry).
    types, notes = placed(
        "ordered:\n"
        "  - accelerators: L40S:1\n"
        "  - accelerators: {L4:1, A10G:1}\n"
        "    cpus: 8\n"
        "  - instance_type: g4dn.xlarge\n"
    )
    assert notes == ()
    assert types == (
        "g6e.xlarge",
        "g6e.2xlarge",
        "g6e.4xlarge",
        "g6e.8xlarge",
        "g6e.16xlarge",
        "g6.2xlarge",
        "g5.2xlarge",
        "g4dn.xlarge",
    )


def test_an_ordered_entry_may_hold_a_list_tried_in_turn_too() -> None:
    types, _ = placed("ordered:\n  - accelerators: [A10G:1, L4:1]\n    cpus: 4\n  - accelerators: T4:1\n    cpus: 4\n")
    assert types == ("g5.xlarge", "g6.xlarge", "g4dn.xlarge")


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        # from_yaml_config: 'Cannot specify both "any_of" and "ordered" in resources.'
        ("any_of: [{cpus: 2}]\nordered: [{cpus: 4}]", "spec.resources.ordered", "give either `any_of`"),
        # from_yaml_config: 'Cannot specify multiple "accelerators" with "ordered" in resources.'
        ("accelerators: {L4, A10G}\nordered: [{cpus: 4}]", "spec.resources.accelerators", "own `ordered` entry"),
        ("accelerators: [L4, A10G]\nordered: [{cpus: 4}]", "spec.resources.accelerators", "own `ordered` entry"),
        # from_yaml_config: 'Cannot specify multiple "accelerators" with prefered order (i.e., list of
        # accelerators) with "any_of" in resources.'
        ("accelerators: [L4, A10G]\nany_of: [{cpus: 4}]", "spec.resources.accelerators", "write them as a set"),
        ("any_of: [{cpus: 4}, {accelerators: [L4, A10G]}]", "spec.resources.any_of[1].accelerators", "as a set"),
    ],
)
def test_skypilots_refusals_between_sets_lists_any_of_and_ordered(text: str, field: str, words: str) -> None:
    fields, message = refusal(text)
    assert fields == [field], message
    assert words in message, message


# --- what no form means ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # _set_accelerators keeps 0.5 (GPU sharing on Kubernetes); no AWS instance type has half a GPU.
        ("accelerators: {A10G:0.5}", "0.5 is a fraction of an accelerator"),
        ("accelerators: A10G:0.5", "0.5 is a fraction of an accelerator"),
        # SkyPilot would make "L4:1:2" and fail its split.
        ("accelerators: {L4:1: 2}", "gives the count twice; write L4:1 or L4: 2"),
        # SkyPilot: 'should be <name> or <name>:<cnt>'; the commas say what was meant.
        ("accelerators: L4:1, A10G:1", "write a set, {L4:1, A10G:1}, or a list in order of preference, [L4:1, A10G:1]"),
        # SkyPilot crashes on an empty mapping (list(accelerators.items())[0]).
        ("accelerators: {}", "give at least one accelerator"),
        ("accelerators: []", "give at least one accelerator"),
        ("accelerators: {L4: 0}", "from 1 to 64"),
        ("accelerators: {L4: true}", "whole number from 1 to 64"),
        ("accelerators: [[L4]]", "each item of an accelerators list"),
        ("accelerators: {'L 4': 1}", "is not an accelerator name"),
    ],
)
def test_malformed_sets_are_refused_naming_the_field(text: str, words: str) -> None:
    fields, message = refusal(text)
    assert fields == ["spec.resources.accelerators"], message
    assert words in message, message


@pytest.mark.parametrize(
    "text",
    [
        "accelerators: {L4:1, A10G:1, A100:1}",
        "accelerators: [L4, A10G]",
        "accelerators: [L4: 1, A10G: 2]",
        "accelerators: {L4: 1.0, A10G: null}",
        "ordered:\n  - accelerators: {L4, A10G}\n  - accelerators: T4:1\n",
    ],
)
def test_a_stored_spec_keeps_the_set_as_written_and_places_it_again(text: str) -> None:
    spec = parse_spec({**BASE, "resources": resources_of(text)})
    again = stored_spec(spec.model_dump_json())
    assert again.to_json_dict()["resources"] == {"use_spot": False, **resources_of(text)}
    assert again.resources.placement == spec.resources.placement


def test_every_accelerator_aws_has_is_in_the_refusals_list() -> None:
    named = {a.name for a in catalogue.ACCELERATORS if any(t.accelerator == a.name for t in catalogue.CATALOGUE)}
    assert all(f"{name} (" in AWS_HAS for name in named)
