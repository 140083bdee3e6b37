"""Teacher forcing: engines score a given continuation, the router routes scores, and a
scripted agent given a router logs the policy's real logprobs and versions (TorchEngine)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gyre_core.events import ListSink, RolloutFinished
from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.agents import ScriptedAgent
from gyre_core.rollout.engine import Completion, EngineLoad, SamplingParams, ScoringEngine
from gyre_core.rollout.harness import HarnessOptions, run_session
from gyre_core.rollout.router import NoEngineError, Router
from gyre_core.rollout.task_env import make_env
from gyre_core.rollout.torch_engine import TorchEngine
from tests.rollout.budgets import session_config
from tests.rollout.scoring_checks import check_scored_rollout, hf_logprobs

TINY = ModelShape(
    vocab_size=512, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128
)
PROMPT = [(7 * i + 3) % 400 + 5 for i in range(9)]
FORCED = [(11 * i + 5) % 400 + 5 for i in range(13)]  # not what the model would pick


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_checkpoint(tmp_path_factory.mktemp("scoring") / "model", TINY)


@pytest.fixture(scope="module")
def tok(ckpt: Path) -> Any:
    return AutoTokenizer.from_pretrained(ckpt, local_files_only=True)


def _model(ckpt: Path) -> torch.nn.Module:
    m: torch.nn.Module = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    return m.eval()


def test_torch_score_equals_transformers_forward(ckpt: Path) -> None:
    model = _model(ckpt)
    engine = TorchEngine(model, version=4)

    async def run() -> tuple[Completion, Completion, Completion]:
        # a score between the decode steps of a running request must not disturb either
        gen = asyncio.create_task(
            engine.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0.0), request_id="g")
        )
        scored = await engine.score(PROMPT, FORCED, request_id="s")
        empty = await engine.score(PROMPT, [], request_id="e")
        return scored, empty, await gen

    scored, empty, gen = asyncio.run(run())
    assert isinstance(engine, ScoringEngine)
    assert scored.token_ids == FORCED and scored.finish_reason == "forced"
    assert scored.versions == [4] * len(FORCED) and scored.prompt_tokens == len(PROMPT)
    assert scored.logprobs == pytest.approx(hf_logprobs(model, PROMPT, FORCED), abs=1e-4)
    assert empty.token_ids == empty.logprobs == empty.versions == []
    # the sampled request's own logprobs are the same quantity: a score of its tokens agrees
    again = asyncio.run(engine.score(PROMPT, gen.token_ids, request_id="s2"))
    assert again.logprobs == pytest.approx(gen.logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="prompt_ids"):
        asyncio.run(engine.score([], FORCED, request_id="x"))


def test_router_scores_with_affinity_and_load(ckpt: Path) -> None:
    a, b = TorchEngine(_model(ckpt), version=0), TorchEngine(_model(ckpt), version=1)
    router = Router({"a": a, "b": b})
    long = SamplingParams(max_tokens=2000, temperature=0.0)

    async def run() -> tuple[Completion, Completion, Completion]:
        first = await router.score("s", PROMPT, FORCED, request_id="1")  # tie: "a"
        busy = asyncio.create_task(router.generate("other", PROMPT, long, request_id="busy"))
        while router.calls_by_engine() != {"b": 1}:  # least loaded (and no session on it)
            await asyncio.sleep(0.005)
        sticky = await router.score("s", PROMPT, FORCED, request_id="2")  # a, its last engine
        fresh = await router.score("new", PROMPT, FORCED, request_id="3")  # a: b is busy
        await router.abort("busy")
        await busy
        return first, sticky, fresh

    first, sticky, fresh = asyncio.run(run())
    assert first.versions == sticky.versions == fresh.versions == [0] * len(FORCED)
    assert router.stats.routed == {"a": 3, "b": 1} and router.stats.calls_scored == 3


def test_drain_waits_for_a_score_and_never_aborts_it(ckpt: Path) -> None:
    a, b = TorchEngine(_model(ckpt), version=0), TorchEngine(_model(ckpt), version=1)
    router = Router({"a": a, "b": b})

    async def run() -> tuple[Completion, int, Completion]:
        await a.pause()  # a paused engine holds the score until resume
        task = asyncio.create_task(router.score("s", PROMPT, FORCED, request_id="held"))
        while router.calls_by_engine() != {"a": 1}:
            await asyncio.sleep(0.005)
        moved = await router.drain("a", 0.05)  # deadline passes with the score still on a
        assert not task.done()
        await a.resume()
        held = await task
        after = await router.score("s", PROMPT, FORCED, request_id="next")  # a is draining
        return held, moved, after

    held, moved, after = asyncio.run(run())
    assert moved == 0 and router.stats.calls_migrated == 0
    assert held.versions == [0] * len(FORCED) and held.finish_reason == "forced"
    assert after.versions == [1] * len(FORCED)


class _Dead:
    """A scoring engine whose every request fails as a dead server's would."""

    version = 9

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       request_id: str) -> Completion:  # fmt: skip
        raise ConnectionError("engine is gone")

    async def score(self, prompt_ids: list[int], completion_ids: list[int], *,
                    request_id: str) -> Completion:  # fmt: skip
        raise ConnectionError("engine is gone")

    async def abort(self, request_id: str) -> bool:
        return False

    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def publish(self, state_dict_path: str, version: int) -> None:
        pass

    async def load(self) -> EngineLoad:
        return EngineLoad(0, 0)


