"""The alb load balancer: the stack's Application Load Balancers, shared by its services.

The template's ALB is pool 0; once it is full the adapter makes more like it, each a pool of
services, and places each new service on the lowest pool with room, never moving it while it has
one (docs/architecture/load-balancer-pools.md). One module per concern:

    balancer.py        AlbBalancer: the LoadBalancer protocol, and where a new endpoint is placed
    pools.py           the pools: found, made like the template's ALB, counted full, retired
    target_groups.py   a target group per incarnation: algorithm, health check, registrations
    routes.py          a service's route on its pool: host rules and priorities, or a listener and port
    dns.py             NAME.<domain> for the services past pool 0 (with a hosted zone)
    elb.py             what they share: the settings, ELB's reads and errors, forward actions

`AlbBalancer(settings.alb)` keeps the settings (fleetkeeper.settings.AlbSettings) it is given.
"""

from fleetkeeper.reconciler.balancers.alb.balancer import AlbBalancer
from fleetkeeper.reconciler.balancers.alb.elb import QUOTA_MESSAGES
from fleetkeeper.reconciler.balancers.alb.pools import (
    EMPTY_SINCE_TAG,
    MAX_POOLS,
    RETIRE_AFTER_SECONDS,
    AlbPool,
    PoolFull,
    PoolQuotas,
)
from fleetkeeper.reconciler.balancers.alb.routes import NoListenerPort
from fleetkeeper.reconciler.balancers.alb.target_groups import ALGORITHMS

__all__ = [
    "ALGORITHMS",
    "EMPTY_SINCE_TAG",
    "MAX_POOLS",
    "QUOTA_MESSAGES",
    "RETIRE_AFTER_SECONDS",
    "AlbBalancer",
    "AlbPool",
    "NoListenerPort",
    "PoolFull",
    "PoolQuotas",
]
