import json

import pytest

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
