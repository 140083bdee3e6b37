"""A launched run's log lines, shipped to ``RunLogLine`` off the run's path: ``add`` (and
the logging handler) only append to a bounded buffer; a thread of its own writes the
buffer every ``interval`` seconds, or at once when it is half full (its own database
connection), so logging never waits on the database. What the buffer cannot hold is
counted and reported as one line.

Sources: ``runtime`` for gyre_core's loggers (any thread: the runtime starts its own),
Python warnings, the job's progress lines and its ``phase_progress`` events; ``worker`` for
the rest, from the task's own thread only (the Celery task's logging; the worker's watchdog
thread logs about other runs)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from datetime import UTC, datetime
from typing import Any

from django.db import close_old_connections, connection
from gyre_web.runs.services import append_log_lines, level_name

from gyre_core.events import Event, PhaseProgress

log = logging.getLogger(__name__)
PENDING = 10000  # lines the buffer holds between writes; more are dropped (and counted)
# Loggers raised to INFO while a run is shipped (their INFO lines are the run's log).
RUN_LOGGERS = ("gyre_core", "workers", "py.warnings")


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _source(logger_name: str) -> str:
    return "runtime" if logger_name.split(".")[0] in ("gyre_core", "py") else "worker"


class _Handler(logging.Handler):
    def __init__(self, shipper: LogShipper) -> None:
        super().__init__(level=logging.INFO)
        self.shipper = shipper

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(__name__):  # never ship the shipper's own complaints
            return
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        except Exception:  # a bad format string: the raw message
            text = str(record.msg)
        source = _source(record.name)
        if source == "worker" and record.thread != self.shipper.owner:
            return  # another thread of the worker (its watchdog reaps other runs)
        self.shipper.add(source, level_name(record.levelno), text)


class LogShipper:
    def __init__(self, run_id: int, *, interval: float = 0.5) -> None:
        self.run_id = run_id
        self.interval = interval
        self.buffer: deque[dict[str, Any]] = deque()
        self.dropped = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.kick = threading.Event()  # write before the interval is up
        self.handler = _Handler(self)
        self.levels: dict[str, int] = {}
        self.owner = 0
        self.thread = threading.Thread(target=self._loop, name=f"gyre-logs-{run_id}", daemon=True)

    def add(self, source: str, level: str, text: str) -> None:
        with self.lock:
            if len(self.buffer) >= PENDING:
                self.dropped += 1
                return
            self.buffer.append({"time": _now(), "source": source, "level": level, "text": text})
            if len(self.buffer) == PENDING // 2:
                self.kick.set()  # a burst: write now rather than at the next interval

    def progress(self, line: str) -> None:
        """``run_job``'s progress callback: a runtime line."""
        self.add("runtime", "info", line)

    def event(self, event: Event) -> None:
        """The line a run's event makes: a ``phase_progress`` as a terminal shows it."""
        if isinstance(event, PhaseProgress):
            self.add("runtime", "info", event.line())

    def start(self) -> LogShipper:
        self.owner = threading.get_ident()  # the task's thread: its worker lines are the run's
        root = logging.getLogger()
        root.addHandler(self.handler)
        logging.captureWarnings(True)
        for name in RUN_LOGGERS:
            lg = logging.getLogger(name)
            self.levels[name] = lg.level
            if lg.getEffectiveLevel() > logging.INFO:
                lg.setLevel(logging.INFO)
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop capturing, write what is left and wait for the writer."""
        logging.getLogger().removeHandler(self.handler)
        logging.captureWarnings(False)
        for name, level in self.levels.items():
            logging.getLogger(name).setLevel(level)
        self.done.set()
        self.kick.set()
        self.thread.join(timeout=30)

    def _take(self) -> list[dict[str, Any]]:
        with self.lock:
            lines, self.buffer = list(self.buffer), deque()
            if self.dropped:
                lines.append(
                    {
                        "time": _now(),
                        "source": "worker",
                        "level": "warning",
                        "text": f"{self.dropped} log lines dropped (more than {PENDING} waiting)",
                    }
                )
                self.dropped = 0
        return lines

    def _loop(self) -> None:
        try:
            while not self.done.is_set():
                self.kick.wait(self.interval)
                self.kick.clear()
                self._write()
            self._write()
        finally:
            connection.close()

    def write_now(self) -> None:
        """Store what the buffer holds from the calling thread (inside its transaction:
        the worker commits a run's last lines with its final status)."""
        self._write(own_connection=False)

    def _write(self, own_connection: bool = True) -> None:
        lines = self._take()
        if not lines:
            return
        try:
            if own_connection:
                close_old_connections()
            append_log_lines(run_id=self.run_id, lines=lines)
        except Exception as err:  # the run goes on; its lines of this moment are lost
            log.warning("run %s: %d log lines not stored: %s", self.run_id, len(lines), err)
