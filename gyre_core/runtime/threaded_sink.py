"""A sink that hands events to a background thread, so a slow downstream sink (a database
write, a network send) never blocks the run's event loop. ``close`` drains it."""

from __future__ import annotations

import queue
import threading

from gyre_core import events as ev

_DONE = object()


class ThreadedSink:
    def __init__(self, inner: ev.EventSink) -> None:
        self.inner = inner
        self.errors: list[BaseException] = []
        self._q: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="gyre-sink", daemon=True)
        self._thread.start()

    def emit(self, event: ev.Event) -> None:
        if self.errors:
            raise RuntimeError(f"event sink failed: {self.errors[0]}") from self.errors[0]
        self._q.put(event)

    def close(self) -> None:
        self._q.put(_DONE)
        self._thread.join()
        if self.errors:
            raise RuntimeError(f"event sink failed: {self.errors[0]}") from self.errors[0]

    def _work(self) -> None:
        while (item := self._q.get()) is not _DONE:
            if self.errors:
                continue  # keep draining so close() returns
            try:
                self.inner.emit(item)  # type: ignore[arg-type]
            except BaseException as exc:  # reported to the run on its next emit
                self.errors.append(exc)
