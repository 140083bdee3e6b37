"""Any decoder that ``AutoModelForCausalLM`` loads from a local folder trains, not only
Qwen3: a Llama and a Mistral saved with ``save_pretrained`` and loaded back give packed
tree logits equal to their linear paths, and a step of the sharded trainer (1 unit x 2
gloo processes) equals the plain trainer's within 1e-5 relative."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig

from gyre_core.train.sharded import ShardedTrainer, decoder_layers, unit_mesh
from gyre_core.train.tree_attention import tree_forward
from tests.train.test_sharded import _relative
from tests.train.test_trainer import make_trainer, sample_rollouts
from tests.train.test_tree_attention import L, path_to, tensors
from tests.train.world import join_world, world_port

SHAPE: dict[str, Any] = dict(
    vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
)  # fmt: skip
CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig}


def _save(kind: str, folder: Path) -> Path:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[kind](**SHAPE), dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


def _load(folder: Path, attn: str = "sdpa") -> Any:
    return AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation=attn
    )


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize(("attn", "impl"), [("sdpa", "dense"), ("gyre_tree", "sparse")])
def test_packed_trees_equal_linear_paths(kind: str, attn: str, impl: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gyre_core.train import tree_attention  # noqa: F401  (registers gyre_tree)

    model = _load(_save(kind, tmp_path / kind), attn)
    assert type(model).__name__ != "Qwen3ForCausalLM" and len(decoder_layers(model)) == 2
    ids, pos, parent = tensors()
    with torch.no_grad():
        packed = tree_forward(model, ids, pos, parent, impl)  # type: ignore[arg-type]
        for i in range(L):
            alone = model(input_ids=ids[path_to(i)][None], use_cache=False).logits[0, -1]
            torch.testing.assert_close(packed[i], alone, rtol=1e-5, atol=1e-5)


def _batch(folder: Path) -> list:  # type: ignore[type-arg]
    return sample_rollouts(_load(folder), groups=2, group_size=4, length=6, seed=7)


def _process(rank: int, world: int, port: int, folder: str, out: str) -> None:
    torch.set_num_threads(1)
    join_world(rank, world, port)
    try:
        trainer = ShardedTrainer(make_trainer(_load(Path(folder))), unit_mesh(1, world))
        metrics = trainer.step(_batch(Path(folder)))
        full = trainer.full_state_dict()
        if rank == 0:
            torch.save({"params": full, "metrics": metrics}, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["llama"])
def test_a_sharded_step_equals_the_plain_one(kind: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = _save(kind, tmp_path / kind)
    plain = make_trainer(_load(folder))
    want_metrics = plain.step(_batch(folder))
    out = tmp_path / "out.pt"
    with world_port() as port:
        mp.spawn(_process, args=(2, port, str(folder), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    worst = max(_relative(got["params"][n], p.detach()) for n, p in plain.model.named_parameters())
    assert worst < 1e-5, f"parameters differ by {worst:.2e} relative"
    assert got["metrics"]["loss"] == pytest.approx(want_metrics["loss"], rel=1e-5, abs=1e-7)
    assert got["metrics"]["tokens"] == want_metrics["tokens"] > 0
