"""Agent harness branches and limits: compaction, sub-agents, retries, budgets, coding."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from transformers import AutoTokenizer

from gyre_core.events import ListSink, RolloutFinished, RolloutProgress
from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.agents import Ask, Codec, Generated, ScriptedAgent
from gyre_core.rollout.harness import HarnessOptions, run_session
from gyre_core.rollout.task_env import CodingTaskEnv, RepoTaskEnv, TaskEnv, make_env
from gyre_core.trajectory import Rollout, build_trees, tree_stats
from gyre_core.trajectory.format import full_sequences
from gyre_core.trajectory.paths import candidates
from tests.rollout.budgets import session_config

TINY = ModelShape(
    vocab_size=512, layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ckpt = init_checkpoint(tmp_path_factory.mktemp("branches") / "model", TINY)
    return AutoTokenizer.from_pretrained(ckpt, local_files_only=True)


def _run(env: TaskEnv, agent: Any, tok: Any, sink: ListSink | None = None, **cfg: Any) -> Rollout:
    """A session with ``cfg``: its ``HarnessOptions`` fields as options, the rest over
    ``session_config(max_turns=200)``."""
    options = {k: cfg.pop(k) for k in list(cfg) if k in HarnessOptions.__dataclass_fields__}
    config = session_config(**{"max_turns": 200, **cfg})
    return asyncio.run(run_session(env, agent, tok, config, options=HarnessOptions(**options),
                                   rollout_id="r", sink=sink))  # fmt: skip


def _text(tok: Any, r: Rollout, call_id: str, *, prompt_only: bool = True) -> str:
    seq = full_sequences(r)[call_id].tolist()
    call = next(c for c in r.calls if c.call_id == call_id)
    return str(tok.decode(seq[: call.prompt_len] if prompt_only else seq))


def test_compaction_restarts_context_from_prompt_and_summary(tok: Any) -> None:
    env = make_env("repo", "train", 1, seed=0)  # a medium task
    prompt_len = len(Codec(tok).encode(env.reset() + "\n"))
    r = _run(env, ScriptedAgent(env, tok), tok, context_budget=prompt_len + 150)
    assert r.status == "completed" and r.progress == 1.0
    kinds = [c.kind for c in r.calls]
    assert kinds.count("compaction") >= 2 and kinds[0] == "continue"
    for i, c in enumerate(r.calls):
        if c.kind != "compaction":
            assert c.prompt_len <= prompt_len + 150 + 60  # never far above the budget
            continue
        assert c.prompt_len > prompt_len + 150
        after = r.calls[i + 1]
        assert after.kind == "continue" and after.prompt_len < c.prompt_len
        text = _text(tok, r, after.call_id)
        assert "Summary of earlier work: progress" in text
        assert text.startswith(env.reset())  # restarts from the task prompt
        assert after.prefix is not None and after.prefix.call_id == "c0"  # shares the prompt
    stats = tree_stats(build_trees([r]).values())
    assert stats["calls_by_kind"]["compaction"] == kinds.count("compaction")
    assert stats["tokens_unique"] < stats["tokens_per_branch"]


def test_subagents_work_in_own_context_and_report_to_parent(tok: Any) -> None:
    env = make_env("repo", "train", 0, seed=0)
    names = [c.name for c in env.components()]
    r = _run(env, ScriptedAgent(env, tok), tok, delegate=True)
    assert r.status == "completed" and r.progress == 1.0
    agents = sorted({c.agent for c in r.calls})
    assert agents == ["main"] + [f"sub-{i}" for i in range(len(names))]
    for i in range(len(names)):
        mine = [c for c in r.calls if c.agent == f"sub-{i}"]
        assert mine[0].kind == "subagent" and all(c.kind == "continue" for c in mine[1:])
        first = _text(tok, r, mine[0].call_id)
        assert f"Sub-goal: build {names[i]}" in first and f"delegate {names[i]}" in first
        assert "PASS" not in first and "result" not in first  # its own, fresh context
        last = _text(tok, r, mine[-1].call_id)
        assert f"wrote {env.components()[i].goal.split(': ')[1].split('=')[0]}" in last
        assert mine[0].prefix is not None and mine[0].prefix.call_id == "c0"  # task prompt
    main = [c for c in r.calls if c.agent == "main"]
    assert len(main) == len(names)  # one brief per component; the last sub finishes the task
    for i, c in enumerate(main[1:]):
        text = _text(tok, r, c.call_id)
        assert f"sub-{i} result: {names[i]} done" in text  # the result reached the parent
        assert "wrote " not in text  # the sub-agents' turns stay in their contexts
    build_trees([r])


def test_retry_restores_save_point(tok: Any) -> None:
    env = make_env("repo", "train", 0, seed=0)
    r = _run(env, ScriptedAgent(env, tok, fault_at=2), tok, max_retries=2)
    assert r.status == "completed" and r.progress == 1.0
    [retry] = r.extra["retries"]
    assert retry["reason"].startswith("failed check: FAIL")
    assert retry["progress_before_restore"] < retry["progress_at_save"]
    assert retry["progress_after_restore"] == retry["progress_at_save"] == pytest.approx(2 / 3)
    retry_calls = [c for c in r.calls if c.kind == "retry"]
    assert len(retry_calls) == 1
    text = _text(tok, r, retry_calls[0].call_id)
    assert "restored to the save point" in text and "wrong-0" not in text  # branch point
    stats = tree_stats(build_trees([r]).values())
    assert stats["calls_by_kind"]["retry"] == 1 and stats["nodes"] > len(r.calls) - 1

    env2 = make_env("repo", "train", 0, seed=0)  # without retries the mistake stays
    r2 = _run(env2, ScriptedAgent(env2, tok, fault_at=2), tok, max_retries=0)
    assert r2.extra["retries"] == [] and r2.progress == pytest.approx(2 / 3)


class _Clumsy:
    """Sends ``bad`` malformed actions first, then follows the oracle."""

    def __init__(self, env: TaskEnv, tok: Any, bad: int) -> None:
        self.oracle = ScriptedAgent(env, tok)
        self.codec = Codec(tok)
        self.bad = bad

    async def generate(self, ask: Ask) -> Generated:
        if ask.purpose == "action" and self.bad > 0:
            self.bad -= 1
            ids = self.codec.encode("frobnicate\n")
            return Generated("frobnicate", ids, [-1.0] * len(ids), [0] * len(ids), "stop")
        return await self.oracle.generate(ask)

    def snapshot(self) -> Any:
        return self.oracle.snapshot()

    def restore(self, snap: Any) -> None:
        self.oracle.restore(snap)


def test_error_streak_triggers_retry(tok: Any) -> None:
    env = make_env("repo", "train", 0, seed=0)
    r = _run(env, _Clumsy(env, tok, bad=3), tok, retry_after_errors=3)
    assert [x["reason"] for x in r.extra["retries"]] == ["3 error observations in a row"]
    assert r.extra["retries"][0]["progress_after_restore"] == 0.0
    assert [c.kind for c in r.calls[:4]] == ["continue"] * 3 + ["retry"]
    assert r.calls[3].prefix is not None and r.calls[3].prefix.tokens < r.calls[1].prompt_len
    assert r.progress == 1.0


def test_token_budget_times_out_keeping_progress(tok: Any) -> None:
    env = make_env("repo", "train", 1, seed=0)
    sink = ListSink()
    r = _run(env, ScriptedAgent(env, tok), tok, sink, token_budget=250, progress_every=2)
    assert r.status == "timeout" and r.extra["stop_reason"] == "token_budget"
    assert 0.0 < r.progress < 1.0 and r.score == r.progress
    assert 250 <= r.extra["tokens_generated"] < 250 + 40
    fin = sink.of(RolloutFinished)[0]
    assert (fin.status, fin.progress) == ("timeout", r.progress)
    prog = sink.of(RolloutProgress)
    assert prog[-1].progress == r.progress and prog[-1].turns == r.extra["turns"]
    assert [e.turns for e in prog[:-1]] == list(range(2, r.extra["turns"] + 1, 2))
    assert prog[-1].branches == {"continue": len(r.calls)}


def test_time_budget_and_turn_budget(tok: Any) -> None:
    env = make_env("repo", "train", 1, seed=3)
    full = _run(env, ScriptedAgent(env, tok), tok)
    total = full.extra["clock_s"]  # simulated tool latency dominates (scale 0: no sleeping)
    assert full.status == "completed" and total > 5.0
    env = make_env("repo", "train", 1, seed=3)
    half = _run(env, ScriptedAgent(env, tok), tok, time_budget_s=total / 2)
    assert half.status == "timeout" and half.extra["stop_reason"] == "time_budget"
    assert 0.0 < half.progress < 1.0 and half.extra["clock_s"] >= total / 2
    env = make_env("repo", "train", 1, seed=3)
    few = _run(env, ScriptedAgent(env, tok), tok, max_turns=5)
    assert few.status == "timeout" and few.extra["stop_reason"] == "max_turns"
    assert few.extra["turns"] == 5 and few.progress < 1.0


def test_tool_time_scale_sleeps_latency(tok: Any) -> None:
    env = make_env("repo", "train", 0, seed=0)
    t0 = time.monotonic()
    r = _run(env, ScriptedAgent(env, tok), tok, tool_time_scale=0.01)
    real = time.monotonic() - t0
    assert real >= 0.01 * (r.extra["clock_s"] - real) * 0.9
    assert r.extra["clock_s"] > 5.0 and r.progress == 1.0


def test_repo_snapshot_restore_round_trip() -> None:
    env = make_env("repo", "train", 0, seed=0)
    assert isinstance(env, RepoTaskEnv)
    env.reset()
    for a in env.oracle_actions(0):
        env.step(a)
    snap, p = env.snapshot(), env.progress()
    assert p > 0
    for a in env.oracle_actions(1):
        env.step(a)
    assert env.progress() > p
    env.restore(snap)
    assert env.progress() == p and not env.component_done(1) and env.component_done(0)


def test_coding_suite_scripted_runs_real_pytest(tok: Any) -> None:
    env = make_env("coding", "train", "fizzbuzz")
    assert isinstance(env, CodingTaskEnv)
    try:
        env.reset()
        snap = env.snapshot()
        env.step("write_file solution.py\ndef fizzbuzz(n):\n    return []\n")
        env.step("write_file extra/notes.txt\nhello\n")
        env.restore(snap)
        assert "NotImplementedError" in (env.env.root / "solution.py").read_text()
        assert not (env.env.root / "extra").exists()
        r = _run(env, ScriptedAgent(env, tok), tok)
    finally:
        env.close()
    assert r.status == "completed" and r.progress == 1.0
    assert [c.kind for c in r.calls] == ["continue"] * 3
    texts = [_text(tok, r, c.call_id, prompt_only=False) for c in r.calls]
    assert "visible tests: 1/1 passed" in texts[2]  # the real pytest output, in context
    assert "write_file solution.py\ndef fizzbuzz" in texts[0]  # the reference solution
    assert env.env.last_report is not None and env.env.last_report.passed == 4


def test_a_run_config_reaches_the_harness_options(tok: Any) -> None:
    """``rollout.delegate``, ``rollout.subagent_max_turns`` and ``rollout.max_retries`` are
    what a run's sessions do (no ``options`` given: the section's); their defaults are the
    harness's own defaults."""
    from gyre_core.config import RunConfig

    assert HarnessOptions.of(RunConfig().rollout) == HarnessOptions()
    rollout = {"delegate": True, "subagent_max_turns": 3, "max_retries": 0}
    section = RunConfig.from_dict({"rollout": rollout}).rollout
    assert HarnessOptions.of(section) == HarnessOptions(True, 0, subagent_max_turns=3)
    env = make_env("repo", "train", 0, seed=0)
    config = session_config(max_turns=200, **rollout)
    r = asyncio.run(run_session(env, ScriptedAgent(env, tok), tok, config, rollout_id="r"))
    assert {c.agent for c in r.calls} >= {"main", "sub-0"}  # delegated
    assert next(c.kind for c in r.calls if c.agent == "sub-0") == "subagent"
    assert all(
        sum(c.agent == a for c in r.calls) <= 3 for a in {c.agent for c in r.calls} - {"main"}
    )


