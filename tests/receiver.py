"""An HTTP server on a free port that records each JSON POST (a webhook's receiver)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


class Receiver:
    """Answers ``codes`` in turn (then 200); ``posts`` holds the bodies received."""

    def __init__(self, codes: list[int]) -> None:
        self.codes: list[int] = list(codes)
        self.posts: list[Any] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                receiver.posts.append(json.loads(self.rfile.read(length)))
                self.send_response(receiver.codes.pop(0) if receiver.codes else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
