"""The rate examples/autoscale/service.yaml's load command reaches, against a local HTTP server.

Runs the command from the example's comment (its URL range cut to --requests) against a threaded
HTTP server on 127.0.0.1 that answers as the example's app does, and prints the requests a second it
reached next to the rate the comment promises.

    .venv/bin/python bench/example_load.py [--requests 100]
"""

from __future__ import annotations

import argparse
import http.server
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.examples.load_command import bounded, load_command


class _Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = 0

    def do_GET(self) -> None:
        _Hello.served += 1
        body = b"hello, autoscaled world\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    command, promised = load_command()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    subprocess.run(
        ["sh", "-c", bounded(command, args.requests)], env={"E": endpoint, "PATH": "/usr/bin:/bin"}, check=True
    )
    elapsed = time.monotonic() - started
    server.shutdown()
    print(f"load command: {command}")
    rate = _Hello.served / elapsed
    print(f"requests: {_Hello.served} in {elapsed:.1f} s = {rate:.1f} req/s (the example promises {promised})")


if __name__ == "__main__":
    main()
