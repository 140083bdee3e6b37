"""The simulator's router by hand: a call whose engine is full waits for it (its prefix
cache) unless the wait costs more than re-prefilling its context on an engine with room."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gyre_core import events as ev
from gyre_core.scheduler.policies import Async
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import TraceRollout, Turn
from tests.sim.test_simulator import HAND

# Three rollout units of one sequence each and a training unit; 10 prompt tokens prefill
# in 1 s and 10 tokens decode in 1 s.
ONE_SEQ = replace(HAND, gpus=4, max_seqs_per_unit=1, prefill_tok_s=10.0)


def _rollout(i: int, *turns: tuple[int, float]) -> TraceRollout:
    return TraceRollout(f"r{i}", f"t{i}", f"t{i}", tuple(Turn(10, c, s) for c, s in turns), 1e9)


def _run(r3_tokens: int) -> tuple[dict, dict[str, float]]:  # type: ignore[type-arg]
    # r0 (unit 0) ends its first call at 2.0 s and returns at 2.5 s; meanwhile r3, queued
    # since 0 s, took unit 0 at 2.0 s; r2 left unit 2 free at 2.2 s. r0's engine is full
    # until r3 ends at 3.0 + r3_tokens / 10 s; re-prefilling its 20 cached tokens on unit 2
    # would take 2 s.
    trace = [
        _rollout(0, (10, 0.5), (10, 0.0)),
        _rollout(1, (100, 0.0)),
        _rollout(2, (12, 0.0)),
        _rollout(3, (r3_tokens, 0.0)),
    ]
    sink = ev.ListSink()
    out = Simulator(trace, ONE_SEQ, Async(3, 1), sink=sink).run()
    return out, {d.rollout_id: d.t for d in sink.of(ev.RolloutFinished)}


def test_a_call_waits_for_its_own_engine_when_that_is_cheaper() -> None:
    out, done = _run(10)  # a 1.5 s wait against 2 s of re-prefill: r0 waits for unit 0
    assert done["r0"] == pytest.approx(4.0 + 1.0 + 1.0, abs=1e-6)  # 10 fresh tokens, 10 decoded
    assert out["tokens_prefilled"] == 4 * 10 + 10


def test_a_call_moves_when_re_prefilling_is_cheaper_than_the_wait() -> None:
    out, done = _run(40)  # a 4.5 s wait: r0 re-prefills its 30 tokens on unit 2 at once
    assert done["r0"] == pytest.approx(2.5 + 3.0 + 1.0, abs=1e-6)
    assert out["tokens_prefilled"] == 4 * 10 + 30


def test_steal_keeps_track_of_the_queues_it_reads_and_picks_the_longest_lowest_first() -> None:
    """``steal`` reads only the units with a queued entry (``Router.nonempty``, kept on every
    enqueue, pop and leave): at each of its calls in a run with queues on several engines,
    that set is exactly the non-empty queues, and the queue it takes from is the longest,
    the lowest unit of those as long (what scanning every unit's queue would pick)."""
    from gyre_core.sim.workload import generate

    costs = replace(HAND, gpus=4, max_seqs_per_unit=2, rollouts_per_step=8, prefill_tok_s=1e3)
    sim = Simulator(generate("mixed", 32, 0), costs, Async(3, 1))
    router, checked = sim.router, []
    steal = router.steal

    def checking(e):  # type: ignore[no-untyped-def]
        queues = router.waiting
        assert router.nonempty == {u for u, q in enumerate(queues) if q}
        if router.nonempty:
            longest = max(range(len(queues)), key=lambda u: len(queues[u]))
            before = {u: len(q) for u, q in enumerate(queues)}
            got = steal(e)
            after = {u: len(q) for u, q in enumerate(router.waiting)}
            changed = {u for u in before if before[u] != after[u]}
            assert changed <= {longest}
            checked.append(got is not None)
            return got
        return steal(e)

    router.steal = checking  # type: ignore[method-assign]
    sim.run()
    assert len(checked) > 20 and any(checked)  # it ran with queues, and took calls from them
