"""Router: session affinity, drain with migration or restart, engine death, no engines."""

from __future__ import annotations

import asyncio

import pytest
import torch

from gyre_core.models.model import build_model, tiny_qwen3_config
from gyre_core.models.shape import ModelShape
from gyre_core.rollout.engine import Completion, EngineLoad, SamplingParams
from gyre_core.rollout.router import NoEngineError, Router
from gyre_core.rollout.torch_engine import TorchEngine

VOCAB = 97
LONG = SamplingParams(max_tokens=300, temperature=0.0)
SHORT = SamplingParams(max_tokens=6, temperature=0.0)
PROMPT = [(7 * i + 3) % VOCAB for i in range(11)]


def _model(seed: int = 0) -> torch.nn.Module:
    cfg = tiny_qwen3_config(
        ModelShape(VOCAB, layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128)
    )
    model: torch.nn.Module = build_model(cfg, seed=seed)
    model.eval()
    return model


def _engines() -> tuple[TorchEngine, TorchEngine]:
    """Two engines with the same weights; ``b`` tags its tokens with version 1."""
    return TorchEngine(_model(), version=0), TorchEngine(_model(), version=1)


@pytest.fixture(scope="module")
def reference() -> Completion:
    """The long greedy request served by one engine, start to end."""
    eng = TorchEngine(_model())
    return asyncio.run(eng.generate(PROMPT, LONG, request_id="ref"))


class _Dying:
    """Delegates to a TorchEngine; ``generate`` raises once ``kill`` is set (after aborting
    the inner request, so its tokens are lost as when a server dies)."""

    def __init__(self, inner: TorchEngine, *, dead_at_start: bool) -> None:
        self.inner = inner
        self.kill = asyncio.Event()
        if dead_at_start:
            self.kill.set()

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        if self.kill.is_set():
            raise ConnectionError("engine is gone")
        task = asyncio.ensure_future(self.inner.generate(prompt_ids, params, request_id=request_id))
        killed = asyncio.ensure_future(self.kill.wait())
        await asyncio.wait([task, killed], return_when=asyncio.FIRST_COMPLETED)
        killed.cancel()
        if task.done():
            return task.result()
        await self.inner.abort(request_id)
        await task
        raise RuntimeError("engine died mid-generation")

    async def abort(self, request_id: str) -> bool:
        return await self.inner.abort(request_id)

    async def pause(self) -> None:
        await self.inner.pause()

    async def resume(self) -> None:
        await self.inner.resume()

    async def publish(self, state_dict_path: str, version: int) -> None:
        await self.inner.publish(state_dict_path, version)

    async def load(self) -> EngineLoad:
        return await self.inner.load()

    @property
    def version(self) -> int:
        return self.inner.version


async def _until_running(engine: TorchEngine) -> None:
    """Wait (bounded) until ``engine`` decodes a sequence: it has prefilled and sampled."""
    for _ in range(2000):
        if (await engine.load()).running:
            return
        await asyncio.sleep(0.005)
    raise TimeoutError("request never started running")


def test_affinity_and_spread() -> None:
    a, b = _engines()
    router = Router({"a": a, "b": b})

    async def run() -> None:
        for turn in range(3):
            for s in ("s1", "s2"):
                out = await router.generate(s, PROMPT, SHORT, request_id=f"{s}-{turn}")
                assert len(out.token_ids) == 6 and out.finish_reason == "length"

    asyncio.run(run())
    assert router.session_engine("s1") != router.session_engine("s2")
    assert router.stats.routed == {"a": 3, "b": 3}  # each session stayed on its engine


