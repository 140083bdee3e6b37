"""A sink that hands events to a background thread, so a slow downstream sink (a database
write, a network send) never blocks the run's event loop. ``close`` drains it.

A downstream failure is kept, not lost: the next ``emit`` raises :class:`SinkFailed`
(the run stops there), and ``close`` still drains and joins the thread without raising,
so the caller can shut everything down before ``check`` reports the failure."""

from __future__ import annotations

import queue
import threading

from gyre_core import events as ev
from gyre_core.runtime.job import error_line

_DONE = object()


class SinkFailed(RuntimeError):
    """The downstream sink raised; the message is one line naming the cause."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"event sink failed: {error_line(cause)}")


class ThreadedSink:
    def __init__(self, inner: ev.EventSink) -> None:
        self.inner = inner
        self.errors: list[BaseException] = []
        self._q: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="gyre-sink", daemon=True)
        self._thread.start()

    def emit(self, event: ev.Event) -> None:
        self.check()
        self._q.put(event)

    def check(self) -> None:
        """Raise :class:`SinkFailed` if the downstream sink has failed."""
        if self.errors:
            raise SinkFailed(self.errors[0]) from self.errors[0]

    def close(self) -> None:
        """Drain the queue and join the thread; never raises (see ``check``)."""
        self._q.put(_DONE)
        self._thread.join()

    def _work(self) -> None:
        while (item := self._q.get()) is not _DONE:
            if self.errors:
                continue  # keep draining so close() returns
            try:
                self.inner.emit(item)  # type: ignore[arg-type]
            except BaseException as exc:  # reported to the run on its next emit
                self.errors.append(exc)
