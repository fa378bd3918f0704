"""Service specs for tests."""

from __future__ import annotations

from typing import Any


def hello_spec(replicas: int = 2, **overrides: Any) -> dict[str, Any]:
    """A small valid spec of `replicas` replicas; keyword arguments replace top-level sections."""
    spec: dict[str, Any] = {
        "service": {"readiness_probe": "/health", "replicas": replicas, "ports": 8080},
        "resources": {"instance_type": "t3.micro"},
        "run": "python3 -m http.server $PORT",
    }
    spec.update(overrides)
    return spec
