"""In-process RL probe (no Ray, no scheduler): the learn config's RL steps on one torch
engine, with the numbers that say *what* the policy learns, step by step.

Besides each step's reward and progress it prints the policy's probability of checking
when the status bar names an untested component, measured on a fixed set of contexts
(hasty demonstrations of tasks no run trains or scores on): ``next`` right after a file is
written (the alternative is moving on to the next file), ``end`` once all are written (the
alternative is submitting). Greedy held-out benchmark every ``--every`` steps.

    python benchmarks/probes/rl_probe.py configs/learn-elastic.yaml --weights W.safetensors
        [--steps 48] [--every 16] [--set train.lr=0.001 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from gyre_core.cli.common import apply_overrides
from gyre_core.config import RunConfig
from gyre_core.events import NullSink
from gyre_core.rollout.agents import Ask, Generated, ScriptedAgent
from gyre_core.rollout.harness import run_session
from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.benchmark import benchmark
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.runtime.warm_start import WarmStart

PROBE_TASKS = 50_000  # task indices apart from the warm start (10 000+) and RL (0+)
TOOLS = ("run_check", "submit", "create_file", "write", "fix")


class _Recorder(ScriptedAgent):
    """A hasty demonstrator that keeps every context it was asked to act in."""

    contexts: list[list[int]]

    async def generate(self, ask: Ask) -> Generated:
        self.contexts.append(list(ask.prompt_ids))
        return await super().generate(ask)


async def decision_contexts(f: SessionFactory, n: int) -> dict[str, list[list[int]]]:
    """Contexts whose status bar names an untested component: ``next`` when the next
    file is still missing (check now or move on), ``end`` when every file is written (check
    or submit)."""
    out: dict[str, list[list[int]]] = {"next": [], "end": []}
    for k in range(n):
        env = f.suite.env("train", PROBE_TASKS + k, k)
        agent = _Recorder(env, f.tokenizer, seed=PROBE_TASKS + k, skip_check=0.5)
        agent.contexts = []
        await run_session(env, agent, f.tokenizer, f.harness, rollout_id=f"probe{k}")
        env.close()
        for ids in agent.contexts:
            obs, bar = f.tokenizer.decode(ids[-80:]).rsplit("\n", 3)[-3:-1]
            if not obs.startswith(("wrote ", "PASS ")):
                continue  # after a crashed check or a fix the next call is not a choice
            if "untested:" in bar and "focus:" not in bar:
                out["end"].append(ids)
            elif "untested:" in bar and bar.endswith(" missing"):
                out["next"].append(ids)
    return out


def tool_ids(f: SessionFactory) -> dict[str, int]:
    ids = {}
    for t in TOOLS:
        enc = f.tokenizer.encode(t, add_special_tokens=False)
        ids[t] = enc[0]
    return ids


@torch.no_grad()
def decision_probs(
    model: Any, contexts: list[list[int]], tools: dict[str, int]
) -> dict[str, float]:
    if not contexts:
        return {}
    sums = dict.fromkeys(tools, 0.0)
    for ids in contexts:
        logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
        p = torch.softmax(logits.float(), -1)
        for t, i in tools.items():
            sums[t] += float(p[i])
    return {t: round(s / len(contexts), 3) for t, s in sums.items()}


async def run(args: argparse.Namespace) -> None:
    data = yaml.safe_load(Path(args.config).read_text())
    apply_overrides(data, tuple(args.set))
    data.setdefault("warm_start", {})["weights"] = args.weights
    cfg = RunConfig.from_dict(data)
    model_dir = make_model_dir(cfg, Path(args.workdir or Path(args.weights).parent))
    f = SessionFactory(cfg, model_dir, NullSink(), time.perf_counter)
    trainer = f.make_trainer()
    WarmStart(f).load(trainer, Path(args.weights))
    if trainer.ref_model is not None:
        trainer.ref_model.load_state_dict(trainer.model.state_dict())
    trainer.reset_optimizer()
    engine = TorchEngine(trainer.model)
    router = Router({"local": engine})
    ctx = await decision_contexts(f, args.probe_tasks)
    tools = tool_ids(f)
    print(f"decision contexts: next {len(ctx['next'])}, end {len(ctx['end'])}", flush=True)
    g = cfg.rollout.group_size
    per_step = cfg.rollout.tasks_per_step * g
    t0 = time.perf_counter()
    rows = []

    def probe(step: int, **extra: Any) -> dict[str, Any]:
        trainer.model.eval()
        row = {"step": step, **extra,
               "p_next": decision_probs(trainer.model, ctx["next"], tools),
               "p_end": decision_probs(trainer.model, ctx["end"], tools)}  # fmt: skip
        return row

    bench = await benchmark(f, router, 0)
    row = probe(0, benchmark=bench)
    print(json.dumps(row), flush=True)
    rows.append(row)
    for step in range(1, args.steps + 1):
        idxs = range((step - 1) * per_step, step * per_step)
        batch = await asyncio.gather(*(f.session(i, router, None) for i in idxs))  # type: ignore[arg-type]
        m = trainer.step(batch)
        engine._version = trainer.version  # the engine serves trainer.model itself
        rewards = [round(float(r.reward or 0.0), 2) for r in batch]
        said = [
            [f.tokenizer.decode(list(c.completion_ids)).strip() for c in r.calls] for r in batch
        ]
        texts = said if args.texts else None
        checks = sum(sum(1 for t in r if t.startswith("run_check")) for r in said)
        row = {"step": step, "reward": round(sum(rewards) / len(rewards), 3),
               "progress": round(sum(r.progress for r in batch) / len(batch), 3),
               "rewards": rewards, "checks_per_rollout": round(checks / len(batch), 2),
               "loss": round(m["loss"], 4), "kl": round(m["kl"], 4),
               "entropy": round(m["entropy"], 3), "clip": round(m["clip_fraction"], 3),
               "grad_norm": round(m["grad_norm"], 3), "s": round(time.perf_counter() - t0)}  # fmt: skip
        if step % args.probe_every == 0 or step == args.steps:
            extra = {}
            if args.every and (step % args.every == 0 or step == args.steps):
                extra["benchmark"] = await benchmark(f, router, step)
            row.update(probe(step, **extra))
        if texts:
            row["texts"] = texts
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows) + "\n")
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--every", type=int, default=16, help="benchmark every k steps (0: off)")
    ap.add_argument("--probe-every", type=int, default=4)
    ap.add_argument("--probe-tasks", type=int, default=12)
    ap.add_argument("--texts", action="store_true", help="print every call's text")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--workdir", default="",
                    help="where the model (and tokenizer) is built; default: the weights' "
                         "folder, where gyre warm-start --workdir built the one the "
                         "weights were trained with")  # fmt: skip
    ap.add_argument("--out", default="")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
