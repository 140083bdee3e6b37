"""``gyre warm-start``: run a config's supervised warm start once, as ``gyre run`` runs it,
and keep its weights for ``warm_start.weights``.

The file is a safetensors of the model's weights with a JSON of the same stem beside it:
``steps``, ``anneal_from`` (the step the annealing tail began at), ``seconds``, ``losses``
(per step), ``benchmark_by_step`` (the greedy held-out score every ``every`` steps and after
the tail, when asked for) and ``config`` (the run config it was made with). A run that
names the file loads the weights and reads ``losses`` and ``seconds`` for its summary
(:meth:`gyre_core.runtime.warm_start.WarmStart.load`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gyre_core import events as ev
from gyre_core.config import RunConfig
from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.runtime.benchmark import benchmark
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.runtime.warm_start import WarmStart, tokenizer_hash
from gyre_core.runtime.warm_target import LocalTrainer


def write_warm_start(
    cfg: RunConfig,
    out: Path,
    *,
    workdir: Path,
    every: int = 0,
    sink: ev.EventSink | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Run ``cfg``'s warm start (never from its cache or an earlier file) on the model
    ``gyre run`` would build in ``workdir``, write the weights to ``out`` and the JSON
    beside them, and return that JSON's content. ``every`` > 0 scores the greedy
    benchmark every ``every`` steps (the warm start then runs in pieces of that many
    steps; ``warm_start.until_loss`` is checked within each piece) and after the
    annealing tail; 0 runs it in one piece, exactly as ``gyre run`` does."""
    cfg = replace(cfg, warm_start=replace(cfg.warm_start, cache="", weights=""))
    if cfg.warm_start.steps < 1:
        raise ValueError(
            "no warm start to run: warm_start.steps is 0 "
            "(set it in the config or with --set warm_start.steps=N)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    sink = sink or ev.NullSink()
    t0 = time.perf_counter()

    def clock() -> float:
        return round(time.perf_counter() - t0, 3)

    torch.manual_seed(cfg.seed)  # as run_real seeds it before building anything
    sessions = SessionFactory(cfg, make_model_dir(cfg, workdir, sink, clock), sink, clock)
    meta = asyncio.run(_warm(cfg, sessions, out, every, say))
    meta["seconds"] = round(clock(), 1)
    meta["config"] = cfg.to_dict()
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


async def _warm(
    cfg: RunConfig, sessions: SessionFactory, out: Path, every: int, say: Callable[[str], None]
) -> dict[str, Any]:
    trainer = sessions.make_trainer()
    target = LocalTrainer(trainer)
    warm = WarmStart(sessions)
    w = cfg.warm_start
    cap = w.steps
    curve: dict[int, float] = {}
    routers: list[Router] = []  # made at the first score (the engine puts the model in eval)

    async def score(losses: list[float]) -> None:
        if not routers:  # the trained weights, in place
            routers.append(Router({"local": TorchEngine(trainer.model)}))
        curve[len(losses)] = s = await benchmark(sessions, routers[0], 0)
        recent = losses[-20:]
        say(
            f"step {len(losses)}: loss (last 20) {sum(recent) / len(recent):.3f}, benchmark {s:.3f}"
        )

    if not every:
        losses = await warm.run(target)
        main_steps = warm.anneal_from
    else:
        losses = []
        while len(losses) < cap:
            want = min(len(losses) + every, cap)
            losses += await warm.run(target, first_step=len(losses), anneal=False, stop=want)
            await score(losses)
            if len(losses) < want:  # warm_start.until_loss ended it
                break
        main_steps = len(losses)
        if w.anneal_steps:
            losses += await warm.settle(target, main_steps)
            await score(losses)
    for task in asyncio.all_tasks():  # the engine's idle loop
        if task is not asyncio.current_task():
            task.cancel()
    save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, str(out))
    return {
        "steps": len(losses),
        "anneal_from": main_steps,
        "missed_target": warm.missed_target,
        "missed_field": warm.missed_field,
        "tokenizer_sha256": tokenizer_hash(sessions.model_dir),
        "losses": [round(x, 5) for x in losses],
        "benchmark_by_step": curve,
    }
