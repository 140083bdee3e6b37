"""``export_hf`` and ``gyre export``: a sharded checkpoint written by a 2-process gloo world
(FSDP2, tied embeddings) and a plain one become Hugging Face directories whose model, loaded
by ``AutoModelForCausalLM``, gives the trainer's logits (exactly in float32, within bf16's
rounding in bfloat16), and whose tokenizer ``AutoTokenizer`` loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core.cli.main import main
from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.train.checkpoint import save_checkpoint
from gyre_core.train.export import checkpoint_weights, export_hf
from gyre_core.train.sharded import ShardedTrainer, unit_mesh
from tests.train.test_sharded import _batch
from tests.train.test_trainer import make_trainer
from tests.train.world import join_world, world_port

SHAPE = ModelShape(300, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128,
                   max_positions=256, tie_embeddings=True)  # fmt: skip
CORPUS = ["def check(path):\n    return {'status': 'ok', 'path': path}\n" * 20]
IDS = torch.tensor([[1, 5, 9, 17, 3, 30, 2, 11]])


def _process(rank: int, world: int, port: int, run: str) -> None:
    """Two steps on a 1 unit x 2 processes mesh, a sharded checkpoint after each as a run
    lays them out (``checkpoints/step-*``, plus the ``state.json`` the runtime adds); rank 0
    keeps the full weights of each version beside them."""
    torch.set_num_threads(1)
    join_world(rank, world, port)
    try:
        model = AutoModelForCausalLM.from_pretrained(f"{run}/model", dtype=torch.float32)
        trainer = ShardedTrainer(make_trainer(model), unit_mesh(1, world))
        for _ in range(2):
            trainer.step(_batch())
            path = Path(run) / "checkpoints" / f"step-{trainer.version:08d}"
            trainer.save(path)
            full = trainer.full_state_dict()
            if rank == 0:
                (path / "state.json").write_text(json.dumps({"version": trainer.version}))
                torch.save(full, Path(run) / f"full-{trainer.version}.pt")
        dist.barrier()  # no process tears its connections down while a peer still works
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export") / "run"
    init_checkpoint(root / "model", SHAPE, corpus=CORPUS)
    with world_port() as port:
        mp.spawn(_process, args=(2, port, str(root)), nprocs=2, join=True)
    return root


def _logits(model_dir: Path, weights: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    if weights is not None:
        model.load_state_dict(weights)
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits.float()  # type: ignore[no-any-return]


def test_a_sharded_run_exports_in_float32_with_exact_logits(run, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out), "--dtype", "float32"]) == 0  # the run folder
    printed = capsys.readouterr().out
    assert f"wrote {out}: " in printed and "step-00000002" in printed and " MB (" in printed
    full = torch.load(run / "full-2.pt")
    initial = load_file(str(run / "model" / "model.safetensors"))
    key = "model.embed_tokens.weight"  # tied: the output head too
    assert not torch.equal(full[key], initial[key])  # it trained
    want = _logits(run / "model", full)  # the trainer's weights in the base model
    got = AutoModelForCausalLM.from_pretrained(str(out))
    assert got.dtype == torch.float32 and got.config.tie_word_embeddings
    with torch.no_grad():
        assert torch.equal(got(input_ids=IDS, use_cache=False).logits, want)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    tok = AutoTokenizer.from_pretrained(str(out))
    base = AutoTokenizer.from_pretrained(str(run / "model"))
    text = "def check(path): return {'status': 'ok'}"
    ids = tok(text)["input_ids"]
    assert ids == base(text)["input_ids"] and tok.decode(ids) == text
    generation = "generation_config.json"
    assert (out / generation).read_bytes() == (run / "model" / generation).read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left beside it


def test_a_sharded_checkpoint_exports_in_bfloat16_within_its_rounding(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = export_hf(run / "checkpoints" / "step-00000001", run / "model", tmp_path / "bf16")
    full = torch.load(run / "full-1.pt")
    written = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in written  # tied: stored once
    assert all(v.dtype == torch.bfloat16 for v in written.values())
    assert all(torch.equal(v, full[k].to(torch.bfloat16)) for k, v in written.items())
    got = _logits(out)
    want = _logits(run / "model", full)
    worst = float((got - want).norm() / want.norm())
    assert 0 < worst < 2e-2, f"bf16 logits differ by {worst:.2e} relative"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_plain_checkpoint_exports_too(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = AutoModelForCausalLM.from_pretrained(str(run / "model"), dtype=torch.float32)
    trainer = make_trainer(model)
    trainer.step(_batch())
    ckpt = save_checkpoint(tmp_path / "checkpoints", trainer)
    out = export_hf(ckpt, run / "model", tmp_path / "plain", "float16")
    got = AutoModelForCausalLM.from_pretrained(str(out))
    assert got.dtype == torch.float16
    want = {k: v.to(torch.float16) for k, v in trainer.model.state_dict().items()}
    assert all(torch.equal(v, want[k]) for k, v in got.state_dict().items())


def test_checkpoint_weights_reads_either_format_whole(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sharded = checkpoint_weights(run / "checkpoints" / "step-00000002")
    full = torch.load(run / "full-2.pt")
    assert sharded.keys() == full.keys() and all(torch.equal(sharded[k], full[k]) for k in full)
    trainer = make_trainer(AutoModelForCausalLM.from_pretrained(str(run / "model")))
    plain = checkpoint_weights(save_checkpoint(tmp_path / "checkpoints", trainer))
    assert all(torch.equal(plain[k], v) for k, v in trainer.model.state_dict().items())
    with pytest.raises(ValueError, match="not a checkpoint"):
        checkpoint_weights(run / "checkpoints")


def test_export_refuses_a_model_of_another_shape_and_an_occupied_out(run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    other = init_checkpoint(tmp_path / "other", ModelShape(300, layers=1, hidden=96, heads=3,
                            kv_heads=1, head_dim=32, intermediate=128, max_positions=256),
                            corpus=CORPUS)  # fmt: skip
    ckpt = run / "checkpoints" / "step-00000002"
    with pytest.raises(ValueError, match=r"do not load into the model of .*other: Size mismatch"):
        export_hf(ckpt, other, tmp_path / "x")
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    shard = broken / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ValueError, match="broken: its weights do not load into the model"):
        export_hf(broken, run / "model", tmp_path / "x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="busy: directory is not empty"):
        export_hf(ckpt, run / "model", tmp_path / "busy")
    with pytest.raises(ValueError, match="is or is inside"):
        export_hf(ckpt, run / "model", run / "model" / "hf", force=True)
    export_hf(ckpt, run / "model", tmp_path / "busy", force=True)
    busy = tmp_path / "busy"
    assert not (busy / "keep.txt").exists() and (busy / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "busy", "other"]
