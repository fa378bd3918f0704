"""Imported first by the benches that drive the simulation's world in-process: the repository on the
path (functions/ and the tests' helpers), moto's fake credentials and region, and replicas' probe
addresses on 127.0.0.1 (never moto's invented 10.x ones). No network: moto answers in-process."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("AWS_REGION", "us-east-1")
os.environ["FLEETKEEPER_REPLICA_HOST"] = "127.0.0.1"
