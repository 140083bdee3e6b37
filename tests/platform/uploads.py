"""Small synthetic ``gyre.trajectory/v1`` files for the import tests."""

from __future__ import annotations

import io

from gyre_core.trajectory.synth import SynthConfig, synth_rollouts
from gyre_core.trajectory.writer import write_rollouts


def synth_jsonl(
    *,
    groups: int = 1,
    group_size: int = 2,
    turns: int = 2,
    seed: int = 1,
    prompt: int = 16,
    completion: int = 8,
    retry_prob: float = 0.0,
) -> bytes:
    """A valid file of ``groups`` x ``group_size`` rollouts (``prompt`` system tokens,
    ``completion`` and tool tokens a turn)."""
    cfg = SynthConfig(
        groups=groups,
        group_size=group_size,
        turns=turns,
        system_tokens=prompt,
        completion_tokens=completion,
        tool_tokens=completion,
        retry_prob=retry_prob,
        seed=seed,
    )
    buf = io.StringIO()
    write_rollouts(buf, synth_rollouts(cfg))
    return buf.getvalue().encode()


def fake_checkpoint(run_id: int, version: int, size: int = 1000) -> None:
    """A complete checkpoint folder (``state.json`` and a weights file of ``size`` bytes)
    in the run's folder, as a real run writes it."""
    import json

    from gyre_web.runs.services import run_dir

    path = run_dir(run_id) / "checkpoints" / f"step-{version:08d}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "state.json").write_text(json.dumps({"version": version}))
    (path / "model.safetensors").write_bytes(b"\x01" * size)


def fake_export(run_id: int, version: int) -> None:
    """A done Hugging Face export of the run's checkpoint ``version`` (a config file in
    its folder), as the export task leaves it."""
    from django.utils import timezone
    from gyre_web.runs.exports import export_dir
    from gyre_web.runs.models import CheckpointExport

    path = export_dir(run_id, version)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    CheckpointExport.objects.create(
        run_id=run_id, version=version, status="done", size_bytes=2, finished_at=timezone.now()
    )
