"""A real two-node Ray cluster on this machine: a head and a worker node, each a separate
``ray start --block`` process in its own session, so that killing one node kills exactly
its raylet and the workers it spawned, and nothing of any other Ray on the machine.

Both nodes advertise ``gpu_unit: 2``. Every port a node would otherwise take from a fixed
default (GCS, dashboard, agent, metrics) is a free one, so this runs beside
other Ray clusters (other tests, other users) on the same host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gyre_core.runtime.inventory import NodeRecord, read_inventory

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE = str(100 * 1024 * 1024)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_ports() -> list[str]:
    return ["--dashboard-agent-listen-port", str(free_port()),
            "--metrics-export-port", str(free_port())]  # fmt: skip


@dataclass
class TwoNodes:
    temp: Path  # short: Ray's socket paths are length-capped
    address: str = ""
    head: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)
    worker_killed: bool = False

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        env.pop("RAY_ADDRESS", None)
        log = self.temp.with_name(self.temp.name + f".{name}.log")
        self.logs.append(log)
        with log.open("wb") as out:
            return subprocess.Popen(
                [RAY, "start", *args, "--num-cpus", "1", "--resources", '{"gpu_unit": 2}',
                 "--object-store-memory", OBJECT_STORE, "--disable-usage-stats", "--block",
                 *_node_ports()],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def start(self, timeout: float = 90.0) -> list[NodeRecord]:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.head = self._start("head", [
            "--head", "--port", str(port), "--temp-dir", str(self.temp),
            "--include-dashboard=false", "--dashboard-port", str(free_port()),
        ])  # fmt: skip
        self._wait(lambda nodes: len(nodes) == 1, timeout, "the head")
        self.worker = self._start("worker", ["--address", self.address])
        return self._wait(lambda nodes: sum(n.alive for n in nodes) == 2, timeout, "the worker")

    def _wait(self, ok: object, timeout: float, what: str) -> list[NodeRecord]:
        deadline = time.monotonic() + timeout
        while True:
            for proc in (self.head, None if self.worker_killed else self.worker):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"ray start exited ({proc.returncode}): {self.tail()}")
            if _listening(self.address):  # else ray.init would wait for the GCS for ever
                nodes = read_inventory(self.address)
                if ok(nodes):  # type: ignore[operator]
                    return nodes
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not join in {timeout}s: {self.tail()}")
            time.sleep(1.0)

    def kill_worker(self) -> None:
        """SIGKILL the worker node: its `ray start`, raylet, agents and unit workers."""
        assert self.worker is not None
        self.worker_killed = True
        _kill_session(self.worker.pid)

    def wait_dead(self, node_id: str, timeout: float = 90.0) -> list[NodeRecord]:
        """Until the head's GCS reports ``node_id`` dead (it misses the raylet's health
        checks for some seconds first)."""
        return self._wait(
            lambda nodes: any(n.node_id == node_id and not n.alive for n in nodes), timeout,
            f"node {node_id[:8]} death",
        )  # fmt: skip

    def stop(self) -> None:
        for proc in (self.worker, self.head):
            if proc is not None:
                _kill_session(proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        shutil.rmtree(self.temp, ignore_errors=True)
        for log in self.logs:
            log.unlink(missing_ok=True)

    def tail(self) -> str:
        return "\n".join(
            log.read_text(errors="replace")[-1500:] for log in self.logs if log.exists()
        )


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except OSError:
        return False
    return True


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (a `ray start` run with
    start_new_session): the node's daemons share its process group, but the raylet puts
    each worker it spawns in a group of its own, within the same session."""
    for pid in _session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _session_pids(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state ppid pgrp session
        if int(fields[3]) == sid:
            out.append(int(entry))
    return out


def make_cluster() -> TwoNodes:
    return TwoNodes(Path(tempfile.mkdtemp(prefix="g2n-", dir="/tmp")))
