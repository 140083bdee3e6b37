"""One agent session behind the OpenAI-compatible endpoint: every call it makes, recorded as
the engine produced it, with the tokens of its prompt reused from earlier calls.

An external agent sends its whole conversation with every call. The session keeps, for each
recorded call, the messages of its prompt, the token offset where each one ends, and its
reply (the message an agent sends back for it). A new call's prompt is built from the
recorded call that shares the longest run of leading messages with it (the reply
included), and only the messages after that run are rendered:

* a call that **extends** the previous one (its messages are the previous call's, its reply,
  and new ones) reuses that call's full sequence token for token: prompt, completion, and
  the closing of the reply. What is trained is exactly what the engine saw; nothing is
  re-tokenised. It is logged with ``prefix`` pointing at that call, kind ``continue``;
* a call that does **not** (the agent compacted its context, started a sub-agent on a part
  of it, retried from an earlier point) reuses the shared leading messages' tokens and
  starts a branch there: ``prefix`` points at the call it shares them with, kind
  ``branch``; the trajectory processor builds the tree from these prefixes;
* a call that shares nothing is a new root (no prefix).

Plain completions (``/v1/completions``) match on tokens instead: the prompt's longest common
prefix with a recorded call's full sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gyre_core.rollout.chat import ChatFormat, Message, ToolCall
from gyre_core.rollout.engine import Completion
from gyre_core.trajectory.format import Call, Prefix, Rollout


@dataclass(slots=True)
class _Turn:
    call_id: str
    keys: list[str]  # the prompt's messages (empty for a plain completion)
    bounds: list[int]  # where each of them ends in ``tokens``
    reply: str  # the key of the assistant message it produced ("" for a plain completion)
    tokens: list[int]  # the call's full sequence: prompt + completion
    closing: list[int]  # what closes the reply before the next message


@dataclass(slots=True)
class Prompt:
    """A call's prompt, as :meth:`ChatSession.prompt` built it (pass it back to ``record``)."""

    ids: list[int]
    prefix: Prefix | None
    keys: list[str] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)


class ChatSession:
    """The calls of one agent session, as ``gyre.trajectory/v1`` calls."""

    def __init__(self, session_id: str, fmt: ChatFormat) -> None:
        self.session_id = session_id
        self.fmt = fmt
        self.calls: list[Call] = []
        self._turns: list[_Turn] = []
        self.generated = 0
        self._issued = 0  # call ids handed out (calls may run concurrently)

    @property
    def issued(self) -> int:
        """Calls started (recorded or still running)."""
        return self._issued

    def reserve(self) -> tuple[str, int]:
        """The next call's id and index, before it is made."""
        n, self._issued = self._issued, self._issued + 1
        return f"c{n}", n

    # ------------------------------------------------------------------ prompts

    def prompt(self, messages: list[Message]) -> Prompt:
        """The prompt of a chat call on ``messages`` (tools already in the system turn)."""
        keys = [m.key() for m in messages]
        best: tuple[int, _Turn] | None = None
        for turn in reversed(self._turns):  # the latest wins a tie
            seq = [*turn.keys, turn.reply]
            k, limit = 0, min(len(seq), len(keys))
            while k < limit and seq[k] == keys[k]:
                k += 1
            if k and (best is None or k > best[0]):
                best = (k, turn)
        ids: list[int] = []
        bounds: list[int] = []
        prefix = None
        k = 0
        if best is not None:
            k, turn = best
            if k > len(turn.keys):  # the reply too: the call's whole sequence, then its close
                ids = list(turn.tokens)
                prefix = Prefix(turn.call_id, len(ids))
                bounds = [*turn.bounds, len(ids)]
                ids += turn.closing
                bounds[-1] = len(ids)  # the reply's message ends after its closing
            else:
                ids = list(turn.tokens[: turn.bounds[k - 1]])
                prefix = Prefix(turn.call_id, len(ids))
                bounds = list(turn.bounds[:k])
        for i in range(k, len(messages)):
            ids += self.fmt.encode_at(messages, i)
            bounds.append(len(ids))
        ids += self.fmt.cue(messages)
        if prefix is not None and prefix.tokens == 0:
            prefix = None  # only a marker that renders as nothing (a template's tools) is shared
        return Prompt(ids, prefix, keys, bounds)

    def text_prompt(self, prompt_ids: list[int]) -> Prompt:
        """The prompt of a plain completion: ``prefix`` at the longest shared token run."""
        best: tuple[int, _Turn | None] = (0, None)
        for turn in reversed(self._turns):
            n = _common(turn.tokens, prompt_ids)
            if n > best[0]:
                best = (n, turn)
        n, found = best
        return Prompt(list(prompt_ids), Prefix(found.call_id, n) if found is not None else None)

    # ------------------------------------------------------------------ recording

    def record(
        self, call_id: str, prompt: Prompt, out: Completion
    ) -> tuple[str, tuple[ToolCall, ...]]:
        """Log call ``call_id`` (from :meth:`reserve`); returns its parsed reply (content and
        tool calls)."""
        head = prompt.prefix.tokens if prompt.prefix is not None else 0
        extends = (
            prompt.prefix is not None
            and bool(self._turns)
            and prompt.prefix.call_id == self._turns[-1].call_id
            and head == len(self._turns[-1].tokens)
        )
        kind = "continue" if extends or prompt.prefix is None else "branch"
        self.calls.append(
            Call(
                call_id,
                np.asarray(prompt.ids[head:], dtype=np.int64),
                np.asarray(out.token_ids, dtype=np.int64),
                np.asarray(out.logprobs, dtype=np.float64),
                np.asarray(out.versions, dtype=np.int64),
                kind=kind,
                prefix=prompt.prefix if head > 0 else None,
            )
        )
        self.generated += len(out.token_ids)
        if prompt.keys:
            content, calls = self.fmt.parse(out.token_ids, f"{self.session_id}-{call_id}")
        else:  # a plain completion: its text
            content, calls = self.fmt.codec.decode(out.token_ids), ()
        reply = Message("assistant", content, calls).key() if prompt.keys else ""
        tokens = [*prompt.ids, *out.token_ids]
        self._turns.append(
            _Turn(
                call_id, prompt.keys, prompt.bounds, reply, tokens, self.fmt.closing(out.token_ids)
            )
        )
        return content, calls

    def rollout(
        self,
        task_id: str,
        status: str,
        progress: float,
        group_id: str = "",
        extra: dict[str, object] | None = None,
    ) -> Rollout:
        return Rollout(
            self.session_id,
            task_id,
            status,
            progress,
            list(self.calls),
            group_id or self.session_id,
            None,
            dict(extra or {}),
        )


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


__all__ = ["ChatSession", "Prompt"]
