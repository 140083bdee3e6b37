"""The warm start `make demo` ships (configs/demo.yaml's ``warm_start.weights``): it fits
the model and the tokenizer that the demo's config builds, and its record says how it was
made (a target reached, the command's config)."""

import asyncio
import json
from pathlib import Path

import pytest

from gyre_core.config import RunConfig, load_config
from gyre_core.events import NullSink
from gyre_core.runtime.session import SessionFactory, make_model_dir
from gyre_core.runtime.warm_start import WarmStart, tokenizer_hash

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"


def test_the_shipped_warm_start_fits_the_demos_model_and_tokenizer(tmp_path) -> None:
    cfg = load_config(DEMO)
    weights = ROOT / cfg.warm_start.weights
    meta = json.loads(weights.with_suffix(".json").read_text())
    assert meta["missed_target"] is None and meta["steps"] > meta["anneal_from"] > 0
    learn = load_config(ROOT / "configs" / "learn-elastic.yaml")
    # the model section it was made with, read as a config (fields added since: defaults)
    made_with = RunConfig.from_dict({"model": meta["config"]["model"]}).model
    assert made_with == learn.model == cfg.model
    model_dir = make_model_dir(cfg, tmp_path)
    assert meta["tokenizer_sha256"] == tokenizer_hash(model_dir)
    sessions = SessionFactory(cfg, model_dir, NullSink(), lambda: 0.0)
    trainer = sessions.make_trainer()
    losses = asyncio.run(WarmStart(sessions).load(trainer, weights))
    assert len(losses) == meta["steps"] and trainer.version == 0


def test_a_warm_start_file_of_another_tokenizer_is_refused(tmp_path) -> None:
    cfg = load_config(DEMO)
    weights = ROOT / cfg.warm_start.weights
    copy = tmp_path / "w.safetensors"
    copy.write_bytes(weights.read_bytes())
    meta = json.loads(weights.with_suffix(".json").read_text())
    copy.with_suffix(".json").write_text(json.dumps({**meta, "tokenizer_sha256": "0" * 64}))
    model_dir = make_model_dir(cfg, tmp_path / "m")
    sessions = SessionFactory(cfg, model_dir, NullSink(), lambda: 0.0)
    with pytest.raises(ValueError, match="another tokenizer"):
        asyncio.run(WarmStart(sessions).load(sessions.make_trainer(), copy))
