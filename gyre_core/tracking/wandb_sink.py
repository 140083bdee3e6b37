"""Weights & Biases: a run in ``tracking.wandb_project``, offline by default (files in the
run's folder, ``wandb/``, that ``wandb sync`` uploads later; no network needed). Metrics
are charted against ``train/step`` (benchmark scores may arrive after a later step's
metrics, which W&B's own step counter would drop). A resumed run continues its own W&B
run (its id is kept in the run's folder)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from gyre_core.tracking.base import Exporter, need

STEP = "train/step"


class WandbExporter(Exporter):
    field = "wandb"

    def __init__(self, cfg: Any, workdir: Path) -> None:
        super().__init__(cfg, workdir)
        self.wandb = need("wandb", self.field, "wandb")
        self.run: Any = None

    def open(self, params: dict[str, Any]) -> None:
        t = self.cfg.tracking
        run_id = self.saved_id() or uuid.uuid4().hex[:8]
        self.save_id(run_id)
        self.run = self.wandb.init(
            project=t.wandb_project,
            name=self.cfg.name,
            id=run_id,
            resume="allow",
            dir=str(self.workdir),
            mode=t.wandb_mode,
            config=params,
            settings=self.wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, STEP: step})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "succeeded" else 1)
