"""The embedded mode's load balancer against a direct connection to the replica, in one run.

A replica (a keep-alive HTTP/1.1 server on 127.0.0.1 answering 200 with a small body, in a process
of its own) is called N times over one keep-alive connection, directly and through the local load
balancer (the one `fleetkeeper local` runs, in a process of its own as there; one target
registered): p50/p99 latency of each and what the balancer adds. Then C client threads for S
seconds each way: requests per second. Three processes, as in embedded mode (client, control
plane, replica), so none of them shares the others' interpreter lock.

    .venv/bin/python bench/endpoint.py [--requests 3000] [--clients 8] [--seconds 3]

Goal (issue 12): at most 1 ms added at p50 on 2 cores. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functions"))

from fleetkeeper.local.balancer import LocalBalancer
from fleetkeeper.model import EndpointConfig
from fleetkeeper.reconciler.balancer import Target

BODY = b'{"ok": true, "text": "hello from the replica"}\n'


class Replica(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Without it Nagle's algorithm and delayed ACKs add ~40 ms to each keep-alive answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: Any) -> None:
        return None


def connect(port: int) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.connect()
    assert connection.sock is not None
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def latencies(port: int, count: int) -> list[float]:
    connection = connect(port)
    took: list[float] = []
    for _ in range(count + 100):
        started = time.perf_counter()
        connection.request("GET", "/v1/completions?x=1")
        answer = connection.getresponse()
        answer.read()
        took.append(time.perf_counter() - started)
        if answer.status != 200:
            raise SystemExit(f"unexpected status {answer.status}")
    connection.close()
    return took[100:]  # the first ones warm up connections and caches


def throughput(port: int, clients: int, seconds: float) -> float:
    done = [0] * clients
    stop = time.perf_counter() + seconds

    def client(number: int) -> None:
        connection = connect(port)
        while time.perf_counter() < stop:
            connection.request("GET", "/")
            connection.getresponse().read()
            done[number] += 1
        connection.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / seconds


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def serve_replica(ready: Any) -> None:
    replica = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    replica.daemon_threads = True
    ready.send(int(replica.server_address[1]))
    replica.serve_forever()


def serve_balancer(replica_port: int, ready: Any, stop: Any) -> None:
    balancer = LocalBalancer(metrics_interval=3600)
    endpoint = balancer.ensure("bench", "0123456789abcdef", EndpointConfig(8080, "least_load", 30, "/health"), None)
    balancer.register(endpoint, [Target(0, "local-0", replica_port, f"http://127.0.0.1:{replica_port}")])
    ready.send(int(endpoint.route))
    stop.wait()
    balancer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    replica = context.Process(target=serve_replica, args=(send,), daemon=True)
    replica.start()
    replica_port = int(receive.recv())
    stop = context.Event()
    balancer = context.Process(target=serve_balancer, args=(replica_port, send, stop), daemon=True)
    balancer.start()
    balancer_port = int(receive.recv())
    try:
        direct = latencies(replica_port, args.requests)
        through = latencies(balancer_port, args.requests)
        p50d, p99d = quantile(direct, 0.5), quantile(direct, 0.99)
        p50b, p99b = quantile(through, 0.5), quantile(through, 0.99)
        print(f"sequential, one keep-alive connection, {args.requests} requests each (ms):")
        print(
            f"  direct          p50 {p50d * 1e3:6.3f}  p99 {p99d * 1e3:6.3f}  mean {statistics.mean(direct) * 1e3:6.3f}"
        )
        mean_through = statistics.mean(through) * 1e3
        print(f"  load balancer   p50 {p50b * 1e3:6.3f}  p99 {p99b * 1e3:6.3f}  mean {mean_through:6.3f}")
        print(f"  added           p50 {(p50b - p50d) * 1e3:6.3f}  p99 {(p99b - p99d) * 1e3:6.3f}")
        rate_direct = throughput(replica_port, args.clients, args.seconds)
        rate_through = throughput(balancer_port, args.clients, args.seconds)
        print(f"{args.clients} concurrent clients, {args.seconds:g} s each (requests/s):")
        print(f"  direct          {rate_direct:8.0f}")
        print(f"  load balancer   {rate_through:8.0f}")
        goal = "met" if (p50b - p50d) <= 0.001 else "NOT met"
        print(f"goal (<= 1 ms added at p50): {goal}")
    finally:
        stop.set()
        balancer.join(10)
        replica.terminate()
        replica.join(10)


if __name__ == "__main__":
    main()
