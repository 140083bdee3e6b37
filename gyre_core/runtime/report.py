"""Report a run to the platform from anywhere (``gyre run CONFIG --report-to URL``).

:class:`Reporter` is an event sink. Every event gets the next sequence number and goes to
a spool file in the run's folder (``report-spool.jsonl``) before anything else, so nothing
is lost while the platform is unreachable; a background thread sends the events not yet
acknowledged in batches (``POST /api/runs/{id}/report-events/``), in order, and records
the last acknowledged number (``report.json``). A batch whose answer was lost is sent
again and stored once (the platform skips numbers it has); while the platform is down the
thread retries with backoff and catches up when it comes back. Every answer carries a
stop asked from the web, which :meth:`Reporter.should_stop` passes to the run.

Nothing here imports Django: the platform is reached over HTTP with the standard library.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gyre_core import events as ev

SPOOL = "report-spool.jsonl"
STATE = "report.json"
BATCH = 200  # events in one request
TIMEOUT_S = 10.0  # one request
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # between tries while the platform is unreachable


class ReportError(ValueError):
    """The platform refused a request (bad token, a bad field): not worth retrying."""


class Unreachable(OSError):
    """The platform did not answer (down, restarting, a proxy's 5xx): retried."""


class Platform:
    """The platform's API at ``url`` with an API token."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """-> (status, answer) for a 2xx or 409; raises Unreachable or ReportError."""
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Token {self.token}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            if err.code >= 500 or err.code in (408, 429):
                raise Unreachable(f"{path}: HTTP {err.code}") from None
            answer = _json(text)
            if err.code == 409:
                return 409, answer
            raise ReportError(f"{path}: HTTP {err.code}: {text[:300]}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            raise Unreachable(f"{path}: {err}") from None

    def create_run(self, experiment: int, config: dict[str, Any], name: str) -> int:
        _, answer = self.post(
            "/api/runs/report/", {"experiment": experiment, "config": config, "name": name}
        )
        return int(answer["id"])


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"detail": text[:300]}
    return value if isinstance(value, dict) else {"detail": value}


def attach(
    platform: Platform,
    workdir: Path,
    *,
    experiment: int,
    config: dict[str, Any],
    name: str,
    resume: bool = False,
) -> int:
    """The platform run this folder reports to: with ``resume``, the one it reported to
    before on the same platform; else a new one in ``experiment`` (the spool of an earlier
    run in this folder is kept beside, as ``report-spool.<run>.jsonl``)."""
    path = workdir / STATE
    state = json.loads(path.read_text()) if path.exists() else {}
    if resume and state.get("url") == platform.url and state.get("run"):
        return int(state["run"])
    run = platform.create_run(experiment, config, name)
    workdir.mkdir(parents=True, exist_ok=True)
    spool = workdir / SPOOL
    if spool.exists():
        spool.replace(workdir / f"report-spool.{state.get('run', 'old')}.jsonl")
    _write_state(workdir, {"url": platform.url, "run": run, "acked": 0})
    return run


def _write_state(workdir: Path, state: dict[str, Any]) -> None:
    tmp = workdir / f"{STATE}.tmp"
    tmp.write_text(json.dumps(state) + "\n")
    tmp.replace(workdir / STATE)


class Reporter:
    """The event sink of a reported run (see the module docstring). ``say``: where a line
    about the platform's reachability goes (the run's progress)."""

    def __init__(
        self,
        platform: Platform,
        run_id: int,
        workdir: Path,
        *,
        interval: float = 0.5,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.platform, self.run_id, self.workdir = platform, run_id, workdir
        self.interval, self.say = interval, say or (lambda line: None)
        state = json.loads((workdir / STATE).read_text())
        self.acked = int(state.get("acked", 0))
        self.pending: list[dict[str, Any]] = []  # spooled, not acknowledged, in order
        spool = workdir / SPOOL
        self.seq = 0
        if spool.exists():
            for line in spool.read_text().splitlines():
                if line.strip():
                    event = json.loads(line)
                    self.seq = max(self.seq, int(event["seq"]))
                    if event["seq"] > self.acked:
                        self.pending.append(event)
        self.spool = spool.open("a", encoding="utf-8")
        self.stop_requested = ""
        self.error = ""
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closing = False
        self.thread = threading.Thread(target=self._loop, name="gyre-reporter", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ the sink

    def emit(self, event: ev.Event) -> None:
        with self.lock:
            self.seq += 1
            record = {"seq": self.seq, **event.to_json()}
            self.spool.write(json.dumps(record) + "\n")
            self.spool.flush()
            self.pending.append(record)
            if len(self.pending) >= BATCH:
                self.wake.set()

    def flush(self) -> None:
        self.wake.set()

    def should_stop(self) -> bool:
        return self.stop_requested in ("cancel", "pause")

    def close(self, wait_s: float = 60.0) -> int:
        """Send what is left (for at most ``wait_s`` seconds) and stop -> the events still
        unsent (they stay in the spool; ``gyre report WORKDIR`` sends them later)."""
        self.closing = True
        self.wake.set()
        self.thread.join(timeout=wait_s)
        self.closing = True
        with self.lock:
            self.spool.close()
            return len(self.pending)

    # ------------------------------------------------------------------ sending

    def _loop(self) -> None:
        tries = 0
        while True:
            self.wake.wait(self.interval)
            self.wake.clear()
            while True:
                with self.lock:
                    batch = self.pending[:BATCH]
                if not batch:
                    break
                try:
                    self._send(batch)
                except Unreachable as err:
                    if tries == 0:
                        self.say(f"platform unreachable ({err}); events kept in {SPOOL}")
                    time.sleep(BACKOFF_S[min(tries, len(BACKOFF_S) - 1)])
                    tries += 1
                    continue  # close() bounds the wait by joining with a timeout
                except ReportError as err:
                    self.error = str(err)
                    self.say(f"platform refused the events: {err}")
                    return
                if tries:
                    self.say("platform reachable again; catching up")
                tries = 0
            if self.closing:
                return

    def _send(self, batch: list[dict[str, Any]]) -> None:
        first = int(batch[0]["seq"])
        events = [{k: v for k, v in e.items() if k != "seq"} for e in batch]
        status, answer = self.platform.post(
            f"/api/runs/{self.run_id}/report-events/", {"first": first, "events": events}
        )
        if status == 409 and answer.get("field") == "first":
            expected = int(answer["expected"])  # the platform has all before it
            if expected - 1 < self.acked:  # it lost some it had acknowledged: resend them
                self._rewind(expected)
            self._acknowledge(expected - 1)
            return
        if status == 409:  # the run takes no more events (ended from the web): stop it
            self.stop_requested = "cancel"
            raise ReportError(str(answer.get("detail", answer)))
        self.stop_requested = str(answer.get("stop", ""))
        self._acknowledge(int(answer["next"]) - 1)

    def _rewind(self, expected: int) -> None:
        with self.lock:
            self.spool.flush()
            lines = (self.workdir / SPOOL).read_text().splitlines()
            self.pending = [e for e in map(json.loads, filter(None, lines)) if e["seq"] >= expected]
            self.acked = expected - 1

    def _acknowledge(self, acked: int) -> None:
        with self.lock:
            self.acked = max(self.acked, acked)
            self.pending = [e for e in self.pending if e["seq"] > self.acked]
            state = {"url": self.platform.url, "run": self.run_id, "acked": self.acked}
        _write_state(self.workdir, state)
