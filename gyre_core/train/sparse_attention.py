"""Block-sparse tree attention in plain torch: forward *and* backward on any device.

FlexAttention is the block-sparse path of choice on GPUs, but torch has no flex backward
on CPU. This path computes the same thing. Queries are cut into blocks of ``BLOCK`` rows;
block ``[qa, qb)`` needs only the keys ``k < qb`` with ``subtree_end[k] > qa`` (in
preorder: the union of the block's ancestor paths). Blocks are grouped into a few
*buckets* of similar key counts; each bucket gathers its keys with one ``index_select``
(padded to the bucket's largest count) and runs one batched SDPA with the exact tree mask.
Work is about ``L * (depth + BLOCK)`` instead of ``L * L``, in a handful of large ops —
few ops matter: each one's backward allocates a gradient the size of the whole sequence.

It plugs into transformers as the attention implementation ``"gyre_tree"``: the model is
called with ``attention_mask`` set to the ``[1, 1, 1, L]`` tensor of subtree ends (a 4-D
tensor, which transformers hands to the attention function untouched).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

NAME = "gyre_tree"
# Query rows per block. Smaller blocks gather tighter key sets, but the key sets of a
# tree's blocks hardly shrink (each token needs its whole ancestor path) while small SDPA
# calls run far below peak: on a 2-core CPU, an 8k-token sample of agentic-cpu took
# 18.4 / 12.4 / 8.4 / 7.6 s forward + backward at 32 / 64 / 128 / 256 rows.
BLOCK = 256
# A bucket may pad its blocks' key lists by at most this share of their total length.
MAX_PAD = 0.2


@dataclass(frozen=True, slots=True)
class Bucket:
    blocks: torch.Tensor  # [nb] indices of the query blocks in this bucket
    keys: torch.Tensor  # [nb * M] key indices, each block's padded to M
    mask: torch.Tensor  # [nb, 1, BLOCK, M] True where the query may attend the key
    width: int  # M


@dataclass(frozen=True, slots=True)
class Plan:
    n: int
    block: int
    end: torch.Tensor
    buckets: list[Bucket]
    order: torch.Tensor  # inverse permutation: bucket-major block order -> block order


def make_plan(end: torch.Tensor, block: int) -> Plan:
    n = len(end)
    nb = -(-n // block)
    ks = torch.arange(n, device=end.device)
    needs = []
    for b in range(nb):
        qa, qb = b * block, min(n, (b + 1) * block)
        needs.append(torch.nonzero((ks < qb) & (end > qa)).flatten())
    by_size = sorted(range(nb), key=lambda b: len(needs[b]))
    groups: list[list[int]] = []
    for b in by_size:  # ascending sizes: a group's width is its last block's size
        if groups:
            g = groups[-1]
            width = len(needs[b])
            total = sum(len(needs[x]) for x in g) + width
            if width * (len(g) + 1) <= (1 + MAX_PAD) * total:
                g.append(b)
                continue
        groups.append([b])
    buckets = []
    rows = torch.arange(nb * block, device=end.device).view(nb, block)
    for g in groups:
        width = max(len(needs[b]) for b in g)
        keys = torch.zeros(len(g), width, dtype=torch.long, device=end.device)
        valid = torch.zeros(len(g), width, dtype=torch.bool, device=end.device)
        for i, b in enumerate(g):
            keys[i, : len(needs[b])] = needs[b]
            valid[i, : len(needs[b])] = True
        q = rows[g][:, :, None]  # [nb, BLOCK, 1]; rows past n attend to key 0 (discarded)
        k = keys[:, None, :]
        mask = ((k <= q) & (q < end[k]) & valid[:, None, :]) | ((q >= n) & (k == 0))
        buckets.append(
            Bucket(torch.tensor(g, device=end.device), keys.flatten(), mask[:, None], width)
        )
    perm = torch.tensor([b for g in groups for b in g], device=end.device)
    return Plan(n, block, end.clone(), buckets, torch.argsort(perm))


_cache: list[Plan] = []  # the last plan: every layer of one forward reuses it


def plan_for(end: torch.Tensor, block: int) -> Plan:
    if _cache:
        p = _cache[0]
        if p.n == len(end) and p.block == block and torch.equal(p.end, end):
            return p
    p = make_plan(end, block)
    _cache[:] = [p]
    return p


def tree_sparse_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query`` ``[B, H, L, D]``, ``key``/``value``
    ``[B, Hkv, L, D]``; returns ``[B, L, H, D]``. Without a mask the sample is one plain
    sequence (a chain: every token's subtree runs to the end), i.e. causal attention."""
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} attention takes one packed sample at a time")
    _, heads, n, dim = query.shape
    if attention_mask is None:
        attention_mask = torch.full((n,), n, dtype=torch.long, device=query.device)
    elif attention_mask.dtype != torch.long or attention_mask.numel() != n:
        raise ValueError(f"{NAME} attention takes the [1, 1, 1, L] subtree ends as attention_mask")
    plan = plan_for(attention_mask.reshape(-1).to(query.device), BLOCK)
    groups = heads // key.shape[1]
    if groups > 1:  # grouped-query attention: share each key/value head
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    nb, block = len(plan.order), plan.block
    q = F.pad(query[0], (0, 0, 0, nb * block - n)).view(heads, nb, block, dim).transpose(0, 1)
    outs = []
    for b in plan.buckets:
        kb = key[0].index_select(1, b.keys).view(heads, -1, b.width, dim).transpose(0, 1)
        vb = value[0].index_select(1, b.keys).view(heads, -1, b.width, dim).transpose(0, 1)
        qb = q.index_select(0, b.blocks)
        outs.append(F.scaled_dot_product_attention(qb, kb, vb, attn_mask=b.mask, scale=scaling))
    out = torch.cat(outs).index_select(0, plan.order)  # [nb, H, BLOCK, D] in block order
    out = out.transpose(0, 1).reshape(heads, nb * block, dim)[:, :n]
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None


AttentionInterface.register(NAME, tree_sparse_attention)
