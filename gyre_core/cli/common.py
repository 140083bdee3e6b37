"""Argument types and helpers shared by the command groups."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import yaml


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def apply_overrides(data: dict[str, Any], sets: tuple[str, ...] | list[str]) -> None:
    """Apply ``section.field=value`` overrides (``--set``; the value parsed as YAML) to a
    config dict in place."""
    for item in sets:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--set wants section.field=value, got {item!r}")
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {part!r} is not a section")
        value = yaml.safe_load(raw)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        node[leaf] = value
