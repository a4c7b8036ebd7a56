#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Bounded load generator for the sandbox: POST /generate through a balancer, every request recorded. Test-only.

    ip netns exec <hub> python loadgen.py --url http://10.200.0.1:8080/generate --clients 8 --duration 120 \
        --max-requests 5000 [--delay 0.5] [--tp 2] [--json OUT] [--stop-file PATH] \
        [--haproxy-socket SOCK | --smg-url http://10.200.0.1:8081]

Bounded: it stops after --duration seconds or --max-requests requests, whichever comes first, or as soon as
--stop-file exists or it gets SIGTERM/SIGINT (it then starts no new request and waits for those in flight). It only
targets the sandbox's own addresses (loopback and the sandbox fleet's 10.200.0.0/24); any other URL is refused before
a request is sent.

Each request's start, latency, HTTP status (0 with the error for a connection that failed) and whether the answer is
correct (the demo server's digests of the text by each of the --tp ranks) goes to --json, with the number of servers
in service sampled every 50 ms (HAProxy's `show stat` UP servers, or smg's healthy workers) when asked. The last line
printed is `N requests during the rollout, M failed`.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
import typing as t
import urllib.parse
import urllib.request

SANDBOX_NETS = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"),
                ipaddress.ip_network("10.200.0.0/24")]


def check_target(url: str) -> urllib.parse.SplitResult:
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise SystemExit("loadgen: %r is not an http:// URL" % url)
    try:
        ip = ipaddress.ip_address(u.hostname)
    except ValueError:
        raise SystemExit("loadgen: %r: give the sandbox address, not a name" % url)
    if not any(ip in n for n in SANDBOX_NETS):
        raise SystemExit("loadgen: %s is not a sandbox address (%s only)" % (ip, ", ".join(map(str, SANDBOX_NETS))))
    return u


def expected_text(text: str, tp: int, max_new: int) -> str:
    """What the demo server answers: each rank's digest of the text, at most max_new of them."""
    words = [hashlib.sha256(("%d:%s" % (r, text)).encode()).hexdigest()[:8] for r in range(tp)]
    return " ".join(words[:max(1, max_new)])


