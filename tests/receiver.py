"""An HTTP server on a free port that records each JSON POST (a webhook's receiver)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Answers ``codes`` in turn (then 200), each after ``delays`` in turn (then at once);
    ``posts`` holds the bodies received, ``arrived_at`` when the last one came
    (time.monotonic)."""

    def __init__(self, codes: list[int], delays: list[float] | None = None) -> None:
        self.codes: list[int] = list(codes)
        self.delays: list[float] = list(delays or [])
        self.arrived_at = 0.0
        self.posts: list[Any] = []
        self.hosts: list[str] = []  # each post's Host header
        self.paths: list[str] = []  # and path
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                receiver.hosts.append(self.headers.get("Host", ""))
                receiver.paths.append(self.path)
                receiver.posts.append(json.loads(self.rfile.read(length)))
                receiver.arrived_at = time.monotonic()
                time.sleep(receiver.delays.pop(0) if receiver.delays else 0.0)
                self.send_response(receiver.codes.pop(0) if receiver.codes else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
