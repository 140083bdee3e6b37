"""The real run's plan: the values the driver and the loop take from a config, cut once;
the trainer's part of it (``gyre_core.train`` never imports the run config); an engine told
its published version through its own method; the tiny model's heads computed once."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from gyre_core.config import ConfigError, RunConfig
from gyre_core.models.shape import tiny_heads
from gyre_core.runtime.loop import Loop
from gyre_core.runtime.plan import RunPlan, train_setup
from gyre_core.runtime.ray_backend import UnitEngine

ROOT = Path(__file__).resolve().parents[2]


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_plan_holds_the_values_the_driver_and_the_loop_take() -> None:
    cfg = RunConfig.from_dict(
        {
            "steps": 3,
            "seed": 5,
            "cluster": {"units": 3},
            "rollout": {"tasks_per_step": 2, "group_size": 4},
            "scheduler": {
                "staleness_bound": 1,
                "admission_staleness": 2,
                "max_concurrent_rollouts": 7,
                "drain_deadline_s": 1.5,
                "policy": "elastic",
            },
            "warm_start": {"steps": 2},
        }
    )
    plan = RunPlan.of(cfg)
    assert (plan.steps, plan.per_step, plan.total, plan.units) == (3, 8, 24, 3)
    assert (plan.staleness, plan.admit_staleness, plan.max_active) == (1, 2, 7)
    assert plan.drain_s == 1.5 and plan.policy == "elastic" and plan.warm_start
    assert plan.batch_order == cfg.scheduler.batch_order
    assert plan.switch_mode == cfg.scheduler.switch_mode
    assert plan.train == train_setup(cfg)
    assert (plan.train.train, plan.train.staleness_bound, plan.train.seed) == (cfg.train, 1, 5)
    assert not RunPlan.of(RunConfig()).warm_start
    with pytest.raises(AttributeError):  # frozen: made once
        plan.steps = 4  # type: ignore[misc]


def test_train_takes_its_section_not_the_run_config() -> None:
    for path in sorted((ROOT / "gyre_core" / "train").glob("*.py")):
        bad = {
            m
            for m in _imported(path)
            if m == "gyre_core.config" or m.startswith("gyre_core.config.")
        }
        assert not bad, f"{path.name} imports the run config: {sorted(bad)}"


def test_the_loop_takes_the_plan_and_reads_no_config() -> None:
    assert "gyre_core.config" not in _imported(ROOT / "gyre_core" / "runtime" / "loop.py")
    params = list(inspect.signature(Loop.__init__).parameters)[1:]
    assert params[0] == "plan" and "run_config" not in params and len(params) <= 10


def test_an_engine_is_told_its_published_version() -> None:
    engine = UnitEngine(actor=None, version=2)
    engine.published(5)
    assert engine.version == 5


def test_the_tiny_models_heads_are_one_rule() -> None:
    assert [tiny_heads(h) for h in (32, 63, 96, 256)] == [1, 1, 3, 8]
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"model": {"hidden_size": 96, "kv_heads": 2}})
    assert err.value.errors == [
        (
            "model.kv_heads",
            "must divide the tiny model's query heads (model.hidden_size // 32 = 3), got 2",
        )
    ]
    RunConfig.from_dict({"model": {"hidden_size": 96, "kv_heads": 3}})
