"""A real run with every tracker on: its step metrics, benchmark scores and config read
back by each tracker's own library, equal to the run's events; a tracker whose package is
missing fails the run at its start, naming the field."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gyre_core.config import RunConfig
from gyre_core.events import Benchmark, ListSink, RunStatus, StepFinished
from gyre_core.runtime import run_job
from gyre_core.tracking.base import IDS, TrackingError
from gyre_core.tracking.mlflow_sink import local_uri
from tests.runtime.conftest import TINY_JOB, ray_cluster  # noqa: F401 (a fixture)
from tests.tracking import readers

TRACKING = {"tensorboard": True, "mlflow": True, "wandb": True}


def _config(**tracking: object) -> RunConfig:
    rollout = {**TINY_JOB["rollout"], "benchmark_every": 1}
    return RunConfig.from_dict({**TINY_JOB, "rollout": rollout, "tracking": tracking})


def _expected(sink: ListSink) -> dict[str, list[tuple[int, float]]]:
    want: dict[str, list[tuple[int, float]]] = {}
    for e in sink.of(StepFinished):
        for k, v in e.metrics.items():
            want.setdefault(k, []).append((e.step, float(v)))
    for b in sink.of(Benchmark):
        want.setdefault(f"benchmark/{b.suite}", []).append((b.step, b.score))
    return {k: sorted(v) for k, v in want.items()}


@pytest.mark.slow
def test_every_exporter_reads_back_the_run_s_metrics(ray_cluster, tmp_path: Path) -> None:  # noqa: F811
    cfg = _config(**TRACKING)
    sink = ListSink()
    out = run_job(cfg, sink=sink, workdir=tmp_path)
    assert out["status"] == "succeeded"
    want = _expected(sink)
    assert "loss" in want and any(k.startswith("benchmark/") for k in want)

    tb = readers.tensorboard_scalars(tmp_path / "tensorboard")
    for key, points in want.items():
        assert [(s, pytest.approx(v, rel=1e-6)) for s, v in points] == sorted(tb[key]), key

    ids = json.loads((tmp_path / IDS).read_text())
    run, history = readers.mlflow_run(local_uri(tmp_path), ids["mlflow"])
    assert run.info.status == "FINISHED" and run.info.run_name == cfg.name
    assert run.data.params["steps"] == str(cfg.steps)
    assert run.data.params["rollout.benchmark_every"] == "1"
    for key, points in want.items():
        assert sorted(history[key]) == [(s, pytest.approx(v)) for s, v in points], key

    (path,) = (tmp_path / "wandb").glob(f"offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb")
    rows = readers.wandb_history(path)
    for key, points in want.items():
        got = sorted((r["train/step"], r[key]) for r in rows if key in r)
        assert got == [(s, pytest.approx(v)) for s, v in points], key
    config = readers.wandb_config(path)
    assert config["steps"] == cfg.steps and config["scheduler.policy"] == cfg.policy


def test_a_missing_tracker_package_fails_the_run_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    sink = ListSink()
    with pytest.raises(TrackingError, match=r"tracking\.mlflow: the mlflow package"):
        run_job(_config(mlflow=True), sink=sink, workdir=tmp_path)
    (status,) = sink.of(RunStatus)
    assert status.status == "failed" and "tracking.mlflow" in status.message


def test_tracking_fields_are_checked() -> None:
    from gyre_core.config import ConfigError

    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"tracking": {"wandb_mode": "cloud", "tensorboard": "yes"}})
    fields = {f for f, _ in e.value.errors}
    assert fields == {"tracking.wandb_mode", "tracking.tensorboard"}


def test_a_failing_tracker_stops_exporting_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a refused port, at once
    cfg = RunConfig.from_dict(
        {
            "backend": "sim",
            "steps": 2,
            "sim": {"rollouts": 32, "gpus": 16, "rollouts_per_step": 8},
            "tracking": {"mlflow": True, "mlflow_tracking_uri": "http://127.0.0.1:9"},
        }
    )
    sink = ListSink()
    out = run_job(cfg, sink=sink, workdir=tmp_path / "run")
    assert out["status"] == "succeeded" and len(sink.of(StepFinished)) == 2
    assert capsys.readouterr().err.count("tracking.mlflow: export stopped") == 1