def test_path_sampling_reads_the_harness_calls_as_their_roles(tok: Any) -> None:
    # the harness labels the call writing a summary `compaction` (it extends the context it
    # summarises); path sampling reads its leaf as a summary of its agent, the leaves the
    # sub-agents end as theirs (docs/trajectory-format.md, "Leaf roles")
    env = make_env("repo", "train", 1, seed=0)
    prompt_len = len(Codec(tok).encode(env.reset() + "\n"))
    r = _run(env, ScriptedAgent(env, tok), tok, context_budget=prompt_len + 150, delegate=True)
    tree = build_trees([r])[r.group_id]
    leaves = candidates(tree)[0]
    roles = Counter(role for _, role in leaves)
    summaries = [c for c in r.calls if c.kind == "compaction"]
    by_agent = Counter("main" if c.agent == "main" else "subagent" for c in summaries)
    assert (
        roles["main_summary"] == by_agent["main"]
        and roles["main_summary"] + roles["subagent_summary"] == len(summaries) > 0
    )
    assert roles["subagent"] >= 1 and roles["main"] >= 1
    for leaf, role in leaves:  # a summary leaf ends with a compaction call's completion
        ends = [tree.calls[c] for c in leaf.ends]
        assert any(c.kind == "compaction" for c in ends) == role.endswith("_summary")
