"""TensorBoard: event files in the run's folder (``tensorboard/``), written by torch's
``SummaryWriter`` (which needs the ``tensorboard`` package)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gyre_core.tracking.base import Exporter, need

FOLDER = "tensorboard"


class TensorBoardExporter(Exporter):
    field = "tensorboard"

    def __init__(self, cfg: Any, workdir: Path) -> None:
        super().__init__(cfg, workdir)
        need("tensorboard", self.field, "tensorboard")
        self.writer: Any = None

    def open(self, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.workdir / FOLDER))
        text = json.dumps(params, indent=1, default=str)
        self.writer.add_text("config", f"```\n{text}\n```", global_step=0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.add_text("status", status)
        self.writer.close()
