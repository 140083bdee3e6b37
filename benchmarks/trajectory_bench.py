"""Trajectory processor benchmark: deduplication, build scale, and training throughput.

Prints measured figures (nothing is asserted):

1. dedup ratios of synthetic workloads (``gyre traj synth`` presets and CPU-sized ones);
2. build time and peak memory of the prefix trees for a log of >= 1e7 tokens per call;
3. training throughput of a Qwen3 (4 layers, hidden 256) on CPU, in *generated tokens
   trained per second* — the workload's unique generated tokens divided by the time one
   pass of forward + backward over the workload takes — for tree-packed samples (block-
   sparse tree attention), per-branch linear sequences and per-call sequences (causal
   SDPA). Per-call training is timed on a random subset of calls holding about
   ``--call-sample`` tokens and scaled by tokens (it is 10x+ the work of the others).

    .venv/bin/python benchmarks/trajectory_bench.py            # everything (~10 min, 2 cores)
    .venv/bin/python benchmarks/trajectory_bench.py --quick    # smaller, for the demo
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.train.tree_attention import tree_pg_loss
from gyre_core.trajectory.pack import pack_trees
from gyre_core.trajectory.rewards import assign_weights, branch_ends
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.synth import PRESETS, SynthConfig, synth_rollouts
from gyre_core.trajectory.tree import PrefixTree, build_trees
from gyre_core.trajectory.writer import write_rollouts

VOCAB = 2048
# CPU-sized agent workloads: GRPO groups on a shared task prompt, compaction, sub-agents,
# retries, contexts capped at a few thousand tokens so that a 2-core CPU trains them.
CPU_WORKLOADS: dict[str, SynthConfig] = {
    "agentic-cpu": replace(
        PRESETS["agentic"], groups=2, group_size=8, turns=10, prompt_tokens=12,
        completion_tokens=40, tool_tokens=80, system_tokens=1500, summary_tokens=60,
        compaction_every=6, max_context=4096, vocab_size=VOCAB,
    ),
    "retry-heavy-cpu": replace(
        PRESETS["agentic"], groups=2, group_size=4, turns=12, prompt_tokens=12,
        completion_tokens=40, tool_tokens=80, system_tokens=400, summary_tokens=60,
        compaction_every=0, retry_prob=0.3, subagent_prob=0.15, max_context=4096,
        vocab_size=VOCAB, seed=1,
    ),
}  # fmt: skip


def dedup_table(names: list[str]) -> None:
    print("\n== dedup ratios (gyre traj stats) ==")
    print(f"{'workload':<16}{'rollouts':>9}{'calls':>7}{'per_call':>12}{'per_branch':>12}"
          f"{'unique':>10}{'vs_call':>9}{'vs_branch':>10}")  # fmt: skip
    for name in names:
        cfg = CPU_WORKLOADS.get(name) or PRESETS[name]
        s = tree_stats(build_trees(synth_rollouts(cfg)).values())
        print(f"{name:<16}{s['rollouts']:>9}{s['calls']:>7}{s['tokens_per_call']:>12}"
              f"{s['tokens_per_branch']:>12}{s['tokens_unique']:>10}{s['dedup_vs_call']:>9.2f}"
              f"{s['dedup_vs_branch']:>10.2f}")  # fmt: skip


def build_scale() -> None:
    """Build the trees of the ``long`` preset from its file in a fresh process."""
    print("\n== build scale: the 'long' preset, read + tree build in a fresh process ==")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.jsonl"
        write_rollouts(path, synth_rollouts(PRESETS["long"]), compress=False)
        code = (
            "import json,resource,sys,time\n"
            "from gyre_core.trajectory import build_trees, read_rollouts, tree_stats\n"
            "t=time.perf_counter(); trees=build_trees(read_rollouts(sys.argv[1])); "
            "b=time.perf_counter()-t\n"
            "s=tree_stats(trees.values())\n"
            "print(json.dumps({'build_s':round(b,2),'peak_rss_mb':"
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024,**s}))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
        )
        r = json.loads(out.stdout)
        mb = path.stat().st_size / 1e6
        print(f"file {mb:.1f} MB, {r['calls']} calls, tokens_per_call {r['tokens_per_call']:.3g}, "
              f"tokens_unique {r['tokens_unique']:.3g}")  # fmt: skip
        print(f"read + build {r['build_s']} s, peak RSS of the whole process {r['peak_rss_mb']} MB")


def branch_sequences(tree: PrefixTree, adv: list[float]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each rollout branch as (tokens, per-token weight on what its rollout generated)."""
    out = []
    for r, ends in sorted(branch_ends(tree).items()):
        for end in sorted(ends, key=lambda n: (n.start, int(n.tokens[0]))):
            path = tree.path(end)
            on_path = set(path)
            w = np.zeros(end.end)
            for c in tree.rollouts[r].calls:
                ref = tree.calls[c]
                if ref.node in on_path:
                    w[ref.prompt_len : ref.full_len] = adv[r]
            out.append((np.concatenate([n.tokens for n in path]).astype(np.int64), w))
    return out


def call_sequences(tree: PrefixTree, adv: list[float]) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for i, c in enumerate(tree.calls):
        w = np.zeros(c.full_len)
        w[c.prompt_len :] = adv[c.rollout]
        out.append((tree.sequence(i).astype(np.int64), w))
    return out


