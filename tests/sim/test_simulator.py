"""The simulator against hand-computed cases, and invariants on random traces."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_core import events as ev
from gyre_core.cluster import ROLLOUT, TRAIN, ClusterError
from gyre_core.scheduler.base import Decision, Snapshot, can_train
from gyre_core.scheduler.policies import Async, Colocate, Elastic, make_policy
from gyre_core.sim.costs import CostError, CostModel
from gyre_core.sim.simulator import Simulator
from gyre_core.sim.workload import TraceRollout, Turn, generate

# Two 1-GPU units; one sequence decodes at 10 tok/s, n together at 10/n each; prefill is
# free; training runs 22 tok/s per unit; a switch takes 5 s, a step 1 s of overhead.
HAND = CostModel(
    gpus=2, gpus_per_unit=1, gpus_per_node=1, decode_peak_tok_s=10.0, decode_half=0.0,
    prefill_tok_s=1e12, train_tok_s=22.0, switch_s=5.0, weight_sync_s=0.0, drain_s=3.0,
    rollouts_per_step=2, group_size=1, staleness=2, step_overhead_s=1.0,
)  # fmt: skip


def rollout(i: int, *completions: int, tool_s: float = 0.0, timeout_s: float = 1e9) -> TraceRollout:
    turns = tuple(Turn(10, c, tool_s) for c in completions)
    return TraceRollout(f"r{i}", f"t{i}", f"t{i}", turns, timeout_s)


def run(trace, policy, costs=HAND, mode="migrate", batch_order="arrival"):
    sink = ev.ListSink()
    out = Simulator(trace, costs, policy, mode=mode, batch_order=batch_order, sink=sink).run()
    return out, sink


def test_colocate_by_hand() -> None:
    # Each rollout alone on a unit: 100 tokens at 10 tok/s = 10 s. Switch both units to
    # training (5 s), train 2 x 110 tokens on 2 units at 22 tok/s = 5 s, plus 1 s.
    out, sink = run([rollout(0, 100), rollout(1, 100)], Colocate())
    assert out["makespan_s"] == pytest.approx(21.0, abs=2e-3)
    assert out["gpu_seconds_by_role"] == pytest.approx(
        {"rollout_busy": 20.0, "rollout_idle": 0.0, "train": 12.0, "switching": 10.0, "idle": 0.0},
        abs=2e-3,
    )
    assert out["tokens_trained"] == 220 and out["steps"] == 1
    changes = sink.of(ev.RoleChange)
    assert [(c.unit, c.from_role, c.to_role) for c in changes] == [
        (0, "idle", "rollout"), (1, "idle", "rollout"),  # every lane starts with an event
        (0, "rollout", "switching"), (1, "rollout", "switching"),
        (0, "switching", "train"), (1, "switching", "train"),
    ]  # fmt: skip


def test_each_direction_of_a_switch_takes_its_own_cost() -> None:
    # Colocate, two steps: rollouts 10 s; into training 2 s; train 5 s + 1 s; back to
    # rollout 7 s (a woken engine with its weights); rollouts 10 s; 2 s; 6 s.
    costs = replace(HAND, switch_to_train_s=2.0, switch_to_rollout_s=7.0)
    out, _ = run([rollout(i, 100) for i in range(4)], Colocate(), costs=costs)
    assert out["makespan_s"] == pytest.approx(10 + 2 + 6 + 7 + 10 + 2 + 6, abs=2e-3)
    assert out["gpu_seconds_by_role"]["switching"] == pytest.approx(2 * (2 + 7 + 2), abs=2e-3)
    # 0 takes switch_s (5 s each way), as tables without the two fields do
    assert costs.switch_to("rollout") == 7.0 and HAND.switch_to("rollout") == 5.0
    plain, _ = run([rollout(i, 100) for i in range(4)], Colocate())
    assert plain["makespan_s"] == pytest.approx(10 + 5 + 6 + 5 + 10 + 5 + 6, abs=2e-3)
    with pytest.raises(CostError, match="--switch-to-train-s"):
        replace(HAND, switch_to_train_s=-1.0)


def test_processor_sharing_by_hand() -> None:
    # Async 1:1: both rollouts share unit 0 at 5 tok/s each. The 50-token one ends at
    # 10 s; the other then runs alone at 10 tok/s for its last 50: ends at 15 s. Train
    # 60 + 110 tokens on one unit at 22 tok/s = 170/22 s, plus 1 s.
    out, _ = run([rollout(0, 50), rollout(1, 100)], Async(1, 1))
    assert out["makespan_s"] == pytest.approx(15.0 + 170 / 22 + 1.0, abs=2e-3)
    assert out["gpu_seconds_by_role"]["rollout_busy"] == pytest.approx(15.0, abs=2e-3)
    assert out["gpu_seconds_by_role"]["train"] == pytest.approx(out["makespan_s"], abs=2e-3)


def test_a_streaming_step_opens_on_the_first_group_by_hand() -> None:
    # As above, but the step opens at 10 s on r0 (60 tokens: done at 10 + 60/22 s) and
    # takes r1 when it ends at 15 s: 110/22 = 5 s more, plus 1 s of update.
    out, _ = run([rollout(0, 50), rollout(1, 100)], Async(1, 1), replace(HAND, streaming=1))
    assert out["makespan_s"] == pytest.approx(15.0 + 5.0 + 1.0, abs=2e-3)
    assert out["tokens_trained"] == 170 and out["steps"] == 1
    with pytest.raises(ValueError, match=r"--streaming 1 .* --batch-order arrival"):
        run([rollout(0, 50), rollout(1, 100)], Async(1, 1), replace(HAND, streaming=1),
            batch_order="index")  # fmt: skip
    with pytest.raises(CostError, match="--streaming"):
        replace(HAND, streaming=2)


class _LendWhileTraining:
    """Units 0 and 2 serve, unit 1 trains; while a step runs, an idle unit 2 moves to
    training (it joins the step in progress under streaming)."""

    name = "lend"

    def initial_roles(self, units: int) -> list[str]:
        return [ROLLOUT, TRAIN, ROLLOUT]

    def decide(self, s: Snapshot) -> Decision:
        move = s.training and s.roles[2] == ROLLOUT and s.loads[2] == 0
        return Decision(targets={2: TRAIN} if move else {}, admit=s.admissible,
                        start_step=can_train(s))  # fmt: skip


def test_a_unit_entering_training_joins_the_step_in_progress_by_hand() -> None:
    # r0 (50 tokens) on unit 0 ends at 5 s, r1 (20) on unit 2 at 2 s. The step opens at 2 s
    # on r1 (30 tokens). At 5 s it takes r0 (60/22 s of work: done at 7.727 s on one unit)
    # and the policy, deciding next, moves the idle unit 2 (2 s): in training at 7 s, it
    # joins, and the 0.727 s left take half that: the update (1 s) starts at 7.364 s.
    costs = replace(HAND, gpus=3, streaming=1, switch_s=2.0)
    out, _ = run([rollout(0, 50), rollout(1, 20)], _LendWhileTraining(), costs)
    assert out["makespan_s"] == pytest.approx(7.0 + (5 + 60 / 22 - 7) / 2 + 1.0, abs=2e-3)
    alone, _ = run([rollout(0, 50), rollout(1, 20)], Async(2, 1), costs)
    assert alone["makespan_s"] == pytest.approx(5 + 60 / 22 + 1.0, abs=2e-3)


def test_tool_time_and_turns_by_hand() -> None:
    # Two turns of 20 tokens (2 s each) with 3 s of tool time between: 7 s per rollout.
    out, sink = run([rollout(0, 20, 20, tool_s=3.0), rollout(1, 20, 20, tool_s=3.0)], Colocate())
    assert out["makespan_s"] == pytest.approx(
        7.0 + 5.0 + 2 * 60 / 44 + 1.0, abs=2e-3
    )  # 2 x (10+20) per rollout
    done = sink.of(ev.RolloutFinished)
    assert [(d.status, d.turns) for d in done] == [("completed", 2), ("completed", 2)]


def test_timeout_keeps_partial_progress() -> None:
    # r0 shares unit 0 with r1 at 5 tok/s for 2 s (10 tokens), then decodes alone at 10 tok/s
    # until its 40 s budget ends: 10 + 380 tokens decoded, then it is cut off.
    out, sink = run([rollout(0, 1000, timeout_s=40.0), rollout(1, 10)], Async(1, 1))
    done = {d.rollout_id: d for d in sink.of(ev.RolloutFinished)}
    assert done["r0"].status == "timeout" and out["timeouts"] == 1
    assert done["r0"].tokens == 10 + 390  # its prompt and what it decoded
    assert done["r1"].status == "completed"


def test_weight_versions_are_per_token() -> None:
    # B = 1, async 1:1. r0 (10 tokens) and r1 share unit 0 at 5 tok/s: r0 is done at 2 s
    # with r1 at 10 tokens. Step 1 trains r0's 20 tokens: 20/22 + 1 s. r1, alone, decodes
    # 19.09 more meanwhile: 29 tokens under v0, then 271 under v1 after the publish.
    costs = replace(HAND, rollouts_per_step=1)
    out, sink = run([rollout(0, 10), rollout(1, 300)], Async(1, 1), costs)
    fin = {d.rollout_id: d for d in sink.of(ev.RolloutFinished)}
    assert fin["r0"].versions == (0, 0) and fin["r1"].versions == (0, 1)
    # step 1 trains r0 (lag 0); step 2 trains r1: v0 tokens lag 2-1-0 = 1, v1 tokens 0.
    assert out["staleness_histogram"] == {"0": 10 + 271, "1": 29}
    assert out["tokens_masked"] == 0
    # Staleness 1, with r2 (10 tokens) admitted after step 1: it shares unit 0 with r1
    # and is trained by step 2; r1, trained by step 3, holds 29 tokens of v0 (lag 2:
    # masked), 29 of v1 (lag 1) and 242 of v2.
    three = [rollout(0, 10), rollout(1, 300), rollout(2, 10)]
    masked, _ = run(three, Async(1, 1), replace(costs, staleness=1))
    assert masked["staleness_histogram"] == {"0": 10 + 10 + 242, "1": 29, "2": 29}
    assert masked["tokens_masked"] == 29


def test_restart_mode_restarts_and_migrate_mode_does_not() -> None:
    # Elastic starting all-rollout, B = 1: r0 (short) and r2 share unit 0, r1 runs long on
    # unit 1. When r0 is done the lighter unit (1) drains for training; its long call
    # outlives the 3 s drain.
    costs = replace(HAND, rollouts_per_step=1)
    trace = [rollout(0, 10), rollout(1, 2000), rollout(2, 40)]
    migrate, sink = run(trace, Elastic(start_split=False), costs, "migrate")
    assert migrate["calls_migrated"] >= 1 and migrate["sessions_restarted"] == 0
    kept = [m.tokens_kept for m in sink.of(ev.CallMigrated)]
    assert kept and all(k > 0 for k in kept)
    restart, _ = run(trace, Elastic(start_split=False), costs, "restart")
    assert restart["sessions_restarted"] >= 1 and restart["tokens_discarded"] > 0
    assert restart["calls_migrated"] == 0
    assert restart["makespan_s"] > migrate["makespan_s"]


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ClusterError, match="at least one unit for rollout and one for training"):
        Simulator([rollout(0, 5)] * 2, replace(HAND, gpus=1), Colocate())
    with pytest.raises(CostError, match="--train-tok-s: must be > 0"):
        replace(HAND, train_tok_s=0.0)
    with pytest.raises(ValueError, match="fewer than one step"):
        Simulator([rollout(0, 5)], HAND, Colocate())
    with pytest.raises(ValueError, match="does not add up"):
        Simulator([rollout(0, 5), rollout(1, 5)], HAND, Async(2, 1))
    with pytest.raises(ValueError, match="--switch-mode"):
        Simulator([rollout(0, 5), rollout(1, 5)], HAND, Colocate(), mode="abort")


SMALL = CostModel(gpus=32, rollouts_per_step=16, max_seqs_per_unit=16, group_size=8)


@settings(max_examples=16, deadline=None)
@given(
    st.sampled_from(["xlong", "mixed", "uniform"]),
    st.integers(0, 10_000),
    st.sampled_from(["colocate", "async", "elastic"]),
    st.sampled_from(["migrate", "restart"]),
    st.sampled_from(["arrival", "index", "streaming"]),
)
def test_invariants(kind: str, seed: int, policy: str, mode: str, order: str) -> None:
    trace = generate(kind, 48, seed)  # type: ignore[arg-type]
    costs = replace(SMALL, drain_s=5.0, streaming=int(order == "streaming"))
    order = "index" if order == "index" else "arrival"
    out, sink = run(trace, make_policy(policy, costs.units), costs, mode, order)
    assert out["steps"] == 3
    total = costs.gpus * out["makespan_s"]  # makespan is rounded to ms
    assert sum(out["gpu_seconds_by_role"].values()) == pytest.approx(total, abs=costs.gpus * 1e-3)
    assert out["makespan_s"] >= out["run_bound_s"] * (1 - 1e-9)
    assert 0 < out["efficiency"] <= 1 and 0 < out["run_efficiency"] <= 1
    if mode == "migrate":
        assert out["sessions_restarted"] == 0 and out["tokens_discarded"] == 0
    lags = {int(k): v for k, v in out["staleness_histogram"].items()}
    assert out["tokens_masked"] == sum(v for k, v in lags.items() if k > costs.staleness)
    if policy == "colocate":
        assert set(lags) <= {0}  # on-policy
    # A unit holds one role at a time and changes it only through `switching`.
    initial = make_policy(policy, costs.units).initial_roles(costs.units)
    changes = sink.of(ev.RoleChange)
    opening = [(c.unit, c.from_role, c.to_role) for c in changes[: costs.units]]
    assert opening == [(u, "idle", r) for u, r in enumerate(initial)]  # each lane's start
    role = dict(enumerate(initial))
    for change in changes[costs.units :]:
        assert change.from_role == role[change.unit]
        assert "switching" in (change.from_role, change.to_role)
        role[change.unit] = change.to_role
    started = [e.rollout_id for e in sink.of(ev.RolloutStarted)]
    assert len(started) == len(set(started)) == len(trace)


def test_batch_order_index_trains_each_steps_own_rollouts_by_hand() -> None:
    # Async 1:1, steps of 2; all four admitted at once share unit 0 at 2.5 tok/s each.
    # r1-r3 finish at 4 s; r0 then decodes its last 90 tokens alone at 10 tok/s: 13 s.
    trace = [rollout(0, 100), rollout(1, 10), rollout(2, 10), rollout(3, 10)]
    sims = {
        order: Simulator(trace, HAND, Async(1, 1), batch_order=order)
        for order in ("arrival", "index")
    }
    out = {order: sim.run() for order, sim in sims.items()}
    # arrival: step 1 trains r1, r2 (2 x 20 tokens) at 4 s, step 2 r0 and r3 once r0 ends;
    # index: step 1 waits for r0 and trains r0, r1; step 2 trains r2, r3.
    assert sims["arrival"].stats.step_tokens == [40, 130]
    assert sims["index"].stats.step_tokens == [130, 40]
    assert out["arrival"]["makespan_s"] == pytest.approx(13.0 + 130 / 22 + 1.0, abs=2e-3)
    assert out["index"]["makespan_s"] == pytest.approx(13.0 + 170 / 22 + 2.0, abs=2e-3)
    with pytest.raises(ValueError, match="--batch-order"):
        Simulator(trace, HAND, Async(1, 1), batch_order="shortest")


def test_arrival_trains_whole_groups_and_index_is_unchanged() -> None:
    # The case above in groups of 2 ({r0, r1}, {r2, r3}): r1-r3 finish at 4 s, r0 at 13 s.
    # arrival no longer trains r1 with r2 (two halves, advantages 0): {r2, r3} first
    trace = [rollout(0, 100), rollout(1, 10), rollout(2, 10), rollout(3, 10)]
    costs = replace(HAND, group_size=2)
    sims = {
        order: Simulator(trace, costs, Async(1, 1), batch_order=order)
        for order in ("arrival", "index")
    }
    for sim in sims.values():
        sim.run()
    assert [sorted(b) for b in sims["arrival"].ready.batches] == [[2, 3], [0, 1]]
    assert [sorted(b) for b in sims["index"].ready.batches] == [[0, 1], [2, 3]]
    assert sims["arrival"].stats.groups_dropped_stale == 0


def test_a_group_past_the_staleness_bound_is_dropped_counted_and_replaced() -> None:
    # Bound 0, all four admitted at version 0 (admission 1 version ahead), all done at 4 s:
    # step 1 trains one group; the other's tokens are then all one version old: dropped,
    # and two new sessions (its trace rollouts again) fill step 2 at version 1.
    trace = [rollout(i, 10) for i in range(4)]
    costs = replace(HAND, group_size=2, staleness=0, admission_staleness=1)
    sink = ev.ListSink()
    sim = Simulator(trace, costs, Async(1, 1), sink=sink)
    out = sim.run()
    assert out["steps"] == 2 and sim.stats.groups_dropped_stale == 1
    assert [sorted(b) for b in sim.ready.batches] == [[0, 1], [4, 5]]
    assert [e.metrics["groups_dropped_stale"] for e in sink.of(ev.StepFinished)] == [0.0, 1.0]
    assert out["tokens_masked"] == 0  # no stale token was trained (nor masked)
    started = [e.rollout_id for e in sink.of(ev.RolloutStarted)]
    assert started[4:] == ["r2+0", "r3+1"]


@pytest.mark.parametrize("policy", [Colocate(), Async(3, 1), Elastic()], ids=lambda p: p.name)
def test_a_cap_on_running_rollouts_holds_for_every_policy(policy) -> None:  # type: ignore[no-untyped-def]
    costs = replace(CostModel(), gpus=32, rollouts_per_step=16, group_size=4)
    trace = generate("uniform", 64, 0, group_size=4)
    free, _ = run(trace, policy, costs=costs)
    capped, _ = run(trace, policy, costs=replace(costs, max_concurrent=6))
    assert free["peak_rollouts"] > 6 and capped["peak_rollouts"] == 6
    assert capped["steps"] == free["steps"] == 4 and capped["tokens_trained"] > 0
    assert capped["makespan_s"] > free["makespan_s"]  # fewer rollouts at once: longer


@pytest.mark.parametrize("policy", [Colocate(), Async(3, 1), Elastic()], ids=lambda p: p.name)
def test_boundary_dispatch_starts_a_burst_only_once_the_last_has_ended(policy) -> None:  # type: ignore[no-untyped-def]
    costs = replace(CostModel(), gpus=32, rollouts_per_step=16, group_size=4, burst_steps=2)
    trace = generate("mixed", 96, 2, group_size=4)
    out, sink = run(trace, policy, costs=costs)
    assert out["steps"] == 6 and out["peak_rollouts"] <= 32
    live, starts = 0, []  # the number running when each rollout starts
    for e in sink.events:
        if isinstance(e, ev.RolloutStarted):
            starts.append(live)
            live += 1
        elif isinstance(e, ev.RolloutFinished):
            live -= 1
    bursts = [n for n, k in enumerate(starts) if k == 0]
    assert bursts[:3] == [0, 32, 64]  # each burst starts on an empty cluster, 2 batches
    assert all(k > 0 for k in starts[1:32])  # within a burst nothing waits for it to drain
    cont, _ = run(trace, policy, costs=replace(costs, burst_steps=0))
    if policy.name != "colocate":  # continuous admission keeps more rollouts running
        assert cont["makespan_s"] < out["makespan_s"]


def test_admission_staleness_is_its_own_bound() -> None:
    """Rollouts admitted further ahead than the masking bound train their older tokens
    masked; the admission bound alone never masks."""
    costs = replace(CostModel(), gpus=32, rollouts_per_step=16, group_size=4, staleness=0)
    trace = generate("mixed", 64, 1, group_size=4)
    same, _ = run(trace, Async(3, 1), costs=costs)
    ahead, _ = run(trace, Async(3, 1), costs=replace(costs, admission_staleness=2))
    assert same["tokens_masked"] == 0 and same["peak_rollouts"] <= 16
    assert ahead["tokens_masked"] > 0 and ahead["peak_rollouts"] > 16
    with pytest.raises(CostError, match="--admission-staleness"):
        replace(costs, admission_staleness=-2)


def test_the_memory_model_sets_a_floor_of_training_units_and_an_offload_cost() -> None:
    """0.5 B parameters at 16 bytes (8 GB) on units holding 5 GB each: two training units
    at least; each GPU's 4 GB shard moves to or from host memory at 2 GB/s (2 s), on top
    of every switch."""
    mem = replace(HAND, params_b=0.5, gpu_mem_gb=10.0, train_mem_share=0.5, host_gbps=2.0)
    assert mem.train_state_gb == 8.0 and mem.min_train_units == 2 and mem.offload_s == 2.0
    assert mem.switch_to("train") == 7.0 and HAND.min_train_units == 1
    # colocate by hand (test_colocate_by_hand), each switch into training 2 s longer
    out, _ = run([rollout(0, 100), rollout(1, 100)], Colocate(), costs=mem)
    assert out["makespan_s"] == pytest.approx(23.0, abs=2e-3)
    with pytest.raises(CostError, match="needs 2 training units, and async trains on at most 1"):
        run([rollout(0, 100), rollout(1, 100)], Async(1, 1), costs=mem)
    with pytest.raises(CostError, match="--train-mem-share"):
        replace(mem, train_mem_share=0.0)


def test_no_step_trains_on_fewer_units_than_the_training_state_needs() -> None:
    costs = replace(CostModel(), gpus=64, rollouts_per_step=16, group_size=4, params_b=100.0)
    assert costs.min_train_units == 5  # 1,600 GB over units of 8 x 80 GB x 0.5
    trace = generate("uniform", 64, 0, group_size=4)
    for policy in (Colocate(), Async(3, 5), Elastic()):
        watched = Watched(policy)
        out, _ = run(trace, watched, costs=costs)
        assert out["steps"] == 4 and len(watched.starts) >= 4, policy.name
        assert min(watched.starts) >= 5, (policy.name, watched.starts)


class Watched:
    """A policy as it is, recording the training units in place at each step's start."""

    def __init__(self, policy) -> None:  # type: ignore[no-untyped-def]
        self.policy, self.name, self.starts = policy, policy.name, []

    def initial_roles(self, units: int) -> list[str]:
        return self.policy.initial_roles(units)  # type: ignore[no-any-return]

    def decide(self, s):  # type: ignore[no-untyped-def]
        d = self.policy.decide(s)
        if d.start_step:
            self.starts.append(sum(r == "train" for r in s.roles))
        return d


