"""``run_job``: the one entry point the CLI and the platform's worker call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gyre_core import events as ev
from gyre_core.config import RunConfig


class Cancelled(Exception):
    """Raised inside a job when its ``should_stop`` turned true; the job ends ``cancelled``."""


class StopCheckingSink:
    """Forwards events and turns a true ``should_stop()`` into :class:`Cancelled` — the
    simulator emits often, so this is a prompt cancellation point without a clock."""

    def __init__(self, sink: ev.EventSink, should_stop: Callable[[], bool]) -> None:
        self.sink, self.should_stop = sink, should_stop

    def emit(self, event: ev.Event) -> None:
        self.sink.emit(event)
        if self.should_stop():
            raise Cancelled

    def flush(self) -> None:
        ev.flush_sink(self.sink)


def error_line(exc: BaseException) -> str:
    """One line naming ``exc`` (its type and the first line of its message, 500 characters
    at most): what a failed run reports. The traceback belongs in a log, not here."""
    lines = str(exc).strip().splitlines()
    return (f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)[:500]


def run_job(
    cfg: RunConfig,
    *,
    sink: ev.EventSink,
    workdir: Path,
    should_stop: Callable[[], bool] = lambda: False,
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` to the end (or until ``should_stop()``); return the summary.

    ``summary["status"]`` is ``succeeded`` or ``cancelled``; errors propagate after a
    ``run_status failed`` event. Checkpoints (real backend) live in ``workdir``; so do the
    files of the trackers ``cfg.tracking`` asks for (:mod:`gyre_core.tracking`), which get
    every event and are closed when the run ends, however it ends.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    from gyre_core.tracking import exporters

    try:
        trackers = exporters(cfg, workdir)
    except Exception as exc:
        sink.emit(ev.RunStatus(t=0.0, status="failed", step=0, message=error_line(exc)))
        raise
    if trackers:
        sink = ev.TeeSink([sink, *trackers])
    status = "failed"
    try:
        if cfg.backend == "sim":
            from gyre_core.runtime.sim_job import run_sim

            guarded = StopCheckingSink(sink, should_stop)
            summary = run_sim(cfg, sink=guarded, workdir=workdir, resume=resume, progress=progress)
        else:
            from gyre_core.runtime.real_job import run_real

            summary = run_real(
                cfg,
                sink=sink,
                workdir=workdir,
                should_stop=should_stop,
                resume=resume,
                progress=progress,
            )
        status = str(summary.get("status", "succeeded"))
    except Cancelled:
        status = "cancelled"
        sink.emit(ev.RunStatus(t=0.0, status="cancelled", step=0, message="cancelled by user"))
        return {"policy": cfg.policy, "backend": cfg.backend, "status": "cancelled"}
    except Exception as exc:
        sink.emit(ev.RunStatus(t=0.0, status="failed", step=0, message=error_line(exc)))
        raise
    finally:
        for tracker in trackers:
            tracker.finish(status)  # a no-op for one the run's last event already ended
    return summary
