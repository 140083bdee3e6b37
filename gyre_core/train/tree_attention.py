"""Tree attention over a packed sample, and the policy-gradient loss on it.

A packed sample lays one or more token trees out in depth-first preorder, so token ``k``'s
subtree is the index range ``[k, end[k])`` and token ``q`` may attend to ``k`` iff
``k <= q < end[k]`` (``k`` is an ancestor-or-self of ``q``). Two ways to hand that to a
transformers model:

* ``dense``: an ``[L, L]`` mask passed as a 4D additive mask. transformers 5.23 returns
  any 4D mask as-is (``masking_utils._preprocess_mask_arguments``), before it would try to
  detect packed sequences from ``position_ids``; works with the ``sdpa``, ``eager`` and
  ``flex_attention`` backends, on any device and dtype, with gradients. Built in the
  dtype the model computes in (:func:`compute_dtype`: bf16 under FSDP2's bf16 policy)
  with that dtype's own most negative value: CUDA's SDPA refuses a bias of another dtype
  than the query's, and float32's ``finfo.min`` cast to bf16 is -inf.
* ``flex``: a block-sparse ``BlockMask`` for ``attn_implementation="flex_attention"``,
  built in O(L + blocks²) without materialising the ``[L, L]`` mask. On CPU, torch 2.13
  runs it forward only (no backward) and only in float32/float16/bfloat16.
* ``sparse``: block-sparse in plain torch (``sparse_attention.py``) for
  ``attn_implementation="gyre_tree"``: forward and backward on any device and dtype,
  about ``L * (depth + block)`` work instead of ``L * L``. The CPU training path.

Token ``i`` is predicted by the logits at ``parent[i]``; a root has no prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch.distributed.fsdp import FSDPModule
from torch.nn.attention.flex_attention import BlockMask
from transformers import PreTrainedModel

from gyre_core.train import sparse_attention
from gyre_core.trajectory.sample import PackedSample

Impl = Literal["dense", "flex", "sparse"]
FLEX_BLOCK_SIZE = 128  # flex attention's default sparse block size


def _as_numpy(parent: torch.Tensor | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    if isinstance(parent, torch.Tensor):
        return np.asarray(parent.detach().cpu().numpy(), dtype=np.int64)
    return np.asarray(parent, dtype=np.int64)


def tree_subtree_end(parent: torch.Tensor | npt.NDArray[np.int64]) -> torch.Tensor:
    """``end[k]``: one past the last index of ``k``'s subtree, after checking the layout.

    Raises ``ValueError`` unless ``parent`` is a preorder forest: ``-1 <= parent[i] < i``
    and every subtree contiguous. A layout that breaks contiguity would make the one-
    comparison mask silently let tokens attend to strangers, so it is rejected here.
    Returns a LongTensor on ``parent``'s device (CPU for a numpy input).
    """
    par = _as_numpy(parent)
    n = len(par)
    idx = np.arange(n)
    if n and (np.any(par < -1) or np.any(par >= idx)):
        raise ValueError("parent[i] must be -1 (a root) or an earlier index")
    # One O(L) pass from the back: children come after parents, so fold each token's end
    # and size into its parent. Plain lists: much faster than numpy scalar indexing.
    pl = par.tolist()
    end = list(range(1, n + 1))
    size = [1] * n
    for i in range(n - 1, -1, -1):
        p = pl[i]
        if p >= 0:
            end[p] = max(end[p], end[i])
            size[p] += size[i]
    ends = np.asarray(end, dtype=np.int64)
    if not np.array_equal(ends - idx, np.asarray(size, dtype=np.int64)):
        bad = int(np.flatnonzero(ends - idx != np.asarray(size))[0])
        raise ValueError(f"not a preorder layout: the subtree of token {bad} is not contiguous")
    device = parent.device if isinstance(parent, torch.Tensor) else torch.device("cpu")
    return torch.from_numpy(ends).to(device)


def dense_tree_mask(parent: torch.Tensor | npt.NDArray[np.int64]) -> torch.Tensor:
    """Boolean ``[L, L]`` mask, ``mask[q, k]`` true iff ``k`` is an ancestor-or-self of ``q``."""
    end = tree_subtree_end(parent)
    ar = torch.arange(len(end), device=end.device)
    q, k = ar[:, None], ar[None, :]
    return (k <= q) & (q < end[None, :])


def dense_tree_masks(
    parents: Sequence[torch.Tensor | npt.NDArray[np.int64]], length: int | None = None
) -> torch.Tensor:
    """Masks for several samples, right-padded to ``length``: bool ``[B, length, length]``.

    A padding position attends to itself only, so its softmax row stays finite (an all-
    masked row gives NaN in sdpa, which would leak into gradients via 0 * NaN); no real
    token ever attends to padding.
    """
    sizes = [len(p) for p in parents]
    length = max(sizes, default=0) if length is None else length
    if any(s > length for s in sizes):
        raise ValueError(f"a sample of {max(sizes)} tokens does not fit length {length}")
    out = torch.eye(length, dtype=torch.bool).repeat(len(parents), 1, 1)
    for b, p in enumerate(parents):
        out[b, : sizes[b], : sizes[b]] = dense_tree_mask(p).cpu()
    return out


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``mask`` is true, the dtype's most negative value elsewhere.

    Additive rather than boolean because transformers' eager attention adds the mask to
    the scores (a bool mask would add 0/1) and its flex path adds a tensor mask as a
    score_mod; sdpa takes either. finfo.min rather than -inf, as transformers itself does:
    a row with every key masked (padding) then softmaxes to something finite, not NaN.
    """
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype ``model``'s forward computes in (its queries, keys and values): the
    parameter dtype of FSDP2's mixed-precision policy when it has one (the weights
    themselves stay in their master dtype), else the model's own dtype."""
    if isinstance(model, FSDPModule):
        policy = getattr(model._get_fsdp_state(), "_mp_policy", None)
        if policy is not None and policy.param_dtype is not None:
            wanted: torch.dtype = policy.param_dtype
            return wanted
    dtype: torch.dtype = model.dtype  # type: ignore[assignment]
    return dtype


