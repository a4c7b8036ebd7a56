# SPDX-License-Identifier: GPL-3.0-or-later
"""The SGLang Model Gateway's worker API, enough for the balancer target: ARGS PORT_FILE PID_FILE WORKER_URL..."""
from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORKERS = {"w%d" % i: {"id": "w%d" % i, "url": u, "is_healthy": True} for i, u in enumerate(sys.argv[3:])}


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"workers": list(WORKERS.values())}) if self.path == "/workers" else self._send(404, {})

    def do_POST(self):
        url = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}").get("url")
        wid = "w%d" % (len(WORKERS) + 100)
        WORKERS[wid] = {"id": wid, "url": url, "is_healthy": True}
        self._send(202, {"id": wid})

    def do_DELETE(self):
        self._send(200 if WORKERS.pop(self.path.rsplit("/", 1)[-1], None) else 404, {})


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
