"""The agent harness: runs agent sessions on task environments and logs every LLM call in
``gyre.trajectory/v1`` (:class:`~gyre_core.trajectory.format.Rollout`).

A session (:func:`run_session`) is one asyncio coroutine. Its text, as tokens, is::

    <task prompt>\\n  > <action>\\n  <observation>\\n  > <action>\\n ...

Each agent (``main``, and ``sub-<i>`` with ``delegate``) owns a context: a token list that
only grows by appending -- prompt pieces are tokenized one at a time, never re-tokenized --
so every call's full prompt extends an earlier call's full sequence and is logged with
``prefix`` pointing at it (the *anchor*). That is what lets the tree builder share tokens:
across turns, with the task prompt of sub-agents and post-compaction contexts, across the
branches of a retry, and across the rollouts of a GRPO group (:func:`run_group`).

* **Compaction.** Before a call, if an agent's context holds more than ``context_budget``
  tokens and something beyond its root (+ last summary), the agent writes a one-line
  summary (call kind ``compaction``) and its context restarts from its root (task prompt,
  plus the sub-goal for a sub-agent) + the summary.
* **Sub-agents.** With ``delegate``, the parent makes one call per component (its brief),
  the sub-agent ``sub-<i>`` works on that component in its own context (first call kind
  ``subagent``) until it is done or ``subagent_max_turns`` pass, and a result line returns
  to the parent's context as an observation. The parent then closes the episode.
* **Retries.** An agent holds a save point (environment, its context, the agent's own
  state), taken when it starts and again whenever one more component is done. A step that
  fails in a way the agent cannot repair in place (``env.last_failed``) or
  ``retry_after_errors`` error observations in a row restore the save point; the next
  call has kind ``retry``. At most ``max_retries`` restores per session; after that the
  agent carries on from where it is.
* **Budgets** (turns, generated tokens, harness-clock seconds) end the session with status
  ``timeout``; ``progress`` keeps what was reached. The harness clock is real time not
  spent sleeping plus the simulated tool latency (slept as ``latency * tool_time_scale``).
* **Events**: ``rollout_started``, ``rollout_progress`` every ``progress_every`` turns,
  ``rollout_finished`` with the (min, max) policy versions of the generated tokens
  ((0, 0) when no call was made). Event ``t`` is the session's harness clock.

An exception from the router or engine (e.g. ``NoEngineError``) propagates to the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gyre_core.events import EventSink, NullSink, RolloutFinished, RolloutProgress, RolloutStarted
from gyre_core.rollout.agents import Agent, Ask, Codec, Generated, Purpose
from gyre_core.rollout.config import RolloutConfig
from gyre_core.rollout.harness_config import HarnessOptions
from gyre_core.rollout.task_env import TaskEnv, make_env
from gyre_core.trajectory.format import Call, Prefix, Rollout

ACTION_CUE = "> "
SUMMARY_CUE = "\nSummarize the progress so far in one line:\n"


class _Stop(Exception):
    """A budget ran out; ``reason`` names it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Clock:
    def __init__(self) -> None:
        self._start = time.monotonic()
        self.slept = 0.0
        self.latency = 0.0

    def now(self) -> float:
        return time.monotonic() - self._start - self.slept + self.latency

    async def tool(self, latency_s: float, scale: float) -> None:
        self.latency += latency_s
        if scale > 0 and latency_s > 0:
            t0 = time.monotonic()
            await asyncio.sleep(latency_s * scale)
            self.slept += time.monotonic() - t0


@dataclass(slots=True)
class _Context:
    agent: str
    session_id: str
    root: list[int]  # task prompt (+ sub-goal): where a compaction restarts
    tokens: list[int]
    anchor: Prefix | None = None  # an earlier call whose full sequence starts self.tokens
    root_anchor: Prefix | None = None  # a call whose full sequence starts with self.root
    pending_kind: str | None = None  # kind of this agent's next action call
    floor: int = 0  # no compaction at or below this length (see _Session._floor)


@dataclass(slots=True)
class _SavePoint:
    env: Any
    agent: Any
    tokens: list[int]
    anchor: Prefix | None
    floor: int
    progress: float
    completed: int


