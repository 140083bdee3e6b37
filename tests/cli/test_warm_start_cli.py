"""``gyre warm-start``: a config's warm start run once, its weights and JSON written, and a
run with ``warm_start.weights`` beginning from exactly those weights."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from gyre_core.cli.main import main
from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.runtime.warm_start import WarmStart

TINY = {
    "model": {"tokenizer": "suite", "hidden_size": 64, "layers": 1},
    "rollout": {"hints": "status", "benchmark_split": "heldout", "tasks_per_step": 1,
                "benchmark_tasks": 2, "max_turns": 4, "max_new_tokens": 8},
    "train": {"lr": 1e-3},
    "warm_start": {"demos": 2, "lr": 1e-2, "anneal_steps": 1},
}  # fmt: skip


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warm-cli")
    model = make_model_dir(RunConfig.from_dict(TINY), root)
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "model": {**TINY["model"], "checkpoint": str(model)}}))
    return path


def test_warm_start_writes_weights_that_a_run_then_begins_from(config, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "w" / "warm.safetensors"
    args = ["warm-start", str(config), "--out", str(out), "--set", "warm_start.steps=3"]
    assert main([*args, "--workdir", str(tmp_path / "work")]) == 0
    meta = json.loads(out.with_suffix(".json").read_text())
    assert (meta["steps"], meta["anneal_from"], meta["benchmark_by_step"]) == (4, 3, {})
    assert len(meta["losses"]) == 4 and meta["seconds"] > 0
    assert meta["config"]["warm_start"]["steps"] == 3  # the --set reached the config
    err = capsys.readouterr().err
    assert "warm start 3/3, loss " in err and "warm start (anneal) 1/1" in err

    # exactly the warm start `gyre run` would run: the same seed, steps and weights
    cfg = RunConfig.from_dict(meta["config"])
    torch.manual_seed(cfg.seed)
    factory = SessionFactory(cfg, Path(cfg.model.checkpoint), ListSink(), lambda: 0.0)
    trainer = factory.make_trainer()
    losses = asyncio.run(WarmStart(factory).run(trainer))
    assert [round(x, 5) for x in losses] == meta["losses"]
    written = load_file(str(out))
    assert all(torch.equal(v, written[k]) for k, v in trainer.model.state_dict().items())

    # a run naming the file begins from those weights, with its losses for the summary
    d = {**meta["config"], "warm_start": {**meta["config"]["warm_start"], "weights": str(out)}}
    again = SessionFactory(RunConfig.from_dict(d), Path(cfg.model.checkpoint), ListSink(),
                           lambda: 0.0)  # fmt: skip
    fresh = again.make_trainer()
    warm = WarmStart(again)
    assert asyncio.run(warm.run(fresh)) == meta["losses"]
    assert all(torch.equal(v, written[k]) for k, v in fresh.model.state_dict().items())
    assert warm.warm_start_cached == str(out) and warm.warm_start_s == meta["seconds"]


def test_warm_start_every_scores_the_benchmark_along_the_way(config, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "curve.safetensors"
    args = ["warm-start", str(config), "--out", str(out), "--every", "2",
            "--set", "warm_start.steps=3", "--workdir", str(tmp_path / "work")]  # fmt: skip
    assert main(args) == 0
    meta = json.loads(out.with_suffix(".json").read_text())
    assert list(meta["benchmark_by_step"]) == ["2", "3", "4"]  # pieces of 2, the cap, the tail
    assert all(0.0 <= s <= 1.0 for s in meta["benchmark_by_step"].values())
    assert "benchmark 2/2" in capsys.readouterr().err


def test_warm_start_refuses_what_it_cannot_run(config, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = str(tmp_path / "w.safetensors")
    assert main(["warm-start", str(config), "--out", out]) == 2  # the config has no steps
    assert "warm_start.steps" in capsys.readouterr().err
    assert main(["warm-start", str(config), "--out", str(tmp_path / "w.pt")]) == 2
    assert main(["warm-start", str(config), "--out", out, "--set", "train"]) == 2
    assert "--set wants section.field=value" in capsys.readouterr().err
    assert not (tmp_path / "w.safetensors").exists()
