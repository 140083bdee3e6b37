"""In-process learning probe (no Ray): supervised steps on fresh scripted demonstrations,
then optional RL steps, with greedy progress and credit on train and held-out tasks.

An investigation loop from tuning the learning demo: it builds the tiny Qwen3 the way ``gyre run`` does
(``model.tokenizer: suite``), trains it in this process and prints one line per
evaluation. ``--load``/``--save`` continue from / keep the weights.

    python benchmarks/probes/learning_probe.py [--sft 150] [--every 25] [--lr 1e-2] [--demos 8]
        [--rl 0] [--rl-lr 2e-3] [--reward partial|progress|binary] [--hidden 128]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core.config import RolloutConfig, RunConfig, TrainConfig
from gyre_core.envs import repo_suite
from gyre_core.rollout.agents import Codec, ModelAgent, ScriptedAgent
from gyre_core.rollout.harness import run_session
from gyre_core.rollout.router import Router
from gyre_core.rollout.task_env import RepoTaskEnv, make_env
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.session import make_model_dir
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.format import Rollout

IDX = repo_suite.SIZES.index("short")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tie", action="store_true", help="model.tie_embeddings")
    ap.add_argument("--no-hints", action="store_true", help="rollout.hints: off")
    ap.add_argument("--lr", type=float, default=1e-2, help="supervised learning rate")
    ap.add_argument("--demos", type=int, default=8, help="fresh demonstrations per step")
    ap.add_argument("--sft", type=int, default=150)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--evaln", type=int, default=6, help="tasks per greedy evaluation")
    ap.add_argument("--rl", type=int, default=0)
    ap.add_argument("--rl-lr", type=float, default=2e-3)
    ap.add_argument("--tasks", type=int, default=2, help="RL tasks per step")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--reward", default="partial", choices=("partial", "progress", "binary"))
    ap.add_argument("--workdir", default=".data/bench/learning-probe")
    ap.add_argument("--load", default="")
    ap.add_argument("--save", default="")
    ap.add_argument("--demo-base", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=4096, help="train.max_tokens")
    ap.add_argument(
        "--skip-check",
        type=float,
        default=0.0,
        help="warm_start.skip_check: the hasty demonstrator's skip rate",
    )
    args = ap.parse_args()
    asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    hints = not args.no_hints
    cfg = RunConfig.from_dict({
        "model": {"hidden_size": args.hidden, "layers": args.layers, "tokenizer": "suite",
                  "tie_embeddings": args.tie},
        "rollout": {"hints": "status" if hints else "off"},
    })  # fmt: skip
    model_dir = make_model_dir(cfg, Path(args.workdir))
    codec = Codec(AutoTokenizer.from_pretrained(str(model_dir)))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if args.load:
        model.load_state_dict(torch.load(args.load))
    train = TrainConfig(lr=args.lr, max_tokens=args.max_tokens)
    trainer = Trainer(model, train, staleness_bound=4, seed=0)
    sample = RolloutConfig(max_turns=24, context_budget=2048, max_new_tokens=16,
                           time_budget_s=0.0, token_budget=10**6)  # fmt: skip
    greedy = replace(sample, temperature=0.0)

    def env(split: str, k: int, seed: int) -> RepoTaskEnv:
        e = make_env("repo", split, k * 3 + IDX, seed, hints=hints)
        assert isinstance(e, RepoTaskEnv)
        return e

    async def evaluate(split: str) -> str:
        router = Router({"e": TorchEngine(model)})

        async def one(k: int) -> tuple[float, float]:
            e = env(split, k, 7 + k)
            r = await run_session(e, ModelAgent(router, codec), codec, greedy,
                                  rollout_id=f"ev{k}", seed=k)  # fmt: skip
            return r.progress, e.credit()

        got = await asyncio.gather(*(one(k) for k in range(args.evaln)))
        n = len(got)
        return (f"{split} progress {sum(p for p, _ in got) / n:.3f} "
                f"credit {sum(c for _, c in got) / n:.3f}")  # fmt: skip

    print(f"model {model_dir} vocab {len(codec.tokenizer)} ({time.perf_counter() - t0:.1f} s)")
    for step in range(1, args.sft + 1):
        demos = []
        for k in range(
            args.demo_base + step * args.demos, args.demo_base + (step + 1) * args.demos
        ):
            e = env("train", 10_000 + k, k)
            demos.append(await run_session(e, ScriptedAgent(e, codec, skip_check=args.skip_check, seed=k),
                                           codec, sample,
                                           rollout_id=f"d{k}"))  # fmt: skip
        loss = trainer.sft_step(trainer.prepare(demos, 0))["sft_loss"]
        if step % args.every == 0 or step == args.sft:
            print(f"sft {step} loss {loss:.3f} | {await evaluate('train')} | "
                  f"{await evaluate('heldout')} | {time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    trainer.version = 0
    if args.save:
        torch.save(model.state_dict(), args.save)
    for g in trainer.optimizer.param_groups:
        g["lr"] = args.rl_lr
    engine = TorchEngine(model)
    router = Router({"e": engine})
    for step in range(1, args.rl + 1):

        async def rollout(i: int, step: int = step) -> Rollout:
            task = step * args.tasks + i // args.group
            e = env("train", task, 1000 * step + i)
            r = await run_session(e, ModelAgent(router, codec), codec, sample,
                                  rollout_id=f"s{step}-{i}", group_id=f"s{step}-t{task}",
                                  seed=1000 * step + i)  # fmt: skip
            if args.reward == "partial":
                r.reward = e.credit()
            elif args.reward == "binary":
                r.reward = float(r.progress >= 1.0)
            return r

        batch = await asyncio.gather(*(rollout(i) for i in range(args.tasks * args.group)))
        trainer.step(batch)
        engine._version = trainer.version  # same weights object: only the tag moves
        reward = sum(r.reward or 0.0 for r in batch) / len(batch)
        line = f"rl {step} reward {reward:.3f} progress {sum(r.progress for r in batch) / len(batch):.3f}"
        if step % args.every == 0 or step == args.rl:
            line += f" | {await evaluate('heldout')}"
        print(f"{line} | {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
