"""Calibration: fitting the cost table on synthetic measurements, turning logged calls into a
trace, and (slow) a real run that writes a table and workload the simulator predicts from."""

import json
import math

import numpy as np
import pytest

from gyre_core.cli.main import main as gyre
from gyre_core.config import RunConfig
from gyre_core.events import ListSink
from gyre_core.runtime import run_job
from gyre_core.runtime.calibrate import (
    HALF_CAP,
    CalibrationError,
    CallSample,
    StepSample,
    concurrency,
    fit_calls,
    fit_training,
    predict,
    rollout_turns,
    sim_tokens,
)
from gyre_core.runtime.timed_router import CallRecord
from gyre_core.sim.costs import CostModel
from gyre_core.sim.workload import TraceRollout, parse_rollout, read_trace, rollout_to_json
from gyre_core.trajectory.format import Call, Prefix, Rollout
from tests.runtime.conftest import tiny_job


def _seconds(c: int, k: int, n: float, peak: float, half: float, prefill: float) -> float:
    """What the simulator charges: decode at peak / (n + half) per sequence, prefill shared."""
    return c * (n + half) / peak + k * n / prefill


def test_fit_recovers_the_decode_curve_and_prefill_rate():
    rng = np.random.default_rng(0)
    peak, half, prefill = 900.0, 6.0, 20_000.0
    samples = []
    for _ in range(200):
        n = float(rng.uniform(1, 12))
        c, k = int(rng.integers(1, 64)), int(rng.integers(10, 400))
        noise = 1 + 0.02 * rng.standard_normal()
        samples.append(CallSample(_seconds(c, k, n, peak, half, prefill) * noise, c, k, n))
    fit = fit_calls(samples)
    assert fit.decode_peak_tok_s == pytest.approx(peak, rel=0.05)
    assert fit.decode_half == pytest.approx(half, rel=0.1)
    assert fit.prefill_tok_s == pytest.approx(prefill, rel=0.1)
    assert fit.calls == 200 and fit.rmse_s < 0.05 * fit.mean_s
    costs = CostModel(decode_peak_tok_s=fit.decode_peak_tok_s, decode_half=fit.decode_half)
    assert costs.seq_rate(1) == pytest.approx(peak / (1 + half), rel=0.05)


def test_a_rate_flat_in_the_batch_caps_half_and_free_prefill_is_capped():
    # Every sequence decodes at 200 tok/s whatever the batch; prompts cost nothing.
    samples = [CallSample(c / 200.0, c, 50, n) for c in (8, 16, 32) for n in (1.0, 2.0, 4.0)]
    fit = fit_calls(samples)
    assert fit.decode_half == HALF_CAP
    assert fit.decode_peak_tok_s / (1 + fit.decode_half) == pytest.approx(200.0, rel=1e-3)
    assert fit.prefill_tok_s >= 1e8 and fit.rmse_s < 1e-9


def test_fit_needs_calls():
    with pytest.raises(CalibrationError):
        fit_calls([CallSample(0.1, 8, 8, 1.0)])


def test_concurrency_is_the_time_weighted_count_on_the_same_engine():
    recs = [
        CallRecord("r0/c0", "unit-0", 0.0, 2.0, 10, 4),
        CallRecord("r1/c0", "unit-0", 1.0, 2.0, 10, 4),  # overlaps the first half of its life
        CallRecord("r2/c0", "unit-1", 0.0, 2.0, 10, 4),  # another engine: alone
    ]
    assert concurrency(recs) == pytest.approx([1.5, 2.0, 1.0])


def test_the_concurrency_sweep_matches_the_pairwise_overlaps():
    rng = np.random.default_rng(1)
    recs = []
    for i in range(200):
        a, d = float(rng.uniform(0, 20)), float(rng.uniform(0.01, 2))
        recs.append(CallRecord(f"r{i}/c0", f"unit-{i % 3}", a, a + d, 1, 1))
    got = concurrency(recs)
    for r, n in zip(recs, got, strict=True):
        same = [q for q in recs if q.engine == r.engine]
        overlap = sum(max(0.0, min(r.t1, q.t1) - max(r.t0, q.t0)) for q in same)
        assert n == pytest.approx(overlap / (r.t1 - r.t0), rel=1e-9)


def test_training_rate_is_per_unit_and_the_rest_of_the_span_is_overhead():
    steps = [StepSample(0.0, 3.0, 2.0, 2, 8_000), StepSample(5.0, 7.5, 1.5, 4, 12_000)]
    rate, overhead = fit_training(steps)
    assert rate == pytest.approx(20_000 / (2.0 * 2 + 1.5 * 4))
    assert overhead == pytest.approx((1.0 + 1.0) / 2)
    with pytest.raises(CalibrationError):
        fit_training([])


def _call(cid, prompt, completion, prefix=None):
    return Call(cid, np.asarray(prompt, dtype=np.int64), np.asarray(completion, dtype=np.int64),
                np.zeros(len(completion)), np.zeros(len(completion), dtype=np.int64),
                prefix=prefix)  # fmt: skip


