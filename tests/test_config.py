import json

import pytest
import yaml

from gyre_core.config import ConfigError, RunConfig, config_schema, dump_config, load_config
from tests.gyre_cli import gyre


def test_every_bad_field_is_reported_by_path() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(
            {"steps": 0, "scheduler": {"policy": "x", "bogus": 1}, "rollout": 3, "seed": True}
        )
    paths = dict(err.value.errors)
    assert set(paths) == {"steps", "scheduler.policy", "scheduler.bogus", "rollout", "seed"}
    assert "colocate, async, elastic" in paths["scheduler.policy"]


def test_cross_field_rules() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"scheduler": {"policy": "elastic", "rollout_units": 2}})
    assert err.value.errors[0][0] == "scheduler.rollout_units"
    cfg = RunConfig.from_dict({"scheduler": {"policy": "async", "rollout_units": 2}})
    assert cfg.policy == "async" and cfg.scheduler.rollout_units == 2


@pytest.mark.parametrize(
    ("changes", "path", "problem"),
    [
        ({"model": {"hidden_size": 128, "kv_heads": 3}}, "model.kv_heads", "hidden_size // 32 = 4"),
        ({"model": {"hidden_size": 64, "kv_heads": 4}}, "model.kv_heads", "got 4"),
        (
            {
                "rollout": {"suite": "coding"},
                "warm_start": {"steps": 5, "skip_check": 0.5},
            },
            "warm_start.skip_check",
            "needs rollout.suite repo",
        ),
        ({"backend": "sim", "sim": {"gpus": 12}}, "sim.gpus", "a multiple of 8"),
        ({"backend": "sim", "sim": {"gpus": 8}}, "sim.gpus", "at least 16, got 8"),
        ({"backend": "sim", "rollout": {"group_size": 5}}, "sim.rollouts_per_step", "(5), got 64"),
        (
            {
                "backend": "sim",
                "scheduler": {"policy": "async", "rollout_units": 2},
                "sim": {"gpus": 16},
            },
            "scheduler.rollout_units",
            "leave >= 1 of 2 units",
        ),
    ],
)
def test_rules_the_runtime_needs_are_refused_by_field(changes, path, problem) -> None:
    """Each of these failed only inside the runtime (building the model, playing the
    hasty demonstrator, cutting the simulated cluster into units), minutes after queueing."""
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(changes)
    errors = dict(err.value.errors)
    assert list(errors) == [path] and problem in errors[path], errors


def test_rules_hold_only_where_they_apply() -> None:
    # A given checkpoint has its own heads; a warm start from a file plays no demonstrator;
    # a real run's units are cluster.units, whatever the sim section says.
    RunConfig.from_dict({"model": {"checkpoint": "/m", "kv_heads": 3}})
    RunConfig.from_dict(
        {
            "rollout": {"suite": "coding"},
            "warm_start": {"steps": 5, "skip_check": 0.5, "weights": "/w.safetensors"},
        }
    )
    RunConfig.from_dict({"sim": {"gpus": 12}, "rollout": {"group_size": 5}})
    cfg = RunConfig.from_dict(
        {"backend": "sim", "scheduler": {"policy": "async", "rollout_units": 7}}
    )
    assert cfg.scheduler.rollout_units == 7  # the simulated 64 GPUs are 8 units, not 6


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".toml"])
def test_files_in_three_formats_merge_over_defaults(tmp_path, suffix) -> None:
    text = {
        ".yaml": "steps: 3\nscheduler:\n  policy: async\n",
        ".json": json.dumps({"steps": 3, "scheduler": {"policy": "async"}}),
        ".toml": "steps = 3\n[scheduler]\npolicy = 'async'\n",
    }[suffix]
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    cfg = load_config(path)
    assert (cfg.steps, cfg.policy, cfg.rollout.group_size) == (3, "async", 4)


