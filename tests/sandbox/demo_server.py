#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""TEST DOUBLE: a small inference server of the SGLang shape, for GPU-less tests and the demo. Stdlib only.

    python3 demo_server.py --port 30000 --tp 2 --gpus 0,1 --mib 20000 [--host 0.0.0.0] [--state-dir DIR]
        [--startup-delay S] [--fail-at-startup] [--hang-after-health] [--ignore-term] [--model NAME] [--log FILE]
        [--generate-delay S] [--drain-timeout S] [--startup-gate FILE]

    --port 0 binds a free port; launcher.json (in the state dir) and the "fired up" log line name the port bound.

- The launcher starts one worker per TP rank with multiprocessing's 'spawn' context (like sglang's
  schedulers). Workers are non-daemonic and get no parent-death signal: when the launcher dies by
  SIGKILL they live on as orphans that still hold their GPU memory (sglang#23627, vllm#55510).
- Each worker holds `--mib` of fake GPU memory on its GPU through the test-only fake NVML's
  `fake_gpu.hold()` (if `fake_gpu` is importable; otherwise it holds nothing), records the NCCL_* and
  GPUFLEET_* variables of its environment in DIR/worker-<rank>.json, and answers requests.
- HTTP (threaded http.server): GET /health -> 200 once all workers are up (503 while loading);
  POST /generate {"text": ..., "max_new_tokens": N} -> JSON computed by a round trip through every
  worker (a hung worker hangs the request); GET /health_generate = a tiny /generate;
  GET /get_model_info; GET /workers -> the workers' records (pid, gpu, recorded env). The /generate answer is
  SGLang's: {"text": ..., "meta_info": {"completion_tokens": N, "prompt_tokens": ..., "id": ..., "workers": [...]}}
  with N = max_new_tokens (default 8), the count server_bench reads.
- `GPUFLEET_DEMO_TOKEN_DELAY_S` (read by each worker from its environment; default 0): seconds each worker sleeps per
  generated token (max_new_tokens of the request) before it answers. A STAND-IN for a slower server (a slower GPU,
  a worse NCCL setting, a regressed build), so server_bench can measure a throughput drop without a GPU: nothing is
  generated. The TP group serves one request at a time (its round trip is serialised, as it always was here), so
  with a delay D the server gives at most 1/D output tokens per second, whatever the client's concurrency.
- Like SGLang and vLLM behind a balancer: POST /generate takes `--generate-delay` seconds (or the request's own
  `"delay"`, in seconds) besides the worker round trip, so requests are in flight when a drain starts; GET /metrics
  answers in Prometheus text format with SGLang's gauges `sglang:num_running_reqs` (requests being generated) and
  `sglang:num_queue_reqs` (waiting for the TP group). A request's `"until": PATH` keeps it running until PATH
  exists (at most its `"delay"`, default 600 s): a test ends it when the behaviour it checks has happened, not after
  a guess of how long that takes on a busy machine. GET /stats counts the GET /metrics answered so far
  (`{"metrics_reads": N}`): a test can tell that a poller has read the metrics without reading them itself.
  SIGTERM to the launcher drains: it stops accepting (the
  listening socket closes; a request on a kept-alive connection gets 503 with `Connection: close`), lets the
  requests in flight finish (at most `--drain-timeout` seconds, default 60), then stops its workers and exits 0.
  A SIGTERM sent to the workers themselves during the drain ends them, and the requests in flight then fail (what a
  kill that signals the whole tree at once does to a real server).
- `--startup-gate FILE`: the workers wait until FILE exists before their `--startup-delay` (a test holds a
  restart between its launch and its readiness for as long as it needs, whatever the machine's speed).
- `--hang-after-health`: /health says 200, but workers never answer, so /generate never returns
  (sglang#22779). `--fail-at-startup`: logs an error and exits 1. `--ignore-term`: the launcher and the
  workers ignore SIGTERM (only SIGKILL ends them). Without it, SIGTERM to the launcher stops the
  workers and exits 0; a worker dying unexpectedly makes the launcher stop the others and exit 1.
- `--log FILE`: the launcher's messages (its errors included) are appended to FILE instead of stderr, as a
  server with its own log file does; stdout/stderr (the launch log) then get none of them.
- With NCCL_DEBUG=INFO, each worker writes to its log (the launcher's stderr) an IMITATION of the lines
  real NCCL logs when it reads its environment, in NCCL's format, e.g.
  `host1:4242:4242 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS` (NCCL's int64 parameters
  end with a period: `NCCL_NVLS_ENABLE set by environment to 0.`). No NCCL is involved.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import typing as t
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RECORDED_PREFIXES = ("NCCL_", "GPUFLEET_")
TOKEN_DELAY_VAR = "GPUFLEET_DEMO_TOKEN_DELAY_S"  # the stand-in for a slower server (module docstring)
# NCCL's own debug knobs are not parameters it reports as "set by environment".
NCCL_NOT_REPORTED = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
NCCL_VERSION = "2.21.5+cuda12.4"


LOG_FILE: t.Optional[str] = None  # --log


def log(msg: str) -> None:
    line = "[%s demo_server %d] %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), os.getpid(), msg)
    if LOG_FILE:
        with open(LOG_FILE, "a") as f:
            f.write(line)
        return
    sys.stderr.write(line)
    sys.stderr.flush()


def recorded_env() -> t.Dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_PREFIXES)}


def nccl_info_lines(rank: int, env: t.Mapping[str, str]) -> t.List[str]:
    """Imitation of NCCL's INFO lines about its environment (only when NCCL_DEBUG=INFO or TRACE)."""
    if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        return []
    head = "%s:%d:%d [%d] NCCL INFO " % (socket.gethostname().split(".")[0], os.getpid(), threading.get_native_id(), rank)
    lines = [head + "NCCL version " + NCCL_VERSION] if rank == 0 else []
    for k in sorted(env):
        if not k.startswith("NCCL_") or k in NCCL_NOT_REPORTED or env[k] == "":
            continue
        v = env[k]
        try:
            v = "%d." % int(v, 0)  # ncclLoadParam: "%s set by environment to %lld."
        except ValueError:
            pass
        lines.append(head + "%s set by environment to %s" % (k, v))
    return lines


def token_delay() -> float:
    """Seconds per generated token, from TOKEN_DELAY_VAR (0 when unset; a bad value fails the worker at start)."""
    raw = os.environ.get(TOKEN_DELAY_VAR, "").strip()
    delay = float(raw) if raw else 0.0
    if not delay >= 0:
        raise ValueError("%s must be a number of seconds >= 0, got %r" % (TOKEN_DELAY_VAR, raw))
    return delay


def worker_main(rank: int, gpu: int, mib: int, state_dir: str, requests: t.Any, replies: t.Any, ready: t.Any,
                startup_delay: float, ignore_term: bool, hang: bool, gate: t.Optional[str] = None) -> None:
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    env = recorded_env()
    per_token = token_delay()
    for line in nccl_info_lines(rank, env):
        sys.stderr.write(line + "\n")
    sys.stderr.flush()
    held = None
    try:
        import fake_gpu  # the test-only fake NVML's holder API, when installed (sandbox hosts)
    except ImportError:
        fake_gpu = None
    if fake_gpu is not None:
        held = fake_gpu.hold(gpu, mib)
    record = {"rank": rank, "gpu": gpu, "pid": os.getpid(), "ppid": os.getppid(), "mib": mib if held else 0,
              "env": env}
    tmp = os.path.join(state_dir, "worker-%d.json.tmp" % rank)
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.rename(tmp, os.path.join(state_dir, "worker-%d.json" % rank))
    while gate and not os.path.exists(gate):
        time.sleep(0.05)
    time.sleep(startup_delay)  # "loading weights"
    ready.put(record)
    while True:
        try:
            req = requests.get()
        except (EOFError, OSError):
            break  # launcher gone: live on as an orphan, still holding the GPU
        if hang:
            break  # sglang#22779: healthy on /health, never answers a real request
        if per_token > 0:
            time.sleep(per_token * max(0, int(req.get("tokens", 1))))  # the stand-in for generation time
        digest = hashlib.sha256(("%d:%s" % (rank, req["text"])).encode()).hexdigest()[:8]
        replies.put({"id": req["id"], "rank": rank, "pid": os.getpid(), "gpu": gpu, "digest": digest})
    while True:
        time.sleep(3600)


class Server:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: t.List[t.Any] = []
        self.records: t.List[t.Dict[str, t.Any]] = []
        self.ready = False
        self.stopping = False
        self.lock = threading.Lock()
        self.next_id = 0
        self.requests: t.List[t.Any] = []
        self.replies = self.ctx.Queue()
        self.ready_q = self.ctx.Queue()
        self.draining = False
        self.running = 0  # in /generate past the queue (the "decode" delay and the TP round trip)
        self.queued = 0  # waiting for the TP group
        self.metrics_reads = 0  # GET /metrics answered (GET /stats)
        self.count_lock = threading.Lock()
        self.httpd: t.Optional[ThreadingHTTPServer] = None

    def start_workers(self) -> None:
        for rank in range(self.a.tp):
            q = self.ctx.Queue()
            p = self.ctx.Process(target=worker_main, name="demo-tp%d" % rank, daemon=False,
                                 args=(rank, self.a.gpus[rank], self.a.mib, self.a.state_dir, q, self.replies,
                                       self.ready_q, self.a.startup_delay, self.a.ignore_term, self.a.hang_after_health,
                                       self.a.startup_gate))
            p.start()
            self.requests.append(q)
            self.workers.append(p)
        self.write_state()

    def wait_ready(self) -> None:
        recs = []
        while len(recs) < len(self.workers):
            try:
                recs.append(self.ready_q.get(timeout=0.2))
            except Exception:  # queue.Empty
                dead = [p for p in self.workers if p.exitcode is not None]
                if dead:
                    raise RuntimeError("worker %s exited with %s during startup" % (dead[0].name, dead[0].exitcode))
        self.records = sorted(recs, key=lambda r: r["rank"])
        self.ready = True
        self.write_state()

    def write_state(self) -> None:
        st = {"pid": os.getpid(), "port": self.a.port, "tp": self.a.tp, "gpus": self.a.gpus, "ready": self.ready,
              "workers": [p.pid for p in self.workers]}
        tmp = os.path.join(self.a.state_dir, "launcher.json.tmp")
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.rename(tmp, os.path.join(self.a.state_dir, "launcher.json"))

    def count(self, running: int = 0, queued: int = 0) -> None:
        with self.count_lock:
            self.running += running
            self.queued += queued

    def generate_timed(self, text: str, max_new_tokens: int, delay: float,
                       until: t.Optional[str] = None) -> t.Dict[str, t.Any]:
        """A request as the metrics see it: queued for the TP group, then running for `delay` s (or until the file
        `until` exists, at most `delay` s) plus the round trip."""
        self.count(queued=1)
        try:
            with self.lock:  # serialise only the queue hand-over; generation itself overlaps (continuous batching)
                pass
        finally:
            self.count(queued=-1)
        self.count(running=1)
        try:
            if until:
                deadline = time.monotonic() + delay
                while not os.path.exists(until) and time.monotonic() < deadline:
                    time.sleep(0.05)
            elif delay > 0:
                time.sleep(delay)
            return self.generate(text, max_new_tokens)
        finally:
            self.count(running=-1)

    def metrics(self) -> str:
        with self.count_lock:
            running, queued = self.running, self.queued
        label = '{model_name="%s"}' % self.a.model.replace('"', '')
        out = []
        for name, help_, v in (("sglang:num_running_reqs", "The number of running requests.", running),
                               ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queued)):
            out += ["# HELP %s %s" % (name, help_), "# TYPE %s gauge" % name, "%s%s %.1f" % (name, label, v)]
        return "\n".join(out) + "\n"

    def drain_and_stop(self) -> None:
        """SIGTERM: stop accepting, finish what is in flight (bounded), then stop the workers and exit 0."""
        self.draining = True
        log("SIGTERM: draining (no new requests; %d running, %d queued)" % (self.running, self.queued))
        if self.httpd is not None:
            self.httpd.shutdown()  # the accept loop ends; handler threads of open connections go on
            self.httpd.server_close()  # new connections are refused from now on
        deadline = time.monotonic() + self.a.drain_timeout
        while (self.running or self.queued) and time.monotonic() < deadline:
            time.sleep(0.02)
        log("drained (%d running, %d queued left); stopping the workers" % (self.running, self.queued))
        self.stop(0)

    def generate(self, text: str, max_new_tokens: int) -> t.Dict[str, t.Any]:
        with self.lock:  # one request at a time through the TP group, like a single batch
            self.next_id += 1
            rid = self.next_id
            for q in self.requests:
                q.put({"id": rid, "text": text, "tokens": max_new_tokens})
            parts = []
            while len(parts) < len(self.requests):
                r = self.replies.get()  # no timeout: a hung worker hangs the request
                if r["id"] == rid:
                    parts.append(r)
        parts.sort(key=lambda r: r["rank"])
        words = [p["digest"] for p in parts][:max(1, max_new_tokens)]
        meta = {"id": rid, "prompt_tokens": len(text.split()), "completion_tokens": max(0, max_new_tokens),
                "workers": [{k: p[k] for k in ("rank", "pid", "gpu")} for p in parts]}
        return {"text": " ".join(words), "meta_info": meta}

    def watch_workers(self) -> None:
        while not self.stopping:
            if self.draining:
                self.drain_and_stop()
            for p in self.workers:
                if p.exitcode is not None and not self.stopping:
                    log("worker %s (pid %d) exited unexpectedly with %s; stopping the server" % (p.name, p.pid, p.exitcode))
                    self.stop(1)
            time.sleep(0.2)

    def stop(self, code: int) -> None:
        self.stopping = True
        for p in self.workers:
            if p.exitcode is None:
                p.terminate()
        for p in self.workers:
            p.join(5)
        os._exit(code)


def make_handler(server: Server) -> t.Type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: t.Any) -> None:
            log("%s %s" % (self.address_string(), fmt % args))

        def reply(self, code: int, body: t.Any, ctype: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            if server.draining:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/health":
                if server.draining:
                    self.reply(503, {"status": "shutting down"})
                    return
                self.reply(200 if server.ready else 503, {"status": "ok" if server.ready else "loading"})
            elif path == "/stats":
                self.reply(200, {"metrics_reads": server.metrics_reads})
            elif path == "/metrics":
                with server.count_lock:
                    server.metrics_reads += 1
                self.reply(200, server.metrics(), "text/plain; version=0.0.4")
            elif path == "/health_generate":
                if not server.ready:
                    self.reply(503, {"status": "loading"})
                else:
                    self.reply(200, server.generate("ping", 1))
            elif path == "/get_model_info":
                self.reply(200, {"model_path": server.a.model, "tp_size": server.a.tp, "is_generation": True})
            elif path == "/workers":
                self.reply(200, {"ready": server.ready, "workers": server.records})
            else:
                self.reply(404, {"error": "not found: " + path})

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            if path != "/generate":
                self.reply(404, {"error": "not found: " + path})
                return
            if not server.ready:
                self.reply(503, {"error": "server is loading"})
                return
            if server.draining:
                self.reply(503, {"error": "server is shutting down"})
                return
            try:
                body = json.loads(raw or b"{}")
                text = str(body.get("text", ""))
                max_new = int(body.get("max_new_tokens", body.get("sampling_params", {}).get("max_new_tokens", 8)))
                until = body.get("until")
                delay = float(body.get("delay", 600.0 if until else server.a.generate_delay))
            except (ValueError, AttributeError, TypeError) as e:
                self.reply(400, {"error": "bad request body: %s" % e})
                return
            self.reply(200, server.generate_timed(text, max_new, delay, str(until) if until else None))

    return Handler


def parse_args(argv: t.Optional[t.Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Demo inference server (test double of the SGLang shape).")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size = number of workers")
    ap.add_argument("--gpus", help="comma-separated GPU index per rank (default: 0..tp-1)")
    ap.add_argument("--mib", type=int, default=20000, help="fake GPU memory each worker holds")
    ap.add_argument("--model", default="demo/tiny-model")
    ap.add_argument("--state-dir", help="where launcher.json and worker-<rank>.json go "
                                        "(default $GPUFLEET_DEMO_STATE_DIR or /tmp/gpufleet-demo/<port>)")
    ap.add_argument("--startup-delay", type=float, default=0.0, help="seconds workers take to 'load weights'")
    ap.add_argument("--startup-gate", help="the workers wait until this file exists before --startup-delay")
    ap.add_argument("--fail-at-startup", action="store_true")
    ap.add_argument("--hang-after-health", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--log", help="append the server's messages to this file instead of stderr")
    ap.add_argument("--generate-delay", type=float, default=0.0,
                    help="seconds each /generate takes besides the worker round trip (a request's \"delay\" wins)")
    ap.add_argument("--drain-timeout", type=float, default=60.0,
                    help="on SIGTERM, at most this long for the requests in flight to finish")
    a = ap.parse_args(argv)
    if a.tp < 1:
        ap.error("--tp must be at least 1")
    if a.gpus:
        try:
            a.gpus = [int(x) for x in a.gpus.split(",")]
        except ValueError:
            ap.error("--gpus must be comma-separated integers, got %r" % a.gpus)
    else:
        a.gpus = list(range(a.tp))
    if len(a.gpus) < a.tp:
        ap.error("--gpus lists %d GPUs for --tp %d" % (len(a.gpus), a.tp))
    a.state_dir = a.state_dir or os.environ.get("GPUFLEET_DEMO_STATE_DIR") or "/tmp/gpufleet-demo/%d" % a.port
    return a


def main(argv: t.Optional[t.Sequence[str]] = None) -> int:
    global LOG_FILE
    a = parse_args(argv)
    LOG_FILE = a.log
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log("server_args: port=%d tp=%d gpus=%s mib=%d model=%s" % (a.port, a.tp, a.gpus, a.mib, a.model))
    if a.fail_at_startup:
        time.sleep(a.startup_delay)
        log("RuntimeError: demo failure at startup (--fail-at-startup): not enough memory to load the model")
        return 1
    os.makedirs(a.state_dir, exist_ok=True)
    for n in os.listdir(a.state_dir):
        if n.startswith(("worker-", "launcher.")):
            os.unlink(os.path.join(a.state_dir, n))
    server = Server(a)
    httpd = ThreadingHTTPServer((a.host, a.port), make_handler(server))
    a.port = httpd.server_address[1]  # the port bound (--port 0: a free one)
    httpd.daemon_threads = True
    server.httpd = httpd
    if not a.ignore_term:
        # Only a flag: the main thread (watch_workers) drains, so the handler never blocks a request thread.
        def on_term(*_: t.Any) -> None:
            if not server.ready:
                server.stop(0)  # nothing to drain while loading
            server.draining = True
        signal.signal(signal.SIGTERM, on_term)
    server.start_workers()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server.wait_ready()
    except RuntimeError as e:
        log("RuntimeError: %s" % e)
        server.stop(1)
    log("The server is fired up and ready to roll! (http://%s:%d, workers %s)"
        % (a.host, a.port, [p.pid for p in server.workers]))
    server.watch_workers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
