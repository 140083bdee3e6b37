"""The run's ``sim`` section: the simulated workload and cluster of a run with backend
``sim``, and its replay speed."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field


@dataclass(frozen=True, slots=True)
class SimConfig:
    workload: str = config_field(
        "xlong", "simulated workload kind", choices=("xlong", "mixed", "uniform")
    )
    rollouts: int = config_field(256, "rollouts in the simulated trace", min=1)
    gpus: int = config_field(64, "simulated GPUs", min=2)
    rollouts_per_step: int = config_field(64, "simulated rollouts per training step", min=1)
    speed: float = config_field(
        0.0,
        "replay speed from the web: simulated seconds per wall second (0 = as fast as possible)",
        min=0.0,
    )
