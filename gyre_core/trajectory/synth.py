"""Synthetic branching agent logs in ``gyre.trajectory/v1``, for tests, demos and benchmarks.

Each GRPO group is one task: its rollouts share a task prompt (``system_tokens``) and take
turns (model completion, tool output, next prompt). Every call names its relation to an
earlier call through ``prefix``, so files stay linear in size however long the contexts:

- ``continue``: extends the previous call of the same agent by a tool output and a prompt.
- ``compaction``: a new context, the task prompt plus a summary that the previous call
  (a ``continue`` asked to summarise) wrote; ``prefix`` names the rollout's first call.
- ``subagent``: the first call of a sub-agent (``sub-1``, ...) on its own context: the
  sub-agent prompt and a task description copied from the parent's last completion; its
  final completion comes back to the parent inside the next tool output.
- ``retry``: the completion of an earlier call of the current context is sampled again
  (``prefix`` is that call's full prompt, a strict prefix of its sequence, and
  ``prompt_ids`` is empty); that call and those after it are abandoned.

Statuses: ``timeout`` and ``failed`` rollouts stop before their planned turns, so keep partial
progress (milestones of 0.05 reached in proportion to the turns taken); a ``completed`` one
reaches 1.0 when it solves the task. Versions start anywhere in ``version`` and step up at
random, sometimes inside a completion. Token ids are uniform in ``[0, vocab_size)``. Output
is a function of the config alone (``seed`` included); each group draws its own stream.

The calls already carry their prefixes, so ``write_rollouts(..., compress=False)`` writes
the linear file as generated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gyre_core.trajectory.format import Call, FloatArray, IntArray, Prefix, Rollout

_EMPTY: IntArray = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class SynthConfig:
    groups: int = 2
    group_size: int = 4  # rollouts per GRPO group (one task per group)
    turns: float = 8.0  # mean main-agent turns per rollout (log-normal, capped at 4x)
    prompt_tokens: int = 32  # mean harness prompt per turn
    completion_tokens: int = 128  # mean completion per call
    tool_tokens: int = 256  # mean tool output per turn (heavier tail)
    system_tokens: int = 1024  # task prompt shared by the group (sub-agent prompt: 1/4)
    vocab_size: int = 32_000
    compaction_every: int = 0  # compact every k turns; 0: only when max_context forces it
    summary_tokens: int = 256  # mean summary written at a compaction
    subagent_prob: float = 0.0  # per turn
    retry_prob: float = 0.0  # per turn
    shared_opening_prob: float = 0.0  # a rollout reuses the start of a group-mate's opening
    timeout_prob: float = 0.0
    fail_prob: float = 0.0
    seed: int = 0
    max_context: int | None = None  # hard cap on a main call's full length
    version: int | tuple[int, int] = 0  # policy version, or an inclusive range (lo, hi)

    def __post_init__(self) -> None:
        sizes = (self.prompt_tokens, self.completion_tokens, self.tool_tokens)
        if min(self.groups, self.group_size, self.system_tokens, self.summary_tokens) < 1:
            raise ValueError("groups, group_size, system_tokens, summary_tokens must be >= 1")
        if self.turns < 1 or min(sizes) < 1 or self.compaction_every < 0:
            raise ValueError("turns and token means must be >= 1, compaction_every >= 0")
        if not 2 <= self.vocab_size <= 2**31:
            raise ValueError(f"vocab_size must be in [2, 2**31], got {self.vocab_size}")
        probs = (self.subagent_prob, self.retry_prob, self.shared_opening_prob)
        if not all(0.0 <= p <= 1.0 for p in (*probs, self.timeout_prob, self.fail_prob)):
            raise ValueError("probabilities must be in [0, 1]")
        if self.timeout_prob + self.fail_prob > 1.0:
            raise ValueError("timeout_prob + fail_prob must be <= 1")
        lo, hi = self.version_range
        if not 0 <= lo <= hi:
            raise ValueError(f"version must be >= 0, or a range lo <= hi, got {self.version}")
        floor = (self.system_tokens + 12 * (self.summary_tokens + sum(sizes[:2]))) * 8 // 7 + 1
        if self.max_context is not None and self.max_context < floor:
            raise ValueError(f"max_context must be >= {floor} for these token means")

    @property
    def version_range(self) -> tuple[int, int]:
        v = self.version
        return (v, v) if isinstance(v, int) else (v[0], v[1])


# fmt: off
PRESETS: dict[str, SynthConfig] = {
    # ~500 distinct tokens (~1.4k over all calls); every kind of call, for seed 0.
    "tiny": SynthConfig(
        groups=2, group_size=3, turns=5, prompt_tokens=4, completion_tokens=6, tool_tokens=6,
        system_tokens=12, vocab_size=100, compaction_every=3, summary_tokens=4,
        subagent_prob=0.2, retry_prob=0.2, shared_opening_prob=0.5, timeout_prob=0.25,
        fail_prob=0.1, version=(0, 2),
    ),
    # A coding agent: GRPO groups of 8 on an 8k-token task prompt (instructions and tools),
    # a 32k window, compaction every 8 turns, sub-agents and retries on 1 turn in 10 each.
    "agentic": SynthConfig(
        groups=4, group_size=8, turns=16, prompt_tokens=24, completion_tokens=160,
        tool_tokens=400, system_tokens=8000, vocab_size=151_936, compaction_every=8,
        summary_tokens=400, subagent_prob=0.1, retry_prob=0.1, shared_opening_prob=0.4,
        timeout_prob=0.15, fail_prob=0.05, max_context=32_768, version=(40, 43),
    ),
    # Hundreds of calls on contexts growing to ~1e5 tokens (compacted near the 120k cap):
    # 3e7 to 2e8 tokens over all calls (1.4e8 for seed 0), in a file of 5 to 30 MB.
    "long": SynthConfig(
        groups=2, group_size=4, turns=300, prompt_tokens=32, completion_tokens=150,
        tool_tokens=300, system_tokens=4000, vocab_size=151_936, summary_tokens=1500,
        subagent_prob=0.02, retry_prob=0.02, shared_opening_prob=0.5, timeout_prob=0.25,
        max_context=120_000, version=(7, 9),
    ),
}
# fmt: on


def synth_rollouts(cfg: SynthConfig) -> Iterator[Rollout]:
    """Yield ``cfg.groups * cfg.group_size`` rollouts, group after group."""
    for g in range(cfg.groups):
        rng = np.random.default_rng([cfg.seed, g])
        group_id = f"grp-{cfg.seed}-{g}"
        task = _Task(cfg, rng)
        for r in range(cfg.group_size):
            yield _Rollout(cfg, rng, task).run(f"{group_id}-{r}", f"task-{cfg.seed}-{g}", group_id)


class _Task:
    """What the rollouts of a group share: prompts, difficulty and first-turn openings."""

    def __init__(self, cfg: SynthConfig, rng: np.random.Generator) -> None:
        self.system = rng.integers(0, cfg.vocab_size, cfg.system_tokens, dtype=np.int64)
        n_sub = max(1, cfg.system_tokens // 4)
        self.sub_system = rng.integers(0, cfg.vocab_size, n_sub, dtype=np.int64)
        self.solve_rate = float(rng.beta(0.7, 0.7))
        self.openings: list[tuple[IntArray, FloatArray]] = []  # first completions so far


class _Rollout:
    def __init__(self, cfg: SynthConfig, rng: np.random.Generator, task: _Task) -> None:
        self.cfg, self.rng, self.task = cfg, rng, task
        self.calls: list[Call] = []
        lo, hi = cfg.version_range
        self.version = int(rng.integers(lo, hi + 1))
        self.sub_root: Call | None = None  # first sub-agent call: holds the sub-agent prompt

    def run(self, rollout_id: str, task_id: str, group_id: str) -> Rollout:
        cfg, rng = self.cfg, self.rng
        sigma = 0.8
        mu = math.log(cfg.turns) - sigma**2 / 2
        planned = int(min(round(rng.lognormal(mu, sigma)), 4 * cfg.turns))
        u = rng.random()
        status = "timeout" if u < cfg.timeout_prob else "completed"
        if cfg.timeout_prob <= u < cfg.timeout_prob + cfg.fail_prob:
            status = "failed"
        planned = max(planned, 1 if status == "completed" else 2)
        taken = planned if status == "completed" else int(rng.integers(1, planned))
        quality = 1.0 if rng.random() < self.task.solve_rate else float(rng.uniform(0.1, 0.9))
        # Partial credit: milestones of 0.05 reached in proportion to the turns taken.
        progress = math.floor(20 * quality * taken / planned + 1e-9) / 20
        self._main(taken)
        return Rollout(rollout_id, task_id, status, progress, self.calls, group_id)

    def _main(self, turns: int) -> None:
        cfg, task = self.cfg, self.task
        first = self._call(
            self._cat(task.system, self._ids(cfg.prompt_tokens)),
            "main",
            "continue",
            None,
            self._len(cfg.completion_tokens),
            opening=True,
        )
        last, segment, n_sub = first, [first], 0
        cap = cfg.max_context
        # Room kept free below the cap: any one turn fits in it, and so does a summary call.
        longest = 8 * max(cfg.completion_tokens, cfg.summary_tokens)  # twice the clip of a draw
        room = 0 if cap is None else cap // 8 + 4 * cfg.prompt_tokens + longest
        for turn in range(1, turns):
            tool = self._ids(cfg.tool_tokens, sigma=1.0, clip=8.0)
            if self.rng.random() < cfg.subagent_prob:
                n_sub += 1
                result = self._subagent(f"sub-{n_sub}", last.completion_ids[-64:])
                tool = self._cat(self._ids_n(8), result)  # in a wrapper
            prompt, n = self._ids(cfg.prompt_tokens), self._len(cfg.completion_tokens)
            n_summary = self._len(cfg.summary_tokens)
            if cap is not None:
                tool = tool[: cap // 8]  # the harness truncates long tool outputs
            forced = cap is not None and last.full_len + len(tool) + len(prompt) + n + room > cap
            if forced or (cfg.compaction_every and turn % cfg.compaction_every == 0):
                if cap is not None:  # a retry may have left less room: cut the tool output
                    tool = tool[: max(0, cap - last.full_len - len(prompt) - n_summary)]
                after = Prefix(last.call_id, last.full_len)
                summary = self._call(self._cat(tool, prompt), "main", "continue", after, n_summary)
                resume = self._cat(summary.completion_ids, self._ids(cfg.prompt_tokens))
                at_task = Prefix(first.call_id, len(task.system))
                last = self._call(resume, "main", "compaction", at_task, n)
                segment = [last]
            elif self.rng.random() < cfg.retry_prob:
                latest = self.rng.random() < 0.5
                i = len(segment) - 1 if latest else int(self.rng.integers(len(segment)))
                save = segment[i]
                del segment[i:]
                at_save = Prefix(save.call_id, save.prompt_len)
                last = self._call(_EMPTY, "main", "retry", at_save, n)
                segment.append(last)
            else:
                after = Prefix(last.call_id, last.full_len)
                last = self._call(self._cat(tool, prompt), "main", "continue", after, n)
                segment.append(last)

    def _subagent(self, agent: str, description: IntArray) -> IntArray:
        """Run a sub-agent chain (mean 3 calls); return its final completion."""
        cfg = self.cfg
        if self.sub_root is None:
            prompt, at = self._cat(self.task.sub_system, description), None
        else:
            prompt, at = description, Prefix(self.sub_root.call_id, len(self.task.sub_system))
        call = self._call(prompt, agent, "subagent", at, self._len(cfg.completion_tokens))
        self.sub_root = self.sub_root or call
        for _ in range(min(int(self.rng.geometric(1 / 3)), 8) - 1):
            extra = self._cat(self._ids(cfg.tool_tokens, sigma=1.0), self._ids(8))
            after = Prefix(call.call_id, call.full_len)
            call = self._call(extra, agent, "continue", after, self._len(cfg.completion_tokens))
        return call.completion_ids

    def _call(
        self,
        prompt: IntArray,
        agent: str,
        kind: str,
        prefix: Prefix | None,
        n: int,
        opening: bool = False,
    ) -> Call:
        rng = self.rng
        ids = self._ids_n(n)
        logprobs = -rng.gamma(0.3, 1.5, n)
        if opening:
            if self.task.openings and rng.random() < self.cfg.shared_opening_prob:
                mate_ids, mate_lps = self.task.openings[int(rng.integers(len(self.task.openings)))]
                k = int(rng.integers(1, len(mate_ids) + 1))
                ids = np.concatenate([mate_ids[:k], ids[k:]])
                logprobs = np.concatenate([mate_lps[:k], logprobs[k:]])
                n = len(ids)
            self.task.openings.append((ids, logprobs))
        versions = np.full(n, self.version, dtype=np.int64)
        if self.version < self.cfg.version_range[1] and rng.random() < 0.1:
            versions[int(rng.integers(n)) :] += 1  # weights updated mid-generation
            self.version += 1
        call = Call(f"c{len(self.calls)}", prompt, ids, logprobs, versions, agent, kind, prefix)
        self.calls.append(call)
        return call

    def _len(self, mean: float, sigma: float = 0.6, clip: float = 4.0) -> int:
        draw = self.rng.lognormal(math.log(mean) - sigma**2 / 2, sigma)
        return max(1, int(min(draw, clip * mean)))

    def _ids(self, mean: float, sigma: float = 0.6, clip: float = 4.0) -> IntArray:
        return self._ids_n(self._len(mean, sigma, clip))

    def _ids_n(self, n: int) -> IntArray:
        return self.rng.integers(0, self.cfg.vocab_size, n, dtype=np.int64)

    @staticmethod
    def _cat(*parts: IntArray) -> IntArray:
        return np.concatenate(parts)


# --------------------------------------------------------------------------- measuring
