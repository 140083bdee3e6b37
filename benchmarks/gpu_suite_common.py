"""What the device check (``benchmarks/gpu_suite.py``) and the CPU scale scripts share: the
Qwen3 shapes, the synthetic agentic batch, the benchmarks' trainer, and the FLOP count an
MFU figure divides by the device's peak.

Imports only torch, transformers and gyre_core's model, trainer and trajectory modules,
none of which imports Ray, vLLM or Django (``tests/train/test_gpu_suite.py`` checks it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trajectory_bench import CPU_WORKLOADS
from gyre_core.models.model import tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train.config import TrainConfig
from gyre_core.train.trainer import Trainer, TrainerOptions
from gyre_core.trajectory.format import Rollout
from gyre_core.trajectory.sample import PackedSample
from gyre_core.trajectory.synth import synth_rollouts

# Qwen3-0.6B's and Qwen3-1.7B's published shapes (any vocabulary), and tiny ones for tests.
SHAPES = {
    "0.6b": dict(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
    "1.7b": dict(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144),
    "tiny": dict(layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128),
    "tiny2": dict(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256),
}
STATE_BYTES = 4 + 4 + 8  # a parameter's fp32 training state: weight, gradient, AdamW moments
QWEN3_VOCAB = 151_936
# The device check's quick batch: one GRPO group of the agentic kind, about 1,000 tokens.
QUICK_BATCH = replace(
    CPU_WORKLOADS["agentic-cpu"], groups=1, group_size=4, turns=3, system_tokens=100,
    tool_tokens=30, completion_tokens=30, version=0,
)  # fmt: skip
# bf16 dense peak TFLOPS by a name fragment of the device, first match wins.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))


def model_config(shape: str, vocab: int) -> Qwen3Config:
    """The transformers config of ``SHAPES[shape]`` with a vocabulary of ``vocab``."""
    return tiny_qwen3_config(ModelShape(vocab, max_positions=40_960, **SHAPES[shape]))  # type: ignore[arg-type]


def agentic_batch(vocab: int, quick: bool, groups: int | None = None) -> list[Rollout]:
    """The synthetic agentic batch (``agentic-cpu``: GRPO groups of 8 rollouts, contexts
    up to 4,096 tokens), or with ``quick`` a small one (groups of 4 rollouts, 4 turns, a
    200-token task prompt); ``groups`` GRPO groups if given."""
    cfg = replace(CPU_WORKLOADS["agentic-cpu"], vocab_size=vocab, version=0)
    if quick:
        cfg = replace(cfg, groups=1, group_size=4, turns=4, system_tokens=200, tool_tokens=40)
    if groups is not None:
        cfg = replace(cfg, groups=groups)
    return list(synth_rollouts(cfg))


def bench_trainer(
    model: torch.nn.Module,
    attention: str,
    max_tokens: int = 8192,
    precision: str = "fp32",
    recompute: bool = False,
    loss: str = "ppo",
) -> Trainer:
    """The benchmarks' trainer; ``recompute``: ``train.activation_checkpointing``."""
    train = TrainConfig(
        max_tokens=max_tokens, precision=precision, activation_checkpointing=recompute, loss=loss
    )
    return Trainer(
        model,  # type: ignore[arg-type]
        train,
        staleness_bound=4,
        seed=0,
        options=TrainerOptions(attention=attention),  # type: ignore[arg-type]
    )


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    """The device's bf16 dense peak: ``given``, else looked up by its name (None: unknown,
    and always on the CPU)."""
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tf for part, tf in PEAK_TFLOPS if part in name), None)


@dataclass(frozen=True)
class StepFlops:
    """Model FLOPs of one training step (forward and backward: 3x the forward's), by part."""

    matmul: float  # the decoder layers' projections and MLPs, over every packed token
    head: float  # the output embedding, over the rows projected (the trained tokens)
    attention: float  # scores and values, over the (query, key) pairs the masks allow
    six_n: float  # 6 x all parameters (embeddings included) x packed tokens, no attention

    @property
    def model(self) -> float:
        """What MFU divides: matmuls, head and attention; the embedding lookup is no FLOP."""
        return self.matmul + self.head + self.attention


def step_flops(
    conf: Qwen3Config, samples: list[PackedSample], trained: int, params: int
) -> StepFlops:
    """The FLOPs of training ``samples`` (packed trees) with ``trained`` tokens projected
    through the output embedding; ``params``: the model's parameter count (for 6N)."""
    h, layers, v = int(conf.hidden_size), int(conf.num_hidden_layers), int(conf.vocab_size)
    heads = int(conf.num_attention_heads)
    kv_heads = int(conf.num_key_value_heads or heads)
    d = int(conf.head_dim or h // heads)
    q, kv = heads * d, kv_heads * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * conf.intermediate_size
    tokens = sum(len(s) for s in samples)
    # A tree token attends to itself and its ancestors: its depth (position) + 1 keys.
    pairs = sum(int((s.position_ids + 1).sum()) for s in samples)
    return StepFlops(
        matmul=6.0 * layers * per_layer * tokens,
        head=6.0 * v * h * trained,
        attention=3.0 * 4.0 * q * layers * pairs,
        six_n=6.0 * params * tokens,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