class Load:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.u = check_target(a.url)
        self.records: t.List[t.Dict[str, t.Any]] = []
        self.in_service: t.List[t.Tuple[float, int]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.n = 0
        self.t0 = time.time()

    def take(self) -> t.Optional[int]:
        with self.lock:
            if self.stop.is_set() or self.n >= self.a.max_requests or time.time() - self.t0 >= self.a.duration:
                self.stop.set()
                return None
            if self.a.stop_file and os.path.exists(self.a.stop_file):
                self.stop.set()
                return None
            self.n += 1
            return self.n

    def client(self, cid: int) -> None:
        conn: t.Optional[http.client.HTTPConnection] = None
        while True:
            i = self.take()
            if i is None:
                break
            text = "client %d request %d" % (cid, i)
            body = json.dumps({"text": text, "max_new_tokens": 8} if self.a.delay is None
                              else {"text": text, "max_new_tokens": 8, "delay": self.a.delay})
            rec: t.Dict[str, t.Any] = {"i": i, "client": cid, "start": round(time.time() - self.t0, 4)}
            t1 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.u.hostname, self.u.port or 80, timeout=self.a.timeout)
                conn.request("POST", self.u.path or "/generate", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                rec["status"] = r.status
                if r.status == 200:
                    try:
                        got = json.loads(data)["text"]
                    except (ValueError, KeyError, TypeError):
                        got = None
                    rec["correct"] = got == expected_text(text, self.a.tp, 8)
                else:
                    rec["error"] = data[:200].decode("utf-8", "replace")
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                rec["status"] = 0
                rec["error"] = "%s: %s" % (type(e).__name__, e)
                if conn is not None:
                    conn.close()
                conn = None
            rec["latency"] = round(time.monotonic() - t1, 4)
            with self.lock:
                self.records.append(rec)
        if conn is not None:
            conn.close()

    def sample(self) -> None:
        while not self.stop.is_set():
            try:
                n = self.count_in_service()
            except (OSError, ValueError, KeyError):
                n = -1  # the balancer did not answer: recorded as unknown, never as in service
            self.in_service.append((round(time.time() - self.t0, 3), n))
            self.stop.wait(0.05)

    def count_in_service(self) -> int:
        if self.a.haproxy_socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(self.a.haproxy_socket)
            s.sendall(b"show stat\n")
            out = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
            s.close()
            lines = out.decode().splitlines()
            head = lines[0].lstrip("# ").split(",")
            rows = [dict(zip(head, x.split(","))) for x in lines[1:] if x]
            return sum(1 for r in rows if r.get("pxname") == self.a.backend
                       and r.get("svname") not in ("FRONTEND", "BACKEND") and r.get("status", "").startswith("UP"))
        with urllib.request.urlopen(self.a.smg_url.rstrip("/") + "/workers", timeout=2) as r:
            return sum(1 for w in json.load(r)["workers"] if w.get("is_healthy"))

    def run(self) -> t.Dict[str, t.Any]:
        threads = [threading.Thread(target=self.client, args=(c,), daemon=True) for c in range(self.a.clients)]
        sampler = None
        if self.a.haproxy_socket or self.a.smg_url:
            sampler = threading.Thread(target=self.sample, daemon=True)
            sampler.start()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.stop.set()
        if sampler:
            sampler.join()
        return self.summary()

    def summary(self) -> t.Dict[str, t.Any]:
        recs = sorted(self.records, key=lambda r: r["i"])
        failed = [r for r in recs if r["status"] != 200 or not r.get("correct")]
        lat = sorted(r["latency"] for r in recs if r["status"] == 200)

        def pct(q: float) -> t.Optional[float]:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

        known = [n for _t, n in self.in_service if n >= 0]
        return {"requests": len(recs), "failed": len(failed), "p50": pct(0.50), "p99": pct(0.99),
                "statuses": {str(s): sum(1 for r in recs if r["status"] == s) for s in sorted({r["status"] for r in recs})},
                "failures": failed[:50], "min_in_service": min(known) if known else None,
                "unknown_samples": sum(1 for _t, n in self.in_service if n < 0), "in_service": self.in_service,
                "records": recs, "duration": round(time.time() - self.t0, 3)}


def main(argv: t.Optional[t.Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--url", required=True, help="http://ADDR:PORT/generate on a sandbox address")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=120, help="stop after this many seconds (at most 900)")
    ap.add_argument("--max-requests", type=int, default=5000, help="stop after this many requests (at most 100000)")
    ap.add_argument("--delay", type=float, help="seconds each request takes on the server (its `delay`)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds one request may take")
    ap.add_argument("--tp", type=int, default=2, help="the demo server's TP size (to check the answers)")
    ap.add_argument("--stop-file", help="stop (finishing what is in flight) once this file exists")
    ap.add_argument("--json", help="write every request and the in-service samples here")
    ap.add_argument("--haproxy-socket", help="sample UP servers of --backend from this admin socket")
    ap.add_argument("--backend", default="gpufleet")
    ap.add_argument("--smg-url", help="sample healthy workers from this smg (GET /workers)")
    a = ap.parse_args(argv)
    if not 1 <= a.clients <= 64 or not 0 < a.duration <= 900 or not 1 <= a.max_requests <= 100000:
        ap.error("--clients 1..64, --duration 0..900 s and --max-requests 1..100000 bound the load")
    if a.smg_url:
        check_target(a.smg_url)
    load = Load(a)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: load.stop.set())
    s = load.run()
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(s, f)
        os.replace(tmp, a.json)
    print("p50 %s s, p99 %s s, statuses %s, fewest in service %s" % (s["p50"], s["p99"], s["statuses"], s["min_in_service"]))
    print("%d requests during the rollout, %d failed" % (s["requests"], s["failed"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
