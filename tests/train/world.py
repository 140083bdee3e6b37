"""Process groups for tests without a port race: the test's own process opens the
rendezvous store on a port the system picks and holds it while the spawned processes run
(no other process can take the port between its choice and its use, as one picked free and
closed again can be), and each spawned process joins it as a client. A world of one
process needs no port at all (:func:`alone`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore

TIMEOUT = timedelta(seconds=300)


@contextmanager
def world_port() -> Iterator[int]:
    """The port of a rendezvous store held open until the block ends."""
    store = TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)
    try:
        yield int(store.port)
    finally:
        del store


def join_world(rank: int, world: int, port: int, backend: str = "gloo") -> TCPStore:
    """Join the world of :func:`world_port`'s store (in a spawned process); the store, for
    keys of the test's own."""
    store = TCPStore("127.0.0.1", port, world, False, TIMEOUT)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    return store


def alone(backend: str = "gloo") -> None:
    """A world of this process only (a store in memory)."""
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
