"""A sink that turns the events of a run into short progress lines for a terminal."""

from __future__ import annotations

from collections.abc import Callable

from gyre_core import events as ev


class ProgressSink:
    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.finished = 0

    def emit(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStatus):
            self.write(f"run {event.status} (step {event.step}) {event.message}".rstrip())
        elif isinstance(event, ev.StepFinished):
            shown = ", ".join(
                f"{k} {v:.3g}" for k, v in event.metrics.items() if isinstance(v, int | float)
            )
            self.write(f"step {event.step} (version {event.version}): {shown}")
        elif isinstance(event, ev.Benchmark):
            self.write(f"benchmark {event.suite} at step {event.step}: {event.score:.3f}")
        elif isinstance(event, ev.RoleChange) and event.to_role != "switching":
            self.write(f"unit {event.unit}: {event.from_role} -> {event.to_role}")
        elif isinstance(event, ev.PhaseProgress):
            self.write(event.line())
        elif isinstance(event, ev.RolloutFinished):
            self.finished += 1
            if self.finished % 8 == 0:
                self.write(f"{self.finished} rollouts finished")
