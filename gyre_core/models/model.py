"""Randomly initialised Qwen3 models built from a config alone (no hub download)."""

from __future__ import annotations

import copy

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gyre_core.models.shape import ModelShape

ROPE_THETA = 10_000.0


def tiny_qwen3_config(shape: ModelShape) -> Qwen3Config:
    """The transformers config of ``shape``."""
    return Qwen3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=shape.tie_embeddings,
        attention_dropout=0.0,
        use_sliding_window=False,
        use_cache=False,
    )


def build_model(
    config: Qwen3Config,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    attn_implementation: str = "sdpa",
) -> Qwen3ForCausalLM:
    """A randomly initialised ``Qwen3ForCausalLM``; the same seed gives the same weights.

    Weights are always drawn in float32 and then cast, so a float64 model built with the
    same seed is the float32 one, upcast: handy for comparing paths at tight tolerance.
    The global RNG state is left as it was, and so is ``config`` (the model gets a copy).
    """
    # The model keeps a reference to its config and reads the attention backend from it on
    # every forward, so two models built from one config must not share it.
    config = copy.deepcopy(config)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    # nn.Module.to rather than the model's own: transformers wraps it in a way mypy cannot
    # type, and its override only adds checks for quantised models.
    torch.nn.Module.to(model, dtype=dtype)
    return model
