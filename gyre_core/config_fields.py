"""The documented field every config section is made of, and the bounds a field's type
sets where its rules set none (``gyre_core.config`` checks both)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

# Every field is bounded by its type, unless it declares tighter bounds: an int fits a
# 32-bit column (the platform stores steps, seed, ... in one), a float is finite and at
# most FLOAT_MAX in size, a string is at most STR_MAX characters without control chars.
INT_MAX = 2**31 - 1
FLOAT_MAX = 1e12
STR_MAX = 500  # a path or a URL; the run's name has its own, shorter, bound


def config_field(default: Any, help: str, **rules: Any) -> Any:
    """A documented field. ``rules``: choices, min, max (inclusive), above (exclusive min),
    max_length (a string's); the type's bounds above apply where none is given. ``path=True``
    marks a file or folder path: a relative one is made absolute where a config file is read
    (``gyre_core.config.load_config``), against the directory the command runs in."""
    return field(default=default, metadata={"help": help, **rules})
