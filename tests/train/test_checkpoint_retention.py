"""``prune_checkpoints``: keep the newest K and every Nth, never the newest, and touch nothing
but complete ``step-*`` checkpoints; the run config's two fields that set it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre_core.config import ConfigError, RunConfig
from gyre_core.train.checkpoint import prune_checkpoints, save_checkpoint
from gyre_core.train.checkpoint_dirs import checkpoints, latest_checkpoint
from tests.train.test_trainer import make_trainer, tiny_model


def _root(tmp_path: Path, versions: range) -> Path:
    """``step-*`` folders holding a state.json, plus what pruning must leave alone: a
    hidden temporary folder, another name, a short name and one still being written."""
    root = tmp_path / "checkpoints"
    for v in versions:
        (root / f"step-{v:08d}").mkdir(parents=True)
        (root / f"step-{v:08d}" / "state.json").write_text("{}")
    for name in (".tmp-step-00000099-7", "notes", "step-5", "step-00000098"):
        (root / name).mkdir()
    (root / ".tmp-step-00000099-7" / "state.json").write_text("{}")
    (root / "step-5" / "state.json").write_text("{}")
    return root


def _left(root: Path) -> list[int]:
    return [v for v, _ in checkpoints(root)]


OTHERS = [".tmp-step-00000099-7", "notes", "step-00000098", "step-5"]


@pytest.mark.parametrize(
    ("keep_last", "keep_every", "left"),
    [
        (0, 0, list(range(1, 11))),  # 0 keeps all
        (0, 4, list(range(1, 11))),
        (2, 0, [9, 10]),
        (2, 4, [4, 8, 9, 10]),
        (1, 3, [3, 6, 9, 10]),  # the newest, though no multiple of 3
        (3, 1, list(range(1, 11))),  # every version is a multiple of 1
        (20, 0, list(range(1, 11))),
    ],
)
def test_the_rule_keeps_the_newest_k_and_every_nth(tmp_path, keep_last, keep_every, left) -> None:  # type: ignore[no-untyped-def]
    root = _root(tmp_path, range(1, 11))
    gone = prune_checkpoints(root, keep_last, keep_every)
    assert _left(root) == left
    assert gone == [root / f"step-{v:08d}" for v in range(1, 11) if v not in left]
    assert all((root / name).is_dir() for name in OTHERS)  # step-00000098: being written
    assert not any(p.name.startswith(".del-") for p in root.iterdir())


def test_pruning_again_deletes_nothing_more_and_the_newest_still_resumes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trainer = make_trainer(tiny_model())
    root = tmp_path / "ckpt"
    for v in range(1, 6):
        trainer.version = v
        save_checkpoint(root, trainer)
        prune_checkpoints(root, 2, 2)
    assert _left(root) == [2, 4, 5]
    assert prune_checkpoints(root, 2, 2) == []
    assert latest_checkpoint(root) == root / "step-00000005"
    assert sorted(p.name for p in root.iterdir()) == [f"step-{v:08d}" for v in (2, 4, 5)]
    assert prune_checkpoints(tmp_path / "absent", 1, 0) == []
    with pytest.raises(ValueError, match="must be >= 0"):
        prune_checkpoints(root, -1, 0)


def test_the_run_config_fields_default_to_keep_all_and_refuse_negatives() -> None:
    cfg = RunConfig()
    assert (cfg.checkpoint_keep_last, cfg.checkpoint_keep_every) == (0, 0)
    cfg = RunConfig.from_dict({"checkpoint_keep_last": 3, "checkpoint_keep_every": 10})
    assert (cfg.checkpoint_keep_last, cfg.checkpoint_keep_every) == (3, 10)
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"checkpoint_keep_last": -1, "checkpoint_keep_every": -2})
    assert {p for p, _ in err.value.errors} == {"checkpoint_keep_last", "checkpoint_keep_every"}
