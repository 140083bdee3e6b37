"""Errors that every floor of gyre_core raises, defined on the ground floor: this module
imports nothing of gyre_core, so any part may raise them without importing the config.

``ConfigError`` is re-exported by :mod:`gyre_core.config`, where the platform and the CLI
import it from."""

from __future__ import annotations


class ConfigError(ValueError):
    """Every bad field of a config, by dotted path."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{p}: {m}" for p, m in errors))