@dataclass(slots=True)
class _Session:
    env: TaskEnv
    agent: Agent
    codec: Codec
    cfg: RolloutConfig
    options: HarnessOptions
    sink: EventSink
    rollout_id: str
    group_id: str
    seed: int
    step: int
    calls: list[Call] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    clock: _Clock = field(default_factory=_Clock)
    generated: int = 0
    turns: int = 0
    done: bool = False
    retries: list[dict[str, Any]] = field(default_factory=list)
    last_obs: str = ""

    # ------------------------------------------------------------------ top level

    async def run(self) -> Rollout:
        task_id = self.env.task_id
        self.sink.emit(
            RolloutStarted(
                t=0.0,
                rollout_id=self.rollout_id,
                task_id=task_id,
                group_id=self.group_id,
                step=self.step,
            )
        )
        root = self.codec.encode(self.env.reset() + "\n")
        main = _Context("main", self.rollout_id, root, list(root), floor=self._floor(root))
        status, reason = "completed", None
        try:
            if self.options.delegate:
                await self._delegate_all(main)
                await self._work(main, None, "finish")
            else:
                await self._work(main, None, "action")
        except _Stop as stop:
            status, reason = "timeout", stop.reason
        progress = float(self.env.progress())
        versions = [int(v) for c in self.calls for v in c.versions]
        span = (min(versions), max(versions)) if versions else (0, 0)
        self._progress_event(force=True)
        self.sink.emit(
            RolloutFinished(
                t=self.clock.now(),
                rollout_id=self.rollout_id,
                status=status,
                progress=progress,
                reward=progress,
                turns=self.turns,
                tokens=self.generated,
                versions=span,
            )
        )
        extra = {
            "turns": self.turns,
            "tokens_generated": self.generated,
            "clock_s": round(self.clock.now(), 6),
            "stop_reason": reason,
            "seed": self.seed,
            "retries": self.retries,
        }
        return Rollout(
            self.rollout_id, task_id, status, progress, self.calls, self.group_id, None, extra
        )

    # ------------------------------------------------------------------ agents at work

    async def _work(self, ctx: _Context, component: int | None, purpose: Purpose) -> None:
        """Act until the episode (or ``component``, or the sub-agent's turn cap) is done."""
        save = self._save(ctx)
        errors = 0
        cap = self._sub_cap() if component is not None else None
        start = self.turns
        while not self.done:
            if component is not None and self.env.component_done(component):
                return
            if cap is not None and self.turns - start >= cap:
                return
            await self._maybe_compact(ctx, component)
            ctx.tokens += self.codec.encode(ACTION_CUE)
            gen = await self._advance(ctx, purpose, component)
            await self._act(ctx, gen.text)
            errors = errors + 1 if self.env.last_error else 0
            failure = None
            if self.env.last_failed:
                failure = "failed check: " + self.last_obs.split("\n", 1)[0][:80]
            elif errors >= self.options.retry_after_errors:
                failure = f"{errors} error observations in a row"
            if failure and not self.done and len(self.retries) < self.options.max_retries:
                self._restore(ctx, save, failure)
                errors = 0
            elif self._completed() > save.completed:
                save = self._save(ctx)

    async def _delegate_all(self, main: _Context) -> None:
        for i, comp in enumerate(self.env.components()):
            if self.done:
                return
            if self.env.component_done(i):
                continue
            await self._maybe_compact(main, None)
            main.tokens += self.codec.encode(ACTION_CUE)
            brief = await self._advance(main, "delegate", i)
            header = (
                f"You are sub-agent {i}. Sub-goal: {comp.goal}\n"
                f"Brief from the main agent: {brief.text}\n"
            )
            sub_root = main.root + self.codec.encode(header)
            sub = _Context(
                f"sub-{i}",
                f"{self.rollout_id}/sub-{i}",
                sub_root,
                list(sub_root),
                floor=self._floor(sub_root),
            )
            sub.anchor, sub.pending_kind = main.root_anchor, "subagent"
            before = self.turns
            await self._work(sub, i, "action")
            state = "done" if self.env.component_done(i) else "not done"
            result = (
                f"sub-{i} result: {comp.name} {state} after {self.turns - before} steps; "
                f"progress {self.env.progress():.2f}; last: {self.last_obs.splitlines()[0][:80]}"
                if self.last_obs
                else f"sub-{i} result: {comp.name} {state}; no steps taken"
            )
            main.tokens += self.codec.encode(result + "\n")

    def _sub_cap(self) -> int:
        if self.options.subagent_max_turns is not None:
            return self.options.subagent_max_turns
        return max(1, self.cfg.max_turns // max(1, len(self.env.components())))

    # ------------------------------------------------------------------ calls

    def _budget(self) -> None:
        cfg = self.cfg
        if self.turns >= cfg.max_turns:
            raise _Stop("max_turns")
        if cfg.token_budget and self.generated >= cfg.token_budget:
            raise _Stop("token_budget")
        if cfg.time_budget_s and self.clock.now() >= cfg.time_budget_s:
            raise _Stop("time_budget")

    async def _call(
        self, ctx: _Context, prompt: list[int], purpose: Purpose, component: int | None, kind: str
    ) -> tuple[Generated, str]:
        """Make and log one call whose full prompt is ``prompt`` (it extends ctx.tokens)."""
        self._budget()
        n = len(self.calls)
        call_id = f"c{n}"
        max_tokens = self.cfg.max_new_tokens
        if self.cfg.token_budget:
            max_tokens = max(1, min(max_tokens, self.cfg.token_budget - self.generated))
        ask = Ask(
            session_id=ctx.session_id,
            request_id=f"{self.rollout_id}/{call_id}",
            agent=ctx.agent,
            prompt_ids=prompt,
            purpose=purpose,
            component=component,
            max_tokens=max_tokens,
            temperature=self.cfg.temperature,
            seed=(self.seed * 1_000_003 + n) % 2**63,
        )
        gen = await self.agent.generate(ask)
        anchor = ctx.anchor if ctx.anchor is not None and ctx.anchor.tokens > 0 else None
        head = anchor.tokens if anchor is not None else 0
        self.calls.append(
            Call(
                call_id,
                np.asarray(prompt[head:], dtype=np.int64),
                np.asarray(gen.token_ids, dtype=np.int64),
                np.asarray(gen.logprobs, dtype=np.float64),
                np.asarray(gen.versions, dtype=np.int64),
                agent=ctx.agent,
                kind=kind,
                prefix=anchor,
            )
        )
        self.kinds[kind] += 1
        self.generated += len(gen.token_ids)
        if ctx.root_anchor is None:
            ctx.root_anchor = Prefix(call_id, len(ctx.root))
        return gen, call_id

    async def _advance(self, ctx: _Context, purpose: Purpose, component: int | None) -> Generated:
        """A call on the whole context; the completion joins the context (and a newline
        when the completion did not end with one)."""
        kind = ctx.pending_kind or "continue"
        gen, call_id = await self._call(ctx, ctx.tokens, purpose, component, kind)
        ctx.pending_kind = None
        ctx.tokens = ctx.tokens + gen.token_ids
        ctx.anchor = Prefix(call_id, len(ctx.tokens))
        if not self.codec.decode(gen.token_ids).endswith("\n"):
            ctx.tokens += self.codec.encode("\n")
        return gen

    async def _maybe_compact(self, ctx: _Context, component: int | None) -> None:
        if len(ctx.tokens) <= self.cfg.context_budget or len(ctx.tokens) <= ctx.floor:
            return
        prompt = ctx.tokens + self.codec.encode(SUMMARY_CUE)
        gen, _ = await self._call(ctx, prompt, "summary", component, "compaction")
        ctx.tokens = ctx.root + self.codec.encode(f"Summary of earlier work: {gen.text}\n")
        ctx.anchor = ctx.root_anchor
        ctx.floor = self._floor(ctx.tokens)

    def _floor(self, tokens: list[int]) -> int:
        """A context is compacted only once it holds a turn beyond ``tokens`` (its root,
        or root + summary): compacting a context with nothing new in it gains nothing."""
        return len(tokens) + len(self.codec.encode(ACTION_CUE))

    # ------------------------------------------------------------------ environment

    async def _act(self, ctx: _Context, action: str) -> None:
        obs, done = await asyncio.to_thread(self.env.step, action)
        self.turns += 1
        self.done = done
        self.last_obs = obs
        await self.clock.tool(self.env.tool_latency_s, self.cfg.tool_time_scale)
        ctx.tokens += self.codec.encode(obs + "\n")
        self._progress_event()

    def _progress_event(self, force: bool = False) -> None:
        if force or self.turns % self.options.progress_every == 0:
            self.sink.emit(
                RolloutProgress(
                    t=self.clock.now(),
                    rollout_id=self.rollout_id,
                    turns=self.turns,
                    tokens=self.generated,
                    progress=float(self.env.progress()),
                    branches=dict(self.kinds),
                )
            )

    def _completed(self) -> int:
        return sum(self.env.component_done(i) for i in range(len(self.env.components())))

    def _save(self, ctx: _Context) -> _SavePoint:
        return _SavePoint(
            self.env.snapshot(),
            self.agent.snapshot(),
            list(ctx.tokens),
            ctx.anchor,
            ctx.floor,
            float(self.env.progress()),
            self._completed(),
        )

    def _restore(self, ctx: _Context, save: _SavePoint, reason: str) -> None:
        before = float(self.env.progress())
        self.env.restore(save.env)
        self.agent.restore(save.agent)
        ctx.tokens, ctx.floor = list(save.tokens), save.floor
        # a save point taken before this agent's first call holds no anchor, but its
        # tokens start with the root, which a call made since then does cover
        ctx.anchor = save.anchor if save.anchor is not None else ctx.root_anchor
        ctx.tokens += self.codec.encode(f"(restored to the save point after: {reason})\n")
        ctx.pending_kind = "retry"
        self.retries.append(
            {
                "agent": ctx.agent,
                "reason": reason,
                "turn": self.turns,
                "progress_at_save": save.progress,
                "progress_before_restore": before,
                "progress_after_restore": float(self.env.progress()),
            }
        )


# ---------------------------------------------------------------------------- public API


async def run_session(
    env: TaskEnv,
    agent: Agent,
    tokenizer: Any,
    config: RolloutConfig | None = None,
    *,
    options: HarnessOptions | None = None,
    rollout_id: str,
    group_id: str = "",
    sink: EventSink | None = None,
    seed: int = 0,
    step: int = 0,
) -> Rollout:
    """Run one agent session on ``env`` (already constructed, not yet reset) and return
    its rollout. ``config``: the run's ``rollout`` section, whose budgets the session keeps
    (a ``time_budget_s`` or ``token_budget`` of 0 sets no limit); ``options``: the
    harness's own knobs (default: ``config``'s, :meth:`HarnessOptions.of`). ``tokenizer``: a transformers tokenizer or any object with
    ``encode``/``decode``; it must be the one the policy's engines use."""
    if not rollout_id:
        raise ValueError("rollout_id must be a non-empty string")
    session = _Session(
        env=env,
        agent=agent,
        codec=tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer),
        cfg=config or RolloutConfig(),
        options=options or HarnessOptions.of(config or RolloutConfig()),
        sink=sink or NullSink(),
        rollout_id=rollout_id,
        group_id=group_id or rollout_id,
        seed=seed,
        step=step,
    )
    return await session.run()


