#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""A small REAL GPU server of the SGLang shape, for the H200 end-to-end run (tests/gpu/run_e2e.sh).

    python3 real_server.py --port 30000 --workers 2 --gib 20 --log-dir /var/log/gpufleet-gpu

- The launcher starts `--workers` workers with multiprocessing 'spawn' (like SGLang's TP schedulers).
- Each worker allocates `--gib` GiB on its GPU with torch, initialises NCCL through torch.distributed
  and runs an all_reduce. With one GPU, NCCL refuses two ranks of one communicator on the same GPU
  ("Duplicate GPU detected"), so each worker gets its own size-1 communicator (world size 1, its own
  file store); with several GPUs (--one-communicator) the workers form one communicator, a rank a GPU.
- NCCL logs go where NCCL_DEBUG_FILE says (the launcher sets NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV
  only if they are not set already, so the logs show what NCCL read from its environment).
- HTTP: GET /health -> 200 once every worker finished its all_reduce; POST /generate -> a round trip
  through every worker that runs another all_reduce and returns its sum. With `{"max_new_tokens": N}` in the body
  each worker first does N "tokens" of real GPU work (a token: MATMULS fp32 matmuls of 4096x4096, TF32 allowed as
  inference servers allow it), and the answer carries SGLang's `meta_info.completion_tokens` = N: the performance
  gate's stand-in for decoding. `NVIDIA_TF32_OVERRIDE=0` in the server's environment turns TF32 off in the CUDA
  libraries (a real setting that really slows fp32 matmuls), the slower definition the gate must catch.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MATMULS = 8  # fp32 4096x4096 matmuls per generated token


def worker(rank: int, world: int, gpu: int, gib: float, store_dir: str, one_comm: bool, req_q, resp_q) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(gpu)
    hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")  # noqa: F841 (held)
    if one_comm:
        dist.init_process_group("nccl", init_method="file://%s/store" % store_dir, rank=rank, world_size=world)
    else:
        dist.init_process_group("nccl", init_method="file://%s/store-%d" % (store_dir, rank), rank=0, world_size=1)
    x = torch.ones(1 << 20, device="cuda") * (rank + 1)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    torch.backends.cuda.matmul.allow_tf32 = True  # as inference servers run fp32 matmuls
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    resp_q.put(("ready", rank, float(x[0].item()), os.getpid()))
    while True:
        msg = req_q.get()
        if msg is None:
            break
        value, tokens = msg if isinstance(msg, tuple) else (msg, 0)
        for _token in range(tokens):
            for _m in range(MATMULS):
                a = torch.mm(a, b) * (1.0 / 64)  # 1/sqrt(4096): the values keep their scale
        y = torch.ones(1 << 16, device="cuda") * value
        dist.all_reduce(y)
        torch.cuda.synchronize()
        resp_q.put(("result", rank, float(y[0].item()), os.getpid()))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gib", type=float, default=20)
    ap.add_argument("--store-dir", default="/tmp/gpufleet-gpu-store")
    ap.add_argument("--one-communicator", action="store_true", help="one NCCL communicator, a rank a GPU")
    a = ap.parse_args()
    import shutil
    shutil.rmtree(a.store_dir, ignore_errors=True)
    os.makedirs(a.store_dir)
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV")
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    ngpu = int(os.environ.get("GPUFLEET_TEST_GPUS", "1"))
    reqs = [ctx.Queue() for _rank in range(a.workers)]
    resp = ctx.Queue()
    procs = []
    for r in range(a.workers):
        gpu = r % ngpu if a.one_communicator else 0
        p = ctx.Process(target=worker, args=(r, a.workers, gpu, a.gib, a.store_dir, a.one_communicator, reqs[r], resp))
        p.start()
        procs.append(p)
    state = {"ready": 0, "pids": []}
    lock = threading.Lock()

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path.startswith("/health") and state["ready"] == a.workers
            body = json.dumps({"ready": state["ready"], "workers": state["pids"]}).encode()
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            try:
                tokens = int(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                             .get("max_new_tokens") or 0)
            except (ValueError, AttributeError):
                tokens = 0
            with lock:
                for q in reqs:
                    q.put((1.0, tokens))
                out = [resp.get(timeout=120) for _q in reqs]
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"text": "pong", "sums": [o[2] for o in out],
                                         "meta_info": {"completion_tokens": tokens}}).encode())

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", a.port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    while state["ready"] < a.workers:
        kind, rank, val, pid = resp.get()
        state["ready"] += 1
        state["pids"].append(pid)
        print("worker %d (pid %d) ready, all_reduce=%s" % (rank, pid, val), flush=True)
    print("server ready after %.2f s (startup_s=%.3f)" % (time.monotonic() - t0, time.monotonic() - t0), flush=True)
    for p in procs:
        p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
