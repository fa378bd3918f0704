"""The variables a replica's `setup` and `run` see beside its `envs`: SkyPilot's task variables, as
SkyPilot sets them for a one-node service replica, and fleetkeeper's own. Pure: derived from the
launch (service, incarnation, version, replica id) and the instance type launched, so a launch
retried after a crash renders byte-identical user data (its ClientToken must find the same request).

SkyPilot's names and meanings (docs/source/running-jobs/environment-variables.rst and
sky/skylet/constants.py of skypilot-org/skypilot; sky/serve sets SKYPILOT_SERVE_REPLICA_ID in a
replica task's envs):

- SKYPILOT_NODE_RANK / SKYPILOT_SETUP_NODE_RANK: the node's rank, 0 (a replica is one node);
- SKYPILOT_NUM_NODES: 1;
- SKYPILOT_NODE_IPS / SKYPILOT_SETUP_NODE_IPS: the nodes' IPs, one a line: the instance's own private
  IP, which only the instance knows (the ec2 user data reads it from IMDSv2 at boot; a local replica
  is 127.0.0.1);
- SKYPILOT_NUM_GPUS_PER_NODE / SKYPILOT_SETUP_NUM_GPUS_PER_NODE: the accelerators of the instance
  type, by fleetkeeper.spec.catalogue (SkyPilot's count of `accelerators: NAME:COUNT`, Neuron devices
  included); 0 for a CPU type or one the catalogue does not know;
- SKYPILOT_TASK_ID: a unique, stable id of the replica's task, shaped as SkyPilot's
  (`<prefix>-<unique>_<cluster>_<job>`): `fleetkeeper-<uid>_<service>-<replica id>_<version>`;
- SKYPILOT_SERVE_REPLICA_ID: the replica's id within the service counted from 1, as in SkyPilot
  (fleetkeeper's own ids count from 0: FLEETKEEPER_REPLICA_ID).

Not set: SKYPILOT_CLUSTER_INFO, SKYPILOT_USER and the managed-job variables (no such notions here).
fleetkeeper's own: FLEETKEEPER_SERVICE, FLEETKEEPER_VERSION, FLEETKEEPER_REPLICA_ID (and PORT, in
the envs' file as before). A spec may not set any of these names in `envs` or `secrets` (spec/service.py);
on an instance they are in a third EnvironmentFile, read after the envs' and the secrets', so a
spec stored before that rule cannot shadow them either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.spec import catalogue

if TYPE_CHECKING:
    from fleetkeeper.spec.service import ServiceSpec

NODE_RANK = "SKYPILOT_NODE_RANK"
SETUP_NODE_RANK = "SKYPILOT_SETUP_NODE_RANK"
NUM_NODES = "SKYPILOT_NUM_NODES"
NODE_IPS = "SKYPILOT_NODE_IPS"
SETUP_NODE_IPS = "SKYPILOT_SETUP_NODE_IPS"
NUM_GPUS_PER_NODE = "SKYPILOT_NUM_GPUS_PER_NODE"
SETUP_NUM_GPUS_PER_NODE = "SKYPILOT_SETUP_NUM_GPUS_PER_NODE"
TASK_ID = "SKYPILOT_TASK_ID"
SERVE_REPLICA_ID = "SKYPILOT_SERVE_REPLICA_ID"
SERVICE = "FLEETKEEPER_SERVICE"
VERSION = "FLEETKEEPER_VERSION"
REPLICA_ID = "FLEETKEEPER_REPLICA_ID"

# The variables whose value is the node's IP: known at boot only, on EC2.
NODE_IP_VARIABLES = (NODE_IPS, SETUP_NODE_IPS)
NAMES = frozenset(
    {
        NODE_RANK,
        SETUP_NODE_RANK,
        NUM_NODES,
        *NODE_IP_VARIABLES,
        NUM_GPUS_PER_NODE,
        SETUP_NUM_GPUS_PER_NODE,
        TASK_ID,
        SERVE_REPLICA_ID,
        SERVICE,
        VERSION,
        REPLICA_ID,
    }
)


def accelerators_of(instance_type: str | None) -> int:
    """The accelerators (GPUs or Neuron devices) of an instance type; 0 when it has none or the
    catalogue does not know it."""
    known = catalogue.BY_NAME.get(instance_type) if instance_type is not None else None
    return known.accelerator_count if known is not None else 0


def first_instance_type(spec: ServiceSpec) -> str | None:
    """The type a replica of `spec` is launched as first: its first candidate (None: the stack's
    default). An embedded replica takes its accelerators from it, as an EC2 one from its instance."""
    candidates = spec.resources.placement.instance_types
    return candidates[0] if candidates else None


def variables(
    service: str, uid: str, version: int, replica_id: int, instance_type: str | None, node_ip: str | None = None
) -> dict[str, str]:
    """The task variables of one replica launched as `instance_type`; the node-IP ones only when the
    IP is given (on EC2 the instance adds them at boot)."""
    gpus = str(accelerators_of(instance_type))
    values = {
        NODE_RANK: "0",
        SETUP_NODE_RANK: "0",
        NUM_NODES: "1",
        NUM_GPUS_PER_NODE: gpus,
        SETUP_NUM_GPUS_PER_NODE: gpus,
        TASK_ID: f"fleetkeeper-{uid}_{service}-{replica_id}_{version}",
        SERVE_REPLICA_ID: str(replica_id + 1),
        SERVICE: service,
        VERSION: str(version),
        REPLICA_ID: str(replica_id),
    }
    if node_ip is not None:
        values.update(dict.fromkeys(NODE_IP_VARIABLES, node_ip))
    return values
