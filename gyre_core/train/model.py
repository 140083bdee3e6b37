"""Randomly initialised Qwen3 models built from a config alone (no hub download)."""

from __future__ import annotations

import copy

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def tiny_qwen3_config(
    vocab_size: int,
    *,
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    intermediate: int = 768,
    max_positions: int = 4096,
    rope_theta: float = 10_000.0,
    tie_embeddings: bool = False,
) -> Qwen3Config:
    """A small Qwen3 config: full attention on every layer, no dropout, no sliding window."""
    if head_dim < 32:
        # A floor kept on purpose: tinier heads would run attention kernels (flex, sdpa's
        # fused paths) in shapes no real model uses, so tests on them would prove less.
        raise ValueError(f"head_dim must be >= 32, got {head_dim}")
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=tie_embeddings,
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