def _drain_scenario(
    mode: str, params: SamplingParams = LONG
) -> tuple[Router, Completion, TorchEngine]:
    a, b = _engines()
    router = Router({"a": a, "b": b}, mode=mode)  # type: ignore[arg-type]

    async def run() -> Completion:
        call = asyncio.ensure_future(router.generate("s", PROMPT, params, request_id="r"))
        await _until_running(a)
        await asyncio.sleep(0.05)  # let it decode some tokens; the pause below makes it safe
        await a.pause()  # still running at the deadline, however fast the machine is
        assert not call.done()
        await router.drain("a", deadline_s=0.05)
        out = await call
        await a.resume()
        after = await router.generate("s", PROMPT, SHORT, request_id="after")
        assert len(after.token_ids) == 6
        return out

    out = asyncio.run(run())
    assert router.stats.routed["a"] == 1  # nothing new went to the draining engine
    assert router.session_engine("s") == "b"
    return router, out, a


def test_drain_migrates_call_without_restart(reference: Completion) -> None:
    router, out, _ = _drain_scenario("migrate")
    assert out.token_ids == reference.token_ids
    assert out.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
    assert out.finish_reason == "length" and out.prompt_tokens == len(PROMPT)
    kept = out.versions.count(0)  # tokens generated on a before the move
    assert 0 < kept < 300 and out.versions == [0] * kept + [1] * (300 - kept)
    s = router.stats
    assert s.calls_migrated == 1 and s.sessions_restarted == 0 and s.tokens_discarded == 0
    assert s.tokens_reprefilled == len(PROMPT) + kept


def test_a_sampled_call_migrates_as_if_it_never_moved() -> None:
    """Sampling at temperature 1 (near-uniform on this untrained model, so any other draw
    shows at once): the migrated call's tokens are exactly those of the call left alone,
    since each token's draw depends on its seed and position, not on the engine."""
    sampled = SamplingParams(max_tokens=300, temperature=1.0, seed=42)
    alone = asyncio.run(TorchEngine(_model()).generate(PROMPT, sampled, request_id="x"))
    router, out, _ = _drain_scenario("migrate", sampled)
    kept = out.versions.count(0)
    assert router.stats.calls_migrated == 1 and 0 < kept < 300
    assert out.token_ids == alone.token_ids
    assert out.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert len(set(alone.token_ids)) > 50  # it did sample: a greedy run would repeat


def test_drain_restart_mode_discards(reference: Completion) -> None:
    router, out, _ = _drain_scenario("restart")
    assert out.token_ids == reference.token_ids
    assert out.versions == [1] * 300  # all regenerated on b
    s = router.stats
    assert s.sessions_restarted == 1 and s.tokens_discarded > 0
    assert s.calls_migrated == 0 and s.tokens_reprefilled == 0


def test_engine_dead_at_first_call_moves_call() -> None:
    a, b = _engines()
    dying = _Dying(a, dead_at_start=True)
    router = Router({"a": dying, "b": b})
    out = asyncio.run(router.generate("s", PROMPT, SHORT, request_id="r"))
    ref = asyncio.run(TorchEngine(_model()).generate(PROMPT, SHORT, request_id="x"))
    assert out.token_ids == ref.token_ids and out.versions == [1] * 6
    assert router.stats.calls_migrated == 1 and router.stats.sessions_restarted == 0
    assert router.live() == ["b"]


def test_engine_dies_mid_generation(reference: Completion) -> None:
    a, b = _engines()
    dying = _Dying(a, dead_at_start=False)
    router = Router({"a": dying, "b": b})

    async def run() -> Completion:
        call = asyncio.ensure_future(router.generate("s", PROMPT, LONG, request_id="r"))
        await _until_running(a)
        await a.pause()
        dying.kill.set()
        return await call

    out = asyncio.run(run())
    assert out.token_ids == reference.token_ids  # tokens lost with the engine: regenerated
    assert out.versions == [1] * 300
    assert router.stats.calls_migrated == 1 and router.live() == ["b"]


def test_no_engine_is_a_clear_error() -> None:
    with pytest.raises(NoEngineError, match="no engine available"):
        asyncio.run(Router({}).generate("s", PROMPT, SHORT, request_id="r"))
    a, _ = _engines()
    router = Router({"a": a})

    async def run() -> None:
        await router.drain("a", deadline_s=0.0)
        await router.generate("s", PROMPT, SHORT, request_id="r")

    with pytest.raises(NoEngineError, match="draining=\\['a'\\]"):
        asyncio.run(run())
    router.add("a", a)  # rejoins rollout
    assert len(asyncio.run(router.generate("s", PROMPT, SHORT, request_id="r")).token_ids) == 6


