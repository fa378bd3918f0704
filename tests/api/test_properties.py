"""Property: whatever a client sends, the api answers 2xx or 4xx with the error shape, never a 5xx.

Settings come from the hypothesis profiles in conftest.py: derandomized in `make test`, a longer
random search in `make fuzz`. Every input a search has found is kept below as an @example.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)

spec_keys = st.sampled_from(
    ["service", "resources", "run", "setup", "envs", "update", "name", "file_mounts", "workdir", "num_nodes"]
)
# Specs close to valid ones, so the fuzzer gets past the first field and into nested validation.
near_specs = st.builds(
    lambda base, key, value, drop: {k: v for k, v in {**base, key: value}.items() if k != drop},
    st.just(hello_spec()),
    spec_keys,
    json_values,
    st.one_of(st.none(), spec_keys),
)
names = st.one_of(st.sampled_from(["web", "api", "x"]), st.text(min_size=1, max_size=70))
bodies = st.one_of(
    st.none(),
    json_values,
    st.fixed_dictionaries({"name": names, "spec": st.one_of(near_specs, json_values)}),
    st.fixed_dictionaries({"spec": near_specs}, optional={"mode": json_values, "extra": json_values}),
    st.fixed_dictionaries({}, optional={"version": json_values}),
)
paths = st.one_of(
    st.sampled_from(
        [
            "/v1/services",
            "/v1/services/web",
            "/v1/services/web/versions",
            "/v1/services/web/rollback",
            "/v1/openapi.json",
        ]
    ),
    names.map(lambda n: f"/v1/services/{n}"),
    names.map(lambda n: f"/v1/services/{n}/rollback"),
    st.tuples(st.integers(-5, 500), st.text(max_size=30)).map(lambda t: f"/v1/services?limit={t[0]}&next_token={t[1]}"),
    st.text(max_size=40).map(lambda t: "/" + t),
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "If-Match": st.text(max_size=12),
        "Idempotency-Key": st.text(max_size=300),
        "Content-Type": st.one_of(
            st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-8", ""]),
            st.text(max_size=30),
        ),
    },
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"])


def check(response: Any) -> None:
    assert 200 <= response.status < 500, (response.status, response.body)
    if response.status >= 400:
        assert set(response.body) == {"error"}
        assert set(response.body["error"]) == {"code", "message", "details"}
        assert response.body["error"]["message"]
        assert "Traceback" not in json.dumps(response.body)


@given(method=methods, path=paths, body=bodies, header_map=headers)
# Found by the search: a body sent as text/plain was a 500 (now a 415 that names the header to send).
@example(
    method="POST",
    path="/v1/services",
    body={"name": "web", "spec": hello_spec()},
    header_map={"Content-Type": "text/plain"},
)
# Found by the search: "¹".isdigit() is true, int("¹") raises: If-Match "¹" was a 500 (now a 400).
@example(method="POST", path="/v1/services/web/rollback", body=None, header_map={"If-Match": "¹"})
@example(method="PUT", path="/v1/services/web", body={"spec": hello_spec()}, header_map={"If-Match": "٣"})
def test_no_request_yields_a_5xx(
    api: HandlerClient, method: str, path: str, body: Any, header_map: dict[str, str]
) -> None:
    # Keep one service around so update/rollback/delete paths reach the store, not only 404s.
    if api.get("/v1/services/web").status == 404:
        api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    check(api.call(method, path, body, headers=header_map))


@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200)), path=paths)
# Found by the search: a body that is not UTF-8 was a 500 (now a 400).
@example(raw=b"\xff\xfe", path="/v1/services")
def test_no_raw_body_yields_a_5xx(api: HandlerClient, raw: bytes | str, path: str) -> None:
    check(api.call("POST", path, raw=raw))
    check(api.call("PUT", path, raw=raw))
