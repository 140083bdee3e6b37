"""``ModelShape``: a small Qwen3's architecture (dense, or a mixture of experts), light to
import (no torch), so the CLI builds its flags from it without paying for torch."""

from __future__ import annotations

from dataclasses import dataclass, field

TINY_HEAD_DIM = 32  # the head size of a run's tiny model (model.hidden_size wide)


def tiny_heads(hidden_size: int) -> int:
    """The query heads of a run's tiny model: ``model.hidden_size // 32``, at least one.
    The one place this is computed: the model build (runtime/session.py) uses it, and the
    config's cross-check (``model.kv_heads`` must divide it) reads it."""
    return max(1, hidden_size // TINY_HEAD_DIM)


@dataclass(frozen=True)
class ModelShape:
    """A small Qwen3's architecture: each argument's one home and its one default (the CLI's
    ``gyre model init`` flags are these fields). Full attention on every layer, no dropout,
    no sliding window. ``vocab_size`` is the model's vocabulary; ``init_checkpoint`` reads
    it as the size the tokenizer is trained to, and the model gets the tokenizer's.
    ``experts > 0`` makes it a Qwen3-MoE (transformers' ``Qwen3MoeForCausalLM``): every
    layer's MLP is ``experts`` experts of ``moe_intermediate`` width, each token routed to
    ``experts_per_token`` of them (their weights renormalised, as Qwen3's MoE models do);
    ``intermediate`` is then unused."""

    vocab_size: int = field(default=4096, metadata={"help": "vocabulary size"})
    layers: int = field(default=4, metadata={"help": "transformer layers"})
    hidden: int = field(default=256, metadata={"help": "hidden size"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    kv_heads: int = field(default=2, metadata={"help": "key/value heads (divides heads)"})
    head_dim: int = field(default=64, metadata={"help": "size of one head (at least 32)"})
    intermediate: int = field(default=768, metadata={"help": "MLP intermediate size"})
    max_positions: int = field(default=32768, metadata={"help": "longest context"})
    experts: int = field(
        default=0, metadata={"help": "experts per MoE layer (0: a dense MLP)", "min": 0}
    )
    experts_per_token: int = field(
        default=2, metadata={"help": "experts each token is routed to (MoE only)"}
    )
    moe_intermediate: int = field(
        default=256, metadata={"help": "one expert's MLP intermediate size (MoE only)"}
    )
    tie_embeddings: bool = field(
        default=False, metadata={"help": "share the input embedding with the output head"}
    )

    def __post_init__(self) -> None:
        if self.head_dim < 32:
            # A floor kept on purpose: tinier heads would run attention kernels (flex,
            # sdpa's fused paths) in shapes no real model uses, so tests on them would
            # prove less.
            raise ValueError(f"head_dim must be >= 32, got {self.head_dim}")
        if self.heads % self.kv_heads != 0:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.experts < 0:
            raise ValueError(f"experts must be >= 0 (0: a dense MLP), got {self.experts}")
        if self.experts and not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(
                f"experts_per_token must be between 1 and experts ({self.experts}), "
                f"got {self.experts_per_token}"
            )
        if self.experts and self.moe_intermediate < 1:
            raise ValueError(f"moe_intermediate must be >= 1, got {self.moe_intermediate}")

    @property
    def architecture(self) -> str:
        """The transformers class of this shape's model."""
        return "Qwen3MoeForCausalLM" if self.experts else "Qwen3ForCausalLM"