def test_show_round_trips_and_schema_covers_every_field(tmp_path) -> None:
    path = tmp_path / "default.yaml"
    path.write_text(dump_config(RunConfig()))
    assert load_config(path) == RunConfig()
    schema = config_schema()
    assert schema["scheduler.policy"]["choices"] == ["colocate", "async", "elastic"]
    assert schema["steps"]["default"] == RunConfig().steps and "help" in schema["steps"]


def test_cli_validate_names_each_bad_field(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: -1\nscheduler: {policy: fast}\ntrain: {lr: 0}\n")
    out = gyre("config", "validate", str(bad))
    assert out.returncode == 2
    assert "steps: must be >= 1" in out.stderr and "scheduler.policy" in out.stderr
    assert "train.lr: must be > 0.0, got 0.0" in out.stderr  # the trainer refuses 0 too
    good = tmp_path / "good.yaml"
    good.write_text(gyre("config", "show").stdout)
    ok = gyre("config", "validate", str(good))
    assert ok.returncode == 0 and "policy elastic" in ok.stdout


def test_the_dashboard_bundles_the_current_schema() -> None:
    """The launch form falls back to a copy of the schema bundled at build time; it must
    be the schema of this code (regenerate: json.dumps(config_schema(), indent=1))."""
    import json
    from pathlib import Path

    from gyre_core.config import config_schema

    bundled = Path(__file__).resolve().parents[1] / "frontend/src/lib/schema.snapshot.json"
    assert json.loads(bundled.read_text()) == json.loads(json.dumps(config_schema()))


@pytest.mark.parametrize(
    ("changes", "path", "problem"),
    [
        ({"steps": 2**31}, "steps", "must be <= 1000000"),
        ({"seed": 2**63}, "seed", "must be <= 2147483647"),
        ({"seed": -1}, "seed", "must be >= 0"),
        ({"cluster": {"units": 10**6}}, "cluster.units", "must be <= 4096"),
        ({"cluster": {"units": float("inf")}}, "cluster.units", "expected an integer"),
        ({"rollout": {"max_turns": 10**40}}, "rollout.max_turns", "an integer of 41 digits"),
        ({"sim": {"speed": float("inf")}}, "sim.speed", "expected a finite number, got inf"),
        ({"sim": {"speed": float("nan")}}, "sim.speed", "expected a finite number, got nan"),
        ({"sim": {"speed": 1e300}}, "sim.speed", "must be <= 1000000000000.0"),
        ({"sim": {"speed": 10**400}}, "sim.speed", "must be at most 1e+12 in size"),
        ({"train": {"lr": float("inf")}}, "train.lr", "expected a finite number"),
        ({"name": "n" * 2**20}, "name", "longer than 200 characters (1048576)"),
        ({"name": "a\x00b"}, "name", "contains the control character '\\x00'"),
        ({"model": {"checkpoint": "/x" * 300}}, "model.checkpoint", "longer than 500"),
        ({"model": {"checkpoint": "a\nb"}}, "model.checkpoint", "control character"),
        ({"scheduler": {"policy": "x" * 10**6}}, "scheduler.policy", "got 'xxxxxxxx"),
    ],
)
def test_every_number_and_string_is_bounded_by_its_type(changes, path, problem) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(changes)
    errors = dict(err.value.errors)
    assert list(errors) == [path] and problem in errors[path], errors
    assert len(errors[path]) < 200  # a huge value is never echoed whole


def test_the_schema_states_every_bound() -> None:
    schema = config_schema()
    for path, entry in schema.items():
        if entry["type"] in ("int", "float"):
            assert "max" in entry and ("min" in entry or "above" in entry), path
        if entry["type"] == "str" and "choices" not in entry:
            assert entry["max_length"] <= 500, path
    assert schema["cluster.units"]["max"] == 4096 and schema["seed"]["max"] == 2**31 - 1
    assert RunConfig.from_dict({"seed": 2**31 - 1, "name": "n" * 200}).seed == 2**31 - 1


def test_a_files_relative_paths_are_made_absolute_where_it_is_read(tmp_path, monkeypatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("warm_start:\n  weights: w/seed0.safetensors\n  cache: /abs/cache\n")
    cfg = load_config(path, base=tmp_path / "repo")
    assert cfg.warm_start.weights == str(tmp_path / "repo" / "w" / "seed0.safetensors")
    assert cfg.warm_start.cache == "/abs/cache" and cfg.model.checkpoint == ""
    monkeypatch.chdir(tmp_path)
    assert load_config(path).warm_start.weights == str(tmp_path / "w" / "seed0.safetensors")
    assert config_schema()["warm_start.weights"]["path"] is True


def test_the_old_warm_start_keys_are_refused_with_their_new_name(tmp_path) -> None:
    from gyre_core.train.warm_start_config import MOVED

    assert len(MOVED) == 13 and MOVED["train.warm_start_from"] == "warm_start.weights"
    for old, new in MOVED.items():
        with pytest.raises(ConfigError) as err:
            RunConfig.from_dict({"train": {old.split(".")[1]: 0, "lr": 1e-3}})
        assert err.value.errors == [(old, f"moved to {new}")]
        section, field = new.split(".")
        assert hasattr(getattr(RunConfig(), section), field)  # the new name exists
    bad = tmp_path / "old.yaml"
    bad.write_text("train:\n  warm_start_steps: 5\n  warm_start_from: w.safetensors\n")
    out = gyre("config", "validate", str(bad))
    assert out.returncode != 0
    assert "train.warm_start_steps: moved to warm_start.steps" in out.stderr
    assert "train.warm_start_from: moved to warm_start.weights" in out.stderr


def test_config_show_lists_the_loss_with_its_choices() -> None:
    out = gyre("config", "show", "--format", "schema")
    assert out.returncode == 0
    loss = json.loads(out.stdout)["train.loss"]
    assert loss["choices"] == ["ppo", "decoupled", "pg", "gspo"] and loss["default"] == "ppo"
    shown = gyre("config", "show").stdout  # the YAML names each field's choices
    assert "  loss: ppo  # ppo | decoupled | pg | gspo\n  ratio_cap: 0.0\n" in shown
    assert "  policy: elastic  # colocate | async | elastic\n" in shown
    assert RunConfig.from_dict(yaml.safe_load(shown)) == RunConfig()  # it loads as it was
    assert RunConfig.from_dict({"train": {"loss": "pg"}}).train.loss == "pg"
    with pytest.raises(ConfigError, match=r"train\.loss: must be one of ppo, decoupled, pg, gspo"):
        RunConfig.from_dict({"train": {"loss": "dpo"}})


def test_ratio_cap_is_off_or_above_the_clip() -> None:
    assert RunConfig().train.ratio_cap == 0.0  # off: the losses' ratio_cap None
    assert RunConfig.from_dict({"train": {"ratio_cap": 4.0}}).train.ratio_cap == 4.0
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"train": {"ratio_cap": 1.1}})
    assert err.value.errors == [
        ("train.ratio_cap", "must be > 1 + train.clip_high (1.28) or 0, got 1.1")
    ]


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"cluster": {"gpus_per_unit": 2}}, "needs cluster.gpus_per_unit 1"),
        ({"engine": {"weight_sync": "nccl"}}, "other than nccl"),
        ({"backend": "sim", "scheduler": {"batch_order": "index"}}, "batch_order arrival"),
    ],
)
def test_streaming_refuses_what_it_cannot_run_on_its_own_field(changes, problem) -> None:
    scheduler = {"streaming": True, **changes.pop("scheduler", {})}
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({**changes, "scheduler": scheduler})
    errors = dict(err.value.errors)
    assert list(errors) == ["scheduler.streaming"] and problem in errors["scheduler.streaming"]
    assert RunConfig.from_dict({"scheduler": {"streaming": True}}).scheduler.streaming
