"""The async split search and the three-policy comparison, at library level (small traces)."""

from __future__ import annotations

import random

import pytest

from gyre_core.cluster import ClusterError
from gyre_core.scheduler.policies import Async, make_policy
from gyre_core.sim.compare import GRID, best_by_goodput, best_split, compare, grid, search
from gyre_core.sim.costs import CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import TraceRollout, generate

SMALL = CostModel(gpus=32, rollouts_per_step=16)  # 4 units: splits 1:3, 2:2, 3:1


@pytest.fixture(scope="module")
def trace() -> list[TraceRollout]:
    return generate("mixed", 32, seed=1)


@pytest.mark.parametrize(("lo", "hi"), [(1, 1), (1, 3), (1, 8), (1, 9), (5, 40), (1, 4095)])
def test_grid_spans_the_interval_with_at_most_grid_points(lo: int, hi: int) -> None:
    points = grid(lo, hi)
    assert points == sorted(set(points))
    assert points[0] == lo and points[-1] == hi
    assert len(points) == min(GRID, hi - lo + 1)


@pytest.mark.parametrize("units", [2, 3, 8, 9, 16, 64, 1024, 4096])
def test_search_finds_the_optimum_of_a_unimodal_makespan(units: int) -> None:
    calls: list[int] = []
    for opt in sorted({1, max(1, units // 3), units - 1}):
        calls.clear()

        def makespan(r: int, opt: int = opt) -> float:
            calls.append(r)
            return float((r - opt) ** 2)

        best, seen = search(units, makespan)
        assert best == opt
        assert sorted(calls) == sorted(seen)  # each split simulated once
        assert set(seen) <= set(range(1, units))
    if units <= GRID + 1:
        assert len(seen) == units - 1  # small clusters: every split
    else:
        assert len(seen) <= 40  # large ones: logarithmic, far from units - 1


@pytest.mark.parametrize("seed", range(20))
def test_search_returns_a_local_minimum_even_when_the_makespan_is_not_unimodal(
    seed: int,
) -> None:
    rng = random.Random(seed)
    units = rng.choice([5, 17, 64, 300])
    values = [rng.random() for _ in range(units)]
    best, seen = search(units, lambda r: values[r])
    assert seen[best] == min(seen.values())
    for neighbour in (best - 1, best + 1):
        if 1 <= neighbour < units:
            assert seen[neighbour] >= seen[best]


def test_best_split_tries_every_split_of_a_small_cluster(trace: list[TraceRollout]) -> None:
    split, summary, evaluated = best_split(trace, SMALL)
    assert [e["split"] for e in evaluated] == ["1:3", "2:2", "3:1"]
    best = max(evaluated, key=lambda e: e["goodput_tok_s"])  # no split times out more
    assert {e["timeouts"] for e in evaluated} == {0}
    assert f"{split[0]}:{split[1]}" == best["split"]
    assert summary["goodput_tok_s"] == best["goodput_tok_s"]
    direct = Simulator(trace, SMALL, Async(*split)).run()
    assert direct["makespan_s"] == summary["makespan_s"]
    assert direct["policy"] == "async" and sum(split) == SMALL.units


def test_a_split_may_not_buy_goodput_with_timeouts() -> None:
    """The best goodput among splits whose timeouts exceed the fewest by at most 1% of the
    rollouts: a split that drops more rollouts is not chosen however fast it trains."""
    s = lambda goodput, timeouts: {"goodput_tok_s": goodput, "timeouts": timeouts}  # noqa: E731
    seen = {1: s(900.0, 40), 2: s(500.0, 3), 3: s(480.0, 0), 4: s(700.0, 12)}
    assert best_by_goodput(seen, rollouts=1000) == 2  # 10 allowed: 4 (12) and 1 (40) are out
    assert best_by_goodput(seen, rollouts=2000) == 4  # 20 allowed
    assert best_by_goodput(seen, rollouts=4000) == 1  # 40 allowed: the fastest
    seen[5] = s(700.0, 0)
    assert best_by_goodput(seen, rollouts=2000) == 4  # a tie goes to fewer rollout units


def test_best_split_on_a_larger_cluster_skips_splits_but_keeps_a_local_minimum(
    trace: list[TraceRollout],
) -> None:
    costs = CostModel(gpus=128, gpus_per_unit=8, rollouts_per_step=16)  # 16 units
    split, summary, evaluated = best_split(trace, costs)
    rs = [int(e["split"].split(":")[0]) for e in evaluated]
    assert rs == sorted(rs) and len(rs) < costs.units - 1
    by_r = {int(e["split"].split(":")[0]): e["goodput_tok_s"] for e in evaluated}
    assert {e["timeouts"] for e in evaluated} == {0}  # so goodput alone decides
    assert by_r[split[0]] == max(by_r.values()) == summary["goodput_tok_s"]
    for r in (split[0] - 1, split[0] + 1):
        if 1 <= r < costs.units:
            assert r in by_r


def test_compare_runs_three_policies_on_the_same_work(trace: list[TraceRollout]) -> None:
    lines: list[str] = []
    result = compare(trace, SMALL, progress=lines.append)
    assert len(lines) == 2 + len(result["async_splits"])  # one line per simulation
    for policy in ("colocate", "async", "elastic"):
        s = result[policy]
        assert s["policy"] == policy and s["switch_mode"] == "migrate"
        assert s["steps"] == 2 and s["rollouts"] == 32
    evaluated = {e["split"]: e["goodput_tok_s"] for e in result["async_splits"]}
    assert evaluated[result["async"]["split"]] == result["async"]["goodput_tok_s"]
    assert result["async"]["goodput_tok_s"] == max(evaluated.values())
    g = result["elastic"]["goodput_tok_s"]
    assert result["elastic_vs_colocate"] == round(g / result["colocate"]["goodput_tok_s"], 4)
    assert result["elastic_vs_async"] == round(g / result["async"]["goodput_tok_s"], 4)
    e = result["elastic"]["makespan_s"]
    assert result["makespan_vs_colocate"] == round(result["colocate"]["makespan_s"] / e, 4)
    colocate = Simulator(trace, SMALL, make_policy("colocate", SMALL.units)).run()
    assert colocate == result["colocate"]  # deterministic: same inputs, same summary


def test_compare_with_index_order_trains_the_same_rollouts_in_every_policy(
    trace: list[TraceRollout],
) -> None:
    result = compare(trace, SMALL, batch_order="index")
    assert result["batch_order"] == "index"
    trained = {p: result[p]["tokens_trained"] for p in ("colocate", "async", "elastic")}
    assert len(set(trained.values())) == 1, trained  # the same rollouts, the same tokens


def test_compare_passes_the_switch_mode(trace: list[TraceRollout]) -> None:
    result = compare(trace, SMALL, "restart")
    assert {result[p]["switch_mode"] for p in ("colocate", "async", "elastic")} == {"restart"}
    assert result["elastic"]["calls_migrated"] == 0


def test_an_impossible_cluster_is_refused_before_any_simulation(
    trace: list[TraceRollout],
) -> None:
    lines: list[str] = []
    with pytest.raises(ClusterError, match="at least one unit for rollout and one for training"):
        compare(
            trace, CostModel(gpus=8, gpus_per_unit=8, rollouts_per_step=16), progress=lines.append
        )
    assert lines == []
    with pytest.raises(ValueError, match="at least 2 units"):
        search(1, float)


def test_the_regime_diagnostics_by_hand() -> None:
    from dataclasses import replace

    from gyre_core.sim.regime import describe, regime
    from tests.sim.test_simulator import HAND, rollout

    # Two rollouts of a 10-token prompt and 100 decoded tokens: 10 s each at the best
    # decode rate (64 sequences at 10/64 tok/s each), 110 tokens each to train at 22 tok/s.
    r = regime([rollout(0, 100), rollout(1, 100)], HAND)
    assert r["train_over_rollout"] == pytest.approx(10 / 20, abs=1e-4)
    assert r["balanced_train_units"] == pytest.approx(2 * 10 / 30, abs=0.01)
    assert (r["floor_train_units"], r["live_rollouts"], r["slots"]) == (1, 6, 128)
    capped = regime([rollout(0, 100), rollout(1, 100)], replace(HAND, max_concurrent=4))
    assert capped["live_rollouts"] == 4
    line = describe(regime([rollout(0, 100)] * 2, replace(HAND, burst_steps=2, streaming=1)))
    assert "bursts of 2 steps" in line and "streaming steps" in line
