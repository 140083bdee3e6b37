"""A local HTTP server with a vLLM server's weight-update routes: it records every POST
(path without its query, JSON body) and answers ``GET /weight_info`` with the version last
tagged (``/update_weight_version``), or with ``serves`` when given (a server whose weights
stay at one version, as one that restarted would report)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class UpdateServer:
    def __init__(self, serves: str | None = None) -> None:
        posts: list[tuple[str, Any]] = []
        self.posts = posts

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, data: object) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                tagged = [b["new_version"] for p, b in posts if p == "/update_weight_version"]
                last = tagged[-1] if tagged else "0"
                self._reply({"weight_version": serves if serves is not None else last})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                posts.append((self.path.split("?")[0], json.loads(raw) if raw else None))
                self._reply({})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
