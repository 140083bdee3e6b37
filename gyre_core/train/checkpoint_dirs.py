"""Which folders are checkpoints: ``<root>/step-<version, 8 digits>/`` holding
``state.json`` (:mod:`gyre_core.train.checkpoint` writes them). Torch-free, so that the
platform lists a run's checkpoints without importing the trainer."""

from __future__ import annotations

import re
from pathlib import Path

STATE_FILE = "state.json"
_NAME = re.compile(r"^step-(\d{8,})$")


def checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Every complete checkpoint under ``root`` as ``(version, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()
    )


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint of the highest version under ``root``, or ``None``."""
    found = checkpoints(root)
    return found[-1][1] if found else None