def check_mask_dtype(mask: torch.Tensor | BlockMask, dtype: torch.dtype) -> None:
    """Refuse an additive (floating-point) ``mask`` of another dtype than ``dtype``, the one
    the model computed in: CUDA's SDPA refuses such a bias where the CPU's accepts it."""
    if isinstance(mask, torch.Tensor) and mask.is_floating_point() and mask.dtype != dtype:
        raise ValueError(
            f"the tree mask is {mask.dtype} but the model computes in {dtype}: the attention "
            "bias must have the query's dtype (CUDA's SDPA refuses another)"
        )


def _tree_mask_mod(end: torch.Tensor) -> Any:
    # A module-level factory, so every block mask's mask_mod has the same code object and
    # torch.compile sees only a new captured tensor, not a new function, per sample.
    def mask_mod(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        return (kv <= q) & (q < end[kv])

    return mask_mod


def flex_tree_block_mask(
    parent: torch.Tensor | npt.NDArray[np.int64],
    *,
    block_size: int = FLEX_BLOCK_SIZE,
    device: torch.device | str | None = None,
) -> BlockMask:
    """A ``BlockMask`` (batch 1, shared by all heads) for the tree of ``parent``.

    Equal to ``create_block_mask(kv <= q & q < end[kv], ...)`` but computed per block from
    ``end`` alone, without the ``[L, L]`` mask that ``create_block_mask`` materialises
    when not compiled. For q block ``i`` starting at ``qa`` and ending at ``qb`` and kv
    block ``j < i``: some ``(q, k)`` is allowed iff ``max(end[k in j]) > qa``, all are iff
    ``min(end[k in j]) >= qb``; a diagonal block is always partial; later blocks are empty.
    """
    end = tree_subtree_end(parent)
    dev = torch.device(device) if device is not None else end.device
    end = end.to(dev)
    n = len(end)
    nb = max(1, -(-n // block_size))
    # Pad to whole blocks with end = 0 (allows nothing): the kernels may call mask_mod on
    # kv indices past L inside the last block, and end[kv] must stay in bounds.
    end_pad = torch.zeros(nb * block_size, dtype=torch.long, device=dev)
    end_pad[:n] = end
    blocks = end_pad.view(nb, block_size)
    max_end = blocks.max(dim=1).values
    # A ragged last block is never full (create_block_mask pads with False).
    min_end = blocks.min(dim=1).values
    bi = torch.arange(nb, device=dev)
    i, j = bi[:, None], bi[None, :]
    qa, qb = i * block_size, (i + 1) * block_size
    whole = qb <= n  # q block lies fully inside the sequence
    full = (j < i) & (min_end[None, :] >= qb) & whole
    if block_size == 1:
        full |= (j == i) & whole
    any_ = ((j < i) & (max_end[None, :] > qa)) | (j == i)
    partial = any_ & ~full

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Flex's layout: per q block, the count of kv blocks and their indices listed first.
        d = dense.to(torch.int32)[None, None]
        idx = torch.argsort(d, dim=-1, descending=True, stable=True)
        return d.sum(-1, dtype=torch.int32), idx.to(torch.int32)

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block_size,
        mask_mod=_tree_mask_mod(end_pad),
        seq_lengths=(n, n),
    )


def flex_unavailable_reason(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    requires_grad: bool = False,
) -> str | None:
    """Why the flex path cannot run here (``None`` if it can). Cheap: compiles nothing."""
    dev = torch.device(device)
    if dev.type == "cpu":
        if requires_grad:
            # torch.nn.attention.flex_attention._validate_device refuses this outright.
            return f"torch {torch.__version__} has no flex attention backward on CPU"
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return f"flex attention on CPU (inductor's C++ template) does not support {dtype}"
        try:
            # Flex attention only runs compiled; on CPU inductor needs a C++ compiler.
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as e:
            return f"no C++ compiler for torch inductor: {type(e).__name__}: {e}"
        return None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available"
        from torch.utils._triton import has_triton

        return None if has_triton() else "flex attention on CUDA needs triton"
    return f"flex attention is not wired up for device type {dev.type!r} here"


def flex_available(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    requires_grad: bool = False,
) -> bool:
    return flex_unavailable_reason(device, dtype, requires_grad=requires_grad) is None


def _needs_grad(model: torch.nn.Module) -> bool:
    return torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())


def tree_mask(
    model: PreTrainedModel, parent: torch.Tensor, impl: Impl = "dense"
) -> torch.Tensor | BlockMask:
    """The ``attention_mask`` that makes ``model`` attend along the tree of ``parent``.

    ``impl="flex"`` needs a model built with ``attn_implementation="flex_attention"``;
    ``impl="dense"`` works with ``eager``, ``sdpa`` or ``flex_attention`` (not flash
    attention, which cannot take an arbitrary mask); ``impl="sparse"`` needs
    ``attn_implementation="gyre_tree"``.
    """
    backend = str(model.config._attn_implementation)
    device, dtype = model.device, compute_dtype(model)
    if impl == "dense":
        if backend not in ("eager", "sdpa", "flex_attention"):
            raise ValueError(
                f"the dense tree mask needs eager, sdpa or flex attention, not {backend}"
            )
        return additive_mask(dense_tree_mask(parent).to(device), dtype)[None, None]
    if impl == "flex":
        if backend != "flex_attention":
            raise ValueError(
                f'impl="flex" needs attn_implementation="flex_attention", not {backend}'
            )
        reason = flex_unavailable_reason(device, dtype, requires_grad=_needs_grad(model))
        if reason is not None:
            raise RuntimeError(f"flex tree attention unavailable: {reason}")
        return flex_tree_block_mask(parent, device=device)
    if impl == "sparse":
        if backend != sparse_attention.NAME:
            raise ValueError(
                f'impl="sparse" needs attn_implementation="{sparse_attention.NAME}", not {backend}'
            )
        return tree_subtree_end(parent).to(device).view(1, 1, 1, -1)
    raise ValueError(f"unknown impl {impl!r}")


def tree_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    parent: torch.Tensor,
    impl: Impl = "dense",
) -> torch.Tensor:
    """Logits ``[L, V]`` for one packed sample (1-D ``input_ids``, ``position_ids``, ``parent``);
    see :func:`tree_mask` for the backend each ``impl`` needs. The trainer does not keep
    these: it projects the hidden states of :func:`tree_hidden` in chunks (``memory.py``)."""
    device = model.device
    mask = tree_mask(model, parent, impl)
    out = model(
        input_ids=input_ids.to(device)[None],
        position_ids=position_ids.to(device)[None],
        attention_mask=mask,
        use_cache=False,
    )
    logits: torch.Tensor = out.logits[0]
    check_mask_dtype(mask, logits.dtype)
    return logits


