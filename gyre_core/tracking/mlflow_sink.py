"""MLflow: a run in ``tracking.mlflow_experiment``, on ``tracking.mlflow_tracking_uri`` or a
SQLite store in the run's folder (``mlflow.db``; MLflow's file store is in maintenance
mode), through ``MlflowClient`` (no global state, so two runs in one process do not share
an active run). A resumed run continues its own
MLflow run (its id is kept in the run's folder)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gyre_core.tracking.base import Exporter, need

STORE = "mlflow.db"
BATCH = 100  # MLflow takes at most 100 parameters and 1,000 metrics per batch
PARAM_MAX = 6000  # characters of a parameter's value
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def local_uri(workdir: Path) -> str:
    """The tracking URI of the store in a run's folder."""
    return f"sqlite:///{(workdir / STORE).resolve()}"


class MlflowExporter(Exporter):
    field = "mlflow"

    def __init__(self, cfg: Any, workdir: Path) -> None:
        super().__init__(cfg, workdir)
        need("mlflow", self.field, "mlflow")
        t = cfg.tracking
        self.uri = t.mlflow_tracking_uri or local_uri(workdir)
        self.client: Any = None
        self.run_id = ""

    def open(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        name = self.cfg.tracking.mlflow_experiment
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        self.run_id = self.saved_id()
        if self.run_id:
            self.client.update_run(self.run_id, status="RUNNING")
            return
        self.run_id = self.client.create_run(exp_id, run_name=self.cfg.name).info.run_id
        self.save_id(self.run_id)
        items = [Param(k, str(v)[:PARAM_MAX]) for k, v in params.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + BATCH])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=STATUS.get(status, "FINISHED"))
