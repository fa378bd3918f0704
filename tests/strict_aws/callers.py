"""Which of the stack's functions is making an AWS call: read off the Python stack at the call.

In AWS each function signs with its own role's credentials; in the suite every client signs with
the same fake keys, so the layer tells the caller the way a reader of the code would: by the
function whose code is running. Walking outward from the botocore call, the outermost frame of a
fleetkeeper module that belongs to one function decides (a handler calls the store, the store calls
botocore: the handler's function is the caller). Shared modules (fleetkeeper.store, fleetkeeper.aws,
the spec, the model) belong to no function: a call made only through them, or from a test's own
set-up, is the operator's (the test's) and is not evaluated.

Work handed to a thread pool (the reconciler's parallel reads) runs on a stack without the
handler: there the module of the function running in the pool decides, which is the same function.
A test can also say who is calling (`StrictAws.calling_as`), which wins over the stack.
"""

from __future__ import annotations

import sys

# (module, function) of each template function's handler: the exact entry points.
HANDLERS: dict[tuple[str, str], str] = {
    ("fleetkeeper.api.handler", "lambda_handler"): "ApiFunction",
    ("fleetkeeper.reconciler.handler", "dispatch_handler"): "DispatcherFunction",
    ("fleetkeeper.reconciler.handler", "lambda_handler"): "ReconcilerFunction",
    ("fleetkeeper.cleanup.handler", "lambda_handler"): "CleanupFunction",
    ("fleetkeeper.wake.handler", "lambda_handler"): "WakeFunction",
    ("fleetkeeper.uninstall.handler", "lambda_handler"): "UninstallFunction",
    ("fleetkeeper.deploy.zone_check", "lambda_handler"): "LoadBalancerZoneCheckFunction",
}

# Functions of shared modules that only one function calls (a test may call them directly).
OWNED_FUNCTIONS: dict[tuple[str, str], str] = {
    # The dispatcher's sweep of empty load balancer pools (reconciler/dispatcher.py, _retire_pools).
    ("fleetkeeper.reconciler.balancers.alb.pools", "retire_pools"): "DispatcherFunction",
    # The owners' identities are made and removed by the dispatcher (IdentityKeeper); the reconciler
    # only reads their records (ReplicaIdentities, the same module).
    ("fleetkeeper.replicas.identity", "ensure"): "DispatcherFunction",
    ("fleetkeeper.replicas.identity", "sweep"): "DispatcherFunction",
}

# Module prefixes only one function runs, most specific first. The dispatcher's modules (it lists
# services, queues shards, sweeps orphans and keeps the owners' identities) come before the
# reconciler package they live in.
MODULES: tuple[tuple[str, str], ...] = (
    ("fleetkeeper.reconciler.dispatcher", "DispatcherFunction"),
    ("fleetkeeper.reconciler.fanout", "DispatcherFunction"),
    ("fleetkeeper.reconciler", "ReconcilerFunction"),
    ("fleetkeeper.api", "ApiFunction"),
    ("fleetkeeper.cleanup", "CleanupFunction"),
    ("fleetkeeper.wake", "WakeFunction"),
    ("fleetkeeper.uninstall", "UninstallFunction"),
    ("fleetkeeper.deploy.zone_check", "LoadBalancerZoneCheckFunction"),
)


def _module_function(module: str) -> str | None:
    for prefix, function in MODULES:
        if module == prefix or module.startswith(prefix + "."):
            return function
    return None


def calling_function() -> str | None:
    """The logical id of the template function whose code makes the current call, or None.

    Only the frames between the call and the nearest test frame count: a test's hook or helper
    that runs inside a function's code (a concurrent writer injected into a cleanup, another worker
    in a race) makes its own calls, as the operator. Among them the innermost handler decides (a
    handler's code is that function's), else the outermost frame of a module one function owns.
    """
    frame = sys._getframe(1)
    # The layer's own frames (its hook, called by botocore) come first: the walk starts at botocore.
    while frame is not None and not frame.f_globals.get("__name__", "").startswith("botocore."):
        frame = frame.f_back  # type: ignore[assignment]
    handler: str | None = None
    outermost: str | None = None
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("tests.") or module == "tests":
            break
        if module.startswith("fleetkeeper."):
            entry = HANDLERS.get((module, frame.f_code.co_name))
            if entry is not None and handler is None:
                handler = entry
            owner = OWNED_FUNCTIONS.get((module, frame.f_code.co_name)) or _module_function(module)
            if owner is not None:
                outermost = owner
        frame = frame.f_back  # type: ignore[assignment]
    return handler or outermost
