"""A spec file that is not valid YAML is reported at the line where the error starts (PyYAML's
context mark), with PyYAML's own context and problem, and the line itself (fleetkeeper.spec.yaml_errors).

The CLI is the one place a spec is YAML text (the api takes JSON): `fleetkeeper up`/`update` read
the file with cli.spec_input.load_spec; no API is needed to see the error (exit code 2 before any request).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import pytest
import yaml

from fleetkeeper.cli.http import UsageError
from fleetkeeper.cli.main import run
from fleetkeeper.cli.spec_input import load_spec
from fleetkeeper.spec import yaml_errors

if TYPE_CHECKING:
    from pathlib import Path

# The case: a quote opened on line 8 and never closed. PyYAML's problem mark is the end of
# the file (line 11); its context mark, where the quoted scalar starts, is line 8, column 13.
UNTERMINATED = """\
name: web
service:
  readiness_probe: /health
  replicas: 2
resources:
  cpus: 2
envs:
  GREETING: "hello
run: |
  python3 -m http.server $PORT
"""


def test_an_unterminated_quote_is_reported_where_it_opens_with_pyyamls_words(tmp_path: Path) -> None:
    path = tmp_path / "service.yaml"
    path.write_text(UNTERMINATED)
    with pytest.raises(UsageError) as caught:
        load_spec(path)
    assert str(caught.value) == (
        f"{path}, line 8, column 13: not valid YAML: while scanning a quoted scalar: found unexpected end of "
        "stream (at the end of the file); the quote opened here is never closed\n"
        '  8 |   GREETING: "hello\n'
        "    |             ^"
    )


def test_the_cli_exits_2_with_it_before_any_request(tmp_path: Path) -> None:
    path = tmp_path / "service.yaml"
    path.write_text(UNTERMINATED)
    out, err = io.StringIO(), io.StringIO()
    code = run(["up", str(path), "--api-url", "http://127.0.0.1:9", "--local"], out=out, err=err)
    assert code == 2
    assert err.getvalue().startswith(f"fleetkeeper: {path}, line 8, column 13: not valid YAML: while scanning")
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # An unclosed flow mapping: starts at its `{` (line 2), PyYAML gives up on line 3.
        (
            "resources:\n  accelerators: {L4:1, A10G:1\nrun: x\n",
            "line 2, column 17: not valid YAML: while parsing a flow mapping: expected ',' or '}', but got ':' "
            "(at line 3, column 4)\n  2 |   accelerators: {L4:1, A10G:1\n    |                 ^",
        ),
        # No context: the problem's own mark is where it starts.
        (
            "service:\n  replicas: 2\n   ports: 8080\nrun: x\n",
            "line 3, column 9: not valid YAML: mapping values are not allowed here\n  3 |    ports: 8080\n"
            "    |         ^",
        ),
        # A tab: the context has no mark of its own; the problem's mark is the line.
        (
            "service:\n\treplicas: 2\nrun: x\n",
            "line 2, column 1: not valid YAML: while scanning for the next token: found character '\\t' that "
            "cannot start any token\n  2 |  replicas: 2\n    | ^",
        ),
        # An unclosed sequence at the end of the file: the mark is past the last line (no excerpt).
        (
            "service: [\n",
            "line 2, column 1: not valid YAML: while parsing a flow node: expected the node content, but found "
            "'<stream end>'",
        ),
    ],
)
def test_each_error_starts_where_pyyaml_says_it_does(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        load_spec(path)
    assert str(caught.value) == f"{path}, {expected}"


def test_an_error_without_marks_keeps_its_text() -> None:
    assert yaml_errors.describe(yaml.YAMLError("bad stream"), "s.yaml", "") == "s.yaml: not valid YAML: bad stream"
