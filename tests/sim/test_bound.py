"""The makespan lower bound by hand, and the router's load-balance fallback."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gyre_core.scheduler.policies import Async, Colocate, Elastic
from gyre_core.sim.bound import (
    admission_path,
    critical_path,
    lower_bound,
    reached,
    rollout_path,
    step_time,
    trace_bound,
)
from gyre_core.sim.costs import CostError, CostModel
from gyre_core.sim.ps_queue import Call
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import KINDS, TraceRollout, Turn, generate

# One sequence decodes at 10 tok/s; prefill free; a step costs 1 s of overhead.
COSTS = CostModel(
    gpus=2, gpus_per_unit=1, gpus_per_node=1, decode_peak_tok_s=10.0, decode_half=0.0,
    prefill_tok_s=1e12, train_tok_s=1e9, switch_s=0.0, weight_sync_s=0.0, drain_s=0.0,
    rollouts_per_step=1, group_size=1, staleness=0, step_overhead_s=1.0,
)  # fmt: skip


def rollout(i: int, tokens: int, tool_s: float = 0.0, timeout_s: float = 1e9) -> TraceRollout:
    turns = (Turn(1, tokens, tool_s), Turn(1, 0, 0.0))
    return TraceRollout(f"r{i}", f"t{i}", f"t{i}", turns, timeout_s)


def test_rollout_path_is_calls_back_to_back_plus_tools_capped_by_the_timeout() -> None:
    assert rollout_path(rollout(0, 100, tool_s=7.0), COSTS) == pytest.approx(17.0)
    assert rollout_path(rollout(0, 100, tool_s=7.0, timeout_s=12.0), COSTS) == 12.0


def test_admission_path_by_hand() -> None:
    # Staleness 0, one rollout a step: rollout i may start only once version i is out.
    # Paths 10, 20, 5 s: P1 = 10 + 1 = 11; P2 = 11 + 20 + 1 = 32; P3 = 32 + 5 + 1 = 38.
    trace = [rollout(0, 100), rollout(1, 200), rollout(2, 50)]
    assert admission_path(trace, COSTS) == pytest.approx(38.0)
    assert critical_path(trace, COSTS) == pytest.approx(21.0)  # the longest alone + 1 s
    # Staleness 2: all three may start at once; the k-th step waits for the k-th finish
    # (5, 10, 20 s) and for the step before: 6, 11, 21.
    assert admission_path(trace, replace(COSTS, staleness=2)) == pytest.approx(21.0)
    # Two rollouts a step, staleness 0: both start at 0, step 1 at max(10, 20) + 1 = 21;
    # the third is left over (no second step), so it does not count.
    assert admission_path(trace, replace(COSTS, rollouts_per_step=2)) == pytest.approx(21.0)


def test_the_policy_independent_bound_by_hand() -> None:
    # Units of one sequence at 10 tok/s; prompts prefill at 2 tok/s, training at 5 tok/s.
    costs = replace(COSTS, max_seqs_per_unit=1, prefill_tok_s=2.0, train_tok_s=5.0, staleness=2)
    trace = [rollout(0, 100), rollout(1, 200), rollout(2, 50)]
    got = trace_bound(trace, costs)
    # work: 350 decoded at 10, 6 prefilled at 2, 356 trained at 5, 3 steps of 1 s on one
    # unit: 112.2 unit-seconds over 2 units
    assert got["work_s"] == pytest.approx(56.1) and got["bound_s"] == got["work_s"]
    assert got["tokens"] == 356
    # the longest path, 0.5 + 20 + 0.5 s, then the smallest step: 1 + 52 / (5 * 2) s
    assert got["path_s"] == pytest.approx(21.0 + 6.2)
    # all three start at once (staleness 2); finishes 6, 11, 21 s, steps of 6.2 s
    assert got["admission_s"] == pytest.approx(27.2)
    # windows: the third rollout may start only after version 1; its 6 unit-seconds (50
    # decoded at 10 tok/s, 2 prefilled at 2) and steps 1 and 2 (11.4 unit-seconds each:
    # 52 tokens at 5 tok/s, 1 s of overhead) on 2 units, then its step: 14.4 + 6.2
    assert got["windows_s"] == pytest.approx(20.6)
    # a rollout whose timeout cuts its path in half counts for half its tokens
    half = trace_bound([rollout(1, 200, timeout_s=10.5)], costs)
    assert half["tokens"] == 101
    # a prompt counts from its turn's start: 20 prompt tokens prefill for 10 s, then 50
    # of the 100 decode before the 15 s timeout (15 unit-seconds in all)
    late = TraceRollout("p", "t", "t", (Turn(20, 100, 0.0), Turn(1, 0, 0.0)), 15.0)
    assert reached(late, costs) == (70, pytest.approx(15.0))
    # every policy's makespan and goodput stay within it
    for policy in (Async(1, 1), Elastic(), Colocate()):
        out = Simulator(trace, costs, policy).run()
        assert out["makespan_s"] >= got["bound_s"] - 1e-6, policy.name
        assert out["goodput_tok_s"] <= got["tokens"] / got["bound_s"] + 1e-6, policy.name


def test_each_step_takes_at_least_its_tokens_on_every_unit() -> None:
    # Training at 10 tok/s a unit on 2 units: a step of 20 tokens takes 1 + 20 / 20 = 2 s,
    # one of 40 takes 3 s. Paths 10, 20, 5 s at staleness 0: P1 = 10 + 2 = 12;
    # P2 = 12 + 20 + 3 = 35; P3 = 35 + 5 + 1 = 41.
    slow = replace(COSTS, train_tok_s=10.0)
    assert step_time(40, slow) == pytest.approx(3.0)
    trace = [rollout(0, 100), rollout(1, 200), rollout(2, 50)]
    assert admission_path(trace, slow, [20, 40, 0]) == pytest.approx(41.0)
    # The longest rollout, then at least the last step: 20 + 1 (the last trains nothing).
    assert critical_path(trace, slow, [20, 40, 0]) == pytest.approx(21.0)
    assert critical_path(trace, slow, [20, 40, 60]) == pytest.approx(24.0)
    # Steps' tokens only ever add to the bound, and it still holds for every policy.
    for policy in (Async(1, 1), Elastic(), Colocate()):
        out = Simulator(trace, slow, policy).run()
        assert out["makespan_s"] >= out["run_bound_s"] - 1e-6, policy.name
        assert out["run_bound_s"] > admission_path(trace, slow), policy.name


def test_the_bound_holds_and_is_tight_when_the_rule_binds() -> None:
    trace = [rollout(0, 100), rollout(1, 200), rollout(2, 50)]
    for policy in (Async(1, 1), Elastic(), Colocate()):
        out = Simulator(trace, COSTS, policy).run()
        assert out["makespan_s"] >= out["lower_bound_s"] - 1e-6
    out = Simulator(trace, COSTS, Async(1, 1)).run()
    assert out["lower_bound_s"] == pytest.approx(38.0)
    assert out["efficiency"] == pytest.approx(1.0, abs=1e-3)  # one at a time, as the rule says


@pytest.mark.parametrize("kind", KINDS)
def test_the_bound_holds_on_every_workload_and_policy(kind: str) -> None:
    costs = CostModel(gpus=32, rollouts_per_step=16, group_size=8)
    trace = generate(kind, 48, 3)
    bound = lower_bound(trace, costs, decoded=0, prefilled=0, step_tokens=[])
    assert bound == pytest.approx(max(critical_path(trace, costs), admission_path(trace, costs)))
    for policy in (Colocate(), Async(2, 2), Elastic()):
        out = Simulator(trace, costs, policy).run()
        assert out["makespan_s"] >= out["lower_bound_s"] * (1 - 1e-9), policy.name


def test_a_crowded_engine_sheds_sessions_to_the_least_loaded_one() -> None:
    costs = CostModel(
        gpus=3, gpus_per_unit=1, gpus_per_node=1, max_seqs_per_unit=8, rollouts_per_step=8,
        group_size=8, balance_abs=2, balance_rel=1.5,
    )  # fmt: skip
    turns = (Turn(1, 50, 1.0),)
    trace = [TraceRollout(f"r{i}", "t", "t", turns, 1e9) for i in range(8)]
    sim = Simulator(trace, costs, Async(2, 1))
    e0, e1 = sim.engines[0], sim.engines[1]
    e0.active = {i: Call(i, 10, 0.0) for i in range(5)}
    assert sim.router.crowded(e0)  # 5 calls against 0: more than 2 above, more than 1.5x
    e1.active = {10 + i: Call(10 + i, 10, 0.0) for i in range(3)}
    assert not sim.router.crowded(e0)  # 5 against 3: only 2 above
    e1.active = {10: Call(10, 10, 0.0), 11: Call(11, 10, 0.0)}
    assert sim.router.crowded(e0)  # 5 against 2
    sticky = Simulator(trace, replace(costs, balance_abs=0), Async(2, 1))
    sticky.engines[0].active = dict(e0.active)
    assert not sticky.router.crowded(sticky.engines[0])  # 0 turns the fallback off
    # A session whose prefix cache is on the crowded engine is routed to engine 1 and
    # prefills its whole context there.
    sim.admit()
    session = sim.sessions[0]
    sim.router.set_unit(session, 0)
    session.context = 400
    sim.router.route(session, Call(0, 50, 0.0), fresh=1)
    assert session.unit == 1 and sim.stats.tokens_prefilled == 400


def test_router_options_are_checked() -> None:
    with pytest.raises(CostError, match="--balance-rel"):
        CostModel(balance_rel=0.5)
    with pytest.raises(CostError, match="--balance-abs"):
        CostModel(balance_abs=-1)
