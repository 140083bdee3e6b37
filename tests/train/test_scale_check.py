"""benchmarks/scale_check.py on the tiny shape: 2 units x 2 gloo processes train one step,
and the figures its ``--json`` writes are the model's and the run's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.gpu_suite_common import model_config
from benchmarks.scale_check import main
from gyre_core.models.model import build_model


def test_the_tiny_shape_trains_on_2_units_of_2_processes_and_reports_sane_figures(
    tmp_path: Path,
) -> None:
    out = tmp_path / "scale.json"
    args = ["--shape", "tiny", "--units", "2", "--per-unit", "2", "--steps", "1"]
    returned = main([*args, "--vocab", "512", "--json", str(out)])
    r = json.loads(out.read_text())
    assert r == json.loads(json.dumps(returned))
    params = sum(p.numel() for p in build_model(model_config("tiny", 512)).parameters())
    assert r["parameters"] == params and r["world"] == 4
    assert r["full_state_bytes"] == 16 * params
    assert r["share_bytes"] == r["full_state_bytes"] // 2 < r["full_state_bytes"]
    b = r["batch"]
    assert b["rollouts"] == 12 and b["samples"] >= 4  # every process has a sample to train
    assert 0 < b["fresh_tokens"] < b["packed_tokens"]
    assert len(r["step_s"]) == len(r["loss"]) == 1 and r["step_s"][0] > 0
    assert math.isfinite(r["loss"][0]) and r["grad_norm"][0] > 0
    want = b["fresh_tokens"] / r["step_s"][0] / 4
    assert math.isclose(r["tokens_per_s_per_process"], want, rel_tol=1e-9)
    procs = r["processes"]
    assert [(p["rank"], p["unit"]) for p in procs] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    for p in procs:
        assert 0 < p["baseline_rss_bytes"] <= p["built_rss_bytes"] <= p["peak_rss_bytes"]
        # the tiny model may fit under the peak the imports left behind
        assert p["peak_increase_bytes"] == p["peak_rss_bytes"] - p["baseline_rss_bytes"] >= 0
        assert len(p["step_s"]) == 1 and 0 < p["step_s"][0] <= r["step_s"][0]


def test_recomputed_activations_train_the_same_step() -> None:
    args = ["--shape", "tiny", "--units", "1", "--per-unit", "2", "--steps", "1", "--vocab", "512"]
    plain, recomputed = main(args), main([*args, "--recompute"])
    assert not plain["recompute"] and recomputed["recompute"]
    assert recomputed["loss"][0] == pytest.approx(plain["loss"][0], rel=1e-6)
    assert recomputed["grad_norm"][0] == pytest.approx(plain["grad_norm"][0], rel=1e-5)
