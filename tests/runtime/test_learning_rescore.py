"""benchmarks/learning_bench.py --rescore: an earlier run's checkpoints scored again (greedy
and sampled) without training anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from gyre_core.config import RunConfig
from gyre_core.events import NullSink
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.train.checkpoint import save_checkpoint
from gyre_core.train.checkpoint_dirs import checkpoints

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "learning_bench.py"
CONFIG = {
    "model": {"hidden_size": 64, "layers": 1},
    "rollout": {"benchmark_tasks": 2, "max_turns": 3, "max_new_tokens": 8},
}


def _earlier_run(tmp_path: Path) -> Path:
    """What ``learning_bench.py --out`` leaves: a row naming a run folder beside its config,
    the run holding checkpoints at versions 1 and 2."""
    work = tmp_path / "learning" / "elastic"
    run = work / "run"
    work.mkdir(parents=True)
    cfg = RunConfig.from_dict(CONFIG)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    trainer = SessionFactory(cfg, make_model_dir(cfg, run), NullSink(), lambda: 0.0).make_trainer()
    for version in (1, 2):
        trainer.version = version
        save_checkpoint(run / "checkpoints", trainer)
    row = {"name": "elastic", "workdir": str(run), "benchmark_before": 0.0,
           "benchmark_after": 0.0, "steps": 2, "wall_s": 1.0, "benchmark_curve": {}}  # fmt: skip
    out = tmp_path / "runs.json"
    out.write_text(json.dumps([row]))
    return out


def _rescore(earlier: Path, out: Path, *args: str) -> list[dict]:  # type: ignore[type-arg]
    p = subprocess.run([sys.executable, str(SCRIPT), "--rescore", str(earlier), "--out", str(out),
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_rescore_scores_every_kth_checkpoint_greedy_or_sampled(tmp_path: Path) -> None:
    earlier = _earlier_run(tmp_path)
    greedy = _rescore(earlier, tmp_path / "g.json", "--every", "2")
    sampled = _rescore(earlier, tmp_path / "s.json", "--every", "2", "--bench-samples", "3")
    again = _rescore(earlier, tmp_path / "s2.json", "--every", "2", "--bench-samples", "3")
    for rows, samples in ((greedy, 0), (sampled, 3)):
        (row,) = rows
        assert row["name"] == "elastic" and list(row["benchmark_curve"]) == ["2"]  # not v1
        assert 0.0 <= row["benchmark_curve"]["2"] <= 1.0
        assert row["benchmark_scoring"] == {"every": 2, "tasks": 0, "samples": samples}
    assert again[0]["benchmark_curve"] == sampled[0]["benchmark_curve"]  # the same draws
    ckpts = tmp_path / "learning" / "elastic" / "run" / "checkpoints"
    assert [v for v, _ in checkpoints(ckpts)] == [1, 2]  # nothing trained, nothing saved


def test_rescore_refuses_what_it_cannot_score(tmp_path: Path) -> None:
    def fails(*args: str) -> str:
        p = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert p.returncode != 0
        return p.stderr

    assert "--every" in fails("--rescore", str(tmp_path / "x.json"), "--every", "0")
    assert "missing.json" in fails("--rescore", str(tmp_path / "missing.json"))
    assert "--bench-samples" in fails("--rescore", "x.json", "--bench-samples", "-1")
