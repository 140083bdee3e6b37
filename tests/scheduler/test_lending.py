"""Elastic lends the units that hold the training state to rollout between steps and
recalls them before the next batch (gyre_core/scheduler/elastic.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gyre_core.cluster import ROLLOUT, SWITCHING, TRAIN
from gyre_core.scheduler.base import FinishRate, Snapshot
from gyre_core.scheduler.policies import Elastic

B = 8


def snap(roles: list[str], **kw: object) -> Snapshot:
    """4 units, 2 of which hold the training state; engines of 4 sequences; a step done."""
    base = Snapshot(
        t=0.0, roles=tuple(roles), targets=tuple(roles), loads=tuple(0 for _ in roles),
        affinity=tuple(0 for _ in roles), queued_calls=0, active_sessions=0,
        calls_in_flight=0, ready=0, ready_tokens=0, started=24, remaining=40, version=1,
        steps_total=8, training=False, rollouts_per_step=B, staleness=4,
        max_seqs_per_unit=4, switch_s=30.0, train_tok_s=1000.0, max_active=20, min_train=2,
        finish_rate=0.01,  # 8 rollouts to go: the next batch in 800 s
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


LENT = [TRAIN, TRAIN, ROLLOUT, ROLLOUT]


def test_elastic_lends_the_floor_units_when_sessions_overflow_the_engines() -> None:
    # 20 live sessions, 8 engine slots: 3 units' worth waits. Both units holding the
    # training state serve until the next batch (the old rule kept the floor of 2).
    s = snap(LENT, active_sessions=20)
    assert s.admissible == 0
    assert Elastic().decide(s).targets == {0: ROLLOUT, 1: ROLLOUT}
    assert Elastic(lend=False).decide(s).targets == {}
    assert Elastic().decide(replace(s, training=True)).targets == {}  # never inside a step


def test_elastic_declines_to_lend_what_the_sessions_cannot_fill() -> None:
    # 11 sessions (no more may start): 3 beyond the 8 slots, less than a unit's worth (4)
    assert Elastic().decide(snap(LENT, active_sessions=11, max_active=11)).targets == {}
    # 13: one unit's worth, one unit lent
    one = snap(LENT, active_sessions=13, max_active=13)
    assert Elastic().decide(one).targets == {0: ROLLOUT}


def test_elastic_declines_when_the_wait_does_not_pay_for_switches_and_reprefills() -> None:
    s = snap(LENT, active_sessions=20)
    # no finish rate, or no step yet: no prediction of the batch to recall against
    assert Elastic().decide(replace(s, finish_rate=0.0)).targets == {}
    assert Elastic().decide(replace(s, version=0, started=20)).targets == {}
    # 8 rollouts at 0.1/s: ready in 80 s, less than a switch out and back plus the drain
    assert Elastic().decide(replace(s, finish_rate=0.1, drain_s=30.0)).targets == {}
    # re-prefill: 4 sessions x 100k tokens / 1,000 tok/s = 400 s < 800 - 60 s served
    priced = replace(s, prefill_tok_s=1000.0, mean_rollout_tokens=100_000.0)
    assert len(Elastic().decide(priced).targets) == 2
    # 300k tokens: 1,200 s of re-prefill, more than the 740 s the units would serve
    assert Elastic().decide(replace(priced, mean_rollout_tokens=300_000.0)).targets == {}


def test_elastic_recalls_lent_units_in_time_for_the_next_batch() -> None:
    roles = [ROLLOUT] * 4
    loads = (4, 1, 3, 4)
    # 6 of 8 ready at 0.1/s: the batch in 20 s, within a switch (30 s): both units that
    # the step needs come back at once, least loaded first.
    s = snap(roles, loads=loads, ready=6, active_sessions=16, finish_rate=0.1)
    assert Elastic().decide(s).targets == {1: TRAIN, 2: TRAIN}
    # the batch still far (2 at 0.001/s: 2,000 s) and the engines busy: they stay lent
    far = replace(s, finish_rate=0.001)
    assert Elastic().decide(far).targets == {}
    # the waterlevel: the sessions fit fewer engines, so one unit comes back at a time
    light = replace(far, active_sessions=2, max_active=2)
    assert Elastic().decide(light).targets == {1: TRAIN}
    arriving = replace(light, roles=(SWITCHING, *roles[1:]), targets=(TRAIN, *roles[1:]))
    assert Elastic().decide(arriving).targets == {}  # the next once that one is in place


def test_finish_rate_counts_rollouts_as_they_become_trainable() -> None:
    f = FinishRate(window=3)
    assert f.rate(10.0) == 0.0 and f.mean_tokens == 0.0
    f.observe(0.0, 100, 0)  # a group member: nothing trainable yet
    f.observe(10.0, 200, 4)  # its group completes
    assert f.rate(20.0) == 0.0  # one arrival: no rate
    f.observe(20.0, 300, 4)
    assert f.rate(20.0) == pytest.approx(4 / 10) and f.rate(30.0) == pytest.approx(4 / 20)
    f.observe(30.0, 400, 4)
    f.observe(40.0, 500, 4)  # the window keeps the last 3 arrivals
    assert f.rate(40.0) == pytest.approx(8 / 20)
    assert f.mean_tokens == pytest.approx((300 + 400 + 500) / 3)