def test_the_seeds_preset_is_memory_bound() -> None:
    """configs/sim-seeds.json: holding the training state takes more than half the GPUs."""
    from pathlib import Path

    c = CostModel.load(Path(__file__).parents[2] / "configs" / "sim-seeds.json")
    assert (c.units, c.min_train_units) == (32, 18) and c.min_train_units / c.units > 0.5
    assert c.offload_s == pytest.approx(38_400 / (18 * 32) / 50)


def test_elastic_lending_the_trainer_beats_keeping_it_on_a_decode_heavy_run() -> None:
    """Half the units hold the training state (4 of 8); hour-long, decode-bound rollouts
    keep more sessions live than the other 4 engines hold. Lending the 4 between steps
    trains more tokens a second than keeping them (measured 4,060 against 3,425 tok/s)."""
    costs = CostModel(
        gpus=8, gpus_per_unit=1, gpus_per_node=8, max_seqs_per_unit=16, rollouts_per_step=32,
        group_size=8, staleness=4, max_concurrent=96, train_tok_s=20_000.0,
        prefill_tok_s=80_000.0, params_b=2.0, gpu_mem_gb=16.0, train_mem_share=0.5,
    )  # fmt: skip
    assert (costs.units, costs.min_train_units) == (8, 4)
    trace = generate("decode", 16 * 32, 0)
    lent = Simulator(trace, costs, Elastic()).run()
    kept = Simulator(trace, costs, Elastic(lend=False)).run()
    assert lent["steps"] == kept["steps"] == 16 and lent["timeouts"] == kept["timeouts"] == 0
    assert lent["goodput_tok_s"] > 1.1 * kept["goodput_tok_s"]
    assert lent["role_switches"] > kept["role_switches"]


def test_the_throughput_preset_pins_18_of_32_units_and_trains_near_35_percent_mfu() -> None:
    """docs/sim-costs.md: 2.4 T parameters at 16 bytes (38.4 TB) over units of 32 H200s
    holding half of 141 GB each: 18 units; 6 x 95 B active FLOPs a token at 19,400 tok/s
    per unit is ~35 % of 32 x 989 TFLOP/s."""
    from pathlib import Path

    c = CostModel.load(Path(__file__).parents[2] / "configs" / "sim-seeds-throughput.json")
    assert (c.units, c.min_train_units) == (32, 18)
    assert c.offload_s == pytest.approx(38_400 / (18 * 32) / 50)
    assert 6 * 95e9 * c.train_tok_s / (32 * 989e12) == pytest.approx(0.35, abs=0.005)
    assert c.rollouts_per_step == 2048 and c.staleness == 4 and c.max_concurrent == 6144
