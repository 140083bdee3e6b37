"""Checkpoints: a resumed run continues bit for bit; writes are atomic; bad input is refused."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gyre_core.config import TrainConfig
from gyre_core.train.checkpoint import load_checkpoint, save_checkpoint
from gyre_core.train.checkpoint_dirs import latest_checkpoint
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.synth import synth_rollouts
from tests.train.test_trainer import SYNTH, make_trainer, params, tiny_model

CFG = TrainConfig(lr=1e-3, max_tokens=256)


def new(model: Any, train: TrainConfig = CFG, **kw: Any) -> Trainer:
    return make_trainer(model, train, weight_decay=0.01, **kw)


def batch(index: int) -> list[Rollout]:
    """The data stream: batch ``index`` of a synthetic log, versions 0..2."""
    return list(synth_rollouts(replace(SYNTH, seed=index, groups=1)))


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def run(trainer: Trainer, start: int, steps: int) -> int:
    for i in range(start, start + steps):
        trainer.step(batch(i))
    return start + steps


def test_resumed_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    trainer = new(tiny_model(seed=0), version=2)  # the log's newest version
    pos = run(trainer, 0, 2)
    saved = save_checkpoint(tmp_path, trainer, {"next_batch": pos})
    after_save = draws()
    run(trainer, pos, 2)
    want = params(trainer.model)

    resumed = new(tiny_model(seed=7))  # other initial weights: all must be loaded
    found = latest_checkpoint(tmp_path)
    assert found == saved
    ck = load_checkpoint(found, resumed)
    assert draws() == after_save  # python, numpy and torch RNGs restored
    assert ck.data_position == {"next_batch": 2} and resumed.version == ck.version == 4
    run(resumed, ck.data_position["next_batch"], 2)
    assert resumed.version == trainer.version == 6
    got = params(resumed.model)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_latest_ignores_unfinished_writes_and_picks_the_highest_version(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    trainer = new(tiny_model())
    first = save_checkpoint(tmp_path, trainer)
    trainer.version = 12
    last = save_checkpoint(tmp_path, trainer, {"i": 1})
    (tmp_path / ".tmp-step-00000099-1").mkdir()  # a crashed write: never renamed
    (tmp_path / "step-00000050").mkdir()  # no state.json: not a complete checkpoint
    assert first.name == "step-00000000" and last.name == "step-00000012"
    assert latest_checkpoint(tmp_path) == last
    again = save_checkpoint(tmp_path, trainer, {"i": 2})  # same version: replaced in place
    assert again == last and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".tmp-step-00000099-1", "step-00000000", "step-00000012", "step-00000050"]
    )
    assert load_checkpoint(again, new(tiny_model())).data_position == {"i": 2}


def test_bad_checkpoints_and_mismatched_configs_are_refused(tmp_path: Path) -> None:
    trainer = new(tiny_model())
    with pytest.raises(ValueError, match="data_position must be JSON-serialisable"):
        save_checkpoint(tmp_path, trainer, {"x": object()})
    with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
        load_checkpoint(tmp_path, trainer)
    path = save_checkpoint(tmp_path, trainer)
    other = new(tiny_model(), replace(CFG, lr=2e-3), staleness_bound=1)
    with pytest.raises(
        ValueError, match=r"different trainer config \(lr, staleness_bound differ\)"
    ):
        load_checkpoint(path, other)
    assert load_checkpoint(path, other, strict_config=False).config == trainer.settings()


def test_a_checkpoint_written_before_the_warm_start_section_resumes(tmp_path: Path) -> None:
    """Its settings also recorded train.warm_start_* and ratio_cap None (0 now): a run
    checkpointed then resumes; a setting that changes a step is still refused."""
    import json

    trainer = new(tiny_model())
    path = save_checkpoint(tmp_path, trainer)
    state = json.loads((path / "state.json").read_text())
    old = {**state["config"], "ratio_cap": None, "warm_start_steps": 2000, "warm_start_from": ""}
    (path / "state.json").write_text(json.dumps({**state, "config": old}))
    assert load_checkpoint(path, new(tiny_model())).config == trainer.settings()
    with pytest.raises(ValueError, match=r"\(ratio_cap differ\)"):
        load_checkpoint(path, new(tiny_model(), replace(CFG, ratio_cap=4.0)))
