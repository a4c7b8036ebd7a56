#!/usr/bin/env python
# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""How long after a GPU holder's death does gpu_wait return?  (fake NVML driver, real processes)

    .venv/bin/python bench/gpu_wait_latency.py [--repeats 20] [--module-repeats 5] [--release-delay 0.15]

For each repeat a real process holds 40 GiB of fake GPU memory (tests/fakes/nvml: freed
--release-delay s after the holder dies, like an H200's 0.12-0.19 s), then gets SIGKILL. Times are
CLOCK_MONOTONIC, shared by every process on the host, measured from the moment SIGKILL is sent:

  reference      a separate process reading NVML in a tight loop (no sleep): first read that sees
                 the GPU clean. This is when the memory was actually released.
  wait()         _gpuwait.wait() in-process (default 20 ms poll) returns.
  module         the gpu_wait module process, run by ansible-playbook against localhost, exits
                 (found as the playbook's pipelined module interpreter and watched through a pidfd).
  seed           the hand-run `kill -9 ...; sleep 3 && nvidia-smi`: 3 s plus one read (modelled; one
                 read measured here), and it looks once, whatever the driver did meanwhile.

Target: wait() within 50 ms of the reference. Prints a table; writes JSON to bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import typing as t
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from collection_copy import private_collections  # noqa: E402
from helpers import FAKE_NVML_DIR, PY, FakeGpus, wait_for  # noqa: E402

sys.path.insert(0, str(FAKE_NVML_DIR))  # the fake pynvml, before _nvml imports it
sys.path.insert(0, str(private_collections()))

from ansible_collections.gpufleet.serving.plugins.module_utils import _gpuwait, _nvml  # noqa: E402

MIB = 40960

REFERENCE = r'''
import sys, time
sys.path.insert(0, %(fake)r)
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
busy = None
print("ready", flush=True)
while True:
    used = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
    now = time.monotonic()
    if (used > 0) != busy:
        busy = used > 0
        print("%%s %%.6f" %% ("busy" if busy else "clean", now), flush=True)
'''

PLAYBOOK = """
- name: gpu_wait latency bench
  hosts: all
  gather_facts: false
  tasks:
    - name: Wait for GPU 0 to be clean
      gpufleet.serving.gpu_wait:
        gpus: [0]
        timeout: 60
      register: r
    - name: Save the result
      ansible.builtin.copy:
        content: "{{ r | to_nice_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


class Reference:
    """A tight-loop NVML poller in its own process; reports busy/clean transitions with monotonic times."""

    def __init__(self, env: t.Dict[str, str]) -> None:
        self.p = subprocess.Popen([PY, "-c", REFERENCE % {"fake": str(FAKE_NVML_DIR)}], env=env,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None
        assert self.p.stdout.readline().strip() == "ready"
        self.lines: t.List[t.Tuple[str, float]] = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            kind, ts = line.split()
            with self.cv:
                self.lines.append((kind, float(ts)))
                self.cv.notify_all()

    def next_after(self, kind: str, after: float, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for k, ts in self.lines:
                    if k == kind and ts >= after:
                        return ts
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("reference poller saw no %s after %.3f" % (kind, after))
                self.cv.wait(left)

    def stop(self) -> None:
        self.p.kill()
        self.p.wait()


def _kill(holder: subprocess.Popen) -> float:
    t_kill = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    return t_kill


def bench_wait(fg: FakeGpus, ref: Reference, repeats: int, poll: float) -> t.List[t.Dict[str, float]]:
    out = []
    with _nvml.open_backend("nvml") as backend:
        for _i in range(repeats):
            holder = fg.hold(gpu=0, mib=MIB)
            ref.next_after("busy", 0)
            box: t.Dict[str, float] = {}

            def killer(h: subprocess.Popen = holder) -> None:
                time.sleep(0.2)
                box["kill"] = _kill(h)

            th = threading.Thread(target=killer)
            th.start()
            r = _gpuwait.wait(backend, [0], timeout=10, poll_interval=poll)
            t_ret = time.monotonic()
            th.join()
            assert r["ok"], r
            t_ref = ref.next_after("clean", box["kill"])
            out.append({"reference_s": t_ref - box["kill"], "wait_s": t_ret - box["kill"],
                        "wait_minus_reference_s": t_ret - t_ref, "polls": r["polls"]})
            fg.holders.remove(holder)
    return out


def _module_process(playbook: subprocess.Popen, timeout: float = 60) -> int:
    """The module interpreter: a descendant of ansible-playbook running AnsiballZ_gpu_wait.py (or, pipelined, bare PY)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = _descendants(playbook.pid)
        for pid in kids:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            args = [x for x in argv[1:] if x]
            if argv[:1] == [PY.encode()] and (not args or args[0].endswith(b"AnsiballZ_gpu_wait.py")):
                return pid
        if playbook.poll() is not None:
            raise RuntimeError("ansible-playbook exited before the module started")
        time.sleep(0.005)
    raise RuntimeError("module process not found")


def _descendants(root: int) -> t.List[int]:
    kids: t.Dict[int, t.List[int]] = {}
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                with open("/proc/%s/stat" % n) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(n))
    out, stack = [], [root]
    while stack:
        for c in kids.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def bench_module(fg: FakeGpus, ref: Reference, repeats: int, work: Path) -> t.Tuple[t.List[t.Dict[str, float]], int]:
    """Returns the runs, and how many were discarded because the module was not yet polling at the kill."""
    pb = work / "bench.yml"
    pb.write_text(PLAYBOOK)
    env = dict(fg.env, ANSIBLE_COLLECTIONS_PATH=str(private_collections()), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_NOCOLOR="1")
    out: t.List[t.Dict[str, float]] = []
    discarded = 0
    settle = 1.5  # module start-up (AnsiballZ, imports, nvmlInit) before it polls; grows if too short
    i = 0
    while len(out) < repeats:
        i += 1
        if discarded > 3 * repeats:
            raise RuntimeError("the module never polled before the kill; machine too loaded?")
        holder = fg.hold(gpu=0, mib=MIB)
        ref.next_after("busy", 0)
        res = work / ("result-%d.json" % i)
        play = subprocess.Popen([str(Path(PY).parent / "ansible-playbook"), str(pb), "-i", "localhost,", "-c", "local",
                                 "-e", "ansible_python_interpreter=%s" % PY, "-e", "out=%s" % res],
                                cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        mod = _module_process(play)
        fd = os.pidfd_open(mod)
        time.sleep(settle)
        t_kill = _kill(holder)
        p = select.poll()
        p.register(fd, select.POLLIN)
        p.poll(30000)
        t_exit = time.monotonic()
        os.close(fd)
        stdout, _err = play.communicate(timeout=120)
        fg.holders.remove(holder)
        if play.returncode != 0:
            raise RuntimeError(stdout[-3000:])
        r = json.loads(res.read_text())
        t_ref = ref.next_after("clean", t_kill)
        if r["polls"] < 3 or r["waited_s"] < (t_ref - t_kill):
            discarded += 1  # it was still starting when the memory was released: not a latency sample
            settle += 1.0
            continue
        out.append({"reference_s": t_ref - t_kill, "module_s": t_exit - t_kill, "module_minus_reference_s": t_exit - t_ref,
                    "module_waited_s": r["waited_s"], "polls": r["polls"], "settle_s": settle})
    return out, discarded


def one_read_s(n: int = 200) -> float:
    with _nvml.open_backend("nvml") as b:
        t0 = time.perf_counter()
        for _i in range(n):
            b.memory(0)
            b.processes(0)
        return (time.perf_counter() - t0) / n


def stats(xs: t.Sequence[float]) -> t.Dict[str, float]:
    s = sorted(xs)
    p95 = s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))]
    return {"n": len(s), "mean": statistics.mean(s), "p50": statistics.median(s), "p95": p95, "min": s[0], "max": s[-1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--module-repeats", type=int, default=5)
    ap.add_argument("--release-delay", type=float, default=0.15)
    ap.add_argument("--poll-interval", type=float, default=0.02, help="wait()'s poll interval (the module default)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    fg = FakeGpus(work / "nvml")
    fg.configure(gpus=1, release_delay_s=a.release_delay)
    os.environ["FAKE_NVML_CONFIG"] = str(fg.config)
    ref = Reference(fg.env)
    try:
        waits = bench_wait(fg, ref, a.repeats, a.poll_interval)
        mods, discarded = bench_module(fg, ref, a.module_repeats, work) if a.module_repeats else ([], 0)
        read = one_read_s()
    finally:
        ref.stop()
        fg.cleanup()

    rows = [
        ("reference: release seen by tight-loop poller", stats([w["reference_s"] for w in waits + mods])),
        ("_gpuwait.wait() returns (poll %.0f ms)" % (a.poll_interval * 1000), stats([w["wait_s"] for w in waits])),
        ("  wait() minus reference", stats([w["wait_minus_reference_s"] for w in waits])),
    ]
    if mods:
        rows += [("gpu_wait module process exits (ansible-playbook)", stats([m["module_s"] for m in mods])),
                 ("  module minus reference", stats([m["module_minus_reference_s"] for m in mods]))]
    seed = 3.0 + read
    rows.append(("seed: sleep 3 && one read (model)", {"n": 1, "mean": seed, "p50": seed, "p95": seed, "min": seed, "max": seed}))

    print("gpu_wait latency after SIGKILL of a %d MiB holder; fake driver release delay %.3f s" % (MIB, a.release_delay))
    print("%-52s %4s %9s %9s %9s %9s" % ("measured from SIGKILL (ms)", "n", "mean", "p50", "p95", "max"))
    for name, s in rows:
        print("%-52s %4d %9.1f %9.1f %9.1f %9.1f" % (name, s["n"], s["mean"] * 1e3, s["p50"] * 1e3, s["p95"] * 1e3, s["max"] * 1e3))
    over = max(w["wait_minus_reference_s"] for w in waits)
    verdict = "PASS" if over <= 0.05 else "FAIL"
    print("one NVML read (memory + processes, fake driver): %.3f ms" % (read * 1e3))
    if mods:
        print("module runs discarded (still starting up at the kill): %d" % discarded)
    print("target wait() <= reference + 50 ms: worst %.1f ms -> %s" % (over * 1e3, verdict))

    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / ("gpu_wait_latency-%s.json" % time.strftime("%Y%m%dT%H%M%S"))
    path.write_text(json.dumps({
        "command": " ".join([Path(sys.executable).name] + sys.argv), "release_delay_s": a.release_delay,
        "poll_interval_s": a.poll_interval, "holder_mib": MIB, "one_read_s": read, "cpu_count": os.cpu_count(),
        "summary": {name.strip(): s for name, s in rows}, "wait_runs": waits, "module_runs": mods,
        "module_runs_discarded": discarded, "verdict": verdict,
    }, indent=2))
    print("wrote %s" % path)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
