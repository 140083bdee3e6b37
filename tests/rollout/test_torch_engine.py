"""TorchEngine: batching, sampling, abort, pause and publish on a tiny Qwen3."""

from __future__ import annotations

import asyncio
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.engine import Completion, SamplingParams
from gyre_core.rollout.torch_engine import TorchEngine, _inverse_cdf, position_uniform

VOCAB = 97
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def _model(seed: int = 0) -> torch.nn.Module:
    cfg = tiny_qwen3_config(
        ModelShape(VOCAB, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128)
    )
    return build_model(cfg, seed=seed).eval()


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [(7 * i + 3 + offset) % VOCAB for i in range(n)]


def _gen(engine: TorchEngine, prompt: list[int], params: SamplingParams, rid: str) -> Completion:
    return asyncio.run(engine.generate(prompt, params, request_id=rid))


def test_greedy_matches_hf_generate_and_logprobs() -> None:
    model = _model()
    prompt = _prompt(9)
    out = _gen(TorchEngine(model), prompt, GREEDY, "a")
    ids = torch.tensor([prompt])
    with torch.no_grad():
        ref = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=12,
            min_new_tokens=12,
            pad_token_id=0,
            eos_token_id=None,
        )
    assert out.token_ids == ref[0, len(prompt) :].tolist()
    assert out.finish_reason == "length" and out.prompt_tokens == len(prompt)
    assert out.versions == [0] * 12
    full = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0].float(), dim=-1)
    expected = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(out.token_ids)]
    assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_concurrent_requests_do_not_mix() -> None:
    model = _model()
    prompts = [_prompt(n, offset=n) for n in (1, 3, 5, 8, 13, 2, 21, 6)]
    params = [SamplingParams(max_tokens=4 + 2 * i, temperature=0.0) for i in range(8)]
    alone = [_gen(TorchEngine(model), p, sp, "x") for p, sp in zip(prompts, params, strict=True)]

    async def together() -> list[Completion]:
        eng = TorchEngine(model, max_batch=5)  # fewer slots than requests: admits mid-run
        return await asyncio.gather(
            *(
                eng.generate(p, sp, request_id=str(i))
                for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
            )
        )

    batched = asyncio.run(together())
    for a, b in zip(alone, batched, strict=True):
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_seeded_sampling_reproducible_and_limits() -> None:
    model = _model()
    eng = TorchEngine(model)
    sp = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.8, seed=123)
    a = _gen(eng, _prompt(4), sp, "a")
    b = _gen(eng, _prompt(4), sp, "b")
    c = _gen(eng, _prompt(4), SamplingParams(max_tokens=16, temperature=0.9, seed=7), "c")
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert len(a.token_ids) == 16 and a.finish_reason == "length"
    assert c.token_ids != a.token_ids
    # stop token: cut at its first occurrence, included in the output
    stop = a.token_ids[5]
    first = a.token_ids.index(stop)
    s = _gen(eng, _prompt(4), SamplingParams(**{**_asdict(sp), "stop_token_ids": (stop,)}), "s")
    assert s.finish_reason == "stop"
    assert s.token_ids == a.token_ids[: first + 1]
    one = _gen(eng, _prompt(4), SamplingParams(max_tokens=1, temperature=0.0), "o")
    assert len(one.token_ids) == 1 and one.finish_reason == "length"


def test_position_draws_sample_the_distribution() -> None:
    """Inverse-CDF sampling over position-keyed draws gives each token its probability,
    never one of probability 0, and neighbouring seeds or positions give unrelated draws."""
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2])
    n = 20_000
    counts = Counter(_inverse_cdf(probs, position_uniform(9, pos)) for pos in range(n))
    assert counts[1] == 0
    for tok, p in ((0, 0.5), (2, 0.3), (3, 0.2)):
        assert abs(counts[tok] / n - p) < 0.015, (tok, counts)
    assert _inverse_cdf(probs, 0.0) == 0 and _inverse_cdf(probs, 1.0 - 1e-16) == 3
    by_seed = [position_uniform(s, 5) for s in range(n)]
    assert abs(sum(by_seed) / n - 0.5) < 0.01 and min(by_seed) >= 0 and max(by_seed) < 1
    pairs = list(pairwise(by_seed))  # lag-1 correlation across seeds
    mean = sum(by_seed) / n
    cov = sum((x - mean) * (y - mean) for x, y in pairs) / len(pairs)
    assert abs(cov / (1 / 12)) < 0.03


