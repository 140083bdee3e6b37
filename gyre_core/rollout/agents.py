"""Who writes an agent's text: the policy behind the router, or a scripted oracle.

The harness owns the context (token ids) and asks an :class:`Agent` for one completion per
call with an :class:`Ask`. Both agents answer with a :class:`Generated` -- token ids,
log-probabilities and versions -- so the harness logs their calls the same way.

* :class:`ModelAgent` sends the call through :class:`~gyre_core.rollout.router.Router`;
  an action stops at the first newline (``stop_token_ids`` = every vocabulary entry whose
  text holds a newline, plus end-of-text) unless the environment takes multi-line actions.
* :class:`ScriptedAgent` replays the environment's oracle plan. Its text is tokenized and
  logged as the completion. Given a ``router``, the call goes through an engine: the router
  *scores* the forced text (teacher forcing, ``Router.score``), so the call logs the policy's
  real per-token logprobs and the serving engine's version, like a model-driven call.
  Without one (fast unit tests) it logs log-probability 0.0 and version ``version`` -- an
  int, or a callable read at each call. For compaction it writes a deterministic summary of
  the environment's progress.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from transformers import PreTrainedTokenizerBase

from gyre_core.rollout.engine import SamplingParams
from gyre_core.rollout.router import Router
from gyre_core.rollout.task_env import TaskEnv

Purpose = Literal["action", "summary", "delegate", "finish"]


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class Codec:
    """Text <-> token ids with a transformers tokenizer (no special tokens added, special
    tokens dropped when decoding) or any object with ``encode``/``decode``."""

    def __init__(self, tokenizer: Any) -> None:
        if not (
            callable(getattr(tokenizer, "encode", None))
            and callable(getattr(tokenizer, "decode", None))
        ):
            raise TypeError(f"tokenizer must have encode/decode, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self._hf = isinstance(tokenizer, PreTrainedTokenizerBase)
        self._stops: tuple[int, ...] | None = None

    def encode(self, text: str) -> list[int]:
        if self._hf:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        if self._hf:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return str(self.tokenizer.decode(ids))

    def eos_ids(self) -> tuple[int, ...]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return (eos,) if isinstance(eos, int) else ()

    def newline_stop_ids(self) -> tuple[int, ...]:
        """Ids whose text contains a newline (all of them when the vocabulary can be
        listed, else the encoding of ``"\\n"``), plus end-of-text."""
        if self._stops is None:
            try:
                size = len(self.tokenizer)
            except TypeError:
                ids = set(self.encode("\n"))
            else:
                ids = {i for i in range(size) if "\n" in self.decode([i])}
            self._stops = tuple(sorted(ids | set(self.eos_ids())))
        return self._stops


@dataclass(frozen=True, slots=True)
class Ask:
    """One call the harness wants made. ``purpose``: an environment action, a compaction
    summary, the parent's brief for a sub-agent working on ``component``, or the parent's
    closing action once every component was delegated."""

    session_id: str
    request_id: str
    agent: str  # "main" or "sub-<i>"
    prompt_ids: list[int]
    purpose: Purpose
    component: int | None
    max_tokens: int
    temperature: float
    seed: int


@dataclass(slots=True)
class Generated:
    text: str  # the action / summary / brief, as the harness should act on it
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str


class Agent(Protocol):
    async def generate(self, ask: Ask) -> Generated: ...

    def snapshot(self) -> Any:
        """State to restore with the environment at a save point."""

    def restore(self, snap: Any) -> None: ...


class ModelAgent:
    """The policy: every call goes through ``router``; stateless across calls."""

    def __init__(self, router: Router, tokenizer: Any, *, multiline: bool = False) -> None:
        self.router = router
        self.codec = tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer)
        self.multiline = multiline

    async def generate(self, ask: Ask) -> Generated:
        multi = self.multiline and ask.purpose in ("action", "finish")
        stops = self.codec.eos_ids() if multi else self.codec.newline_stop_ids()
        params = SamplingParams(
            max_tokens=ask.max_tokens,
            temperature=ask.temperature,
            stop_token_ids=stops,
            seed=ask.seed,
        )
        out = await self.router.generate(
            ask.session_id, ask.prompt_ids, params, request_id=ask.request_id
        )
        text = self.codec.decode(out.token_ids)
        text = text.strip() if multi else text.split("\n", 1)[0].strip()
        return Generated(text, out.token_ids, out.logprobs, out.versions, out.finish_reason)

    def snapshot(self) -> Any:
        return None

    def restore(self, snap: Any) -> None:
        pass


class ScriptedAgent:
    """The oracle for one environment: replays ``env.oracle_actions`` component by
    component (with ``delegate``, the parent hands out components and each ``sub-<i>``
    replays component ``i``), then ``env.finish_action()``.

    ``fault_at=i`` injects one mistake for tests of retries: on its first attempt at
    component ``i`` (>= 1) it overwrites a value of component ``i-1`` and re-checks it, a
    failure that a restore to the save point before component ``i`` undoes; after any
    restore it plays clean.

    ``router``: when given, every call is scored by an engine behind it (teacher forcing:
    one forward pass over prompt + oracle text), and the logged call carries the engine's
    logprobs, version and finish_reason ``"forced"``; ``version`` is then unused.

    ``skip_check=q`` makes it a *hasty* demonstrator (the warm start of docs/learning.md):
    after writing a component it moves on to the next without its check with probability
    ``q``; once every file is written it checks each unchecked component in turn, latest
    first (the one a status bar names), with probability ``1 - q``, else submits untested
    work. Every choice between checking and going on is thus made with probability ``1 - q``
    (the last component's check is the first choice of the end, not a second chance).
    Choices are seeded by ``seed``."""

    def __init__(
        self,
        env: TaskEnv,
        tokenizer: Any,
        *,
        version: int | Callable[[], int] = 0,
        fault_at: int | None = None,
        router: Router | None = None,
        skip_check: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= skip_check < 1.0:
            raise ValueError(f"skip_check must be in [0, 1), got {skip_check}")
        if fault_at is not None and not 1 <= fault_at < len(env.components()):
            raise ValueError(
                f"fault_at must name a component after the first (1..{len(env.components()) - 1}),"
                f" got {fault_at}"
            )
        self.env = env
        self.codec = tokenizer if isinstance(tokenizer, Codec) else Codec(tokenizer)
        self.version = version
        self.fault_at = fault_at
        self.router = router
        self.skip_check = skip_check
        self.seed = seed
        self._cursor: dict[str, int] = {}
        self._restores = 0

    def _plan(self, agent: str, component: int | None) -> list[str]:
        n = len(self.env.components())
        if agent.startswith("sub-") and component is not None:
            return self.env.oracle_actions(component)
        if self.skip_check:
            return self._hasty_plan(n)
        plan: list[str] = []
        for i in range(n):
            if self.fault_at == i and self._restores == 0:
                plan += self._fault_actions(i - 1)
            plan += self.env.oracle_actions(i)
        return plan

    def _hasty_plan(self, n: int) -> list[str]:
        rng = random.Random(f"hasty/{self.seed}")
        plan: list[str] = []
        skipped: list[list[str]] = []
        for i in range(n):
            actions = self.env.oracle_actions(i)
            cut = next((j for j, a in enumerate(actions) if a.startswith("run_check ")), None)
            if cut is None:
                raise ValueError("skip_check needs a suite whose components end in run_check")
            plan += actions[:cut]
            # The last component has nothing to move on to: checking it is the first of
            # the choices below, so that every choice checks with probability 1 - q.
            if i == n - 1 or rng.random() < self.skip_check:
                skipped.append(actions[cut:])
            else:
                plan += actions[cut:]
        for checks in reversed(skipped):  # latest first, as the status bar names them
            if rng.random() < self.skip_check:
                break
            plan += checks
        return plan

    def _fault_actions(self, prev: int) -> list[str]:
        first = self.env.oracle_actions(prev)
        writes = [a for a in first if a.startswith("write ")]
        checks = [a for a in first if a.startswith("run_check ")]
        if not writes or not checks:
            raise ValueError("fault injection needs a component with write and run_check")
        path, key = writes[0].split()[1:3]
        return [f"write {path} {key} wrong-0", checks[0]]

    def _next_action(self, agent: str, component: int | None) -> str:
        plan = self._plan(agent, component)
        i = self._cursor.get(agent, 0)
        self._cursor[agent] = i + 1
        if i < len(plan):
            return plan[i]
        return self.env.finish_action() or "submit"

    def summary(self) -> str:
        comps = self.env.components()
        done = [c.name for i, c in enumerate(comps) if self.env.component_done(i)]
        todo = [c.name for i, c in enumerate(comps) if not self.env.component_done(i)]
        return (
            f"progress {self.env.progress():.2f}; done: {', '.join(done) or 'none'}; "
            f"remaining: {', '.join(todo) or 'none'}"
        )

    async def generate(self, ask: Ask) -> Generated:
        if ask.purpose == "summary":
            text = self.summary()
        elif ask.purpose == "finish":
            text = self.env.finish_action() or "submit"
        elif ask.purpose == "delegate":
            assert ask.component is not None
            text = f"delegate {self.env.components()[ask.component].name}"
        else:
            text = self._next_action(ask.agent, ask.component)
        ids = self.codec.encode(text + "\n")
        if self.router is not None:
            out = await self.router.score(
                ask.session_id, ask.prompt_ids, ids, request_id=ask.request_id
            )
            return Generated(text, ids, out.logprobs, out.versions, out.finish_reason)
        version = self.version() if callable(self.version) else self.version
        return Generated(text, ids, [0.0] * len(ids), [version] * len(ids), "stop")

    def snapshot(self) -> Any:
        return dict(self._cursor)

    def restore(self, snap: Any) -> None:
        self._cursor = dict(snap)
        self._restores += 1


__all__ = ["Agent", "Ask", "Codec", "Generated", "ModelAgent", "ScriptedAgent", "TextTokenizer"]
