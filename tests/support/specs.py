"""Service specs for tests."""

from __future__ import annotations

from typing import Any


def hello_spec(**overrides: Any) -> dict[str, Any]:
    """A small valid spec; keyword arguments replace top-level sections."""
    spec: dict[str, Any] = {
        "service": {"readiness_probe": "/health", "replicas": 2, "ports": 8080},
        "resources": {"instance_type": "t3.micro"},
        "run": "python3 -m http.server $PORT",
    }
    spec.update(overrides)
    return spec
