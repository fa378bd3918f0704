"""The codec's number decoding: the integer shortcut gives what the Decimal rule gives."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper.store.codec import from_raw


def _by_the_rule(text: str) -> int | Decimal:
    number = Decimal(text)
    return int(number) if number == number.to_integral_value() else number


@given(
    st.one_of(
        st.integers(min_value=-(10**38), max_value=10**38).map(str),
        st.integers(min_value=0, max_value=10**6).map(lambda n: f"{n:08d}"),  # leading zeros
        st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str),
        st.sampled_from(["1.0", "1e3", "-0", "0.000", "1E-2"]),
    )
)
def test_a_number_decodes_as_the_decimal_rule_decodes_it(text: str) -> None:
    got = from_raw({"n": {"N": text}})["n"]
    want = _by_the_rule(text)
    assert (got, type(got)) == (want, type(want))


@pytest.mark.parametrize(("raw", "error"), [({}, ValueError), ({"B": "AA=="}, TypeError)])
def test_an_attribute_value_it_cannot_decode_is_refused(raw: dict[str, str], error: type[Exception]) -> None:
    with pytest.raises(error):
        from_raw({"a": raw})


@pytest.mark.parametrize("text", ["²", "١٢", "", "1_000", " 7"])
def test_an_odd_number_text_decodes_or_fails_as_the_decimal_rule_does(text: str) -> None:
    try:
        want: object = _by_the_rule(text)
    except Exception as exc:  # the rule's own refusal is what to expect
        with pytest.raises(type(exc)):
            from_raw({"n": {"N": text}})
    else:
        assert from_raw({"n": {"N": text}})["n"] == want