def test_calls_become_turns_with_appended_prompts_tool_gaps_and_compaction():
    calls = [
        _call("c0", range(10), [1, 2, 3]),  # full sequence: 13 tokens
        _call("c1", [7, 7], [4, 4], Prefix("c0", 13)),  # continues: 2 appended
        _call("c2", [9], [5], Prefix("c1", 17)),  # a compaction call: 1 appended
        _call("c3", [6, 6, 6], [8], Prefix("c0", 10)),  # restarts from the root (10 tokens)
    ]
    rollout = Rollout("r3", "t", "completed", 0.5, calls, "g")
    recs = {f"r3/c{i}": CallRecord(f"r3/c{i}", "unit-0", 1.0 * i, 1.0 * i + 0.75, 0, 0)
            for i in range(4)}  # fmt: skip
    turns = rollout_turns(rollout, recs)
    assert [(t.prompt_tokens, t.completion_tokens) for t in turns] == [(10, 3), (2, 2), (1, 1),
                                                                       (3, 1)]  # fmt: skip
    assert [t.tool_s for t in turns] == [0.25, 0.25, 0.25, 0.0]
    assert [t.compact_to for t in turns] == [None, None, 10, None]
    assert sim_tokens(turns) == 13 + 4 + 2 + 10 + 4
    # the trace reader accepts it (compact_to within the context, first prompt >= 1)
    tr = TraceRollout("r3", "t", "g", turns, 600.0)
    assert parse_rollout(rollout_to_json(tr)).turns == turns


def test_predict_names_what_is_missing_and_why_a_run_was_not_calibrated(tmp_path, capsys):
    with pytest.raises(CalibrationError, match=r"calibration\.json: missing"):
        predict(tmp_path)
    (tmp_path / "calibration.json").write_text(json.dumps({"error": "no training step"}))
    with pytest.raises(CalibrationError, match="not calibrated: no training step"):
        predict(tmp_path)
    assert gyre(["sim", "predict", str(tmp_path)]) == 2  # one line, no traceback
    assert "no training step" in capsys.readouterr().err


def test_predict_simulates_the_run_s_own_scheduler_section(tmp_path):
    """A report carries the run's scheduler section, elastic knobs included; one written
    before it did keeps its async split."""
    from gyre_core.sim.workload import generate, write_trace

    (tmp_path / "costs.json").write_text(json.dumps(CostModel(gpus=32).to_json()))
    write_trace(tmp_path / "workload.jsonl", generate("uniform", 128, 1, group_size=8))

    def predicted(report: dict) -> float:
        (tmp_path / "calibration.json").write_text(json.dumps({"actual_s": 1.0, **report}))
        return predict(tmp_path)["predicted_s"]

    base = {"policy": "elastic", "scheduler": {"policy": "elastic"}}
    # (a sparser fill: with whole groups a fuller one gives this small trace the same schedule)
    sparser = {**base, "scheduler": {"policy": "elastic", "elastic_fill": 0.05}}
    assert predicted(sparser) != predicted(base)
    old = predicted({"policy": "async", "split": "1:3"})
    assert old == predicted({"policy": "async", "scheduler": {"rollout_units": 1}})
    assert old != predicted({"policy": "async", "split": "2:2"})


# --------------------------------------------------------------------------- a real run

BASE = tiny_job("async")


@pytest.mark.slow
def test_a_real_run_writes_a_cost_table_and_workload_that_predict_reads(
    ray_cluster, tmp_path, capsys
):
    from gyre_core.runtime.session import make_model_dir

    model = make_model_dir(RunConfig.from_dict(BASE), tmp_path / "m")
    cfg = RunConfig.from_dict({**BASE, "model": {"checkpoint": str(model)}})
    out = run_job(cfg, sink=ListSink(), workdir=tmp_path / "run")
    assert out["status"] == "succeeded" and out["steps"] == 2
    work = tmp_path / "run"
    costs = CostModel.load(work / "costs.json")
    assert costs.units == 4 and costs.rollouts_per_step == 2 and costs.group_size == 2
    assert costs.max_seqs_per_unit >= 1 and costs.train_tok_s > 0 and costs.switch_s >= 0
    trace = read_trace(work / "workload.jsonl")
    assert [r.rollout_id for r in trace] == ["r0", "r1", "r2", "r3"]  # admission order
    assert all(len(r.turns) >= 1 for r in trace)
    report = json.loads((work / "calibration.json").read_text())
    assert report["policy"] == "async" and report["split"] == "2:2" and report["actual_s"] > 0
    assert len(report["steps"]) == 2 and report["decode_fit"]["calls"] >= 3
    # async's 2 training units joined the group at bring-up: its re-form was timed
    assert report["switch_parts_s"]["reform_s"] > 0 and "engine_stop_s" in report["switch_parts_s"]
    # each direction's cost, without the drain wait: async only ever switched into train
    by_role = report["switch_parts_by_role_s"]
    assert by_role["rollout"] == {} and by_role["train"]["reform_s"] > 0
    assert 0 < costs.switch_to_train_s <= costs.switch_s and costs.switch_to_rollout_s == 0
    assert costs.switch_to("rollout") == costs.switch_s  # unmeasured: the mean stands in
    pred = predict(work)
    assert math.isfinite(pred["predicted_s"]) and pred["predicted_s"] > 0
    assert pred["steps"] == 2 and pred["rollouts"] == 4
    assert gyre(["sim", "predict", str(work), "--json"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["predicted_s"] == pred["predicted_s"] and line["actual_s"] == report["actual_s"]