def linear_pass(model: torch.nn.Module, seqs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    t0 = time.perf_counter()
    for ids, w in seqs:
        x = torch.from_numpy(ids).to(model.device)
        logits = model(input_ids=x[None], use_cache=False).logits[0, :-1].float()
        lp = logits.gather(1, x[1:, None])[:, 0] - logits.logsumexp(-1)
        loss = -(torch.from_numpy(w[1:]).float().to(lp.device) * lp).sum()
        loss.backward()
    return time.perf_counter() - t0


def tree_pass(model: torch.nn.Module, samples: list, impl: str) -> float:
    t0 = time.perf_counter()
    for s in samples:
        loss, _ = tree_pg_loss(model, s, impl)
        loss.backward()
    return time.perf_counter() - t0


def throughput(
    name: str, max_tokens: int, call_sample: int, vocab: int = VOCAB, seed: int = 0
) -> dict[str, float]:
    cfg = CPU_WORKLOADS[name]
    trees = list(build_trees(synth_rollouts(cfg)).values())
    stats = tree_stats(trees)
    advs = [assign_weights(t, mode="once") for t in trees]
    samples = pack_trees(trees, max_tokens)
    branches = [b for t, a in zip(trees, advs, strict=True) for b in branch_sequences(t, a)]
    calls = [c for t, a in zip(trees, advs, strict=True) for c in call_sequences(t, a)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(calls))
    subset, n = [], 0
    for i in order:
        if n >= call_sample:
            break
        subset.append(calls[i])
        n += len(calls[i][0])
    call_tokens = sum(len(c[0]) for c in calls)

    conf = tiny_qwen3_config(ModelShape(vocab, max_positions=max(8192, max_tokens)))
    tree_model = build_model(conf, attn_implementation="gyre_tree")
    lin_model = build_model(conf, attn_implementation="sdpa")
    gen = stats["trainable_tokens_unique"]
    tree_pass(tree_model, samples[:1], "sparse")  # warm-up
    linear_pass(lin_model, branches[:1])
    t_tree = tree_pass(tree_model, samples, "sparse")
    t_branch = linear_pass(lin_model, branches)
    t_call = linear_pass(lin_model, subset) * call_tokens / n
    packed = sum(len(s) for s in samples)
    # Attention work: (query, key) pairs. A tree token attends to its depth + 1 ancestors;
    # a causal linear sequence of length l holds l (l + 1) / 2 pairs.
    tree_pairs = sum(int((s.position_ids + 1).sum()) for s in samples)
    branch_pairs = sum(len(b[0]) * (len(b[0]) + 1) // 2 for b in branches)
    res = {
        "dedup_vs_branch": stats["dedup_vs_branch"],
        "dedup_vs_call": stats["dedup_vs_call"],
        "tokens_unique": stats["tokens_unique"],
        "generated_unique": gen,
        "samples": len(samples),
        "packing_overhead": round(packed / stats["tokens_unique"] - 1, 4),
        "tree_tok_s": gen / t_tree,
        "branch_tok_s": gen / t_branch,
        "call_tok_s": gen / t_call,
    }
    res["speedup_vs_branch"] = res["tree_tok_s"] / res["branch_tok_s"]
    res["speedup_vs_call"] = res["tree_tok_s"] / res["call_tok_s"]
    res["target_vs_branch"] = 0.8 * stats["dedup_vs_branch"]
    res["token_ratio"] = stats["tokens_per_branch"] / packed
    res["pair_ratio"] = branch_pairs / tree_pairs
    print(f"\n-- {name}, vocab {vocab}: max_tokens {max_tokens}, {len(samples)} samples, "
          f"{len(branches)} branches, {len(calls)} calls ({len(subset)} timed) --")  # fmt: skip
    print(f"dedup_vs_branch {res['dedup_vs_branch']:.2f}  dedup_vs_call {res['dedup_vs_call']:.2f}  "
          f"packing_overhead {res['packing_overhead']:.3f}  generated tokens {gen}")  # fmt: skip
    print(
        f"tree-packed  {res['tree_tok_s']:8.1f} generated tok/s  ({t_tree:.1f} s, {packed} tokens)"
    )
    print(f"per-branch   {res['branch_tok_s']:8.1f} generated tok/s  ({t_branch:.1f} s, "
          f"{stats['tokens_per_branch']} tokens)")  # fmt: skip
    print(f"per-call     {res['call_tok_s']:8.1f} generated tok/s  ({t_call:.1f} s scaled from "
          f"{n} of {call_tokens} tokens)")  # fmt: skip
    print(f"speedup vs per-branch {res['speedup_vs_branch']:.2f}x (target >= 0.8 x dedup = "
          f"{res['target_vs_branch']:.2f}x), vs per-call {res['speedup_vs_call']:.2f}x")  # fmt: skip
    print(f"bounds: tokens per-branch / packed {res['token_ratio']:.2f}x (compute per token), "
          f"attention pairs per-branch / packed {res['pair_ratio']:.2f}x (attention-bound)")  # fmt: skip
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="one small workload, no build-scale run")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--call-sample", type=int, default=60_000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, "
          f"peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")  # fmt: skip
    if args.quick:
        dedup_table(["agentic-cpu"])
        throughput("agentic-cpu", args.max_tokens, args.call_sample // 4)
        return
    dedup_table(["tiny", "agentic", "long", *CPU_WORKLOADS])
    build_scale()
    print("\n== training throughput, Qwen3 4 layers x hidden 256, CPU ==")
    for name in CPU_WORKLOADS:
        throughput(name, args.max_tokens, args.call_sample)
    # A real tokenizer's vocabulary: the LM head makes compute per token dominate.
    throughput("agentic-cpu", args.max_tokens, args.call_sample, vocab=32_768)


if __name__ == "__main__":
    main()
