"""A training group's collectives: how long one may wait, and how to end them at once.

A process whose peer is lost stays blocked in a collective until the group's timeout; NCCL's
watchdog then ends the process. The driver sees a lost process first (Ray fails its calls),
so it asks the others to :meth:`GroupAbort.abort`: from another thread of the process (the
actor's other concurrency group) every communicator of the group is aborted and the blocked
collective returns an error within moments, whichever the backend:

* NCCL: ``torch.distributed.distributed_c10d._abort_process_group()`` (every group of the
  process, the default one included, inside one NCCL group call);
* gloo: gloo has no abort (``ProcessGroupGloo`` leaves ``Backend::abort`` empty), so the
  connections it opened are shut down (``shutdown(2)``, as a peer's crash would), then the
  groups are dropped the same way. Its listening sockets are left alone: gloo's listener
  thread ends the process when ``accept`` fails.

The timeout is the backstop where no abort comes (a peer that hangs while Ray still sees it
alive): ``GYRE_COLLECTIVE_TIMEOUT_S`` in the environment of the processes that train, set
by whoever operates the cluster (it is not a run's setting: a run config cannot lengthen
how long the cluster's processes may hang).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch.distributed as dist

TIMEOUT_ENV = "GYRE_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0  # longest wait of one collective: a step's slowest microbatch


def collective_timeout() -> timedelta:
    """How long one collective of a training group may wait for its peers."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV} must be above 0, got {raw!r}")
    return timedelta(seconds=seconds)


def set_timeout(groups: list[Any], timeout: timedelta) -> None:
    """``timeout`` on each of ``groups`` (``None``: the default group). A group made by
    ``new_group``, as a device mesh makes its dimensions', takes the backend's default
    otherwise (30 min for gloo, 10 for NCCL), not the default group's."""
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        raise RuntimeError(
            "this torch has no torch.distributed.distributed_c10d._set_pg_timeout: the "
            "training group's collectives would wait the backend's default timeout"
        )
    for group in groups:
        setter(timeout, group)


def _sockets() -> dict[int, str]:
    """This process's open sockets: descriptor -> ``socket:[inode]`` (Linux's /proc)."""
    out: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


class GroupAbort:
    """The sockets a gloo group opened while it formed (taken between :meth:`before` and
    :meth:`after`, around the group's and the mesh's creation) and the abort of the
    group's communicators (see the module docstring)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._before: dict[int, str] = {}
        self.opened: dict[int, str] = {}

    def before(self) -> None:
        if self.backend == "gloo":
            self._before = _sockets()

    def after(self) -> None:
        if self.backend == "gloo":
            self.opened = {fd: s for fd, s in _sockets().items() if self._before.get(fd) != s}

    def forget(self) -> None:
        self.opened = {}

    def abort(self) -> int:
        """End every collective of this process's groups now, from any thread; the groups
        are gone afterwards (``dist.is_initialized()`` is false). Returns the connections
        shut (gloo; 0 for NCCL)."""
        shut = self._shut_connections() if self.backend == "gloo" else 0
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is None:
            raise RuntimeError(
                "this torch has no torch.distributed.distributed_c10d._abort_process_group: "
                "a lost peer's collectives cannot be aborted"
            )
        if dist.is_initialized():
            abort()
        return shut

    def _shut_connections(self) -> int:
        current, shut = _sockets(), 0
        for fd, ident in self.opened.items():
            if current.get(fd) != ident:  # closed, or the number taken by another socket
                continue
            try:
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
            except OSError:  # not connected (any more)
                pass
            finally:
                sock.close()
        self.opened = {}
        return shut
