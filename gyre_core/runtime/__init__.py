"""Runs a configured job: the simulator (``backend: sim``) or real units on Ray
(``backend: real``). Both report through the same :class:`~gyre_core.events.EventSink`."""

from gyre_core.runtime.job import Cancelled, error_line, run_job

__all__ = ["Cancelled", "error_line", "run_job"]
