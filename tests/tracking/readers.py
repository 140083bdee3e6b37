"""Each tracker's files read back with its own library."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024  # the W&B transaction log's block (LevelDB's log format)
HEADER = 7  # ":W&B", a 2-byte magic, a version byte; each chunk also has a 7-byte header
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_run(uri: str, run_id: str) -> tuple[Any, dict[str, list[tuple[int, float]]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in run.data.metrics
    }
    return run, history


def wandb_records(path: Path) -> list[Any]:
    """The records of an offline W&B run file, decoded by W&B's own protobuf ``Record``
    (the package no longer ships a Python reader of the file's framing, which is LevelDB's
    log format: 32 KiB blocks of chunks, each a CRC, a length and a type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(pending)
            records.append(rec)
    return records


def wandb_history(path: Path) -> list[dict[str, Any]]:
    rows = []
    for rec in wandb_records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                    for i in rec.history.item
                }
            )
    return rows


def wandb_config(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rec in wandb_records(path):
        kind = rec.WhichOneof("record_type")
        updates = rec.run.config.update if kind == "run" else rec.config.update
        if kind in ("run", "config"):
            for item in updates:
                out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out