@dataclass(frozen=True, slots=True)
class TaskRef:
    """A task by name: ``make_env(suite, split, index, suite_seed=suite_seed)``."""

    suite: str
    split: str = "train"
    index: int | str = 0
    suite_seed: int = 0


async def run_group(
    task: TaskRef,
    n: int,
    *,
    make_agent: Callable[[TaskEnv], Agent],
    tokenizer: Any,
    config: RolloutConfig | None = None,
    options: HarnessOptions | None = None,
    sink: EventSink | None = None,
    group_id: str = "",
    seed: int = 0,
    step: int = 0,
) -> list[Rollout]:
    """Run ``n`` sessions of ``task`` concurrently as one GRPO group: one ``group_id``,
    session ``i`` seeded ``seed + i`` (environment and sampling). Returns them in order."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    envs = [
        make_env(task.suite, task.split, task.index, seed + i, suite_seed=task.suite_seed)
        for i in range(n)
    ]
    codec = tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer)
    gid = group_id or f"{envs[0].task_id}/step-{step}/seed-{seed}"
    try:
        return list(
            await asyncio.gather(
                *(
                    run_session(
                        env,
                        make_agent(env),
                        codec,
                        config,
                        options=options,
                        rollout_id=f"{gid}/r{i}",
                        group_id=gid,
                        sink=sink,
                        seed=seed + i,
                        step=step,
                    )
                    for i, env in enumerate(envs)
                )
            )
        )
    finally:
        for env in envs:
            env.close()


__all__ = ["HarnessOptions", "TaskRef", "run_group", "run_session"]
