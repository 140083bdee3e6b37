"""An agent sandbox's one way out: its session's endpoint.

Under bubblewrap an agent command has a network namespace of its own, whose only interface
is a loopback of its own: it cannot reach the worker's services (Postgres, Redis, Ray,
anything listening on the host's loopback) nor any other host. Its session's base URL
still works unchanged: inside the sandbox a small
forwarder (:data:`FORWARDER`, the sandbox's first process, which then runs the command)
listens on the endpoint's loopback address and port and carries each connection over a
Unix socket in the agent's folder to :func:`endpoint_bridge` in the worker, which opens
the same connection to the endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

SOCKET_NAME = ".endpoint.sock"

# Runs inside the sandbox as `python -I -S -c FORWARDER SOCKET PORT ARGV...`: listens on
# 127.0.0.1:PORT of the sandbox's own network, forwards each connection to SOCKET, runs
# ARGV and exits with its code.
FORWARDER = r"""
import socket, subprocess, sys, threading
path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(128)
def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve():
    while True:
        conn, _ = srv.accept()
        up = socket.socket(socket.AF_UNIX)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            continue
        threading.Thread(target=pump, args=(conn, up), daemon=True).start()
        threading.Thread(target=pump, args=(up, conn), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
rc = subprocess.call(argv)
sys.exit(rc if rc >= 0 else 128 - rc)
"""


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError):
        pass
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()


@contextlib.asynccontextmanager
async def endpoint_bridge(folder: Path, host: str, port: int) -> AsyncIterator[Path]:
    """A Unix socket in ``folder`` whose every connection is carried to ``host:port``."""

    async def handle(down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, port)
        except OSError:
            down_w.close()
            return
        try:
            await asyncio.gather(_pump(down_r, up_w), _pump(up_r, down_w))
        finally:
            for w in (up_w, down_w):
                w.close()

    path = folder / SOCKET_NAME
    server = await asyncio.start_unix_server(handle, path=str(path))
    try:
        yield path
    finally:
        server.close()


__all__ = ["FORWARDER", "endpoint_bridge"]
