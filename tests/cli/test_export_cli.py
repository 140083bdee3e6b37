"""``gyre export``: a run folder exports its newest checkpoint with the run's model folder;
bad input is one line on stderr and exit code 2, never a traceback, and leaves nothing
behind. (The export itself, of both checkpoint formats: tests/train/test_export.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gyre_core.cli.main import main
from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.train.checkpoint import save_checkpoint
from tests.train.test_sharded import _batch
from tests.train.test_trainer import make_trainer

SHAPE = ModelShape(300, layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128,
                   max_positions=256)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder: ``model/`` and plain checkpoints of versions 1 and 2 (a half-written
    step-3 without state.json beside them)."""
    root = run_folder(tmp_path_factory.mktemp("export-cli") / "run")
    (root / "checkpoints" / "step-00000003").mkdir()
    return root


def run_folder(root: Path) -> Path:
    """The folder a real run leaves: ``model/`` and plain checkpoints of versions 1, 2."""
    init_checkpoint(root / "model", SHAPE, corpus=["status ok " * 40])
    model = AutoModelForCausalLM.from_pretrained(str(root / "model"), dtype=torch.float32)
    trainer = make_trainer(model)
    for _ in range(2):
        trainer.step(_batch())
        save_checkpoint(root / "checkpoints", trainer)
    return root


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_a_run_folder_exports_its_newest_checkpoint(run, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out), "--dtype", "float32"]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"wrote {out}: ") and "float32, from " in line
    assert line.rstrip().endswith("step-00000002")
    size = sum(f.stat().st_size for f in out.iterdir())
    config_mode = (out / "config.json").stat().st_mode
    assert (out / "model.safetensors").stat().st_mode == config_mode  # not 0600
    assert f"({size} bytes)" in line
    want = load_file(str(run / "checkpoints" / "step-00000002" / "model.safetensors"))
    got = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())
    # a checkpoint directory itself, and the default dtype bfloat16
    one = run / "checkpoints" / "step-00000001"
    assert main(["export", str(one), str(tmp_path / "bf16")]) == 0
    assert "bfloat16, from " in capsys.readouterr().out
    written = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert written["lm_head.weight"].dtype == torch.bfloat16


def test_bad_paths_are_one_line_and_exit_2(run, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = str(tmp_path / "out")
    err = _fails(["export", str(tmp_path / "nope"), out], capsys)
    assert "nope: no such checkpoint or run folder" in err
    (tmp_path / "file").write_text("x")
    assert "not a directory" in _fails(["export", str(tmp_path / "file"), out], capsys)
    (tmp_path / "empty").mkdir()
    err = _fails(["export", str(tmp_path / "empty"), out], capsys)
    assert "empty: neither a checkpoint nor a run folder (no .metadata or model.safetensors" in err
    (tmp_path / "fresh" / "checkpoints").mkdir(parents=True)
    err = _fails(["export", str(tmp_path / "fresh"), out], capsys)
    assert "checkpoints: no complete checkpoint to export" in err
    # a checkpoint away from its run: the model folder must be named
    alone = tmp_path / "alone" / "step-00000002"
    shutil.copytree(run / "checkpoints" / "step-00000002", alone)
    err = _fails(["export", str(alone), out], capsys)
    assert "no run model folder at " in err and "pass --model-dir DIR" in err
    err = _fails(["export", str(alone), out, "--model-dir", str(tmp_path / "empty")], capsys)
    assert "empty: not a model folder (no config.json)" in err
    assert main(["export", str(alone), out, "--model-dir", str(run / "model")]) == 0
    capsys.readouterr()
    # an occupied OUT is refused, and replaced with --force
    err = _fails(["export", str(run), out], capsys)
    assert "out: directory is not empty (pass --force to replace it)" in err
    assert main(["export", str(run), out, "--force"]) == 0
    assert "step-00000002" in capsys.readouterr().out
    err = _fails(["export", str(run), str(tmp_path / "file"), "--force"], capsys)
    assert "file: exists and is not a directory" in err
    # a truncated weights file
    broken = tmp_path / "broken" / "step-00000002"
    shutil.copytree(alone, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    model = str(run / "model")
    err = _fails(["export", str(broken), str(tmp_path / "b"), "--model-dir", model], capsys)
    assert "step-00000002: its weights do not load into the model of " in err
    assert not (tmp_path / "b").exists()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary left


def test_a_dtype_outside_the_choices_is_a_usage_error(run, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(run), str(tmp_path / "x"), "--dtype", "int8"])
    assert exit_.value.code == 2
    assert "invalid choice: 'int8'" in capsys.readouterr().err
