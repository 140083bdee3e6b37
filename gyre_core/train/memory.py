"""What keeps the trainer's memory down: log-probs projected in chunks, activation
checkpointing, and the check that ``train.precision`` is what the model computes in.

The trainer never materialises a sample's ``[L, V]`` logits. :func:`tree_logprobs` runs the
model to its final hidden states (``tree_hidden``), keeps the rows that predict a trained
token (``parent[i]`` for each trained ``i``) and projects them ``chunk`` rows at a time,
each chunk under ``torch.utils.checkpoint`` (non-reentrant): the forward keeps only a
chunk's log-probs, and the backward recomputes one chunk's logits at a time. The chosen
token's log-prob and the entropy (detached) come from a chunk's logits lifted to float32.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from gyre_core.train.tree_attention import Impl, tree_hidden


def _project(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``targets`` ``[n]`` under ``head(hidden)`` and (detached) entropies
    ``[n]``, or an empty one when not asked for."""
    # One name for the logits and their log-softmax, so the logits go as soon as it exists
    # (log_softmax keeps its output for the backward, not its input).
    x = head(hidden)
    x = torch.log_softmax(x.to(torch.promote_types(x.dtype, torch.float32)), -1)
    lp = x.gather(-1, targets[:, None])[:, 0]
    # After lp, with no saved tensor: a backward's recompute stops before it (torch's
    # non-reentrant checkpoint stops early once it has what the backward needs).
    with torch.no_grad():
        ent = -x.exp().mul_(x).sum(-1) if entropy else x.new_empty(0)
    return lp, ent


def chunked_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    *,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log softmax(head(hidden[r]))[targets[r]]`` per row ``r`` (``[n]``, float32 or
    wider, with gradient) and each row's entropy (detached; empty unless ``entropy``).

    ``chunk`` rows at a time, each under activation checkpointing while gradients are on;
    ``chunk=0`` projects every row at once and keeps their logits for the backward, as
    does a single chunk (``n <= chunk``): its backward would rebuild them all at once.
    """
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0, got {chunk}")
    n = len(hidden)
    if chunk == 0 or chunk >= n:
        return _project(head, hidden, targets, entropy)
    recompute = torch.is_grad_enabled()
    lps, ents = [], []
    for a in range(0, n, chunk):
        h, t = hidden[a : a + chunk], targets[a : a + chunk]
        if recompute:
            lp, ent = checkpoint(_project, head, h, t, entropy, use_reentrant=False)
        else:
            lp, ent = _project(head, h, t, entropy)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), torch.cat(ents)


def tree_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    parent: torch.Tensor,
    rows: torch.Tensor,
    impl: Impl = "dense",
    *,
    chunk: int = 0,
    entropy: bool = True,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the tokens ``rows`` (indices into the sample; none may be a root) and,
    with ``entropy``, the entropy of the distribution each was drawn from: what
    ``token_logprobs(tree_forward(...))[rows]`` and ``token_entropy(logits[parent[rows]])``
    give, without the ``[L, V]`` logits (see the module docstring). ``precision``: the
    run's ``train.precision``, checked against what the model computed in."""
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError(
            "chunked log-probs project with the output embedding alone: "
            "a model that soft-caps its logits is not supported"
        )
    weights = next(model.parameters()).dtype  # before the forward: FSDP2's float32 shards
    hidden = tree_hidden(model, input_ids, position_ids, parent, impl)
    check_precision(precision, weights, hidden.dtype)
    rows = rows.to(hidden.device)
    src = parent.to(hidden.device)[rows]
    if bool((src < 0).any()):
        raise ValueError("a root token cannot be trained: nothing predicts it")
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    if not isinstance(head, torch.nn.Module):
        raise ValueError(f"{type(model).__name__} has no output embedding to project with")
    targets = input_ids.to(hidden.device)[rows]
    return chunked_logprobs(head, hidden[src], targets, chunk, entropy=entropy)


def apply_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer in the backward instead of keeping its activations
    (transformers' own, non-reentrant ``torch.utils.checkpoint``). It checkpoints a
    layer's ``forward``, so module hooks (FSDP2's gather and reshard) stay outside the
    recompute; it holds before or after ``fully_shard``, and renames no parameter."""
    if not model.supports_gradient_checkpointing:
        raise ValueError(f"{type(model).__name__} does not support activation checkpointing")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def check_precision(precision: str, weights: torch.dtype, compute: torch.dtype) -> None:
    """Refuse ``train.precision="bf16"`` unless the model keeps float32 (master) ``weights``
    (their dtype between forwards) and its ``compute`` dtype is bfloat16, as FSDP2's
    mixed-precision policy has it (``ShardedTrainer``)."""
    if precision == "bf16" and (weights, compute) != (torch.float32, torch.bfloat16):
        raise ValueError(
            'train.precision="bf16" needs the sharded trainer (FSDP2\'s mixed-precision '
            f"policy: float32 weights, bfloat16 compute); this model holds {weights} "
            f'weights and computes in {compute}. Use train.precision="fp32" here'
        )
