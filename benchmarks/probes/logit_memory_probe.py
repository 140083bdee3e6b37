"""Peak memory of one trainer loss + backward on a long sample with a real vocabulary:
the full ``[L, V]`` logits (the trainer before ``train.logit_chunk``) against the chunked
projection (``train/memory.py``). One mode a process, so each peak RSS is its own:

    python benchmarks/probes/logit_memory_probe.py --mode full
    python benchmarks/probes/logit_memory_probe.py --mode chunked --chunk 1024
    python benchmarks/probes/logit_memory_probe.py --mode chunked --chunk 0

Prints the process's peak RSS (``ru_maxrss``) after building the model and after the
step, and their difference.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from gyre_core.config import TrainConfig
from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train.losses import TokenBatch, combine_loss, token_entropy
from gyre_core.train.trainer import Trainer, TrainerOptions, demo_sample
from gyre_core.train.tree_attention import token_logprobs, tree_forward


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("full", "chunked"), required=True)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--trained", type=int, default=3072, help="trained tokens of the sample")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(2)
    shape = ModelShape(
        args.vocab, layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2, head_dim=64,
        intermediate=3 * args.hidden, max_positions=args.tokens,
    )  # fmt: skip
    model = build_model(tiny_qwen3_config(shape), attn_implementation="gyre_tree")
    cfg = TrainConfig(max_tokens=args.tokens, logit_chunk=args.chunk)
    trainer = Trainer(model, cfg, staleness_bound=4, seed=0,
                      options=TrainerOptions(attention="sparse"))  # fmt: skip
    rng = np.random.default_rng(0)
    ids = rng.integers(0, args.vocab, args.tokens).tolist()
    cut = args.tokens - args.trained
    sample = demo_sample(ids[:cut], ids[cut:])
    sample.logprob = np.where(sample.trainable, -np.log(args.vocab), np.nan)
    sample.version = np.zeros(len(sample), dtype=np.int64)
    before = peak_mib()
    t0 = time.perf_counter()
    if args.mode == "chunked":
        loss, stats = trainer._sample_loss(sample, 0, float(args.trained))
        assert loss is not None
    else:  # what _sample_loss did before chunks
        t_ids, pos = torch.from_numpy(sample.input_ids), torch.from_numpy(sample.position_ids)
        parent = torch.from_numpy(sample.parent)
        idx = torch.from_numpy(np.flatnonzero(sample.trainable))
        logits = tree_forward(model, t_ids, pos, parent, "sparse")
        lp = token_logprobs(logits, t_ids, parent)[idx]
        col = lambda a: torch.from_numpy(a).to(lp.dtype)[idx]  # noqa: E731
        batch = TokenBatch(lp, col(sample.logprob), col(sample.advantage))
        loss, stats = combine_loss(trainer.loss_fn, batch, trainer.loss_settings, args.trained)
        stats.entropy = float(token_entropy(logits.detach()[parent[idx]]).sum())
    loss.backward()
    secs = time.perf_counter() - t0
    after = peak_mib()
    label = args.mode if args.mode == "full" else f"chunked {args.chunk}"
    print(f"{label}: peak RSS {before:.0f} MiB before the step, {after:.0f} MiB after "
          f"(+{after - before:.0f} MiB), {secs:.1f} s; loss {float(loss.detach()):.6f}, "
          f"entropy {stats.entropy / args.trained:.6f}")  # fmt: skip


if __name__ == "__main__":
    main()
