"""The held-out benchmark of a real run: greedy, or sampled (the policy's expected
progress). :func:`run_benchmark` is the run's own score (``rollout.benchmark_samples``
draws a task, a ``benchmark`` event); :func:`benchmark` scores without an event (a reading
aside). Its progress, tasks done of all, is reported as ``phase_progress`` events named
:data:`PHASE`."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gyre_core import events as ev
from gyre_core.rollout.router import Router
from gyre_core.runtime.session import SessionFactory

BENCH_SEED = 10_000_019  # benchmark episodes are seeded apart from training ones
PHASE = "benchmark"  # the phase_progress name
REPORTS = 4  # phase_progress events a benchmark sends at most (and one at its start)


async def benchmark(
    sessions: SessionFactory, router: Router, version: int, *, samples: int = 0
) -> float:
    """Mean progress on the held-out split, played by the policy behind ``router`` with
    the run's tokenizer and harness limits (``sessions``).

    ``samples=0``: greedy, one session per task. ``samples=K``:
    K sessions per task sampled at ``rollout.temperature``, the policy's *expected*
    progress. A greedy score jumps wherever an argmax flips, so two nearly equal
    policies can score far apart; the sampled score moves with the probabilities. The
    draws' seeds depend only on the task and the draw (not on the version or the run),
    so with position-keyed sampling two close policies draw nearly the same tokens and
    their difference is their own, not the draws'."""
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
    cfg, sink, clock = sessions.cfg, sessions.sink, sessions.clock
    temperature = sessions.harness.temperature if samples else 0.0
    harness = replace(sessions.harness, temperature=temperature)
    n = cfg.rollout.benchmark_tasks
    draws = [(k, d) for k in range(n) for d in range(max(1, samples))]
    done = 0
    what = f"version {version}" + (f", {samples} samples a task" if samples else ", greedy")

    def report() -> None:
        sink.emit(
            ev.PhaseProgress(t=clock(), phase=PHASE, done=done, total=len(draws), message=what)
        )

    async def one(k: int, draw: int) -> float:
        nonlocal done
        env = sessions.suite.env(cfg.rollout.benchmark_split, k, BENCH_SEED + k)
        rid = f"bench-v{version}-{k}" + (f"-s{draw}" if samples else "")
        seed = BENCH_SEED * (draw + 1) + k if samples else 0
        try:
            r = await sessions.play(env, router, harness, rollout_id=rid, seed=seed)
        finally:
            env.close()
        done += 1
        if done * REPORTS // len(draws) != (done - 1) * REPORTS // len(draws):
            report()
        return r.progress

    report()
    scores = await asyncio.gather(*(one(k, d) for k, d in draws))
    score = round(sum(scores) / len(draws), 4)
    return score


async def run_benchmark(sessions: SessionFactory, router: Router, version: int) -> float:
    """The run's own benchmark of ``version``: ``rollout.benchmark_samples`` draws a task
    (0: greedy), emitted as a ``benchmark`` event at that step."""
    cfg = sessions.cfg
    samples = cfg.rollout.benchmark_samples
    score = await benchmark(sessions, router, version, samples=samples)
    sessions.sink.emit(
        ev.Benchmark(
            t=sessions.clock(),
            step=version,
            suite=f"{cfg.rollout.suite}-{cfg.rollout.size}",
            score=score,
            tasks=cfg.rollout.benchmark_tasks,
            samples=samples,
        )
    )
    return score
