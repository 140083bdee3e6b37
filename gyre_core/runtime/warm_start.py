"""The supervised warm start of a real run: steps on scripted demonstrations of training
tasks before RL, an annealing tail at a lower rate, and the two ways to skip it (an
identical earlier warm start from the cache, runtime/warm_cache.py, or the weights file
``warm_start.weights`` names, which ``gyre warm-start`` writes: runtime/warm_file.py). Its progress is reported as
``phase_progress`` events (:data:`PHASE`, :data:`ANNEAL_PHASE`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gyre_core import events as ev
from gyre_core.rollout.agents import ScriptedAgent
from gyre_core.rollout.chat_log import read_demonstrations
from gyre_core.rollout.harness import run_session
from gyre_core.runtime import warm_cache
from gyre_core.runtime.session import SessionFactory
from gyre_core.runtime.warm_target import LocalTrainer, WarmTarget
from gyre_core.train.trainer import Trainer
from gyre_core.trajectory.format import Rollout

PHASE, ANNEAL_PHASE = "warm start", "warm start (anneal)"  # phase_progress names
ROUND_PHASE = "warm start (round)"  # a round at the warm start's rate after the tail
REPORT_EVERY = 25  # steps between phase_progress events (fewer steps: about ten a phase)


class WarmStart:
    """Runs a config's warm start on a trainer; afterwards ``warm_start_losses`` (per step),
    ``warm_start_s`` and ``warm_start_cached`` (the cache entry or weights file it was
    loaded from, else "") describe it for the summary."""

    def __init__(self, sessions: SessionFactory) -> None:
        self.cfg, self.model_dir = sessions.cfg, sessions.model_dir
        self.tokenizer, self.harness = sessions.tokenizer, sessions.harness
        self.sink, self.clock = sessions.sink, sessions.clock
        self.suite = sessions.suite
        self._data: list[Rollout] | None = None  # warm_start.data, once read
        self.warm_start_s = 0.0
        self.warm_start_losses: list[float] = []
        self.warm_start_cached = ""  # the cache entry the warm start was loaded from
        # The mean loss of its last 20 steps when the supervised part ran to its cap above
        # ``warm_start.until_loss``, or its last round ended above
        # ``warm_start.settle_loss`` (None: it reached its targets, or has none);
        # ``missed_field`` names the target missed.
        self.missed_target: float | None = None
        self.missed_field = ""
        self.anneal_from = 0  # the steps before the annealing tail first began

    async def run(
        self,
        trainer: WarmTarget | Trainer,
        first_step: int = 0,
        *,
        anneal: bool = True,
        stop: int = 0,
    ) -> list[float]:
        """Supervised steps on scripted demonstrations of training tasks: each step trains
        on ``warm_start.demos`` fresh ones (tasks 10_000 + ..., apart from the RL
        tasks) at ``warm_start.lr`` (ending early at ``warm_start.until_loss``),
        played by a demonstrator that skips a share ``warm_start.skip_check`` of its
        checks; then ``warm_start.anneal_steps`` more at ``warm_start.anneal_lr``
        (see :meth:`anneal`; ``anneal=False`` leaves them out). With
        ``warm_start.cache`` an identical earlier warm start is loaded instead
        (runtime/warm_cache.py; the summary then names it in ``warm_start_cached``).
        ``first_step`` continues an earlier warm start of that many steps (the
        demonstrations go on where it stopped); ``stop`` (0: ``warm_start.steps``)
        is the step the supervised part ends before. Returns the per-step losses."""
        trainer = _target(trainer)
        t, w = self.cfg.train, self.cfg.warm_start
        if w.weights:
            return await self.load(trainer, Path(w.weights))
        folder = None
        if w.cache and not first_step and anneal:  # whole warm starts only
            folder = Path(w.cache) / warm_cache.cache_key(self.cfg, self.model_dir)
            meta = await warm_cache.load(folder, trainer)
            if meta is not None:
                self.warm_start_s, self.warm_start_losses = meta["seconds"], meta["losses"]
                self.missed_target = meta.get("missed_target")
                self.missed_field = meta.get("missed_field", "")
                self.warm_start_cached = str(folder)
                return list(meta["losses"])
        t0 = self.clock()
        losses = await self._supervised(
            trainer,
            first_step,
            stop or w.steps,
            w.lr or t.lr,
            w.until_loss,
        )
        self.anneal_from = first_step + len(losses)
        if anneal:
            losses += await self.settle(trainer, first_step + len(losses))
        self.warm_start_s = round(self.clock() - t0, 2)
        self.warm_start_losses = losses
        if folder is not None:
            meta = {"seconds": self.warm_start_s, "losses": losses}
            missed = {"missed_target": self.missed_target, "missed_field": self.missed_field}
            await warm_cache.store(folder, trainer, {**meta, **missed})
        return losses

    async def settle(self, trainer: WarmTarget | Trainer, first_step: int) -> list[float]:
        """The annealing tail (:meth:`anneal`); then, while the mean loss of its last 20
        steps is above ``warm_start.settle_loss``, up to ``warm_start.rounds``
        rounds of ``warm_start.anneal_steps`` steps at ``warm_start.lr`` and
        the tail again. A copy the low rate cannot form (a key or a name the model does
        not copy yet: the tail's loss stays flat) forms at the high one. A warm start
        still above the target after its last round says so (``missed_target``)."""
        trainer = _target(trainer)
        t, w = self.cfg.train, self.cfg.warm_start
        losses = await self.anneal(trainer, first_step)
        target = w.settle_loss
        if not (target and losses):
            return losses
        for _ in range(w.rounds):
            if _mean20(losses) <= target:
                break
            step = first_step + len(losses)
            stop = step + w.anneal_steps
            lr = w.lr or t.lr
            losses += await self._supervised(trainer, step, stop, lr, 0.0, phase=ROUND_PHASE)
            losses += await self.anneal(trainer, first_step + len(losses))
        n = w.anneal_steps
        if _mean20(losses) <= target:
            self._report(ANNEAL_PHASE, n, n, losses, target, "target reached")
        else:
            self.missed_target = round(_mean20(losses), 4)
            self.missed_field = "warm_start.settle_loss"
            note = "target NOT reached: raise warm_start.rounds"
            self._report(ANNEAL_PHASE, n, n, losses, target, note)
        return losses

    async def anneal(self, trainer: WarmTarget, first_step: int) -> list[float]:
        """The warm start's last ``warm_start.anneal_steps`` steps, at the lower
        ``warm_start.anneal_lr``, on the demonstrations after step ``first_step``.
        The high rate that finds the copying keeps it noisy (a loss that plateaus near
        0.1); a lower one settles it (docs/learning.md)."""
        t, w = self.cfg.train, self.cfg.warm_start
        if not w.anneal_steps:
            return []
        return await self._supervised(
            trainer,
            first_step,
            first_step + w.anneal_steps,
            w.anneal_lr or t.lr,
            0.0,
            phase=ANNEAL_PHASE,
        )

    def data(self) -> list[Rollout]:
        """The demonstrations of ``warm_start.data``, read once (a bad line fails the
        run at its warm start, naming the file, the line and the field)."""
        if self._data is None:
            self._data = read_demonstrations(
                Path(self.cfg.warm_start.data), self.tokenizer, self.cfg.model.chat_template
            )
            if not self._data:
                raise ValueError(f"warm_start.data: {self.cfg.warm_start.data}: no rollouts")
        return self._data

    async def _demo(self, k: int) -> Rollout:
        """The ``k``-th demonstration: from the data file (cycling), or played by the
        scripted demonstrator on training task ``10_000 + k``."""
        w = self.cfg.warm_start
        if w.data:
            data = self.data()
            return data[k % len(data)]
        env = self.suite.env("train", 10_000 + k, k)
        try:
            agent = ScriptedAgent(env, self.tokenizer, seed=k, skip_check=w.skip_check)
            return await run_session(
                env, agent, self.tokenizer, self.harness, rollout_id=f"demo{k}"
            )
        finally:
            env.close()

    async def _supervised(
        self,
        trainer: WarmTarget,
        start: int,
        stop: int,
        lr: float,
        until_loss: float,
        phase: str = PHASE,
    ) -> list[float]:
        """Warm-start steps ``start`` .. ``stop - 1`` at ``lr`` (RL's rate restored after,
        the version reset to 0), ending early once the mean loss of the last 20 steps is
        at or under ``until_loss`` (0: never). ``phase_progress`` events count the steps
        (of ``stop`` for the warm start, of its own steps for the annealing tail)."""
        w = self.cfg.warm_start
        n = w.demos or self.cfg.rollout.tasks_per_step
        losses: list[float] = []
        if phase == PHASE:
            self.missed_target, self.missed_field = None, ""
        base = start if phase != PHASE else 0
        every = max(1, min(REPORT_EVERY, (stop - base) // 10))
        self._report(phase, start - base, stop - base, losses, until_loss)
        for step in range(start, stop):
            demos = [await self._demo(k) for k in range(step * n, (step + 1) * n)]
            losses.append(await trainer.sft(trainer.prepare(demos, 0), lr))
            if until_loss and len(losses) >= 20 and _mean20(losses) <= until_loss:
                self._report(
                    phase, step + 1 - base, stop - base, losses, until_loss, "target reached"
                )
                break
            missed = bool(until_loss) and step + 1 == stop >= w.steps  # at its cap
            if missed:
                self.missed_target = round(_mean20(losses), 4)
                self.missed_field = "warm_start.until_loss"
            if (step + 1 - base) % every == 0 or step + 1 == stop:
                note = "target NOT reached: raise warm_start.steps" if missed else ""
                self._report(phase, step + 1 - base, stop - base, losses, until_loss, note)
        trainer.version = 0  # the warm-started weights are the RL run's version 0
        return losses

    def _report(
        self, phase: str, done: int, total: int, losses: list[float], target: float, note: str = ""
    ) -> None:
        """A ``phase_progress`` event: step ``done`` of ``total``, the mean loss of the
        last 20 steps and the target loss (when there is one)."""
        parts = [f"loss {_mean20(losses):.3f}"] if losses else []
        if target:
            parts.append(f"(target {target:g})" if losses else f"target {target:g}")
        if note:
            parts.append(note)
        self.sink.emit(
            ev.PhaseProgress(
                t=self.clock(), phase=phase, done=done, total=total, message=" ".join(parts)
            )
        )

    async def load(self, trainer: WarmTarget | Trainer, path: Path) -> list[float]:
        """Begin from the weights an earlier warm start wrote (``warm_start.weights``,
        written by ``gyre warm-start``: runtime/warm_file.py); its ``<stem>.json`` beside
        them, when present, gives the steps' losses and seconds for the summary. A file
        that does not fit this run's model is refused by name."""
        trainer = _target(trainer)
        if not path.is_file():
            raise ValueError(f"warm_start.weights: no such file {path}")
        try:
            await trainer.load_weights(path)
        except ValueError as e:
            raise ValueError(
                f"warm_start.weights: {path} does not fit this run's model "
                f"(model.* settings): {str(e).splitlines()[0]}"
            ) from None
        meta_path = path.with_suffix(".json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        want = meta.get("tokenizer_sha256")
        if want and want != tokenizer_hash(self.model_dir):  # same shapes, other token ids
            raise ValueError(
                f"warm_start.weights: {path} was trained with another tokenizer "
                f"than this run's (model.tokenizer, model.* settings)"
            )
        self.missed_target = meta.get("missed_target")
        self.missed_field = meta.get("missed_field") or (
            "warm_start.until_loss" if self.missed_target is not None else ""
        )
        self.warm_start_s = float(meta.get("seconds", 0.0))
        self.warm_start_losses = [float(x) for x in meta.get("losses", [])]
        self.warm_start_cached = str(path)
        trainer.version = 0
        return list(self.warm_start_losses)


def missed_message(target: float | None, field: str) -> str:
    """The warning a run and ``gyre warm-start`` print when a warm start missed the target
    ``field`` names, ending at mean loss ``target`` ('' when none was missed)."""
    if target is None:
        return ""
    more = "rounds" if field.endswith("settle_loss") else "steps"
    return (
        f"warning: the warm start did not reach {field}: its last 20 steps averaged "
        f"{target:.3f}; RL may not learn from it (raise warm_start.{more})"
    )


def _target(trainer: WarmTarget | Trainer) -> WarmTarget:
    """A plain trainer is trained in this process (``gyre warm-start``, tests)."""
    return LocalTrainer(trainer) if isinstance(trainer, Trainer) else trainer


def _mean20(losses: list[float]) -> float:
    recent = losses[-20:]
    return sum(recent) / len(recent)


def tokenizer_hash(model_dir: Path) -> str:
    """The sha256 of a model folder's ``tokenizer.json``: a warm-start file records the
    tokenizer its token ids mean, and a run with another one refuses the file."""
    return hashlib.sha256((Path(model_dir) / "tokenizer.json").read_bytes()).hexdigest()
