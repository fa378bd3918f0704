"""The autoscale example's load command sends what its comment says (issue 36: a `curl; sleep 0.1`
loop promised ~10 req/s and reached 5 to 7). The rate itself is a figure of bench/example_load.py;
here: the command runs as written, against a real HTTP server on 127.0.0.1, one request per URL of
its range, paced by curl (`--rate`)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.examples.load_command import bounded, hello_server, load_command


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_load_command_sends_one_request_per_url_at_the_rate_it_names() -> None:
    command, rate = load_command()
    assert rate == 10 and "--rate 10/s" in command  # the comment's rate is the one curl is given
    with hello_server() as (endpoint, paths):
        done = subprocess.run(
            ["sh", "-c", bounded(command, 12)], env={"E": endpoint, "PATH": os.environ["PATH"]}, timeout=60, check=False
        )
    assert done.returncode == 0
    assert paths == [f"/?n={n}" for n in range(1, 13)]
