"""A cache for warm-started trainers (``warm_start.cache``).

A warm start is deterministic in what it depends on: the initial checkpoint (weights and
tokenizer), the seed, the trainer settings, the demonstrations (suite, size, hints, harness
limits, the demonstrator's skip rate) and the code that plays and trains them. The key hashes
all of that; an entry holds the trainer's full state after the warm start (weights,
optimizer moments and version 0, as a sharded checkpoint:
:func:`gyre_core.train.sharded_checkpoint.save_state`) and its losses and wall time, so a run that
loads it continues exactly as if it had trained them itself.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gyre_core.config import RunConfig
from gyre_core.runtime.warm_target import WarmTarget

_CODE = (
    "envs/repo_suite.py",
    "rollout/agents.py",
    "rollout/harness.py",
    "rollout/harness_config.py",  # HarnessOptions: retries and error limits shape the demos
    "rollout/task_env.py",
    "train/trainer.py",
    "train/sharded.py",
    "train/memory.py",
    "train/tree_attention.py",
    "runtime/session.py",
    "runtime/warm_start.py",
    "trajectory/pack.py",
)
# Train fields the warm start never reads (supervised steps have no advantages, no policy
# loss), and warm_start fields that only act after it.
_AFTER = (
    "advantage_mode", "normalise_std", "average", "behaviour", "loss", "ratio_cap",
    "gspo_token_cap", "gspo_clip_low", "gspo_clip_high",
)  # fmt: skip
_WARM_AFTER = ("cache", "fresh_optimizer")
_MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json")
STATE_DIR = "state"  # an entry's trainer state: a sharded checkpoint (train/sharded.py)


def _after(cfg: RunConfig) -> tuple[str, ...]:
    """Train fields the warm start does not read: with its own ``warm_start.lr``, the RL
    learning rate is only restored after it (and set again on load)."""
    return (*_AFTER, "lr") if cfg.warm_start.lr else _AFTER


def cache_key(cfg: RunConfig, model_dir: Path) -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    r = cfg.rollout
    settings = {
        "seed": cfg.seed,
        "train": {k: v for k, v in asdict(cfg.train).items() if k not in _after(cfg)},
        "warm_start": {k: v for k, v in asdict(cfg.warm_start).items() if k not in _WARM_AFTER},
        "rollout": {
            k: getattr(r, k)
            for k in (
                "suite",
                "size",
                "hints",
                "max_turns",
                "context_budget",
                "max_new_tokens",
                "tasks_per_step",
                "delegate",  # the harness options the demonstrations are played with
                "subagent_max_turns",
                "max_retries",
            )
        },
        "staleness": cfg.scheduler.staleness_bound,
    }
    h.update(json.dumps(settings, sort_keys=True).encode())
    if cfg.warm_start.data:  # the demonstrations themselves, not only their path
        h.update(Path(cfg.warm_start.data).read_bytes())
        h.update(cfg.model.chat_template.encode())  # a message log's tokens depend on it
    for name in _MODEL_FILES:
        path = model_dir / name
        h.update(path.read_bytes() if path.exists() else b"-")
    for rel in _CODE:
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:20]


async def load(folder: Path, trainer: WarmTarget) -> dict[str, Any] | None:
    """Restore a cached warm start into ``trainer``; its meta (losses, seconds) or None.
    The RL learning rate is this run's (it is not part of the key)."""
    meta = folder / "meta.json"
    if not meta.exists() or not (folder / STATE_DIR).is_dir():
        return None
    await trainer.load_state(folder / STATE_DIR)  # the key has checked what matters
    out: dict[str, Any] = json.loads(meta.read_text())
    return out


async def store(folder: Path, trainer: WarmTarget, meta: dict[str, Any]) -> None:
    """Write an entry: the state first, ``meta.json`` last (an entry without it is
    incomplete and ignored, then replaced)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    await trainer.save_state(folder / STATE_DIR)
    tmp = folder / "meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    tmp.replace(folder / "meta.json")
