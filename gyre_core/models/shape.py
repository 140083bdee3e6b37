"""``ModelShape``: a small Qwen3's architecture, light to import (no torch), so the CLI
builds its flags from it without paying for torch."""

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
    it as the size the tokenizer is trained to, and the model gets the tokenizer's."""

    vocab_size: int = field(default=4096, metadata={"help": "vocabulary size"})
    layers: int = field(default=4, metadata={"help": "transformer layers"})
    hidden: int = field(default=256, metadata={"help": "hidden size"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    kv_heads: int = field(default=2, metadata={"help": "key/value heads (divides heads)"})
    head_dim: int = field(default=64, metadata={"help": "size of one head (at least 32)"})
    intermediate: int = field(default=768, metadata={"help": "MLP intermediate size"})
    max_positions: int = field(default=32768, metadata={"help": "longest context"})
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
