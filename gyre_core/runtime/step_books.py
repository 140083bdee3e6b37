"""A real run's books, step by step: each step's events (``tree_ready``,
``rollouts_written``, ``step_finished``), its payload file and checkpoint, what a resumed
run takes back from the last checkpoint, and the summary at the end."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre_core import events as ev
from gyre_core.config import RunConfig
from gyre_core.rollout.router import Router
from gyre_core.runtime.offpolicy import is_offpolicy
from gyre_core.train.checkpoint import SHARDED_FORMAT
from gyre_core.train.checkpoint import prune_checkpoints as prune
from gyre_core.train.checkpoint_dirs import STATE_FILE, latest_checkpoint
from gyre_core.trajectory.format import Rollout, read_rollouts
from gyre_core.trajectory.paths import PATH_FIGURES
from gyre_core.trajectory.stats import tree_stats
from gyre_core.trajectory.tree import PrefixTree, build_trees
from gyre_core.trajectory.writer import write_rollouts

if TYPE_CHECKING:
    from gyre_core.runtime.loop import Loop
    from gyre_core.runtime.session import SessionFactory
    from gyre_core.runtime.train_group import TrainGroup
    from gyre_core.runtime.warm_start import WarmStart


class StepBooks:
    """Counts what the steps trained (tokens per call and unique, each step's metrics and
    finishing time, the rollouts trained so far) and writes each step's events and files."""

    def __init__(self, cfg: RunConfig, sink: ev.EventSink, clock: Callable[[], float]) -> None:
        self.cfg, self.sink, self.clock = cfg, sink, clock
        self.tokens_per_call = 0
        self.tokens_unique = 0
        self.step_rows: list[dict[str, Any]] = []
        self.trained_ids: set[str] = set()  # rollouts already trained (kept in checkpoints)
        self.step_at: list[float] = []  # run-clock time each step finished

    async def step_done(
        self,
        trainer: TrainGroup,
        batch: list[Rollout],
        metrics: dict[str, Any],
        loop: Loop,
        ckpt_root: Path,
        trees: dict[str, PrefixTree] | None = None,
    ) -> None:
        """A step's books and events, and its checkpoint when one is due. ``trees``: the
        step's trees as the trainer built them (the loop hands them on), else built here."""
        if trees is None:
            trees = build_trees(batch)
        stats = tree_stats(trees.values())
        self.tokens_per_call += stats["tokens_per_call"]
        self.tokens_unique += stats["tokens_unique"]
        for gid in dict.fromkeys(r.group_id for r in batch):  # the batch's order of groups
            one = tree_stats([trees[gid]] if gid in trees else [])  # none: all left out
            self.sink.emit(
                ev.TreeReady(
                    t=self.clock(),
                    group_id=gid,
                    rollouts=one["rollouts"],
                    tokens_unique=one["tokens_unique"],
                    tokens_per_call=one["tokens_per_call"],
                    nodes=one["nodes"],
                )
            )
        self.write_payload(batch, trainer.version, ckpt_root.parent / "rollouts")
        own = [r for r in batch if not is_offpolicy(r)]  # the policy's curve: its own rollouts
        reward = sum(r.reward if r.reward is not None else r.progress for r in own) / len(own)
        progress = sum(r.progress for r in own) / len(own)
        metrics = {
            **metrics,
            "reward": reward,
            "progress": progress,
            "dedup_ratio": stats["dedup_vs_call"],
            "rollouts": float(len(own)),
        }
        if len(own) < len(batch):
            metrics["offpolicy_rollouts"] = float(len(batch) - len(own))
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        self.step_rows.append(clean)
        self.step_at.append(self.clock())
        self.sink.emit(
            ev.StepFinished(
                t=self.clock(), step=trainer.version, version=trainer.version, metrics=clean
            )
        )
        self.trained_ids |= {r.rollout_id for r in own}
        if trainer.version % self.cfg.checkpoint_every == 0 or trainer.version == self.cfg.steps:
            await self.checkpoint(trainer, loop.ready, ckpt_root)

    async def checkpoint(self, trainer: TrainGroup, ready: list[Rollout], root: Path) -> Path:
        """``root/step-<version>``: the training group's sharded state, ``state.json`` (the
        version and the data position: rollouts trained, and finished but not yet) and the
        ready rollouts. Written beside it and renamed into place; then the retention rule
        (``checkpoint_keep_last``, ``checkpoint_keep_every``) drops older ones."""
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step-{trainer.version:08d}"
        tmp = root / f".tmp-{final.name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        await trainer.save(tmp)
        position = {"trained": sorted(self.trained_ids), "ready": [r.rollout_id for r in ready]}
        write_rollouts(tmp / "ready.jsonl", ready)
        state = {"format": SHARDED_FORMAT, "version": trainer.version, "data_position": position}
        (tmp / STATE_FILE).write_text(json.dumps(state))
        if final.exists():
            shutil.rmtree(final)
        tmp.replace(final)
        prune(
            root,
            getattr(self.cfg, "checkpoint_keep_last", 0),
            getattr(self.cfg, "checkpoint_keep_every", 0),
        )
        return final

    def write_payload(self, batch: list[Rollout], step: int, folder: Path) -> Path:
        """The step's rollouts as ``gyre.trajectory/v1`` (written to a temporary name, then
        renamed: a reader never sees half a file) and the ``rollouts_written`` event."""
        folder.mkdir(parents=True, exist_ok=True)
        path = (folder / f"step-{step:05d}.jsonl").resolve()
        tmp = path.with_suffix(".jsonl.tmp")
        write_rollouts(tmp, batch)
        tmp.replace(path)
        groups = list(dict.fromkeys(r.group_id for r in batch))
        self.sink.emit(
            ev.RolloutsWritten(
                t=self.clock(), step=step, path=str(path), rollouts=len(batch), groups=groups
            )
        )
        return path

    def restore(self, root: Path) -> tuple[Path, int, list[Rollout], list[int], int] | None:
        """The latest checkpoint under ``root``: its path, version, the rollouts ready, the
        sessions still to run (the group reads the state itself) and the first session
        index past every one it trained or holds ready (``LoopStart.first_new``: sessions
        that replaced dropped groups ran past the run's total); None without one."""
        path = latest_checkpoint(root)
        if path is None:
            return None
        state = json.loads((path / STATE_FILE).read_text())
        if state.get("format") != SHARDED_FORMAT:
            raise ValueError(f"{path}: format {state.get('format')!r}, not {SHARDED_FORMAT!r}")
        self.trained_ids = set(state["data_position"]["trained"])
        ready = list(read_rollouts(path / "ready.jsonl")) if (path / "ready.jsonl").exists() else []
        done = self.trained_ids | {r.rollout_id for r in ready}
        total = self.cfg.steps * self.cfg.rollout.tasks_per_step * self.cfg.rollout.group_size
        pending = [i for i in range(total) if f"r{i}" not in done]
        ran = [int(i[1:]) for i in done if i[:1] == "r" and i[1:].isdigit()]
        return path, int(state["version"]), ready, pending, max(ran, default=-1) + 1

    def summary(
        self,
        loop: Loop,
        router: Router,
        before: float,
        after: float,
        wall_s: float,
        sessions: SessionFactory,
        warm: WarmStart,
    ) -> dict[str, Any]:
        """The run's ``summary.json``: what the loop, the router and these books counted,
        the benchmark before and after RL, the warm start's figures, and ``paths``: the
        steps' path accounting summed over the run (``trajectory.paths.path_figures``)."""
        c, first = loop.counters, sessions.first_rollout_at
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
            "step_s_mean": self._step_s(first),
            "switch_s_mean": round(sum(c.switch_s) / max(1, len(c.switch_s)), 3),
            "weight_sync_s_mean": round(sum(c.weight_sync_s) / max(1, len(c.weight_sync_s)), 3),
            "train_s_mean": round(sum(c.train_s) / max(1, len(c.train_s)), 3),
            "paths": {k: sum(row.get(k, 0.0) for row in steps) for k in PATH_FIGURES},
            "reward_by_step": [round(s.get("reward", 0.0), 4) for s in steps],
            "progress_by_step": [round(s.get("progress", 0.0), 4) for s in steps],
            "warm_start_s": warm.warm_start_s,
            "warm_start_loss": round(warm.warm_start_losses[-1], 4)
            if warm.warm_start_losses
            else None,
            "warm_start_steps": len(warm.warm_start_losses),
            "warm_start_cached": warm.warm_start_cached or None,
            "warm_start_missed_target": warm.missed_target,
            "warm_start_missed_field": warm.missed_field or None,
            "rl_wall_s": self._rl_wall_s(first),
            "switch_mode": self.cfg.scheduler.switch_mode,
        }

    def _rl_wall_s(self, first_rollout_at: float | None) -> float:
        """Wall seconds of the RL part: from the first rollout to the last step."""
        if not self.step_at or first_rollout_at is None:
            return 0.0
        return round(self.step_at[-1] - first_rollout_at, 2)

    def _step_s(self, first_rollout_at: float | None) -> float:
        """Mean wall seconds per training step, from the first rollout to the last step."""
        if not self.step_at or first_rollout_at is None:
            return 0.0
        return round((self.step_at[-1] - first_rollout_at) / len(self.step_at), 3)
