"""Which finished rollouts a step trains: arrival order against index order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre_core.scheduler.batching import ARRIVAL, INDEX, take, usable


def test_arrival_takes_the_first_to_finish_whatever_step_admitted_them() -> None:
    ready = [5, 2, 7, 0]  # rollout indices in finish order; steps of 2
    assert take(ready, 2, 0, ARRIVAL) == [0, 1]
    assert usable(ready, 2, 0, ARRIVAL) == [0, 1, 2, 3]


def test_index_waits_for_its_own_batch_and_counts_only_what_steps_can_take_next() -> None:
    ready = [5, 2, 7, 0]  # step 0 is {0, 1}: rollout 1 has not finished
    assert take(ready, 2, 0, INDEX) is None
    assert [ready[p] for p in usable(ready, 2, 0, INDEX)] == [0]  # 2, 5, 7 must wait
    ready.append(1)
    assert [ready[p] for p in take(ready, 2, 0, INDEX) or []] == [0, 1]
    # step 1 ({2, 3}) is incomplete, so step 2's finished rollouts are not counted yet
    assert [ready[p] for p in usable(ready, 2, 0, INDEX)] == [0, 1, 2]


def test_index_continues_from_the_step_the_run_is_at() -> None:
    ready = [9, 8, 6, 7]
    assert take(ready, 4, 1, INDEX) is None  # steps of 4: step 1 is {4..7}, 4 and 5 missing
    assert take(ready, 2, 3, INDEX) == [2, 3]  # steps of 2: step 3 is {6, 7}
    assert [ready[p] for p in usable(ready, 2, 3, INDEX)] == [6, 7, 8, 9]


def test_an_unknown_order_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="arrival, index"):
        usable([0], 1, 0, "random")


@given(st.permutations(list(range(12))), st.sampled_from([1, 2, 3, 4]))
def test_both_orders_train_every_rollout_once(finish: list[int], per_step: int) -> None:
    for order in (ARRIVAL, INDEX):
        ready, step, trained = [], 0, []
        for idx in finish:
            ready.append(idx)
            while (picked := take(ready, per_step, step, order)) is not None:
                batch = [ready[p] for p in picked]
                if order == INDEX:
                    assert sorted(batch) == list(range(step * per_step, (step + 1) * per_step))
                trained += batch
                ready = [r for p, r in enumerate(ready) if p not in set(picked)]
                step += 1
        assert sorted(trained) == list(range(12 - 12 % per_step))
        assert len(ready) == 12 % per_step
