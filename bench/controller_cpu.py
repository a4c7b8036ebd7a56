# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller CPU-seconds of one command and everything it starts, by a cgroup (v1 cpuacct or v2), for the benchmarks.

    with Accounted(ssh_wrapper_dir) as acct:
        wall = acct.run(argv, env)       # argv runs in a fresh cgroup; env gets GPUFLEET_BENCH_SSH (the wrapper)
    acct.cpu_s, acct.ssh_cpu_s, acct.main_cpu_s

Why a cgroup and not getrusage(RUSAGE_CHILDREN): ssh's ControlMaster daemonizes (ControlPersist) and is
reparented to init, so its CPU (the encryption of every multiplexed session, and the ProxyCommand it spawned)
is never reaped by us. A cgroup keeps every descendant, daemonized or not: `run` moves the child into it before
exec, waits for the command, then ends what is left in the cgroup (ssh masters and their proxies, with SIGTERM, so
every measured run starts without warm connections) and reads the cgroup's CPU time (the scheduler's runtime).

- `ssh_cpu_s`: the part spent in ssh clients and what they start (the sandbox's `ip netns exec nc` proxy): ssh is
  run through `GPUFLEET_BENCH_SSH` (ansible's ANSIBLE_SSH_EXECUTABLE), a shell script that moves itself into a
  sub-cgroup and execs ssh (its /bin/sh start, ~1 ms, is counted there too).
- `main_cpu_s`: the command's own process (ansible-playbook's main process: strategy, templating, callbacks),
  from /proc/PID/stat, polled every 20 ms until it exits (at most one poll interval short).
The rest (`cpu_s - ssh_cpu_s - main_cpu_s`) is ansible's forked workers (module payloads, connection plugin).
The hosts' processes (sshd, modules, servers) run in the sandbox hosts' own namespaces and cgroups, not here.
Needs root.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import typing as t

V1 = "/sys/fs/cgroup/cpuacct"
V2 = "/sys/fs/cgroup"
TICK = os.sysconf("SC_CLK_TCK")


def _cg_root() -> t.Tuple[str, int]:
    if os.path.exists(os.path.join(V1, "cpuacct.stat")):
        return V1, 1
    if os.path.exists(os.path.join(V2, "cgroup.controllers")):
        return V2, 2
    raise RuntimeError("no cpuacct (cgroup v1) or cgroup v2 hierarchy under /sys/fs/cgroup")


class Cgroup:
    """One cgroup directory (with an `ssh` child); `cpu_s()` is the CPU time of everything that ever ran in it."""

    def __init__(self, name: str) -> None:
        root, self.version = _cg_root()
        self.path = os.path.join(root, name)
        os.makedirs(os.path.join(self.path, "ssh"))

    def cpu_s(self, sub: str = "") -> float:
        p = os.path.join(self.path, sub)
        if self.version == 1:
            # cpuacct.usage is the scheduler's runtime in ns, the clock a process's own process_time() reads. Its
            # usage_user/usage_sys split, like cpuacct.stat, is sampled by ticks: on this VM's contended cores their
            # sum read from 86 % low to 9 % high, depending on the load.
            try:
                return int(open(os.path.join(p, "cpuacct.usage")).read()) / 1e9
            except OSError:
                stat = dict(line.split() for line in open(os.path.join(p, "cpuacct.stat")))
                return (int(stat["user"]) + int(stat["system"])) / TICK
        # usage_usec is the scheduler's runtime itself; user_usec and system_usec split it by sampled ticks.
        stat = dict(line.split() for line in open(os.path.join(p, "cpu.stat")))
        return int(stat["usage_usec"]) / 1e6

    def pids(self) -> t.List[int]:
        out = []
        for sub in ("", "ssh"):
            try:
                out += [int(x) for x in open(os.path.join(self.path, sub, "cgroup.procs")).read().split()]
            except OSError:
                pass
        return out

    def end_all(self, timeout: float = 5.0) -> None:
        """SIGTERM what is left (ssh masters exit cleanly and remove their sockets), SIGKILL after `timeout`."""
        deadline = time.monotonic() + timeout
        sig = signal.SIGTERM
        while True:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
            if time.monotonic() > deadline:
                sig = signal.SIGKILL

    def remove(self) -> None:
        for sub in ("ssh", ""):
            try:
                os.rmdir(os.path.join(self.path, sub))
            except OSError:
                pass


def ssh_wrapper(directory: str) -> str:
    """Write DIRECTORY/ssh: moves itself into $GPUFLEET_BENCH_SSH_CG, then execs the real ssh."""
    path = os.path.join(directory, "ssh")
    with open(path, "w") as f:
        f.write('#!/bin/sh\n# bench/controller_cpu.py: count ssh (and its ProxyCommand) apart\n'
                '[ -n "$GPUFLEET_BENCH_SSH_CG" ] && echo $$ > "$GPUFLEET_BENCH_SSH_CG/cgroup.procs"\nexec ssh "$@"\n')
    os.chmod(path, 0o755)
    return path


def _proc_cpu(pid: int) -> t.Optional[float]:
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15 of proc(5))


class Accounted:
    """Runs commands one at a time, each in a fresh cgroup; the last run's figures are attributes."""

    _seq = 0

    def __init__(self, wrapper_dir: str) -> None:
        self.wrapper = ssh_wrapper(wrapper_dir)
        self.cpu_s = self.ssh_cpu_s = self.main_cpu_s = 0.0
        self.wall_s = 0.0
        self.stdout = ""
        self.returncode = 0

    def __enter__(self) -> "Accounted":
        return self

    def __exit__(self, *exc: t.Any) -> None:
        pass

    def run(self, argv: t.Sequence[str], env: t.Optional[t.Mapping[str, str]] = None,
            cwd: t.Optional[str] = None) -> float:
        Accounted._seq += 1
        cg = Cgroup("gpufleet-bench-%d-%d" % (os.getpid(), Accounted._seq))
        procs = os.path.join(cg.path, "cgroup.procs")
        env = dict(env if env is not None else os.environ, GPUFLEET_BENCH_SSH=self.wrapper,
                   GPUFLEET_BENCH_SSH_CG=os.path.join(cg.path, "ssh"))

        def enter() -> None:  # in the child, before exec
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        try:
            t0 = time.monotonic()
            p = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, preexec_fn=enter)
            main = [0.0]
            stop = threading.Event()

            def poll() -> None:
                while not stop.is_set():
                    v = _proc_cpu(p.pid)
                    if v is not None:
                        main[0] = max(main[0], v)
                    stop.wait(0.02)

            th = threading.Thread(target=poll, daemon=True)
            th.start()
            self.stdout = p.communicate()[0]
            self.wall_s = time.monotonic() - t0
            stop.set()
            th.join()
            self.returncode = p.returncode
            cg.end_all()
            self.cpu_s = cg.cpu_s()
            self.ssh_cpu_s = cg.cpu_s("ssh")
            self.main_cpu_s = main[0]
        finally:
            cg.end_all()
            cg.remove()
        return self.wall_s