def _asdict(sp: SamplingParams) -> dict[str, object]:
    return {k: getattr(sp, k) for k in SamplingParams.__slots__}


def test_abort_returns_partial_tokens() -> None:
    async def body() -> tuple[Completion, bool, bool]:
        eng = TorchEngine(_model())
        task = asyncio.create_task(
            eng.generate(
                _prompt(5), SamplingParams(max_tokens=10_000, temperature=0.0), request_id="r"
            )
        )
        while True:
            await asyncio.sleep(0.01)
            if (await eng.load()).running == 1:
                break
        await asyncio.sleep(0.05)
        ok = await eng.abort("r")
        missing = await eng.abort("nope")
        return await task, ok, missing

    out, ok, missing = asyncio.run(body())
    assert ok and not missing
    assert out.finish_reason == "abort"
    assert 0 < len(out.token_ids) < 10_000
    assert len(out.logprobs) == len(out.versions) == len(out.token_ids)


def test_pause_holds_until_resume() -> None:
    async def body() -> Completion:
        eng = TorchEngine(_model())
        await eng.pause()
        task = asyncio.create_task(eng.generate(_prompt(3), GREEDY, request_id="p"))
        await asyncio.sleep(0.2)
        assert not task.done()
        load = await eng.load()
        assert (load.running, load.waiting) == (0, 1)
        await eng.resume()
        return await task

    out = asyncio.run(body())
    assert len(out.token_ids) == 12 and out.finish_reason == "length"


def test_publish_swaps_weights_and_versions(tmp_path: Path) -> None:
    old, new = _model(seed=0), _model(seed=1)
    prompt = _prompt(6)
    ref_old = _gen(TorchEngine(_model(seed=0)), prompt, GREEDY, "o")
    ref_new = _gen(TorchEngine(_model(seed=1)), prompt, GREEDY, "n")
    assert ref_old.token_ids != ref_new.token_ids
    new.save_pretrained(tmp_path)  # type: ignore[operator]

    async def body() -> tuple[Completion, Completion, Completion]:
        eng = TorchEngine(old, version=3)
        before = await eng.generate(prompt, GREEDY, request_id="b")
        long = asyncio.create_task(
            eng.generate(prompt, SamplingParams(max_tokens=400, temperature=0.0), request_id="l")
        )
        while not (await eng.load()).running:
            await asyncio.sleep(0.005)
        await eng.pause()  # between steps, deterministically: the long request is mid-way
        assert not long.done()
        await eng.publish(str(tmp_path), 4)
        await eng.resume()
        assert eng.version == 4
        after = await eng.generate(prompt, GREEDY, request_id="a")
        return before, after, await long

    before, after, long = asyncio.run(body())
    assert before.token_ids == ref_old.token_ids and before.versions == [3] * 12
    assert after.token_ids == ref_new.token_ids and after.versions == [4] * 12
    # the in-flight request: old version first, then new, switching once
    assert long.versions[0] == 3 and long.versions[-1] == 4
    k = long.versions.index(4)
    assert long.versions == [3] * k + [4] * (len(long.versions) - k)

    # a state dict works too
    async def by_state() -> Completion:
        eng = TorchEngine(_model(seed=1))
        await eng.publish(_model(seed=0).state_dict(), 9)
        return await eng.generate(prompt, GREEDY, request_id="s")

    s = asyncio.run(by_state())
    assert s.token_ids == ref_old.token_ids and s.versions == [9] * 12
