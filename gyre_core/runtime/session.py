"""The agent sessions of a real run, and what they stand on: the model folder (built once),
the tokenizer, the harness limits and the trainer's settings.

The rest of what a run does around the loop lives beside it: the supervised warm start
(:mod:`~gyre_core.runtime.warm_start`), the held-out benchmark
(:mod:`~gyre_core.runtime.benchmark`) and each step's books and the summary
(:mod:`~gyre_core.runtime.step_books`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core import events as ev
from gyre_core.config import RunConfig
from gyre_core.envs import repo_suite
from gyre_core.rollout.agents import ModelAgent
from gyre_core.rollout.chat_template import chat_format
from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.endpoint import Endpoint
from gyre_core.rollout.evaluation import settle_reward
from gyre_core.rollout.external import ExternalAgent, run_external
from gyre_core.rollout.harness import run_session
from gyre_core.rollout.plugins import (
    PluginError,
    PluginSuite,
    load_callable,
    run_suite,
)
from gyre_core.rollout.router import Router
from gyre_core.rollout.task_env import TaskEnv
from gyre_core.runtime.plan import train_setup
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.format import Rollout

if TYPE_CHECKING:
    from gyre_core.runtime.loop import Loop

MODEL_BUILD = "model build"  # the phase_progress name of building the tiny model


def make_model_dir(
    cfg: RunConfig,
    workdir: Path,
    sink: ev.EventSink | None = None,
    clock: Callable[[], float] = lambda: 0.0,
) -> Path:
    """The configured checkpoint, or a tiny Qwen3 built (once) in the work folder; a build
    is reported to ``sink`` as ``phase_progress`` (0 of 1, then 1 of 1)."""
    if cfg.model.checkpoint:
        return Path(cfg.model.checkpoint)
    out = workdir / "model"
    if not (out / "config.json").exists():
        from gyre_core.models.init import init_checkpoint
        from gyre_core.models.shape import TINY_HEAD_DIM, ModelShape, tiny_heads

        say = sink or ev.NullSink()
        what = f"tokenizer ({cfg.model.tokenizer}) and {cfg.model.layers}-layer weights"
        say.emit(ev.PhaseProgress(t=clock(), phase=MODEL_BUILD, done=0, total=1, message=what))

        h = cfg.model.hidden_size  # kv_heads divides the heads: RunConfig.from_dict checks
        shape = ModelShape(
            vocab_size=1024,
            layers=cfg.model.layers,
            hidden=h,
            heads=tiny_heads(h),
            kv_heads=cfg.model.kv_heads,
            head_dim=TINY_HEAD_DIM,
            intermediate=2 * h,
            max_positions=4096,
            tie_embeddings=cfg.model.tie_embeddings,
            experts=cfg.model.experts,
            experts_per_token=min(2, cfg.model.experts) or 2,
            moe_intermediate=h,
        )
        init_checkpoint(out, shape, seed=cfg.seed, overwrite=True, corpus=tokenizer_corpus(cfg))
        say.emit(ev.PhaseProgress(t=clock(), phase=MODEL_BUILD, done=1, total=1, message=what))
    return out


def tokenizer_corpus(cfg: RunConfig) -> list[str] | None:
    """None (the generic default corpus), or with ``model.tokenizer: suite`` that plus
    oracle transcripts of every repo-suite split (fixed seed, not the run's tasks)."""
    if cfg.model.tokenizer != "suite":
        return None
    from gyre_core.models.tokenizer import default_corpus

    hints = cfg.rollout.hints == "status"
    texts = default_corpus()
    for split in repo_suite.SPLITS:
        texts += repo_suite.transcripts(split, 200, seed=99, sizes=("short", "medium"), hints=hints)
    return texts


def make_suite(cfg: RunConfig) -> PluginSuite:
    """The run's tasks: its environment plugin (``rollout.env``, or the built-in suite)."""
    return run_suite(cfg.rollout, cfg.seed)


class SessionFactory:
    """Makes the run's agent sessions (rollout ``idx`` on its training task, with its
    sampling seed and reward kind) and holds what the warm start and the benchmark play
    with: the tokenizer and the harness limits."""

    def __init__(
        self, cfg: RunConfig, model_dir: Path, sink: ev.EventSink, clock: Callable[[], float]
    ) -> None:
        self.cfg, self.model_dir, self.sink, self.clock = cfg, model_dir, sink, clock
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.harness = cfg.rollout  # the sessions' budgets
        self.migrations = 0
        self.rollouts_done = 0
        self.first_rollout_at: float | None = None  # when the first session started
        self.agent = ExternalAgent.from_config(cfg.rollout)  # None: the built-in harness
        self.suite = make_suite(cfg)
        w = cfg.warm_start
        scripted = w.steps and not w.weights and not w.data
        if scripted and not callable(getattr(self.suite.cls, "oracle_actions", None)):
            raise PluginError(
                "warm_start.steps",
                "a scripted warm start replays the environment's oracle_actions, which "
                f"{self.suite.cls.__qualname__} lacks: set warm_start.weights or "
                "warm_start.data",
            )
        r = cfg.rollout
        self.reward_fn = load_callable(r.reward_fn, "rollout.reward_fn") if r.reward_fn else None
        # The chat format of the endpoint's calls, checked before any session starts.
        self.chat = chat_format(self.tokenizer, cfg.model.chat_template)
        self._endpoint: Endpoint | None = None
        self._endpoint_lock = asyncio.Lock()

    async def endpoint(self) -> Endpoint:
        """The run's OpenAI-compatible endpoint, started on first use."""
        async with self._endpoint_lock:
            if self._endpoint is None:
                ep = Endpoint(self.tokenizer, fmt=self.chat, max_positions=self.positions())
                await ep.start()
                self._endpoint = ep
            return self._endpoint

    def positions(self) -> int:
        """The longest sequence the policy serves: the checkpoint's positions
        (``max_position_embeddings``), lowered by ``engine.max_model_len`` when set."""
        config = json.loads((self.model_dir / "config.json").read_text())
        longest = int(config.get("max_position_embeddings") or 0)
        served = self.cfg.engine.max_model_len
        return min(longest, served) if longest and served else longest or served

    async def aclose(self) -> None:
        if self._endpoint is not None:
            await self._endpoint.close()
            self._endpoint = None

    async def play(
        self,
        env: TaskEnv,
        router: Router,
        harness: RolloutConfig,
        *,
        rollout_id: str,
        group_id: str = "",
        sink: ev.EventSink | None = None,
        seed: int = 0,
        step: int = 0,
    ) -> Rollout:
        """One session on ``env`` by the run's agent: the built-in harness with the policy
        behind ``router``, or the external agent through the endpoint."""
        sink = sink or ev.NullSink()
        if self.agent is None:
            rollout = await run_session(
                env, ModelAgent(router, self.tokenizer), self.tokenizer, harness,
                rollout_id=rollout_id, group_id=group_id, sink=sink, seed=seed, step=step,
            )  # fmt: skip
        else:
            rollout = await run_external(
                self.agent, env, await self.endpoint(), router, harness,
                rollout_id=rollout_id, group_id=group_id, sink=sink, seed=seed, step=step,
            )  # fmt: skip
        error = getattr(env, "error", None)  # a plugin environment that raised in play
        if isinstance(error, str):
            rollout.status, rollout.failure = "failed", "environment"
            rollout.extra["env_error"] = error
        return rollout

    def make_trainer(self) -> Trainer:
        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        ref = None
        if self.cfg.train.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        return Trainer.for_run(model, train_setup(self.cfg), ref)

    def _group(self, idx: int) -> tuple[int, str, int]:
        g = self.cfg.rollout.group_size
        per_step = self.cfg.rollout.tasks_per_step * g
        task = idx // g
        return task, f"step{idx // per_step}-task{task}", idx // per_step

    def _sample_seed(self, idx: int) -> int:
        """Rollout ``idx``'s sampling seed; ``rollout.sample_seed`` moves it to another
        stream without touching the task (the env keeps ``seed * 1_000_003 + idx``)."""
        base = self.cfg.seed * 1_000_003 + idx
        return base + self.cfg.rollout.sample_seed * 0x9E3779B1 * 1_000_003

    async def session(self, idx: int, router: Router, loop: Loop) -> Rollout:
        task, group, step = self._group(idx)
        if self.first_rollout_at is None:
            self.first_rollout_at = self.clock()
        env = self.suite.env("train", task, self.cfg.seed * 1_000_003 + idx)
        try:
            rollout = await self.play(
                env,
                router,
                self.harness,
                rollout_id=f"r{idx}",
                group_id=group,
                sink=self.sink,
                seed=self._sample_seed(idx),
                step=step,
            )
            r = self.cfg.rollout
            settle_reward(rollout, env, r.reward, self.reward_fn, retries=r.eval_retries)
        finally:
            env.close()
        self.rollouts_done += 1
        return rollout

    def migrated(self, session_id: str, src: str, dst: str, kept: int) -> None:
        self.migrations += 1
        self.sink.emit(
            ev.CallMigrated(
                t=self.clock(),
                rollout_id=session_id.split("/sub-")[0],
                from_unit=int(src.rsplit("-", 1)[1]),
                to_unit=int(dst.rsplit("-", 1)[1]),
                tokens_kept=kept,
            )
        )
