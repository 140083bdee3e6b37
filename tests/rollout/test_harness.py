"""Agent harness: scripted and model-driven sessions, logs, groups, configuration."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core.config import ConfigError, RunConfig
from gyre_core.events import ListSink, RolloutFinished, RolloutProgress, RolloutStarted
from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.agents import Codec, ModelAgent, ScriptedAgent
from gyre_core.rollout.harness import HarnessOptions, TaskRef, run_group, run_session
from gyre_core.rollout.router import Router
from gyre_core.rollout.task_env import make_env
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.trajectory import build_trees, read_rollouts, tree_stats, write_rollouts
from gyre_core.trajectory.format import full_sequences
from tests.rollout.budgets import session_config

TINY = ModelShape(
    vocab_size=512, layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_checkpoint(tmp_path_factory.mktemp("harness") / "model", TINY)


@pytest.fixture(scope="module")
def tok(ckpt: Path) -> Any:
    return AutoTokenizer.from_pretrained(ckpt, local_files_only=True)


@pytest.fixture(scope="module")
def model(ckpt: Path) -> torch.nn.Module:
    m: torch.nn.Module = AutoModelForCausalLM.from_pretrained(ckpt, local_files_only=True)
    return m.eval()


def _scripted(index: int, tok: Any, sink: ListSink, version: int = 7) -> Any:
    env = make_env("repo", "train", index, seed=index)
    agent = ScriptedAgent(env, tok, version=lambda: version)
    return asyncio.run(
        run_session(env, agent, tok, session_config(max_turns=200), rollout_id=f"r{index}",
                    sink=sink, seed=index)
    )  # fmt: skip


def test_scripted_repo_sessions_solve_and_round_trip(tok: Any, tmp_path: Path) -> None:
    sink = ListSink()
    rollouts = [_scripted(i, tok, sink) for i in (0, 1)]  # a short and a medium task
    for r in rollouts:
        assert r.status == "completed" and r.progress >= 0.9
        assert r.extra["turns"] == len(r.calls) and r.extra["stop_reason"] is None
        assert all((c.versions == 7).all() and (c.logprobs == 0.0).all() for c in r.calls)
        # every call after the first extends the previous context: logged with a prefix
        assert r.calls[0].prefix is None
        assert all(c.prefix is not None and c.prefix.call_id == f"c{i}"
                   for i, c in enumerate(r.calls[1:]))  # fmt: skip
    # events: started, one progress per turn (+ the final one), finished with versions
    assert [e.rollout_id for e in sink.of(RolloutStarted)] == ["r0", "r1"]
    fin = sink.of(RolloutFinished)
    assert [(e.status, e.progress, e.versions) for e in fin] == [("completed", 1.0, (7, 7))] * 2
    prog = [e for e in sink.of(RolloutProgress) if e.rollout_id == "r1"]
    assert len(prog) == rollouts[1].extra["turns"] + 1
    assert [e.turns for e in prog[:-1]] == list(range(1, len(prog)))
    assert prog[-1].progress == 1.0 and prog[0].progress < 1.0

    path = tmp_path / "log.jsonl"
    assert write_rollouts(path, rollouts) == 2
    back = list(read_rollouts(path))
    for a, b in zip(rollouts, back, strict=True):
        assert (a.rollout_id, a.status, a.progress) == (b.rollout_id, b.status, b.progress)
        sa, sb = full_sequences(a), full_sequences(b)
        assert sa.keys() == sb.keys()
        assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    trees = build_trees(back)
    assert len(trees) == 2
    stats = tree_stats(trees.values())
    assert stats["calls"] == sum(len(r.calls) for r in rollouts)
    # one linear conversation per rollout: each token stored once
    assert stats["tokens_unique"] == sum(max(len(s) for s in full_sequences(r).values())
                                         for r in rollouts)  # fmt: skip
    assert stats["trainable_tokens_unique"] == sum(r.extra["tokens_generated"] for r in rollouts)


def test_model_session_records_engine_tokens(tok: Any, model: torch.nn.Module) -> None:
    engine = TorchEngine(model, version=3)
    router = Router({"e0": engine})
    env = make_env("repo", "train", 0, seed=0)
    sink = ListSink()
    cfg = session_config(max_turns=8, max_new_tokens=10, temperature=1.0)
    r = asyncio.run(
        run_session(env, ModelAgent(router, tok), tok, cfg, rollout_id="m0", sink=sink, seed=5)
    )
    assert r.status == "timeout" and r.extra["stop_reason"] == "max_turns"
    assert r.progress <= 0.2  # a random-init policy
    assert len(r.calls) == 8 and router.stats.routed == {"e0": 8}
    stops = set(Codec(tok).newline_stop_ids())
    seqs = full_sequences(r)
    for c in r.calls:
        n = len(c.completion_ids)
        assert 1 <= n <= 10 and (c.versions == 3).all()
        assert n == 10 or int(c.completion_ids[-1]) in stops  # stopped at a newline
        assert not stops & set(c.completion_ids[:-1].tolist())
        full = torch.tensor([seqs[c.call_id].tolist()])
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0].float(), dim=-1)
        start = c.prompt_len
        expected = [float(logp[start - 1 + i, t]) for i, t in enumerate(c.completion_ids)]
        assert c.logprobs.tolist() == pytest.approx(expected, abs=1e-3)
    assert sink.of(RolloutFinished)[0].versions == (3, 3)
    build_trees([r])  # accepted by the tree builder


def test_group_shares_prompt_and_group_id(tok: Any, model: torch.nn.Module) -> None:
    router = Router({"e0": TorchEngine(model, version=1)})
    cfg = session_config(max_turns=2, max_new_tokens=8)
    rollouts = asyncio.run(
        run_group(TaskRef("repo", "train", 0), 3, make_agent=lambda env: ModelAgent(router, tok),
                  tokenizer=tok, config=cfg, group_id="g-1", seed=10)
    )  # fmt: skip
    assert [r.group_id for r in rollouts] == ["g-1"] * 3
    assert len({r.rollout_id for r in rollouts}) == 3
    assert [r.extra["seed"] for r in rollouts] == [10, 11, 12]
    first = [r.calls[0] for r in rollouts]
    assert all(np.array_equal(first[0].prompt_ids, c.prompt_ids) for c in first)
    # distinct seeds sample distinct completions
    assert len({tuple(c.completion_ids.tolist()) for r in rollouts for c in r.calls}) > 1
    trees = build_trees(rollouts)
    assert list(trees) == ["g-1"]
    stats = tree_stats(trees.values())
    assert stats["tokens_unique"] < stats["tokens_per_branch"]
    assert stats["tokens_per_branch"] - stats["tokens_unique"] >= 2 * len(first[0].prompt_ids)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"context_budget": -5}, "context_budget"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"time_budget_s": -1.0}, "time_budget_s"),
        ({"token_budget": 0}, "token_budget"),
        ({"tool_time_scale": float("inf")}, "tool_time_scale"),
    ],
)
def test_bad_budgets_are_refused_by_the_config_naming_the_field(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"rollout": kwargs})
    assert [path for path, _ in err.value.errors] == [f"rollout.{field}"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"delegate": "yes"}, "delegate"),
        ({"max_retries": -1}, "max_retries"),
        ({"retry_after_errors": 0}, "retry_after_errors"),
        ({"progress_every": 0}, "progress_every"),
        ({"subagent_max_turns": 0}, "subagent_max_turns"),
    ],
)
def test_bad_options_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        HarnessOptions(**kwargs)


def test_make_env_errors_and_group_size(tok: Any) -> None:
    with pytest.raises(ValueError, match="unknown suite 'chess'"):
        make_env("chess", "train", 0)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        make_env("repo", "dev", 0)
    with pytest.raises(ValueError, match="index must be an integer >= 0"):
        make_env("repo", "train", -1)
    with pytest.raises(ValueError, match="unknown coding task 'sudoku'"):
        make_env("coding", "train", "sudoku")
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        asyncio.run(run_group(TaskRef("repo"), 0, make_agent=lambda e: ScriptedAgent(e, tok),
                              tokenizer=tok))  # fmt: skip
    assert make_env("repo", "benchmark", 2).task_id == "benchmark-long-2"


def test_model_session_with_subagents_and_compaction(
    tok: Any, model: torch.nn.Module, tmp_path: Path
) -> None:
    router = Router({"e0": TorchEngine(model, version=2)})
    env = make_env("repo", "train", 0, seed=0)
    prompt_len = len(Codec(tok).encode(env.reset() + "\n"))
    cfg = session_config(max_turns=6, max_new_tokens=8, context_budget=prompt_len + 60)
    options = HarnessOptions(delegate=True, subagent_max_turns=2)
    r = asyncio.run(run_session(env, ModelAgent(router, tok), tok, cfg, options=options,
                                rollout_id="d0", seed=1))  # fmt: skip
    assert r.status == "timeout" and r.extra["turns"] == 6
    agents = [c.agent for c in r.calls]
    assert {"sub-0", "sub-1", "sub-2"} <= set(agents)
    assert next(c.kind for c in r.calls if c.agent == "sub-1") == "subagent"
    assert "compaction" in {c.kind for c in r.calls}
    assert all((c.versions == 2).all() for c in r.calls)
    # each sub-agent session stuck to the one engine; every call went through the router
    assert router.stats.routed == {"e0": len(r.calls)}
    write_rollouts(tmp_path / "d.jsonl", [r])
    [back] = read_rollouts(tmp_path / "d.jsonl")
    stats = tree_stats(build_trees([back]).values())
    assert stats["calls"] == len(r.calls) and stats["tokens_unique"] < stats["tokens_per_branch"]
