"""``gyre export``: a sharded checkpoint as a plain Hugging Face
directory that ``AutoModelForCausalLM`` loads with the trainer's weights; and the
checkpoint retention rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core.cli.main import main
from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.train.checkpoint import STATE_FILE, checkpoints, prune_checkpoints
from gyre_core.train.sharded import save_state
from gyre_core.train.trainer import TrainConfig, Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A run folder: its model folder and a checkpoint after one supervised step."""
    root = tmp_path_factory.mktemp("run")
    shape = ModelShape(300, layers=1, hidden=32, heads=1, kv_heads=1, head_dim=32,
                       intermediate=64, max_positions=64, tie_embeddings=False)  # fmt: skip
    init_checkpoint(root / "model", shape, seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(root / "model"))
    trainer = Trainer(model, TrainConfig(lr=1e-2), staleness_bound=2, seed=0)
    trainer.sft_step([([1, 2, 3], [4, 5, 6])])
    ck = root / "checkpoints" / "step-00000001"
    save_state(trainer, ck, 1)
    (ck / STATE_FILE).write_text(json.dumps({"version": 1}))
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, root / "want.pt")
    return root


def _logits(model, ids):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_run_exports_as_a_directory_transformers_loads(run, tmp_path, dtype, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out), "--dtype", dtype]) == 0  # the run's latest
    assert "MB" in capsys.readouterr().out
    got = AutoModelForCausalLM.from_pretrained(str(out))
    assert got.dtype == (torch.float32 if dtype == "float32" else torch.bfloat16)
    want = AutoModelForCausalLM.from_pretrained(str(run / "model"))
    want.load_state_dict(torch.load(run / "want.pt"))
    ids = [1, 2, 3, 4, 5]
    diff = float((_logits(got, ids) - _logits(want, ids)).abs().max())
    assert diff == 0.0 if dtype == "float32" else diff < 0.1
    assert AutoTokenizer.from_pretrained(str(out)).encode("hello")


def test_export_refuses_bad_input_in_one_line(run, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "o")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["export", str(run), str(tmp_path / "full")]) == 2
    assert "--force" in capsys.readouterr().err
    weights = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(weights))
    assert main(["export", str(weights), str(tmp_path / "o")]) == 2
    assert "--model-dir" in capsys.readouterr().err


def test_retention_keeps_the_last_k_and_every_nth(tmp_path) -> None:
    for v in range(1, 11):
        d = tmp_path / f"step-{v:08d}"
        d.mkdir()
        (d / STATE_FILE).write_text("{}")
    (tmp_path / ".tmp-step-00000011").mkdir()  # a half-written one is not touched
    assert prune_checkpoints(tmp_path, 0, 4) == []  # keep_last 0: keep all
    gone = prune_checkpoints(tmp_path, 2, 4)
    assert [v for v, _ in checkpoints(tmp_path)] == [4, 8, 9, 10]
    assert len(gone) == 6 and (tmp_path / ".tmp-step-00000011").is_dir()
    prune_checkpoints(tmp_path, 1, 0)
    assert [v for v, _ in checkpoints(tmp_path)] == [10]