def tree_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    parent: torch.Tensor,
    impl: Impl = "dense",
) -> torch.Tensor:
    """The final hidden states ``[L, H]`` (after the last norm), which the output embedding
    turns into :func:`tree_forward`'s logits, without computing any logits.

    The root module's forward runs (``logits_to_keep`` empty, only the last hidden state
    captured), not its decoder alone: a model sharded with FSDP2's ``fully_shard`` gathers
    its root parameters and hooks its backward on the root's outputs, this one included.
    """
    device = model.device
    mask = tree_mask(model, parent, impl)
    out = model(
        input_ids=input_ids.to(device)[None],
        position_ids=position_ids.to(device)[None],
        attention_mask=mask,
        use_cache=False,
        logits_to_keep=torch.empty(0, dtype=torch.long, device=device),
        output_hidden_states=-1,
    )
    hidden: torch.Tensor = out.hidden_states[-1][0]
    check_mask_dtype(mask, hidden.dtype)
    return hidden


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, parent: torch.Tensor
) -> torch.Tensor:
    """``log softmax(logits[parent[i]])[input_ids[i]]`` for each token; 0 at roots.

    Computed as a gathered logit minus a per-row logsumexp, so no ``[L, V]`` log-softmax is
    kept for backward beyond what logsumexp needs. Half precision is lifted to float32.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    parent = parent.to(logits.device)
    src = parent.clamp(min=0)
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits[src, input_ids.to(logits.device)] - lse[src]
    return torch.where(parent >= 0, lp, torch.zeros_like(lp))


def tree_pg_loss(
    model: PreTrainedModel,
    sample: PackedSample,
    impl: Impl = "dense",
    *,
    normalise: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy-gradient loss ``-sum_i advantage_i * log pi(token_i)`` over trainable tokens.

    An unnormalised sum unless ``normalise`` is given, in which case it is divided by that
    (e.g. the number of trainable tokens in the whole batch, so samples add up). ``info``
    holds detached diagnostics: token counts, the mean new log-prob of trainable tokens and
    its mean difference from the behaviour log-prob (where that is known).
    """
    if normalise is not None and not normalise > 0:
        raise ValueError(f"normalise must be positive, got {normalise}")
    device = model.device
    ids = torch.from_numpy(sample.input_ids).to(device)
    pos = torch.from_numpy(sample.position_ids).to(device)
    parent = torch.from_numpy(sample.parent).to(device)
    trainable = torch.from_numpy(sample.trainable).to(device)
    if bool((trainable & (parent < 0)).any()):
        raise ValueError("a root token cannot be trainable: nothing predicts it")
    lp = token_logprobs(tree_forward(model, ids, pos, parent, impl), ids, parent)
    adv = torch.from_numpy(sample.advantage).to(device=device, dtype=lp.dtype)
    # where, not a product: a NaN advantage on an untrained token must not poison the sum.
    loss = -torch.where(trainable, adv * lp, torch.zeros_like(lp)).sum()
    if normalise is not None:
        loss = loss / normalise
    with torch.no_grad():
        n = int(trainable.sum())
        behaviour = torch.from_numpy(sample.logprob).to(device=device, dtype=lp.dtype)
        known = trainable & torch.isfinite(behaviour)
        info = {
            "tokens": float(len(sample)),
            "trainable_tokens": float(n),
            "loss": float(loss),
            "logprob_mean": float(lp[trainable].mean()) if n else float("nan"),
            "logprob_delta_mean": (
                float((lp - behaviour)[known].mean()) if bool(known.any()) else float("nan")
            ),
        }
    return loss, info