class _Gone(_Dying):
    """An engine whose process is gone: every call and every load read fails."""

    def __init__(self, inner: TorchEngine) -> None:
        super().__init__(inner, dead_at_start=True)

    async def load(self) -> EngineLoad:
        raise ConnectionError("engine is gone")


def test_a_call_leaves_the_failure_domain_of_its_dead_engine() -> None:
    """a and b share node n1; a dies under the call. b looks as idle as c and comes first
    in order, yet the call moves to c on n2: b may be going down with a."""
    a, b = _engines()
    c = TorchEngine(_model(), version=2)
    router = Router({})
    router.add("a", _Dying(a, dead_at_start=True), domain="n1")
    router.add("b", b, domain="n1")
    router.add("c", c, domain="n2")
    dead: list[str] = []
    router.on_dead = dead.append
    out = asyncio.run(router.generate("s", PROMPT, SHORT, request_id="r"))
    assert out.versions == [2] * 6 and router.session_engine("s") == "c"
    assert dead == ["a"] and router.live() == ["b", "c"]  # b was avoided, not declared dead
    # with no other domain left, the dead engine's neighbour still serves
    router.mark_dead("c")
    out = asyncio.run(router.generate("s2", PROMPT, SHORT, request_id="r2"))
    assert out.versions == [1] * 6 and dead == ["a"]  # mark_dead from outside: no on_dead


def test_an_engine_whose_load_fails_is_dead_not_idle() -> None:
    """The dead engine first in order would win on load 0; its failed read retires it."""
    a, b = _engines()
    router = Router({"x": _Gone(a), "b": b})
    dead: list[str] = []
    router.on_dead = dead.append
    out = asyncio.run(router.generate("s", PROMPT, SHORT, request_id="r"))
    assert out.versions == [1] * 6 and router.live() == ["b"] and dead == ["x"]
    assert router.stats.calls_migrated == 0  # it never got the call


class _Scripted:
    """An engine that answers at once with 4 tokens and reports the load it is told."""

    def __init__(self) -> None:
        self.reported = EngineLoad(running=0, waiting=0)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, request_id: str
    ) -> Completion:
        await asyncio.sleep(0.02)
        return Completion([1, 2, 3, 4], [0.0] * 4, [0] * 4, "length")

    async def abort(self, request_id: str) -> bool:
        return False

    async def load(self) -> EngineLoad:
        return self.reported


@pytest.mark.parametrize(
    ("prefill_tok_s", "stays"),
    [(10.0, True), (1e12, False), (0.0, False)],
)
def test_a_busy_engine_keeps_a_session_while_waiting_beats_re_prefilling(
    prefill_tok_s: float, stays: bool
) -> None:
    # The session's 1,000 cached tokens would take 100 s to re-prefill at 10 tok/s: its
    # engine's 10 queued calls, one every ~0.02 s, are the cheaper wait. At 1e12 tok/s
    # re-prefilling is the cheaper; 0 leaves the load slack alone to decide.
    a, b = _Scripted(), _Scripted()
    router = Router({"a": a, "b": b}, prefill_tok_s=prefill_tok_s)  # type: ignore[dict-item]
    prompt = [5] * 996

    async def run() -> str:
        for turn in range(2):  # two completions on "a" measure its gap
            await router.generate("s", prompt, SHORT, request_id=f"r{turn}")
        assert router.session_engine("s") == "a"
        a.reported = EngineLoad(running=8, waiting=10)  # 18 calls against 0: past the slack
        await router.generate("s", prompt, SHORT, request_id="r2")
        return router.session_engine("s") or ""

    assert asyncio.run(run()) == ("a" if stays else "b")
