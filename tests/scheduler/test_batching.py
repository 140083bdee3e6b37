"""Which finished rollouts a step trains: arrival order against index order, whole groups
oldest first, stale groups dropped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre_core.scheduler.batching import ARRIVAL, INDEX, Groups, select, take, usable


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


def test_arrival_with_groups_takes_only_complete_groups_and_late_members_wait() -> None:
    # groups of 2 ({0,1}, {2,3}, {4,5}), steps of 4: 0, 2, 4, 5, 3 finish; 1 still runs
    ready = [0, 2, 4, 5, 3]
    picked = take(ready, 4, 0, ARRIVAL, Groups(2))
    assert sorted(ready[p] for p in picked or []) == [2, 3, 4, 5]  # not 0, 2, 4, 5
    assert [ready[p] for p in usable(ready, 4, 0, ARRIVAL, Groups(2))] == [4, 5, 2, 3]
    assert take([0, 2, 4, 3], 4, 0, ARRIVAL, Groups(2)) is None  # one complete group only


def test_index_is_unchanged_by_groups() -> None:
    ready = [5, 2, 7, 0, 1]
    spans = [(0, 0)] * len(ready)
    for groups in (Groups(), Groups(2, spans, 0)):
        assert [ready[p] for p in usable(ready, 2, 0, INDEX, groups)] == [0, 1, 2]
        assert select(ready, 2, 3, INDEX, groups).stale == []


def test_groups_of_the_oldest_policy_version_go_first_ties_by_last_finish() -> None:
    # {0,1} finished first but its oldest token is version 3; {2,3} and {4,5} hold version
    # 1 tokens: they go first, {4,5} (last member done earlier) before {2,3}
    ready = [0, 1, 2, 4, 5, 3]
    spans = [(3, 4), (3, 3), (2, 2), (1, 3), (2, 2), (1, 1)]
    order = usable(ready, 2, 4, ARRIVAL, Groups(2, spans, 3))
    assert [ready[p] for p in order] == [4, 5, 2, 3, 0, 1]
    assert [ready[p] for p in take(ready, 4, 4, ARRIVAL, Groups(2, spans, 3)) or []] == [4, 5, 2, 3]


def test_a_complete_group_past_the_staleness_bound_is_dropped_not_trained() -> None:
    # at step 5 with bound 2 a token of version v trains iff v >= 3: {0,1} has none
    ready = [0, 1, 2, 3, 4]
    spans = [(1, 2), (0, 1), (2, 3), (1, 2), (0, 0)]
    sel = select(ready, 2, 5, ARRIVAL, Groups(2, spans, 2))
    assert sel.stale == [0, 1]
    assert [ready[p] for p in sel.usable] == [2, 3]  # {4,5}: 5 runs, 4 waits (not dropped)
    assert select(ready, 2, 5, ARRIVAL, Groups(2, spans, None)).stale == []  # no bound


def test_a_failed_member_completes_its_group_and_a_tokenless_group_is_never_stale() -> None:
    ready = [1, 0, 3, 2]  # 0 and 3 failed before their first call: no tokens
    spans = [(0, 0), None, None, None]
    sel = select(ready, 2, 9, ARRIVAL, Groups(2, spans, 1))
    assert sel.stale == [0, 1]  # {0,1}: its one token (version 0) is past the bound
    assert [ready[p] for p in sel.usable] == [2, 3]  # {2,3}: no token, still trained


def test_without_groups_arrival_is_finish_order_and_drops_nothing() -> None:
    ready = [3, 0, 2, 1]
    spans = [(5, 5), (0, 0), (1, 1), (0, 0)]
    sel = select(ready, 2, 9, ARRIVAL, Groups(1, spans, 0))
    assert sel.usable == [0, 1, 2, 3] and sel.stale == []


def test_a_step_that_is_not_whole_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="would split a group"):
        usable([0, 1, 2], 3, 0, ARRIVAL, Groups(2))


@given(
    st.permutations(list(range(12))),
    st.sampled_from([(2, 2), (2, 4), (3, 6), (4, 4), (1, 3)]),
)
def test_arrival_with_groups_trains_whole_groups_each_once(
    finish: list[int], shape: tuple[int, int]
) -> None:
    size, per_step = shape
    ready: list[int] = []
    step, trained = 0, []
    for idx in finish:
        ready.append(idx)
        while (picked := take(ready, per_step, step, ARRIVAL, Groups(size))) is not None:
            batch = [ready[p] for p in picked]
            assert sorted(list({i // size for i in batch}) * size) == sorted(
                i // size for i in batch
            )
            trained += batch
            ready = [r for p, r in enumerate(ready) if p not in set(picked)]
            step += 1
    assert sorted(trained + ready) == list(range(12))
    assert len(trained) == 12 - 12 % per_step
