"""Experiment-tracker exporters: a run's step metrics, benchmark scores and config sent to
TensorBoard, MLflow or Weights & Biases as the run goes (``tracking:`` in the config).

Each exporter is an event sink (:class:`~gyre_core.tracking.base.Exporter`) that uses its
tracker's own package, an optional extra (``pip install 'gyre[tracking]'``); a run that
asks for a tracker whose package is missing fails at its start, naming the field.
:func:`exporters` builds the ones a config asks for; ``run_job`` tees the run's events
into them and closes them when the run ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre_core.tracking.base import Exporter, TrackingError
from gyre_core.tracking.config import TrackingConfig

__all__ = ["Exporter", "TrackingConfig", "TrackingError", "exporters"]


def exporters(cfg: Any, workdir: Path) -> list[Exporter]:
    """The exporters ``cfg.tracking`` asks for, each writing under ``workdir``."""
    t: TrackingConfig = cfg.tracking
    out: list[Exporter] = []
    if t.tensorboard:
        from gyre_core.tracking.tensorboard_sink import TensorBoardExporter

        out.append(TensorBoardExporter(cfg, workdir))
    if t.mlflow:
        from gyre_core.tracking.mlflow_sink import MlflowExporter

        out.append(MlflowExporter(cfg, workdir))
    if t.wandb:
        from gyre_core.tracking.wandb_sink import WandbExporter

        out.append(WandbExporter(cfg, workdir))
    return out
