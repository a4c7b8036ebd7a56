#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmarks 3 and 4 on the sandbox fleet (real sshd hosts, real spawn-worker demo servers, fake NVML): wall time and
the controller's CPU-seconds per host, at several fleet sizes.

    .venv/bin/python bench/fleet_rollout.py --sizes 2,4,8,16,32 --repeats 3 --json docs/evidence/fleet-rollout-bench.json \\
        --profile-size 8 --profile-dir docs/evidence/fleet-profile

3. Fleet restart: `gpufleet.serving.restart` with every host in one batch, versus the seed's method as a
   sequential ssh loop per host: kill -9, sleep 3, read GPU memory (the nvidia-smi step; the sandbox hosts
   have the fake NVML, so a pynvml read stands in), relaunch, poll /health.
4. No-op rollout (`gpufleet.serving.rollout` when everything is already right) versus bare `ansible -m ping`
   on the same hosts. At the sizes of --extras: what the fast path buys (the same no-op with
   gpufleet_rollout_fast_check=false, through the full roles) and what the ansible settings buy (the same no-op with
   ansible's defaults: no pipelining, forks 5, implicit fact gathering, versus the repo's ansible.cfg).

Every measured command runs in its own cgroup (bench/controller_cpu.py): its controller CPU-seconds are the CPU time of
the command and everything it started on this machine (ansible-playbook, its forks, the ssh clients and their
ControlMasters, the sandbox's `ip netns exec nc` proxies), not the hosts' processes; every run starts with no ssh
connection open (the masters of the run before are ended), as a rollout from a fresh controller does.
From --light-from hosts up (default 16), hosts get one fake GPU and a one-worker server (the seed loop too), so
that this box measures the controller rather than 32 x 2 spawn workers.
--profile-size N: after the repeats at N, one more no-op and one more restart with the test-only task_times callback
(tests/gpu/callback) and cProfile on ansible-playbook's main process; the top of each profile and the slowest
tasks go to --profile-dir. Those runs are not in the table (cProfile slows the main process).
Needs root. Prints Markdown tables and writes JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import typing as t

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import controller_cpu  # noqa: E402

PY = sys.executable
BIN = os.path.dirname(PY)
# The tree whose collection, sandbox fleet and demo server are measured: this checkout, or with --rev an export of
# that commit (a shared checkout's working tree changes under a long run).
TREE = ROOT


def fleet_py():
    return os.path.join(TREE, "tests", "sandbox", "fleet.py")


def load(name, path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_fleet():
    return load("gpufleet_sandbox_fleet", fleet_py())


def export_tree(rev: str) -> str:
    """`git archive REV` into a temporary directory, with its collection installed into its own collections/."""
    global TREE
    d = tempfile.mkdtemp(prefix="gpufleet-bench-tree-")
    arch = subprocess.run(["git", "-C", ROOT, "archive", rev], stdout=subprocess.PIPE, check=True).stdout
    subprocess.run(["tar", "-x", "-C", d], input=arch, check=True)
    subprocess.run([PY, os.path.join(d, "scripts", "install-collection"), os.path.join(d, "collections")], check=True)
    TREE = d
    return subprocess.run(["git", "-C", ROOT, "rev-parse", rev], stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


SEED = (
    "pkill -9 -f '[d]emo_server.py'; pkill -9 -f '[m]ultiprocessing.spawn'; sleep 3; "
    "{py} -c 'import pynvml as n; n.nvmlInit(); "
    "print([n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i)).used for i in range(n.nvmlDeviceGetCount())])'; "
    "cd /; nohup setsid {py} /opt/gpufleet-fake/demo_serv''er.py --port 30000 --tp {tp} --gpus {gpus} --mib 20000 "
    "--state-dir /var/lib/demo-seed > /var/log/demo-seed.log 2>&1 < /dev/null & "
    "for i in $(seq 1 200); do {py} -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:30000/health\", timeout=1)' "
    "2>/dev/null && break; sleep 0.25; done"
)
KINDS = ("restart", "seed", "noop", "ping", "noop_full_roles", "noop_ansible_defaults")


class Runner:
    """Measured runs (wall, controller CPU, its ssh and main-process parts) appended to res[kind]."""

    def __init__(self, state: str, env: dict) -> None:
        self.acct = controller_cpu.Accounted(state)
        self.env = dict(env, ANSIBLE_SSH_EXECUTABLE=self.acct.wrapper)

    def run(self, argv, env=None, check=True):
        self.acct.run(argv, env or self.env, cwd=TREE)
        if check and self.acct.returncode != 0:
            sys.stderr.write(self.acct.stdout[-3000:])
            raise SystemExit("failed (rc=%d): %s" % (self.acct.returncode, " ".join(argv[:6])))
        a = self.acct
        return {"wall_s": round(a.wall_s, 3), "cpu_s": round(a.cpu_s, 3), "ssh_cpu_s": round(a.ssh_cpu_s, 3),
                "main_cpu_s": round(a.main_cpu_s, 3)}


def profile_runs(run: Runner, pb, n: int, outdir: str) -> dict:
    """One no-op and one restart under cProfile (main process) with per-task wall times; not in the table."""
    import pstats
    os.makedirs(outdir, exist_ok=True)
    out = {}
    for kind, play in (("noop", "gpufleet.serving.rollout"), ("restart", "gpufleet.serving.restart")):
        prof = os.path.join(outdir, "%s-%dhosts.prof" % (kind, n))
        times = os.path.join(outdir, "%s-%dhosts-tasks.json" % (kind, n))
        env = dict(run.env, GPUFLEET_TASK_TIMES=times,
                   ANSIBLE_CALLBACK_PLUGINS=os.path.join(TREE, "tests", "gpu", "callback"),
                   ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary,task_times")
        m = run.run([PY, "-m", "cProfile", "-o", prof, pb[0]] + pb[1:] + [play], env)
        txt = os.path.join(outdir, "%s-%dhosts-profile.txt" % (kind, n))
        with open(txt, "w") as fh:
            fh.write("# %s, %d hosts, cProfile of ansible-playbook's main process (bench/fleet_rollout.py)\n" % (kind, n))
            fh.write("# this run: %s\n" % json.dumps(m))
            st = pstats.Stats(prof, stream=fh)
            st.sort_stats("cumulative").print_stats(40)
            st.sort_stats("tottime").print_stats(25)
        os.unlink(prof)  # binary and large; the text above is the record
        with open(times) as fh:
            rows = json.load(fh)
        out[kind] = {"run": m, "tasks": len(rows),
                     "slowest_tasks": sorted(rows, key=lambda r: -(r["duration_s"] or 0))[:12],
                     "profile": os.path.relpath(txt, ROOT)}
    return out


@contextlib.contextmanager
def sandbox_fleet(n: int, gpus: int, env: t.Optional[t.Mapping[str, str]] = None):
    """A sandbox fleet of `n` hosts with `gpus` fake GPUs each and the demo server's inventory, torn down on exit.

    Yields (fleet, python, hosts, run, pb): the tests/sandbox Fleet, the hosts' python, their names, a Runner (each
    run in its own cgroup, with `env`, this tree's ansible.cfg and collections) and the ansible-playbook command line
    (the inventory, one batch) to which a playbook name is added."""
    state = tempfile.mkdtemp(prefix="gpufleet-bench-")
    fl = load_fleet()
    sandbox = load("gpufleet_ci_sandbox", os.path.join(TREE, "tools", "gpufleet_ci", "sandbox.py"))
    try:
        subprocess.run([PY, fleet_py(), "up", "--hosts", str(n), "--gpus", str(gpus), "--state-dir", state], check=True,
                       stdout=subprocess.DEVNULL)
        f = fl.Fleet(state)
        python = f.load()["python"]
        hosts = ["host%d" % i for i in range(1, n + 1)]
        inv = os.path.join(state, "inv")
        os.makedirs(inv)
        shutil.copy(os.path.join(state, "inventory.yml"), os.path.join(inv, "fleet.yml"))
        with open(os.path.join(inv, "servers.yml"), "w") as fh:
            fh.write(sandbox.servers_inventory(hosts, sandbox.server_vars(python, gpus=gpus)))
        run = Runner(state, dict(env if env is not None else os.environ, ANSIBLE_CONFIG=os.path.join(TREE, "ansible.cfg"),
                                 ANSIBLE_NOCOLOR="1", ANSIBLE_COLLECTIONS_PATH=os.path.join(TREE, "collections")))
        pb = [os.path.join(BIN, "ansible-playbook"), "-i", inv, "-e", json.dumps({"gpufleet_rollout_serial": ["100%"]})]
        yield f, python, hosts, run, pb
    finally:
        down = subprocess.run([PY, fleet_py(), "down", "--state-dir", state], stdout=subprocess.DEVNULL)
        if down.returncode == 0:  # else leave the state dir: `fleet.py down --state-dir` needs it to clean up
            shutil.rmtree(state, ignore_errors=True)


def bench_size(n: int, repeats: int, light: bool, extras: bool, profile_dir: str = "") -> dict:
    gpus = 1 if light else 2
    with sandbox_fleet(n, gpus) as (f, python, hosts, run, pb):
        ping = [os.path.join(BIN, "ansible"), "all", "-i", pb[pb.index("-i") + 1], "-m", "ansible.builtin.ping"]
        run.run(pb + ["gpufleet.serving.rollout"])  # first rollout: tune + launch everywhere
        res = {"hosts": n, "light_server": light, "load_before": os.getloadavg()[0]}
        for k in KINDS:
            res[k] = []
        for _ in range(repeats):
            res["restart"].append(run.run(pb + ["gpufleet.serving.restart"]))
            res["noop"].append(run.run(pb + ["gpufleet.serving.rollout"]))
            res["ping"].append(run.run(ping))
            if extras:
                # What the fast path buys: the same no-op through the full roles.
                res["noop_full_roles"].append(run.run(pb + ["-e", '{"gpufleet_rollout_fast_check": false}',
                                                            "gpufleet.serving.rollout"]))
                plain = dict(run.env, ANSIBLE_PIPELINING="False", ANSIBLE_FORKS="5", ANSIBLE_GATHERING="implicit")
                res["noop_ansible_defaults"].append(run.run(pb + ["gpufleet.serving.rollout"], plain))
        # The seed's way (the quotes in demo_serv''er.py keep pkill -f from matching this shell itself): one host after
        # the other, one ssh call each, all in one measured shell so that its ssh clients are counted.
        seed = SEED.format(py=python, tp=gpus, gpus=",".join(str(i) for i in range(gpus)))
        loop = " && ".join(shlex.join([run.acct.wrapper] + f.ssh_argv(h, seed)[1:]) for h in hosts)
        reset = " ; ".join(shlex.join([run.acct.wrapper] + f.ssh_argv(
            h, "pkill -9 -f '[d]emo_server.py'; pkill -9 -f '[m]ultiprocessing.spawn'; true")[1:]) for h in hosts)
        for _ in range(repeats):
            res["seed"].append(run.run(["sh", "-c", loop]))
            run.run(["sh", "-c", reset])  # leave the hosts as gpufleet expects for the next repeat (not in the table)
            run.run(pb + ["gpufleet.serving.rollout"])
        if profile_dir:
            res["profile"] = profile_runs(run, pb, n, profile_dir)
        res["load_after"] = os.getloadavg()[0]
        return res


def med(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def stat(runs, key, per=1):
    """(median, min, max) of runs[*][key] / per."""
    xs = [r[key] / per for r in runs]
    return med(xs), min(xs), max(xs)


def fit(points):
    """Least-squares a + b*n over (n, y): the fixed part and the marginal cost per host."""
    k = len(points)
    if k < 2:
        return None
    sx = sum(p[0] for p in points)
    sy = sum(p[1] for p in points)
    sxx = sum(p[0] * p[0] for p in points)
    sxy = sum(p[0] * p[1] for p in points)
    b = (k * sxy - sx * sy) / (k * sxx - sx * sx)
    return {"fixed_s": round((sy - b * sx) / k, 3), "per_host_s": round(b, 4)}


def rng(t, fmt="%.1f"):
    return (fmt + " (" + fmt + "–" + fmt + ")") % t


def tables(results) -> str:
    out = ["| hosts | server | `restart` wall s | seed loop wall s | seed / restart | no-op `rollout` wall s | `ansible -m ping` wall s | no-op / ping | load (1 min) before → after |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rw, sw, nw, pw = (stat(r[k], "wall_s") for k in ("restart", "seed", "noop", "ping"))
        out.append("| %d | %s | %s | %s | **%.2f×** | %s | %s | **%.2f×** | %.1f → %.1f |" % (
            r["hosts"], "1 worker" if r["light_server"] else "2 workers", rng(rw), rng(sw), sw[0] / rw[0], rng(nw), rng(pw),
            nw[0] / pw[0], r["load_before"], r["load_after"]))
    out += ["", "Controller CPU-seconds per host (the CPU time of everything the command ran on this machine, / hosts):", "",
            "| hosts | `restart` | seed loop | no-op `rollout` | `ansible -m ping` | no-op / ping | restart: main process / forks / ssh | no-op: main / forks / ssh | ping: main / forks / ssh |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        n = r["hosts"]
        c = {k: stat(r[k], "cpu_s", n) for k in ("restart", "seed", "noop", "ping")}

        def split(k):
            m = med([x["main_cpu_s"] for x in r[k]]) / n
            s = med([x["ssh_cpu_s"] for x in r[k]]) / n
            return "%.3f / %.3f / %.3f" % (m, c[k][0] - m - s, s)
        out.append("| %d | %s | %s | %s | %s | **%.2f×** | %s | %s | %s |" % (
            n, rng(c["restart"], "%.3f"), rng(c["seed"], "%.3f"), rng(c["noop"], "%.3f"), rng(c["ping"], "%.3f"),
            c["noop"][0] / c["ping"][0], split("restart"), split("noop"), split("ping")))
    ex = [r for r in results if r["noop_full_roles"]]
    if ex:
        out += ["", "| hosts | no-op (fast path) wall s / CPU s | no-op through the full roles | no-op with ansible's defaults |",
                "|---|---|---|---|"]
        for r in ex:
            cells = ["%.1f / %.1f" % (stat(r[k], "wall_s")[0], stat(r[k], "cpu_s")[0])
                     for k in ("noop", "noop_full_roles", "noop_ansible_defaults")]
            out.append("| %d | %s |" % (r["hosts"], " | ".join(cells)))
    fits = {}
    for k in ("restart", "seed", "noop", "ping"):
        fits[k] = {"cpu": fit([(r["hosts"], stat(r[k], "cpu_s")[0]) for r in results]),
                   "main": fit([(r["hosts"], stat(r[k], "main_cpu_s")[0]) for r in results]),
                   "wall": fit([(r["hosts"], stat(r[k], "wall_s")[0]) for r in results])}
    if len(results) < 2:
        out += ["", "(No least-squares fit: it needs at least two sizes.)"]
        results_fits[:] = [fits]
        return "\n".join(out)
    out += ["", "Least-squares fit over the sizes (median of each size): fixed + per host × N", "",
            "| | CPU fixed s | CPU per host s | of which main process: fixed s | main per host s | wall fixed s | wall per host s |",
            "|---|---|---|---|---|---|---|"]
    for k, v in fits.items():
        if v["cpu"]:
            out.append("| %s | %.2f | %.3f | %.2f | %.3f | %.2f | %.3f |" % (
                k, v["cpu"]["fixed_s"], v["cpu"]["per_host_s"], v["main"]["fixed_s"], v["main"]["per_host_s"],
                v["wall"]["fixed_s"], v["wall"]["per_host_s"]))
    results_fits[:] = [fits]
    return "\n".join(out)


results_fits: list = []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--light-from", type=int, default=16, help="from this many hosts on: one GPU, one-worker server")
    ap.add_argument("--extras", default="8", help="sizes that also run the full-roles and ansible-defaults no-ops")
    ap.add_argument("--profile-size", type=int, default=0)
    ap.add_argument("--profile-dir", default=os.path.join(ROOT, "docs", "evidence", "fleet-profile"))
    ap.add_argument("--rev", help="measure this commit (git archive; its collection, fleet and demo server) instead of "
                    "the working tree")
    ap.add_argument("--json")
    ap.add_argument("--tables", nargs="+", metavar="JSON", help="only print the tables of earlier runs' JSON files")
    a = ap.parse_args()
    a.profile_dir = os.path.abspath(a.profile_dir)  # the commands run in the measured tree
    if a.tables:
        results = []
        for f in a.tables:
            with open(f) as fh:
                results += json.load(fh)["results"]
        print(tables(sorted(results, key=lambda r: r["hosts"])))
        return 0
    rev = export_tree(a.rev) if a.rev else None
    try:
        return _main(a, rev)
    finally:
        if TREE != ROOT:
            shutil.rmtree(TREE, ignore_errors=True)


def _main(a, rev) -> int:
    if os.geteuid() != 0:
        raise SystemExit("needs root (sandbox fleet, cgroups)")
    extras = {int(s) for s in a.extras.split(",") if s}
    results = []
    t0 = time.time()
    for n in [int(s) for s in a.sizes.split(",")]:
        r = bench_size(n, a.repeats, n >= a.light_from, n in extras, a.profile_dir if n == a.profile_size else "")
        results.append(r)
        print(json.dumps(r), flush=True)
        if a.json:  # after every size, so that a long run killed late keeps what it measured
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as fh:
                json.dump({"machine": "%d cores" % os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
                           "argv": sys.argv[1:], "rev": rev, "results": results}, fh, indent=1)
    print()
    print(tables(results))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"machine": "%d cores" % os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
                       "argv": sys.argv[1:], "rev": rev, "results": results, "fits": results_fits[0]}, fh, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())
