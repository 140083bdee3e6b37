"""Nodes, GPUs and *units*: the GPUs that together host one model replica at its required
parallelism (an inference engine for rollout, a data-parallel replica for training). A
unit is the smallest thing that changes role; it holds exactly one role at a time.
``ClusterConfig`` is the run's ``cluster`` section: how many units, their GPUs, and Ray.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gyre_core.config_fields import config_field

ROLLOUT, TRAIN, SWITCHING, IDLE = "rollout", "train", "switching", "idle"
ROLES = (ROLLOUT, TRAIN, SWITCHING, IDLE)


class ClusterError(ValueError):
    pass


def async_split(units: int, rollout_units: int = 0) -> tuple[int, int]:
    """The fixed split of ``units`` under policy async: ``(rollout, train)`` units, with
    ``rollout_units`` serving (0 = half the cluster, at least one) and the rest training."""
    rollout = rollout_units or max(1, units // 2)
    return rollout, units - rollout


@dataclass(frozen=True, slots=True)
class Unit:
    id: int
    gpus: tuple[int, ...]  # global GPU ids
    nodes: tuple[int, ...]  # the node(s) its GPUs sit on


class Cluster:
    """A homogeneous cluster cut into units; ``roles[u]`` is unit ``u``'s current role."""

    def __init__(self, gpus: int, gpus_per_unit: int, gpus_per_node: int = 8) -> None:
        if gpus_per_unit < 1 or gpus_per_node < 1:
            raise ClusterError("gpus_per_unit and gpus_per_node must be >= 1")
        if gpus % gpus_per_unit:
            raise ClusterError(f"{gpus} GPUs do not divide into units of {gpus_per_unit}")
        if gpus_per_unit > gpus_per_node and gpus_per_unit % gpus_per_node:
            raise ClusterError(
                f"a unit of {gpus_per_unit} GPUs must take whole nodes of {gpus_per_node}"
            )
        if gpus_per_unit < gpus_per_node and gpus_per_node % gpus_per_unit:
            raise ClusterError(
                f"units of {gpus_per_unit} GPUs do not tile nodes of {gpus_per_node}"
            )
        n_units = gpus // gpus_per_unit
        if n_units < 2:
            raise ClusterError(
                f"{gpus} GPUs make {n_units} unit(s) of {gpus_per_unit}: a cluster needs at "
                "least one unit for rollout and one for training"
            )
        self.gpus = gpus
        self.gpus_per_unit = gpus_per_unit
        self.gpus_per_node = gpus_per_node
        self.units = [
            Unit(
                u,
                tuple(range(u * gpus_per_unit, (u + 1) * gpus_per_unit)),
                tuple(
                    sorted(
                        {
                            g // gpus_per_node
                            for g in range(u * gpus_per_unit, (u + 1) * gpus_per_unit)
                        }
                    )
                ),
            )
            for u in range(n_units)
        ]
        self.roles = [IDLE] * n_units

    def __len__(self) -> int:
        return len(self.units)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    def set_role(self, unit: int, role: str) -> str:
        """Give ``unit`` a new role; returns the one it had."""
        if role not in ROLES:
            raise ClusterError(f"unknown role {role!r}; expected one of {ROLES}")
        old = self.roles[unit]
        self.roles[unit] = role
        return old

    def with_role(self, role: str) -> list[int]:
        return [u for u, r in enumerate(self.roles) if r == role]

    def counts(self) -> dict[str, int]:
        c = Counter(self.roles)
        return {r: c.get(r, 0) for r in ROLES}


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    units: int = config_field(
        6, "units in the cluster (a unit hosts one replica: engine or trainer)", min=2, max=4096
    )
    gpus_per_unit: int = config_field(
        1,
        "processes per unit, one per GPU (a gpu_unit resource each on CPU machines); "
        "a training unit shards the model over them (FSDP2)",
        min=1,
        max=64,
    )
    ray_address: str = config_field(
        "", "join this Ray cluster ('' = start a local one; or RAY_ADDRESS)"
    )
    object_store_mb: int = config_field(256, "Ray object store cap for a local cluster", min=64)
    sysmetrics_s: float = config_field(
        0.0,
        "seconds between samples of each unit's CPU, memory and GPUs (NVML) into "
        "sys_metrics events of a real run (0, the default: none)",
        min=0,
        max=3600,
    )
