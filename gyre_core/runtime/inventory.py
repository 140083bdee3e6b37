"""The GPU inventory as Ray sees it: one record per node that ever joined the cluster.

``read_inventory`` asks the cluster (``ray.nodes()``); the platform turns the records into
its Node and Gpu rows (``gyre_web.cluster.services.sync_inventory``), so a node that left
the cluster shows as gone on the dashboard. A node's GPUs are its ``GPU`` resource on a GPU
cluster, else its ``gpu_unit`` custom resource (what a CPU-only cluster advertises).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import ray

from gyre_core.runtime.ray_backend import RESOURCE


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node_id: str  # Ray's hex node id (changes when the node's raylet restarts)
    name: str  # the hostname, or hostname/<id prefix> when several nodes share a host
    hostname: str
    address: str  # ip:port of the node's raylet
    alive: bool
    head: bool
    gpus: int  # the GPU resource (0 on a CPU node)
    gpu_units: int  # the gpu_unit custom resource
    accelerator: str  # Ray's accelerator_type label, or "" when it reports none

    @property
    def devices(self) -> int:
        """How many GPU rows this node has: real GPUs, else gpu_unit slots."""
        return self.gpus or self.gpu_units

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def records_from_nodes(nodes: list[dict[str, Any]]) -> list[NodeRecord]:
    """Records from the dicts ``ray.nodes()`` returns. A dead node reports no resources,
    so its counts are 0: the reader keeps the GPUs it saw while the node was alive."""
    hosts = Counter(str(n.get("NodeManagerHostname", "")) for n in nodes)
    out = []
    for n in nodes:
        node_id = str(n["NodeID"])
        host = str(n.get("NodeManagerHostname", "")) or str(n.get("NodeManagerAddress", ""))
        resources: dict[str, float] = dict(n.get("Resources") or {})
        accel = next(
            (k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), ""
        )
        out.append(
            NodeRecord(
                node_id=node_id,
                name=host if hosts[host] == 1 else f"{host}/{node_id[:8]}",
                hostname=host,
                address=f"{n.get('NodeManagerAddress', '')}:{n.get('NodeManagerPort', '')}",
                alive=bool(n.get("Alive")),
                head="node:__internal_head__" in resources,
                gpus=int(resources.get("GPU", 0)),
                gpu_units=int(resources.get(RESOURCE, 0)),
                accelerator=accel,
            )
        )
    return sorted(out, key=lambda r: (not r.head, r.name))


def read_inventory(address: str = "") -> list[NodeRecord]:
    """Every node of the cluster this process is connected to; when it is not connected,
    join ``address`` (or ``RAY_ADDRESS``) for the read and leave again."""
    if ray.is_initialized():
        return records_from_nodes(_nodes())
    address = address or os.environ.get("RAY_ADDRESS", "")
    if not address:
        raise ValueError("read_inventory: not connected to Ray and no address (RAY_ADDRESS)")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        return records_from_nodes(_nodes())
    finally:
        ray.shutdown()


def _nodes() -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return nodes
