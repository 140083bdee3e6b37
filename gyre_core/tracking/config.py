"""The run's ``tracking`` section: which experiment trackers a run's metrics go out to."""

from __future__ import annotations

from dataclasses import dataclass

from gyre_core.config_fields import config_field


@dataclass(frozen=True, slots=True)
class TrackingConfig:
    tensorboard: bool = config_field(
        False, "write TensorBoard event files into the run's folder (tensorboard/)"
    )
    mlflow: bool = config_field(False, "log the run to MLflow")
    mlflow_tracking_uri: str = config_field(
        "", "MLflow tracking URI; empty: a SQLite store in the run's folder (mlflow.db)"
    )
    mlflow_experiment: str = config_field("gyre", "MLflow experiment name", max_length=200)
    wandb: bool = config_field(False, "log the run to Weights & Biases")
    wandb_mode: str = config_field(
        "offline",
        "offline: files in the run's folder (wandb/), synced later with `wandb sync`; "
        "online: to the W&B server (needs WANDB_API_KEY)",
        choices=("offline", "online"),
    )
    wandb_project: str = config_field("gyre", "W&B project", max_length=200)

    @property
    def any(self) -> bool:
        return self.tensorboard or self.mlflow or self.wandb
