"""Randomly initialised Qwen3 models (dense or mixture-of-experts) built from a config
alone (no hub download)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import (
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from gyre_core.models.shape import ModelShape

ROPE_THETA = 10_000.0


def tiny_qwen3_config(shape: ModelShape) -> Qwen3Config | Qwen3MoeConfig:
    """The transformers config of ``shape``: a ``Qwen3MoeConfig`` when it has experts."""
    if shape.experts:
        return Qwen3MoeConfig(
            num_experts=shape.experts,
            num_experts_per_tok=shape.experts_per_token,
            moe_intermediate_size=shape.moe_intermediate,
            norm_topk_prob=True,  # as Qwen3's MoE checkpoints
            decoder_sparse_step=1,
            mlp_only_layers=[],
            **_common(shape),
        )
    return Qwen3Config(**_common(shape))


def _common(shape: ModelShape) -> dict[str, Any]:
    return dict(
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
    config: Qwen3Config | Qwen3MoeConfig,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A randomly initialised ``Qwen3ForCausalLM`` (``Qwen3MoeForCausalLM`` for a MoE
    config); the same seed gives the same weights.

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
        model: PreTrainedModel
        if isinstance(config, Qwen3MoeConfig):
            model = Qwen3MoeForCausalLM(config)
        else:
            model = Qwen3ForCausalLM(config)
    # nn.Module.to rather than the model's own: transformers wraps it in a way mypy cannot
    # type, and its override only adds checks for quantised models.
    torch.nn.Module.to(model, dtype=dtype)
    return model
