"""``Router``: sends every LLM call of an agent session to one of several engines.

* **Routing.** A session sticks to the engine that served its last call (its prefix is in
  that engine's cache) unless that engine is draining, dead, or busier than the least-loaded
  live engine by more than ``affinity_slack`` requests *and* waiting for it costs more than
  re-prefilling the session's cached tokens elsewhere; otherwise the least-loaded engine
  wins (ties: fewest sessions pinned to it, then insertion order). Load is the larger of the
  engine's own ``load()`` (running + waiting) and the router's count of its calls there.
  The wait is the engine's queued requests plus one, times the measured seconds between
  its calls' completions (an average over the last few); the re-prefill is the tokens the
  session's last call left in the cache over ``prefill_tok_s``. Until an engine has
  completed two calls its wait is unknown and the slack alone decides.
* **Drain** (a unit leaving rollout): the engine gets no new calls; calls on it may finish
  until the deadline; each one still running is then aborted there and continued elsewhere.
  In ``mode="migrate"`` (default) the continuation keeps the generated tokens (with their
  logprobs and versions): the new engine re-prefills prompt + kept tokens and generates the
  remaining ``max_tokens``; the caller gets one concatenated :class:`Completion`. In
  ``mode="restart"`` (the baseline) the tokens are discarded and the call starts over.
* **Death.** If an engine's ``generate`` raises ``RuntimeError`` or ``OSError`` (which covers
  ``ConnectionError``), the engine is marked dead and the call continues elsewhere with the
  tokens known so far (none: an exception carries no partial tokens). An engine whose
  ``load()`` raises ``ConnectionError`` is dead too: it never looks idle to the choice.
  Engines may carry a failure *domain* (their node): a call continued after its engine's
  death goes to another domain while one has a live engine, since the dead engine's
  neighbours may be going with it (a lost node takes all its engines, and Ray reports
  their deaths one at a time).

* **Scores** (teacher forcing, :meth:`Router.score`: a scripted agent's oracle text) are
  routed like calls -- same affinity and least-loaded choice, among engines that implement
  :class:`~gyre_core.rollout.engine.ScoringEngine` -- and count as load. A score is one
  prefill, so a drain waits for it until the deadline but never aborts or migrates it; an
  engine that dies under it is marked dead like any other and the score is re-sent elsewhere.

A drained or dead engine stays out of rotation until ``add`` puts it back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from gyre_core.rollout.engine import Completion, Engine, SamplingParams, ScoringEngine

PREFILL_TOK_S = 20_000.0  # a GPU engine's prefill rate (the simulator's default, sim-costs.md)
GAP_WEIGHT = 0.2  # weight of the newest interval in the mean gap between completions


class NoEngineError(RuntimeError):
    """No live, non-draining engine is left to serve a call."""


@dataclass(slots=True)
class RouterStats:
    calls_migrated: int = 0  # calls moved to another engine (drain or death)
    tokens_reprefilled: int = 0  # prompt + kept tokens re-sent to the new engine
    tokens_discarded: int = 0  # generated tokens thrown away (restart mode)
    sessions_restarted: int = 0  # calls started over from scratch (restart mode)
    calls_scored: int = 0  # scores (teacher-forced continuations) answered
    routed: dict[str, int] = field(default_factory=dict)  # engine -> calls sent there


@dataclass(slots=True, eq=False)
class _Call:
    engine: str
    request_id: str  # the id used on the engine (one per attempt)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    evicted: bool = False  # aborted by a drain: continue elsewhere
    cancelled: bool = False  # aborted by the caller: return the partial completion
    score: bool = False  # a teacher-forced score: a drain waits for it, never aborts it


class Router:
    def __init__(
        self,
        engines: dict[str, Engine],
        *,
        mode: Literal["migrate", "restart"] = "migrate",
        affinity_slack: int = 4,
        wait_s: float = 0.0,
        prefill_tok_s: float = PREFILL_TOK_S,
    ) -> None:
        if mode not in ("migrate", "restart"):
            raise ValueError(f"mode must be 'migrate' or 'restart', got {mode!r}")
        self.mode = mode
        self.affinity_slack = affinity_slack
        # With no live engine, a call waits this long for one to join (a unit coming back
        # to rollout) before NoEngineError; 0 raises at once.
        self.wait_s = wait_s
        # The rate a session's cached context re-prefills at on another engine (tokens/s);
        # 0: a session never waits for a busy engine beyond the slack.
        self.prefill_tok_s = prefill_tok_s
        self.stats = RouterStats()
        self._engines: dict[str, Engine] = dict(engines)
        self._draining: set[str] = set()
        self._dead: set[str] = set()
        self._domain: dict[str, str] = {}  # engine -> failure domain ("" = unknown)
        self._sessions: dict[str, str] = {}  # session -> engine of its last call
        self._calls: dict[str, _Call] = {}  # caller's request_id -> current attempt
        self._cached: dict[str, int] = {}  # session -> tokens its last call left cached
        self._gap: dict[str, float] = {}  # engine -> mean seconds between completions
        self._done_at: dict[str, float] = {}  # engine -> its last completion (loop time)
        # Hooks for the runtime: an engine found dead; a call continued on another engine
        # (session_id, from engine, to engine, generated tokens kept).
        self.on_dead: Callable[[str], None] | None = None
        self.on_migrate: Callable[[str, str, str, int], None] | None = None

    # ------------------------------------------------------------------ membership

    def add(self, name: str, engine: Engine, *, domain: str = "") -> None:
        """Add (or bring back) an engine; it is live and accepts calls. ``domain`` names
        what fails together with it (its node); "" leaves it unknown."""
        self._engines[name] = engine
        self._domain[name] = domain
        self._draining.discard(name)
        self._dead.discard(name)

    def remove(self, name: str) -> None:
        """Forget an engine (drain it first to move its calls)."""
        self._engines.pop(name, None)
        self._domain.pop(name, None)
        self._draining.discard(name)
        self._dead.discard(name)

    def mark_dead(self, name: str) -> None:
        """Take an engine out of rotation as dead, from outside (its node was reported
        lost); its calls in flight fail over when their engine raises. No ``on_dead``."""
        if name in self._engines:
            self._dead.add(name)

    def _died(self, name: str) -> None:
        if name in self._dead:
            return
        self._dead.add(name)
        if self.on_dead is not None:
            self.on_dead(name)

    def live(self) -> list[str]:
        return [n for n in self._engines if n not in self._draining and n not in self._dead]

    def session_engine(self, session_id: str) -> str | None:
        return self._sessions.get(session_id)

    def engine(self, name: str) -> Engine | None:
        return self._engines.get(name)

    def calls_by_engine(self) -> dict[str, int]:
        """Calls in flight on each engine (the router's own count)."""
        out: dict[str, int] = {}
        for call in self._calls.values():
            out[call.engine] = out.get(call.engine, 0) + 1
        return out

    def sessions_by_engine(self) -> dict[str, int]:
        """Sessions whose last call each engine served (its prefix cache holds them)."""
        out: dict[str, int] = {}
        for name in self._sessions.values():
            out[name] = out.get(name, 0) + 1
        return out

    def forget_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._cached.pop(session_id, None)

    def _completed(self, name: str, session_id: str, cached: int) -> None:
        """A call ended on ``name``: what it left cached, and the gap since the last one."""
        self._cached[session_id] = cached
        now = asyncio.get_running_loop().time()
        last = self._done_at.get(name)
        self._done_at[name] = now
        if last is not None:
            gap = self._gap.get(name)
            self._gap[name] = now - last if gap is None else gap + GAP_WEIGHT * (now - last - gap)

    def _worth_waiting(self, session_id: str, name: str, waiting: int) -> bool:
        """Whether waiting behind ``name``'s ``waiting`` queued requests costs no more than
        re-prefilling the session's cached tokens on another engine."""
        gap = self._gap.get(name)
        if self.prefill_tok_s <= 0 or gap is None:
            return False
        return (waiting + 1) * gap <= self._cached.get(session_id, 0) / self.prefill_tok_s

    # ------------------------------------------------------------------ calls

    async def generate(
        self, session_id: str, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        if request_id in self._calls:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        kept = Completion([], [], [], "abort")
        attempt = 0
        previous = avoid = ""
        while True:
            if len(kept.token_ids) >= params.max_tokens:  # nothing left to generate
                return _finish(kept, "length", len(prompt_ids))
            name = await self._pick(session_id, avoid=avoid)
            engine = self._engines.get(name)
            if engine is None or name in self._draining or name in self._dead:
                continue  # it left rotation while the loads were being read: pick again
            call = _Call(name, request_id if attempt == 0 else f"{request_id}~{attempt}")
            prompt = prompt_ids + kept.token_ids
            sub = replace(params, max_tokens=params.max_tokens - len(kept.token_ids))
            if attempt and self.mode == "migrate":
                self.stats.tokens_reprefilled += len(prompt)
                if self.on_migrate is not None:
                    self.on_migrate(session_id, previous, name, len(kept.token_ids))
            previous = name
            # no await between registering and submitting: a drain sees the call on `name`
            self._calls[request_id] = call
            self._sessions[session_id] = name
            self.stats.routed[name] = self.stats.routed.get(name, 0) + 1
            try:
                out = await engine.generate(prompt, sub, request_id=call.request_id)
            except (RuntimeError, OSError):
                self._died(name)
                avoid = self._domain.get(name, "")
                self.stats.calls_migrated += 1
                attempt += 1
                continue
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await engine.abort(call.request_id)
                raise
            finally:
                call.done.set()
                self._calls.pop(request_id, None)
            if out.finish_reason != "abort" or not call.evicted or call.cancelled:
                self._completed(name, session_id, len(prompt) + len(out.token_ids))
                return _finish(_concat(kept, out), out.finish_reason, len(prompt_ids))
            attempt += 1
            if self.mode == "migrate":
                kept = _concat(kept, out)
                self.stats.calls_migrated += 1
            else:
                self.stats.tokens_discarded += len(kept.token_ids) + len(out.token_ids)
                self.stats.sessions_restarted += 1
                kept = Completion([], [], [], "abort")

    async def score(
        self, session_id: str, prompt_ids: list[int], completion_ids: list[int], *, request_id: str
    ) -> Completion:
        """Score ``completion_ids`` after ``prompt_ids`` on one engine (teacher forcing, see
        :class:`~gyre_core.rollout.engine.ScoringEngine`), chosen as for a call."""
        if request_id in self._calls:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        attempt = 0
        avoid = ""
        while True:
            name = await self._pick(session_id, scoring=True, avoid=avoid)
            engine = self._engines.get(name)
            if (
                not isinstance(engine, ScoringEngine)
                or name in self._draining
                or name in self._dead
            ):
                continue  # it left rotation while the loads were being read: pick again
            call = _Call(name, request_id if attempt == 0 else f"{request_id}~{attempt}")
            call.score = True
            self._calls[request_id] = call
            self._sessions[session_id] = name
            self.stats.routed[name] = self.stats.routed.get(name, 0) + 1
            try:
                out = await engine.score(prompt_ids, completion_ids, request_id=call.request_id)
            except (RuntimeError, OSError):
                self._died(name)
                avoid = self._domain.get(name, "")
                attempt += 1
                continue
            finally:
                call.done.set()
                self._calls.pop(request_id, None)
            self.stats.calls_scored += 1
            return out

    async def abort(self, request_id: str) -> bool:
        """Abort a call for its caller, who gets the tokens so far (finish_reason "abort")."""
        call = self._calls.get(request_id)
        if call is None or call.engine not in self._engines:
            return False
        call.cancelled = True
        return await self._engines[call.engine].abort(call.request_id)

    async def drain(self, name: str, deadline_s: float) -> int:
        """Stop routing to ``name``; after ``deadline_s`` move its running calls elsewhere.
        Returns how many calls were moved."""
        if name not in self._engines:
            raise KeyError(f"unknown engine {name!r}")
        engine = self._engines[name]
        self._draining.add(name)
        calls = [c for c in self._calls.values() if c.engine == name]
        if calls:
            waits = [asyncio.ensure_future(c.done.wait()) for c in calls]
            _, pending = await asyncio.wait(waits, timeout=max(deadline_s, 0.0))
            for w in pending:
                w.cancel()
        moved = 0
        for c in [c for c in self._calls.values() if c.engine == name and not c.score]:
            c.evicted = True
            if await engine.abort(c.request_id):
                moved += 1
        return moved

    # ------------------------------------------------------------------ choice

    async def _pick(self, session_id: str, *, scoring: bool = False, avoid: str = "") -> str:
        """The engine for a session's next call. ``avoid``: a failure domain that just lost
        an engine; its engines are used only when no other domain has a live one."""

        def candidates() -> list[str]:
            names = self.live()
            if scoring:
                names = [n for n in names if isinstance(self._engines[n], ScoringEngine)]
            away = [n for n in names if self._domain.get(n, "") != avoid]
            return away if avoid and away else names

        live = candidates()
        deadline = asyncio.get_running_loop().time() + self.wait_s
        while not live and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            live = candidates()
        if not live:
            raise NoEngineError(
                f"no engine{' able to score' if scoring else ''} available "
                f"(engines={sorted(self._engines)}, "
                f"draining={sorted(self._draining)}, dead={sorted(self._dead)})"
            )
        read = {n: await self._load(n) for n in live}
        loads = {n: x[0] for n, x in read.items() if x is not None}
        queued = {n: x[1] for n, x in read.items() if x is not None}
        if not loads:  # every candidate died while its load was read: choose again
            return await self._pick(session_id, scoring=scoring, avoid=avoid)
        live = list(loads)
        least = min(loads.values())
        last = self._sessions.get(session_id)
        if last in loads and (
            loads[last] <= least + self.affinity_slack
            or self._worth_waiting(session_id, last, queued[last])
        ):
            return last
        pinned = {n: 0 for n in live}
        for n in self._sessions.values():
            if n in pinned:
                pinned[n] += 1
        return min(live, key=lambda n: (loads[n], pinned[n]))

    async def _load(self, name: str) -> tuple[int, int] | None:
        """Calls on ``name`` (running + waiting) and those of them waiting for a slot; None
        when it died while being asked."""
        mine = sum(1 for c in self._calls.values() if c.engine == name)
        engine = self._engines.get(name)  # it may have left while other loads were read
        if engine is None:
            return mine, 0
        try:
            load = await engine.load()
        except ConnectionError:  # the engine is gone (a lost actor or server)
            self._died(name)
            return None
        except (RuntimeError, OSError):  # a slow or failed read: count the router's calls
            return mine, 0
        return max(mine, load.running + load.waiting), load.waiting


def _concat(a: Completion, b: Completion) -> Completion:
    return Completion(
        a.token_ids + b.token_ids, a.logprobs + b.logprobs, a.versions + b.versions, b.finish_reason
    )


def _finish(c: Completion, finish_reason: str, prompt_tokens: int) -> Completion:
    return Completion(c.token_ids, c.logprobs, c.versions, finish_reason, prompt_tokens)