class _NoScore(_Dead):
    score = None  # type: ignore[assignment]  # an engine that cannot score


def test_dead_engine_score_continues_elsewhere_and_no_scorer_raises(ckpt: Path) -> None:
    live = TorchEngine(_model(ckpt), version=2)
    router = Router({"dead": _Dead(), "live": live})
    died: list[str] = []
    router.on_dead = died.append
    out = asyncio.run(router.score("s", PROMPT, FORCED, request_id="r"))
    assert died == ["dead"] and router.live() == ["live"]
    assert out.versions == [2] * len(FORCED) and router.stats.routed == {"dead": 1, "live": 1}

    plain = Router({"plain": _NoScore()})
    with pytest.raises(NoEngineError, match="able to score"):
        asyncio.run(plain.score("s", PROMPT, FORCED, request_id="r"))


@pytest.mark.parametrize("delegate", [False, True])
def test_scripted_repo_rollout_through_torch_engine(tok: Any, ckpt: Path, delegate: bool) -> None:
    model = _model(ckpt)
    router = Router({"e0": TorchEngine(model, version=5)})
    env = make_env("repo", "train", 0, seed=0)
    sink = ListSink()
    cfg = session_config(max_turns=200, context_budget=700 if delegate else 4096)
    agent = ScriptedAgent(env, tok, router=router, version=99)  # version unused with a router
    r = asyncio.run(run_session(env, agent, tok, cfg, options=HarnessOptions(delegate=delegate),
                                rollout_id="t", sink=sink))  # fmt: skip
    assert r.status == "completed" and r.progress >= 0.9
    assert router.stats.calls_scored == len(r.calls) == router.stats.routed["e0"]
    if delegate:
        kinds = {c.kind for c in r.calls}
        assert {"subagent", "compaction"} <= kinds, kinds
    check_scored_rollout(r, model, 5, atol=1e-4)
    assert sink.of(RolloutFinished)[0].versions == (5, 5)


def test_scripted_coding_rollout_through_torch_engine(tok: Any, ckpt: Path) -> None:
    model = _model(ckpt)
    router = Router({"e0": TorchEngine(model, version=3)})
    env = make_env("coding", "train", "fizzbuzz")
    try:
        r = asyncio.run(
            run_session(env, ScriptedAgent(env, tok, router=router), tok,
                        session_config(max_turns=20), rollout_id="c")
        )  # fmt: skip
        report = env.env.last_report  # type: ignore[attr-defined]
    finally:
        env.close()
    assert r.status == "completed" and r.progress == 1.0
    assert report is not None and report.passed == report.total > 0  # the real hidden tests
    assert router.stats.calls_scored == len(r.calls) == 3
    check_scored_rollout(r, model, 3, atol=1e-4)
