"""What every exporter shares: events in, a tracker's calls out."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from gyre_core import events as ev

ENDED = ("succeeded", "failed", "cancelled")
IDS = "tracking.json"  # the trackers' run ids, so that a resumed run continues its own


class TrackingError(RuntimeError):
    """A tracker asked for that cannot run here (its package is missing)."""


def need(module: str, field: str, package: str) -> ModuleType:
    """Import ``module`` or raise :class:`TrackingError` naming the config ``field``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackingError(
            f"tracking.{field}: the {package} package is not installed "
            "(pip install 'gyre[tracking]')"
        ) from None


def flat_config(cfg: Any) -> dict[str, Any]:
    """The run config as ``section.field -> value`` (what a tracker shows as parameters)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out[prefix] = value

    walk("", cfg.to_dict())
    return out


class Exporter:
    """An event sink sending step metrics (``StepFinished``), benchmark scores
    (``benchmark/<suite>``) and, once, the config to one tracker. Subclasses implement
    :meth:`open`, :meth:`log` and :meth:`close`."""

    field = ""

    def __init__(self, cfg: Any, workdir: Path) -> None:
        self.cfg, self.workdir = cfg, workdir
        self.opened = self.closed = False

    # ------------------------------------------------------------------ the sink

    def emit(self, event: ev.Event) -> None:
        """Send what ``event`` holds for the tracker. A tracker that fails (its server
        unreachable, say) stops exporting, with one line on stderr naming it; the run goes
        on, its events stored as ever."""
        if self.closed:
            return
        try:
            self._emit(event)
        except Exception as exc:  # a tracker never fails the run
            self._stopped(exc)

    def _emit(self, event: ev.Event) -> None:
        if isinstance(event, ev.StepFinished):
            metrics = {k: float(v) for k, v in event.metrics.items() if _number(v)}
            self._log(event.step, metrics)
        elif isinstance(event, ev.Benchmark):
            self._log(event.step, {f"benchmark/{event.suite}": float(event.score)})
        elif isinstance(event, ev.RunStatus) and event.status in ENDED:
            self.finish(event.status)

    def finish(self, status: str = "succeeded") -> None:
        """End the tracker's run (idempotent)."""
        if self.opened and not self.closed:
            try:
                self.close(status)
            except Exception as exc:
                self._stopped(exc)
        self.closed = True

    def _stopped(self, exc: Exception) -> None:
        print(f"tracking.{self.field}: export stopped: {exc!r}"[:500], file=sys.stderr)
        self.closed = True

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        if not metrics:
            return
        if not self.opened:
            self.open(flat_config(self.cfg))
            self.opened = True
        self.log(step, metrics)

    # ------------------------------------------------------------------ run ids

    def saved_id(self) -> str:
        path = self.workdir / IDS
        ids = json.loads(path.read_text()) if path.exists() else {}
        return str(ids.get(self.field, ""))

    def save_id(self, run_id: str) -> None:
        path = self.workdir / IDS
        ids = json.loads(path.read_text()) if path.exists() else {}
        ids[self.field] = run_id
        path.write_text(json.dumps(ids, indent=1) + "\n")

    # ------------------------------------------------------------------ a tracker

    def open(self, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        raise NotImplementedError


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
