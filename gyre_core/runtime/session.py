"""What a real run does around the loop: the model, the trainer, the agent sessions, the
benchmark, per-step bookkeeping (events, checkpoints) and the summary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core import events as ev
from gyre_core.config import RunConfig
from gyre_core.envs import repo_suite
from gyre_core.rollout.agents import ModelAgent, ScriptedAgent
from gyre_core.rollout.harness import HarnessConfig, run_session
from gyre_core.rollout.router import Router
from gyre_core.rollout.task_env import make_env
from gyre_core.runtime import warm_cache
from gyre_core.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from gyre_core.train.trainer import Behaviour, Trainer, TrainerConfig
from gyre_core.trajectory.format import Rollout, read_rollouts
from gyre_core.trajectory.rewards import AdvantageMode
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.tree import PrefixTree, build_trees
from gyre_core.trajectory.writer import write_rollouts

if TYPE_CHECKING:
    from gyre_core.runtime.loop import Loop

BENCH_SEED = 10_000_019  # benchmark episodes are seeded apart from training ones


def make_model_dir(cfg: RunConfig, workdir: Path) -> Path:
    """The configured checkpoint, or a tiny Qwen3 built (once) in the work folder."""
    if cfg.model.checkpoint:
        return Path(cfg.model.checkpoint)
    out = workdir / "model"
    if not (out / "config.json").exists():
        from gyre_core.models.init import init_checkpoint
        from gyre_core.models.shape import ModelShape

        h = cfg.model.hidden_size  # kv_heads divides the heads: RunConfig.from_dict checks
        shape = ModelShape(vocab_size=1024, layers=cfg.model.layers, hidden=h,
                           heads=max(1, h // 32), kv_heads=cfg.model.kv_heads, head_dim=32,
                           intermediate=2 * h, max_positions=4096,
                           tie_embeddings=cfg.model.tie_embeddings)  # fmt: skip
        init_checkpoint(out, shape, seed=cfg.seed, overwrite=True, corpus=tokenizer_corpus(cfg))
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
        texts += repo_suite.transcripts(split, 200, seed=99, sizes=("short", "medium"),
                                        hints=hints)  # fmt: skip
    return texts


def _task_index(cfg: RunConfig, k: int) -> int:
    """The ``k``-th task of the configured size (make_env cycles the repo suite's sizes by
    index; any index >= 0 is a task of every suite, the coding suite's pool wrapping)."""
    return k * len(repo_suite.SIZES) + repo_suite.SIZES.index(cfg.rollout.size)


def trainer_config(cfg: RunConfig) -> TrainerConfig:
    """The trainer's settings of a run (its ``weighting`` is what the tree browser shows)."""
    t = cfg.train
    return TrainerConfig(
        lr=t.lr, max_grad_norm=t.max_grad_norm, clip_low=t.clip_low, clip_high=t.clip_high,
        kl_coef=t.kl_coef, max_tokens=t.max_tokens, normalise_std=t.normalise_std,
        advantage_mode=cast("AdvantageMode", t.advantage_mode),
        behaviour=cast("Behaviour", t.behaviour),
        staleness_bound=cfg.scheduler.staleness_bound, seed=cfg.seed,
    )  # fmt: skip


class SessionFactory:
    def __init__(self, cfg: RunConfig, model_dir: Path, sink: ev.EventSink,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.cfg, self.model_dir, self.sink, self.clock = cfg, model_dir, sink, clock
        self.hints = cfg.rollout.hints == "status"
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        r = cfg.rollout
        self.harness = HarnessConfig(
            max_turns=r.max_turns, context_budget=r.context_budget,
            max_new_tokens=r.max_new_tokens, temperature=r.temperature,
            time_budget_s=r.time_budget_s or None, token_budget=r.token_budget,
            tool_time_scale=r.tool_time_scale,
        )  # fmt: skip
        self.trainer_config = trainer_config(cfg)
        self.migrations = 0
        self.rollouts_done = 0
        self.tokens_per_call = 0
        self.tokens_unique = 0
        self.step_rows: list[dict[str, Any]] = []
        self.trained_ids: set[str] = set()  # rollouts already trained (kept in checkpoints)
        self.step_at: list[float] = []  # run-clock time each step finished
        self.first_rollout_at: float | None = None  # when the first session started
        self.warm_start_s = 0.0
        self.warm_start_losses: list[float] = []
        self.warm_start_cached = ""  # the cache entry the warm start was loaded from

    def make_trainer(self) -> Trainer:
        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        ref = None
        if self.cfg.train.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        return Trainer(model, self.trainer_config, ref)

    # ------------------------------------------------------------------ sessions

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
        env = make_env(self.cfg.rollout.suite, "train", _task_index(self.cfg, task),
                       self.cfg.seed * 1_000_003 + idx, suite_seed=self.cfg.seed,
                       hints=self.hints)  # fmt: skip
        try:
            rollout = await run_session(
                env, ModelAgent(router, self.tokenizer), self.tokenizer, self.harness,
                rollout_id=f"r{idx}", group_id=group, sink=self.sink,
                seed=self._sample_seed(idx), step=step,
            )  # fmt: skip
            credit = getattr(env, "credit", None)
            if self.cfg.rollout.reward == "partial" and callable(credit):
                rollout.reward = float(credit())
        finally:
            env.close()
        if self.cfg.rollout.reward == "binary":
            rollout.reward = 1.0 if rollout.progress >= 1.0 else 0.0
        self.rollouts_done += 1
        return rollout

    def migrated(self, session_id: str, src: str, dst: str, kept: int) -> None:
        self.migrations += 1
        self.sink.emit(ev.CallMigrated(
            t=self.clock(), rollout_id=session_id.split("/sub-")[0],
            from_unit=int(src.rsplit("-", 1)[1]), to_unit=int(dst.rsplit("-", 1)[1]),
            tokens_kept=kept,
        ))  # fmt: skip

    async def benchmark(self, router: Router, version: int, *, samples: int = 0) -> float:
        """Mean progress on the held-out split.

        ``samples=0`` (the run's own benchmark): greedy, one session per task. ``samples=K``:
        K sessions per task sampled at ``rollout.temperature``, the policy's *expected*
        progress. A greedy score jumps wherever an argmax flips, so two nearly equal
        policies can score far apart; the sampled score moves with the probabilities. The
        draws' seeds depend only on the task and the draw (not on the version or the run),
        so with position-keyed sampling two close policies draw nearly the same tokens and
        their difference is their own, not the draws'."""
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        temperature = self.harness.temperature if samples else 0.0
        harness = HarnessConfig(**{**_fields(self.harness), "temperature": temperature})
        n = self.cfg.rollout.benchmark_tasks

        async def one(k: int, draw: int) -> float:
            env = make_env(self.cfg.rollout.suite, self.cfg.rollout.benchmark_split,
                           _task_index(self.cfg, k), BENCH_SEED + k, suite_seed=self.cfg.seed,
                           hints=self.hints)  # fmt: skip
            rid = f"bench-v{version}-{k}" + (f"-s{draw}" if samples else "")
            seed = BENCH_SEED * (draw + 1) + k if samples else 0
            try:
                r = await run_session(env, ModelAgent(router, self.tokenizer), self.tokenizer,
                                      harness, rollout_id=rid, seed=seed)  # fmt: skip
            finally:
                env.close()
            return r.progress

        draws = [(k, d) for k in range(n) for d in range(max(1, samples))]
        scores = await asyncio.gather(*(one(k, d) for k, d in draws))
        score = round(sum(scores) / len(draws), 4)
        if not samples:  # the run's benchmark event; a sampled re-score is a reading aside
            self.sink.emit(ev.Benchmark(t=self.clock(), step=version,
                                        suite=f"{self.cfg.rollout.suite}-{self.cfg.rollout.size}",
                                        score=score, tasks=n))  # fmt: skip
        return score

    async def warm_start(
        self, trainer: Trainer, first_step: int = 0, *, anneal: bool = True
    ) -> list[float]:
        """Supervised steps on scripted demonstrations of training tasks: each step trains
        on ``train.warm_start_demos`` fresh ones (tasks 10_000 + ..., apart from the RL
        tasks) at ``train.warm_start_lr`` (ending early at ``train.warm_start_until_loss``),
        played by a demonstrator that skips a share ``train.warm_start_skip_check`` of its
        checks; then ``train.warm_start_anneal_steps`` more at ``train.warm_start_anneal_lr``
        (see :meth:`anneal`; ``anneal=False`` leaves them out). With
        ``train.warm_start_cache`` an identical earlier warm start is loaded instead
        (runtime/warm_cache.py; the summary then names it in ``warm_start_cached``).
        ``first_step`` continues an earlier warm start of that many steps (the
        demonstrations go on where it stopped). Returns the per-step losses."""
        t = self.cfg.train
        if t.warm_start_from:
            return self.load_warm_start(trainer, Path(t.warm_start_from))
        folder = None
        if t.warm_start_cache and not first_step and anneal:  # whole warm starts only
            folder = Path(t.warm_start_cache) / warm_cache.cache_key(self.cfg, self.model_dir)
            meta = warm_cache.load(folder, trainer)
            if meta is not None:
                self.warm_start_s, self.warm_start_losses = meta["seconds"], meta["losses"]
                self.warm_start_cached = str(folder)
                return list(meta["losses"])
        t0 = self.clock()
        losses = await self._supervised(trainer, first_step, t.warm_start_steps,
                                        t.warm_start_lr or t.lr, t.warm_start_until_loss)  # fmt: skip
        if anneal:
            losses += await self.anneal(trainer, first_step + len(losses))
        self.warm_start_s = round(self.clock() - t0, 2)
        self.warm_start_losses = losses
        if folder is not None:
            warm_cache.store(folder, trainer, {"seconds": self.warm_start_s, "losses": losses})
        return losses

    async def anneal(self, trainer: Trainer, first_step: int) -> list[float]:
        """The warm start's last ``train.warm_start_anneal_steps`` steps, at the lower
        ``train.warm_start_anneal_lr``, on the demonstrations after step ``first_step``.
        The high rate that finds the copying keeps it noisy (a loss that plateaus near
        0.1); a lower one settles it (docs/learning.md)."""
        t = self.cfg.train
        if not t.warm_start_anneal_steps:
            return []
        return await self._supervised(trainer, first_step,
                                      first_step + t.warm_start_anneal_steps,
                                      t.warm_start_anneal_lr or t.lr, 0.0)  # fmt: skip

    async def _supervised(
        self, trainer: Trainer, start: int, stop: int, lr: float, until_loss: float
    ) -> list[float]:
        """Warm-start steps ``start`` .. ``stop - 1`` at ``lr`` (RL's rate restored after,
        the version reset to 0), ending early once the mean loss of the last 20 steps is
        at or under ``until_loss`` (0: never)."""
        t = self.cfg.train
        n = t.warm_start_demos or self.cfg.rollout.tasks_per_step
        rl_lr = [g["lr"] for g in trainer.optimizer.param_groups]
        for g in trainer.optimizer.param_groups:
            g["lr"] = lr
        losses: list[float] = []
        for step in range(start, stop):
            demos = []
            for k in range(step * n, (step + 1) * n):
                env = make_env(self.cfg.rollout.suite, "train",
                               _task_index(self.cfg, 10_000 + k), k, suite_seed=self.cfg.seed,
                               hints=self.hints)  # fmt: skip
                try:
                    demos.append(await run_session(
                        env, ScriptedAgent(env, self.tokenizer, seed=k,
                                           skip_check=t.warm_start_skip_check),
                        self.tokenizer, self.harness, rollout_id=f"demo{k}",
                    ))  # fmt: skip
                finally:
                    env.close()
            losses.append(trainer.sft_step(trainer.prepare(demos, trainer.version))["sft_loss"])
            recent = losses[-20:]
            if until_loss and len(recent) == 20 and sum(recent) / 20 <= until_loss:
                break
        for g, old in zip(trainer.optimizer.param_groups, rl_lr, strict=True):
            g["lr"] = old
        trainer.version = 0  # the warm-started weights are the RL run's version 0
        return losses

    def load_warm_start(self, trainer: Trainer, path: Path) -> list[float]:
        """Begin from the weights an earlier warm start wrote (``train.warm_start_from``);
        its ``<stem>.json`` beside them, when present, gives the steps' losses and seconds
        for the summary. A file that does not fit this run's model is refused by name."""
        if not path.is_file():
            raise ValueError(f"train.warm_start_from: no such file {path}")
        state = load_file(str(path))
        try:
            trainer.model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ValueError(f"train.warm_start_from: {path} does not fit this run's model "
                             f"(model.* settings): {str(e).splitlines()[0]}") from None  # fmt: skip
        meta_path = path.with_suffix(".json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        self.warm_start_s = float(meta.get("seconds", 0.0))
        self.warm_start_losses = [float(x) for x in meta.get("losses", [])]
        self.warm_start_cached = str(path)
        trainer.version = 0
        return list(self.warm_start_losses)

    # ------------------------------------------------------------------ steps

    def step_done(self, trainer: Trainer, batch: list[Rollout], metrics: dict[str, Any],
                  loop: Loop, ckpt_root: Path,
                  trees: dict[str, PrefixTree] | None = None) -> None:  # fmt: skip
        """A step's books and events. ``trees``: the step's trees as the trainer built them
        (the loop hands them on), else built here."""
        if trees is None:
            trees = build_trees(batch)
        stats = tree_stats(trees.values())
        self.tokens_per_call += stats["tokens_per_call"]
        self.tokens_unique += stats["tokens_unique"]
        for gid in dict.fromkeys(r.group_id for r in batch):  # the batch's order of groups
            one = tree_stats([trees[gid]])
            self.sink.emit(ev.TreeReady(t=self.clock(), group_id=gid, rollouts=one["rollouts"],
                                        tokens_unique=one["tokens_unique"],
                                        tokens_per_call=one["tokens_per_call"],
                                        nodes=one["nodes"]))  # fmt: skip
        self.write_payload(batch, trainer.version, ckpt_root.parent / "rollouts")
        reward = sum(r.reward if r.reward is not None else r.progress for r in batch) / len(batch)
        progress = sum(r.progress for r in batch) / len(batch)
        metrics = {**metrics, "reward": reward, "progress": progress,
                   "dedup_ratio": stats["dedup_vs_call"], "rollouts": float(len(batch))}  # fmt: skip
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        self.step_rows.append(clean)
        self.step_at.append(self.clock())
        self.sink.emit(ev.StepFinished(t=self.clock(), step=trainer.version,
                                       version=trainer.version, metrics=clean))  # fmt: skip
        if trainer.version % self.cfg.checkpoint_every == 0 or trainer.version == self.cfg.steps:
            trained = {r.rollout_id for r in batch}
            self.trained_ids |= trained
            path = save_checkpoint(ckpt_root, trainer, {
                "trained": sorted(self.trained_ids), "ready": [r.rollout_id for r in loop.ready],
            })  # fmt: skip
            write_rollouts(path / "ready.jsonl", loop.ready)
        else:
            self.trained_ids |= {r.rollout_id for r in batch}

    def write_payload(self, batch: list[Rollout], step: int, folder: Path) -> Path:
        """The step's rollouts as ``gyre.trajectory/v1`` (written to a temporary name, then
        renamed: a reader never sees half a file) and the ``rollouts_written`` event."""
        folder.mkdir(parents=True, exist_ok=True)
        path = (folder / f"step-{step:05d}.jsonl").resolve()
        tmp = path.with_suffix(".jsonl.tmp")
        write_rollouts(tmp, batch)
        tmp.replace(path)
        groups = list(dict.fromkeys(r.group_id for r in batch))
        self.sink.emit(ev.RolloutsWritten(t=self.clock(), step=step, path=str(path),
                                          rollouts=len(batch), groups=groups))  # fmt: skip
        return path

    def restore(self, trainer: Trainer, root: Path) -> tuple[list[Rollout], list[int]] | None:
        path = latest_checkpoint(root)
        if path is None:
            return None
        ck = load_checkpoint(path, trainer)
        self.trained_ids = set(ck.data_position["trained"])
        ready = list(read_rollouts(path / "ready.jsonl")) if (path / "ready.jsonl").exists() else []
        done = self.trained_ids | {r.rollout_id for r in ready}
        total = self.cfg.steps * self.cfg.rollout.tasks_per_step * self.cfg.rollout.group_size
        pending = [i for i in range(total) if f"r{i}" not in done]
        return ready, pending

    def summary(self, loop: Loop, router: Router, before: float, after: float,
                wall_s: float) -> dict[str, Any]:  # fmt: skip
        c = loop.counters
        steps = self.step_rows
        return {
            "policy": self.cfg.policy,
            "backend": "real",
            "status": "succeeded",
            "steps": loop.trainer.version,
            "wall_s": round(wall_s, 2),
            "benchmark_before": before,
            "benchmark_after": after,
            "sessions_restarted": router.stats.sessions_restarted,
            "role_switches": c.role_switches,
            "calls_migrated": router.stats.calls_migrated,
            "tokens_reprefilled": router.stats.tokens_reprefilled,
            "tokens_discarded": router.stats.tokens_discarded,
            "tokens_trained": c.tokens_trained,
            "dedup_vs_call": round(self.tokens_per_call / max(1, self.tokens_unique), 4),
            "step_s_mean": self._step_s(),
            "switch_s_mean": round(sum(c.switch_s) / max(1, len(c.switch_s)), 3),
            "weight_sync_s_mean": round(sum(c.weight_sync_s) / max(1, len(c.weight_sync_s)), 3),
            "train_s_mean": round(sum(c.train_s) / max(1, len(c.train_s)), 3),
            "reward_by_step": [round(s.get("reward", 0.0), 4) for s in steps],
            "progress_by_step": [round(s.get("progress", 0.0), 4) for s in steps],
            "warm_start_s": self.warm_start_s,
            "warm_start_loss": round(self.warm_start_losses[-1], 4)
            if self.warm_start_losses
            else None,
            "warm_start_steps": len(self.warm_start_losses),
            "warm_start_cached": self.warm_start_cached or None,
            "rl_wall_s": self._rl_wall_s(),
            "switch_mode": self.cfg.scheduler.switch_mode,
        }

    def _rl_wall_s(self) -> float:
        """Wall seconds of the RL part: from the first rollout to the last step."""
        if not self.step_at or self.first_rollout_at is None:
            return 0.0
        return round(self.step_at[-1] - self.first_rollout_at, 2)

    def _step_s(self) -> float:
        """Mean wall seconds per training step, from the first rollout to the last step."""
        if not self.step_at or self.first_rollout_at is None:
            return 0.0
        return round((self.step_at[-1] - self.first_rollout_at) / len(self.step_at), 3)


def _fields(h: HarnessConfig) -> dict[str, Any]:
    return {k: getattr(h, k) for k in h.__dataclass_fields__}


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
