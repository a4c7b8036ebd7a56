# SPDX-License-Identifier: GPL-3.0-or-later
"""Test fixtures for the balancer code: a unix-socket server speaking HAProxy's admin text protocol (`show stat`,
`set server B/S state ...`) and an HTTP server speaking the SGLang Model Gateway's worker API (GET/POST /workers,
DELETE /workers/ID). Real sockets and real HTTP; tests/rollout/test_drain.py and test_drain_recovery.py
run the real HAProxy and smg."""
from __future__ import annotations

import json
import os
import socket
import threading
import typing as t
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATES = {"maint": "MAINT", "ready": "UP", "drain": "DRAIN"}


class FakeHAProxy:
    def __init__(self, path: str, servers: t.Dict[t.Tuple[str, str], str]) -> None:
        self.path = path
        self.servers = {k: {"status": v, "weight": "1"} for k, v in servers.items()}
        # show stat's addr column (HAProxy 1.7+), "IP:PORT" by (backend, server): shown once a test sets one.
        self.addrs: t.Dict[t.Tuple[str, str], str] = {}
        self.lastsess: t.Dict[t.Tuple[str, str], str] = {}
        self.commands: t.List[str] = []
        # Called with the command before it is answered: a test's "reload" (MAINT forgotten) or operator action.
        self.hook: t.Optional[t.Callable[[str], None]] = None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.th = threading.Thread(target=self._serve, daemon=True)
        self.th.start()

    def _serve(self) -> None:
        while True:
            try:
                c = self.sock.accept()[0]
            except OSError:
                return
            with c:
                line = c.makefile("rb").readline().decode().strip()
                self.commands.append(line)
                if self.hook:
                    self.hook(line)
                c.sendall(self.answer(line).encode())

    def answer(self, line: str) -> str:
        if line == "show stat":
            # The optional columns a test set values of (addr: HAProxy 1.7+; lastsess: seconds since the server's last
            # session, -1 never), each by (backend, server).
            extra = [(name, col) for name, col in (("addr", self.addrs), ("lastsess", self.lastsess)) if col]
            out = ["# pxname,svname,qcur,status,weight," + "".join(name + "," for name, _col in extra)]
            for b in sorted({k[0] for k in self.servers}):
                out.append("%s,FRONTEND,,OPEN,,%s" % (b, "," * len(extra)))
                for (bk, s), v in sorted(self.servers.items()):
                    if bk == b:
                        out.append("%s,%s,0,%s,%s,%s" % (bk, s, v["status"], v["weight"],
                                                         "".join(col.get((bk, s), "") + "," for _name, col in extra)))
                out.append("%s,BACKEND,0,UP,1,%s" % (b, "," * len(extra)))
            return "\n".join(out) + "\n\n"
        parts = line.split()
        if parts[:2] == ["set", "server"] and len(parts) == 5 and parts[3] == "state":
            b, s = parts[2].split("/", 1)
            if (b, s) not in self.servers:
                return "No such server.\n\n"
            self.servers[(b, s)]["status"] = STATES[parts[4]]
            return "\n"
        return "Unknown command.\n\n"

    def status(self, backend: str, server: str) -> str:
        return self.servers[(backend, server)]["status"]

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)


class _RouterHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code: int, body: t.Any = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _seen(self) -> None:
        self.server.calls.append((self.command, self.path, dict(self.headers)))

    def do_GET(self):
        self._seen()
        if self.server.broken:
            return self._send(500, {})
        if self.path.split("?")[0] == "/workers":
            return self._send(200, {"workers": list(self.server.workers.values())})
        return self._send(404, {})

    def do_POST(self):
        self._seen()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.server.broken:
            return self._send(500, {})
        if self.path.startswith("/workers") and self.server.breaks:
            self.server.broken = True  # a router that broke at the add: HTTP 500 to it and to every request after it
            return self._send(500, {})
        if self.path.startswith("/workers"):
            self.server.next_id += 1
            wid = "w%d" % self.server.next_id
            self.server.workers[wid] = {"id": wid, "url": body.get("url"), "is_healthy": True}
            return self._send(202, {"id": wid})
        self.server.bodies.append(body)
        return self._send(self.server.code)

    def do_DELETE(self):
        self._seen()
        if self.server.broken:
            return self._send(500, {})
        wid = self.path.rsplit("/", 1)[-1]
        if self.path.startswith("/workers/") and self.server.workers.pop(wid, None) is not None:
            return self._send(200, {})
        return self._send(self.server.code if not self.path.startswith("/workers/") else 404, {})

    do_PUT = do_POST


def router(workers: t.Sequence[str], breaks: bool = False) -> ThreadingHTTPServer:
    """A router on 127.0.0.1 listing `workers`. With `breaks`, it refuses the add of a worker (HTTP 500) and answers
    every request after it with HTTP 500: a router that broke during the restart."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _RouterHandler)
    srv.daemon_threads = True
    srv.workers = {"w%d" % i: {"id": "w%d" % i, "url": u, "is_healthy": True} for i, u in enumerate(workers)}
    srv.next_id, srv.calls, srv.bodies, srv.code = len(workers), [], [], 200
    srv.breaks, srv.broken = breaks, False
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = "http://127.0.0.1:%d" % srv.server_address[1]
    return srv
