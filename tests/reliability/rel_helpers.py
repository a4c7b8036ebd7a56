# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers of the reliability suite: ansible-runner runs with their job events, sandbox host probes."""
from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import yaml

import helpers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENV_BIN = Path(sys.executable).parent
DEMO = "/opt/gpufleet-fake/demo_server.py"
FAKE_GPU = "/opt/gpufleet-fake/fake_gpu.py"

ROLLOUT_SITE = "- name: gpufleet rollout\n  ansible.builtin.import_playbook: gpufleet.serving.rollout\n"


class RunResult:
    """An ansible-runner run: rc, status, wall time, stdout and every job event."""

    def __init__(self, rc: int, status: str, events: t.List[t.Dict[str, t.Any]], stdout: str, wall_s: float,
                 artifacts: Path) -> None:
        self.rc = rc
        self.status = status
        self.events = events
        self.stdout = stdout
        self.wall_s = wall_s
        self.artifacts = artifacts

    def host_events(self, host: str) -> t.List[t.Dict[str, t.Any]]:
        return [e for e in self.events if (e.get("event_data") or {}).get("host") == host
                and e["event"].startswith("runner_on_")]

    def task(self, host: str, name: str) -> t.Optional[t.Dict[str, t.Any]]:
        """event_data of the last ok/failed/unreachable event of `host` for the task named `name` (exact)."""
        found = None
        for e in self.host_events(host):
            d = e["event_data"]
            if d.get("task") == name and e["event"] in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
                found = dict(d, event=e["event"])
        return found

    def res(self, host: str, name: str) -> t.Dict[str, t.Any]:
        d = self.task(host, name)
        assert d is not None, "no result of task %r on %s; tasks seen: %s" % (name, host, self.tasks_seen(host))
        return d["res"]

    def tasks_seen(self, host: str) -> t.List[str]:
        return [e["event_data"].get("task") for e in self.host_events(host) if e["event"] != "runner_on_start"]

    def failed(self, host: str) -> t.List[t.Dict[str, t.Any]]:
        return [e["event_data"] for e in self.host_events(host)
                if e["event"] == "runner_on_failed" and not e["event_data"].get("ignore_errors")]

    def seconds_until(self, host: str, name: str) -> float:
        """Seconds from the run's first event to the end of task `name` on `host` (job event timestamps)."""
        import datetime

        def ts(e: t.Dict[str, t.Any]) -> float:
            return datetime.datetime.fromisoformat(e["created"]).timestamp()

        ends = [e for e in self.host_events(host) if e["event_data"].get("task") == name
                and e["event"] in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")]
        assert ends, "no task %r on %s" % (name, host)
        return ts(ends[-1]) - ts(self.events[0])

    def unreachable(self, host: str) -> bool:
        return any(e["event"] == "runner_on_unreachable" for e in self.host_events(host))


def runner_play(workdir: Path, playbook: str, inventories: t.Sequence[Path], extravars: t.Optional[t.Dict[str, t.Any]] = None,
                envvars: t.Optional[t.Dict[str, str]] = None, cmdline: str = "", ident: str = "run",
                timeout: int = 300) -> RunResult:
    """Run `playbook` (YAML text) through ansible-runner the way gpufleet_ci does; keep artifacts in workdir."""
    import ansible_runner

    pdd = Path(workdir) / ("runner-" + ident)
    for d in ("project", "inventory", "env"):
        (pdd / d).mkdir(parents=True, exist_ok=True)
    (pdd / "project" / "site.yml").write_text(playbook)
    for i, inv in enumerate(inventories):
        (pdd / "inventory" / ("%02d-%s" % (i, Path(inv).name))).write_text(Path(inv).read_text())
    env = {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": os.environ["ANSIBLE_COLLECTIONS_PATH"],
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PATH": str(VENV_BIN) + os.pathsep + os.environ.get("PATH", ""),
        "GPUFLEET_SUMMARY_DIR": str(pdd / "summary"),
    }
    env.update(envvars or {})
    (pdd / "env" / "envvars").write_text(yaml.safe_dump(env))
    (pdd / "env" / "extravars").write_text(yaml.safe_dump(extravars or {}))
    (pdd / "env" / "cmdline").write_text(cmdline)
    (pdd / "env" / "settings").write_text(yaml.safe_dump({"job_timeout": timeout}))
    t0 = time.monotonic()
    r = ansible_runner.run(private_data_dir=str(pdd), playbook="site.yml", ident=ident, quiet=True)
    wall = time.monotonic() - t0
    events = list(r.events)
    stdout = r.stdout.read() if hasattr(r.stdout, "read") else ""
    return RunResult(r.rc, r.status, events, stdout, wall, pdd / "artifacts" / ident)


def vault_password_file(workdir: Path) -> Path:
    """A fresh vault password in a 0600 file (ansible-vault --vault-password-file)."""
    p = Path(workdir) / "vault-pass"
    p.write_text(secrets.token_hex(16) + "\n")
    os.chmod(p, 0o600)
    return p


def vaulted_yaml(data: t.Any, secret_values: t.Mapping[str, str], password_file: Path) -> str:
    """YAML of `data` in which each string that is a key of `secret_values` becomes an inline `!vault |` value
    (ansible-vault encrypt_string) of the string it maps to; the plaintext is given to ansible-vault on stdin."""
    marks = {"@@VAULT%d@@" % i: (k, v) for i, (k, v) in enumerate(secret_values.items())}

    def sub(x: t.Any) -> t.Any:
        if isinstance(x, dict):
            return {k: sub(v) for k, v in x.items()}
        if isinstance(x, list):
            return [sub(v) for v in x]
        return next((m for m, (k, _v) in marks.items() if x == k), x) if isinstance(x, str) else x

    out = []
    for line in yaml.safe_dump(sub(data), sort_keys=False, width=1000).splitlines():
        m = next((m for m in marks if m in line), None)
        if m is None:
            out.append(line)
            continue
        p = subprocess.run([str(VENV_BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password_file),
                            "--stdin-name", "x"], input=marks[m][1], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=60, check=True)
        body = [ln.strip() for ln in p.stdout.splitlines()[1:] if ln.strip()]
        indent = len(line) - len(line.lstrip(" -")) + 2
        out.append(line.replace("'%s'" % m, m).replace(m, "!vault |"))
        out += [" " * indent + ln for ln in body]
    return "\n".join(out) + "\n"


def summary(run: RunResult) -> t.Dict[str, t.Dict[str, t.Any]]:
    """rollout-summary.json of the rollout_summary callback, by host."""
    p = run.artifacts.parent.parent / "summary" / "rollout-summary.json"
    return {h["host"]: h for h in json.loads(p.read_text())["hosts"]}


# ------------------------------------------------------------------ sandbox hosts

def sh(fleet: t.Any, host: str, script: str, check: bool = True, timeout: float = 60) -> str:
    """Run a shell script inside `host` (nsenter, no ssh: never disturbs ansible's ssh control masters)."""
    p = fleet.host_run(host, ["/bin/sh", "-c", script], timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s: %r failed (rc=%d): %s%s" % (host, script, p.returncode, p.stdout, p.stderr))
    return p.stdout


def host_py(fleet: t.Any, host: str, code: str, *args: str, timeout: float = 60) -> t.Any:
    """Run Python code on `host` with the host interpreter; return the JSON it prints last."""
    p = fleet.host_run(host, [fleet.python, "-c", code] + list(args), timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("%s: python failed (rc=%d): %s" % (host, p.returncode, p.stderr))
    return json.loads(p.stdout.strip().splitlines()[-1])


PS_CODE = r"""
import json, os
out = {}
for n in os.listdir("/proc"):
    if not n.isdigit():
        continue
    try:
        with open("/proc/%s/stat" % n) as f:
            st = f.read()
        with open("/proc/%s/cmdline" % n, "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        env = open("/proc/%s/environ" % n, "rb").read().split(b"\0")
    except OSError:
        continue
    rest = st[st.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        continue
    tag = [e.decode("utf-8", "replace").split("=", 1)[1] for e in env if e.startswith(b"GPUFLEET_SERVICE=")]
    out[n] = {"pid": int(n), "ppid": int(rest[1]), "start": int(rest[19]), "uid": os.stat("/proc/" + n).st_uid,
              "cmd": cmd, "tag": tag[0] if tag else None}
print(json.dumps(out))
"""


def ps(fleet: t.Any, host: str) -> t.Dict[int, t.Dict[str, t.Any]]:
    """Live processes of `host`: pid -> {pid, ppid, start, uid, cmd, tag (GPUFLEET_SERVICE value)}."""
    return {int(k): v for k, v in host_py(fleet, host, PS_CODE).items()}


HOLDERS_CODE = r"""
import json, pynvml
pynvml.nvmlInit()
out = {}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    out[str(i)] = sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
print(json.dumps(out))
"""


def gpu_holders(fleet: t.Any, host: str) -> t.Dict[int, t.List[int]]:
    """GPU index -> pids holding it, through the host's (fake) NVML."""
    return {int(k): v for k, v in host_py(fleet, host, HOLDERS_CODE).items()}


def start_bg(fleet: t.Any, host: str, argv: t.Sequence[str], env: t.Optional[t.Dict[str, str]] = None,
             log: str = "/dev/null", user: t.Optional[str] = None) -> None:
    """Start argv on `host` in its own session, detached (like a process someone started by hand)."""
    cmd = " ".join(shlex.quote(a) for a in argv)
    envs = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in (env or {}).items())
    inner = "cd / && exec env %s %s" % (envs, cmd)
    if user:
        inner = "cd / && exec setpriv --reuid=%s --regid=%s --init-groups env HOME=/ %s %s" % (user, user, envs, cmd)
    sh(fleet, host, "setsid sh -c %s </dev/null >>%s 2>&1 &" % (shlex.quote(inner), shlex.quote(log)))


def wait_for(cond: t.Callable[[], t.Any], timeout: float, what: str, interval: float = 0.1) -> t.Any:
    """helpers.wait_for, polling every 0.1 s: each condition here is an ssh round trip to a sandbox host."""
    return helpers.wait_for(cond, timeout, what, interval)


def read_host_file(fleet: t.Any, host: str, path: str) -> t.Optional[str]:
    p = fleet.host_run(host, ["cat", path])
    return p.stdout if p.returncode == 0 else None


def close_ssh_master(fleet: t.Any, host: str) -> None:
    """Close the shared ssh control master to `host` (ansible and fleet.ssh share DIR/cp-%h)."""
    argv = fleet._fleet.ssh_argv(host, "true")
    argv = argv[:-2] + ["-O", "exit"] + argv[-2:-1]
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15, check=False)


def reset_host(fleet: t.Any, host: str) -> None:
    """SIGKILL, by pid, the demo servers, fake GPU holders and tagged processes this suite started on `host`,
    then remove gpufleet's files there, so the next test starts from a bare host."""
    holding = {pid for pids in gpu_holders(fleet, host).values() for pid in pids}
    victims = [p["pid"] for p in ps(fleet, host).values()
               if p["tag"] or p["pid"] in holding or "demo_server.py" in p["cmd"] or "fake_gpu.py" in p["cmd"]]
    if victims:
        sh(fleet, host, "kill -KILL %s 2>/dev/null; true" % " ".join(str(v) for v in victims))
        wait_for(lambda: not set(victims) & set(ps(fleet, host)), 60, "processes gone on %s" % host)
    sh(fleet, host, "rm -rf /run/gpufleet /var/lib/gpufleet /var/log/gpufleet /var/lib/demo* /var/log/demo*")
    wait_for(lambda: not any(gpu_holders(fleet, host).values()), 60, "GPUs released on %s" % host)


def host_state(fleet: t.Any, host: str) -> t.Dict[str, t.Any]:
    """What a rollout could change on `host`: processes (pid, start, cmd) and gpufleet's files."""
    procs = {pid: (p["start"], p["cmd"]) for pid, p in ps(fleet, host).items()
             if not p["cmd"].startswith(("sshd", "/usr/bin/python3 -c", fleet.python + " -c"))}
    files = {}
    for f in ("/run/gpufleet/demo.pid", "/run/gpufleet/demo.lock", "/var/lib/gpufleet/demo.json",
              "/var/log/gpufleet/demo.log"):
        files[f] = read_host_file(fleet, host, f)
    return {"procs": procs, "files": files}


class CliRun:
    """ansible-playbook (the real CLI) started in its own session, output to a file; for signals and concurrency."""

    def __init__(self, workdir: Path, name: str, playbook: str, inventories: t.Sequence[Path],
                 extravars: t.Optional[t.Dict[str, t.Any]] = None, args: t.Sequence[str] = ()) -> None:
        self.out = Path(workdir) / ("%s.out" % name)
        ev = Path(workdir) / ("%s-extravars.json" % name)
        ev.write_text(json.dumps(extravars or {}))
        argv = [str(VENV_BIN / "ansible-playbook"), playbook, "-e", "@%s" % ev] + list(args)
        for inv in inventories:
            argv += ["-i", str(inv)]
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                   PATH=str(VENV_BIN) + os.pathsep + os.environ.get("PATH", ""))
        self.t0 = time.monotonic()
        with open(self.out, "wb") as f:
            self.proc = subprocess.Popen(argv, cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, 9)
            self.proc.wait()
            raise AssertionError("ansible-playbook ran over %ss:\n%s" % (timeout, self.text()[-3000:]))

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.t0

    def text(self) -> str:
        return self.out.read_text(errors="replace")


def role_cases(workdir: Path, role: str, base: t.Dict[str, t.Any], cases: t.Sequence[t.Tuple[str, t.Dict[str, t.Any]]],
               env: t.Dict[str, str], registers: t.Sequence[str] = (), name: str = "cases",
               wrap: t.Sequence[str] = ()) -> t.Dict[str, t.Any]:
    """Run `role` on localhost once per case (one play each, vars = base | case vars) in ONE ansible-playbook run.

    A failure is caught per play; returns {case id: {failed, msg, task, <registered vars>}} and "_stdout". `wrap`
    prefixes the ansible-playbook argv (for example unshare).
    """
    out = Path(workdir) / ("%s-results.json" % name)
    plays = []
    for cid, cvars in cases:
        dump = {"failed": "{{ _rel_failure is not none }}", "msg": "{{ (_rel_failure or {}).msg | default(none) }}",
                "task": "{{ (_rel_failure or {}).task | default(none) }}"}
        for r in registers:
            dump[r] = "{{ %s | default(none) }}" % r
        plays.append({
            "name": "case %s" % cid, "hosts": "localhost", "gather_facts": False, "vars": dict(base, **cvars),
            "tasks": [
                {"name": "Reset the failure", "ansible.builtin.set_fact": {"_rel_failure": None}},
                {"name": "Run the role", "block": [{"name": "Include the role", "ansible.builtin.include_role": {"name": role}}],
                 "rescue": [{"name": "Record the failure", "ansible.builtin.set_fact": {"_rel_failure": {
                     "msg": "{{ ansible_failed_result.msg | default('') }}",
                     "task": "{{ ansible_failed_task.name | default('') }}"}}}]},
                {"name": "Keep the result", "ansible.builtin.set_fact": {
                    "_rel_results": "{{ _rel_results | default({}) | combine({%s: _rel_dump}) }}" % json.dumps(cid)},
                 "vars": {"_rel_dump": dump}},
            ]})
    plays.append({"name": "Write the results", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "Write them", "check_mode": False, "diff": False,
         "ansible.builtin.copy": {"content": "{{ _rel_results | to_nice_json }}", "dest": str(out), "mode": "0600"}}]})
    pb = Path(workdir) / ("%s.yml" % name)
    pb.write_text(yaml.safe_dump(plays, sort_keys=False, width=1000))
    e = dict(env, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    argv = list(wrap) + [str(VENV_BIN / "ansible-playbook"), str(pb), "-i", "localhost,", "-c", "local",
                         "-e", "ansible_python_interpreter=%s" % sys.executable]
    p = subprocess.run(argv, cwd=str(ROOT), env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                       check=False)
    assert out.exists(), "no results (rc %d):\n%s" % (p.returncode, p.stdout[-4000:])
    res: t.Dict[str, t.Any] = json.loads(out.read_text())
    missing = [c[0] for c in cases if c[0] not in res]
    assert not missing, "cases %s left no result:\n%s" % (missing, p.stdout[-4000:])
    res["_stdout"] = p.stdout
    return res


def local_play(workdir: Path, tasks: t.Sequence[t.Dict[str, t.Any]], registers: t.Sequence[str], env: t.Dict[str, str],
               name: str = "play", interpreter: str = sys.executable, args: t.Sequence[str] = (),
               umask: t.Optional[str] = None) -> t.Tuple[subprocess.CompletedProcess, t.Dict[str, t.Any]]:
    """Run tasks on localhost (real ansible-playbook, `interpreter` as the target python); return the process and
    the registered results (written by a last task, so failures must be ignored or rescued by the tasks)."""
    out = Path(workdir) / ("%s-results.json" % name)
    dump = {"name": "Dump the registered results", "ansible.builtin.copy": {
        "content": "{{ {%s} | to_nice_json }}" % ", ".join("%s: %s | default(none)" % (json.dumps(r), r) for r in registers),
        "dest": str(out), "mode": "0600"}, "check_mode": False, "diff": False}
    pb = Path(workdir) / ("%s.yml" % name)
    pb.write_text(yaml.safe_dump([{"name": name, "hosts": "localhost", "gather_facts": False,
                                   "tasks": list(tasks) + [dump]}], sort_keys=False, width=1000))
    e = dict(env, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    argv = [str(VENV_BIN / "ansible-playbook"), str(pb), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % interpreter] + list(args)
    if umask:
        argv = ["/bin/sh", "-c", 'umask %s && exec "$@"' % umask, "sh"] + argv
    p = subprocess.run(argv, cwd=str(ROOT), env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                       check=False)
    assert out.exists(), "no results (rc %d):\n%s" % (p.returncode, p.stdout[-4000:])
    return p, json.loads(out.read_text())


def rescued_role(name: str, role: str, role_vars: t.Dict[str, t.Any], register: str) -> t.Dict[str, t.Any]:
    """A task block including `role`; a failure is recorded in the fact `register` ({failed, msg, task})."""
    return {"name": name, "vars": role_vars, "block": [
        {"name": "Include %s" % role, "ansible.builtin.include_role": {"name": role}},
        {"name": "Record success", "ansible.builtin.set_fact": {register: {"failed": False}}}],
        "rescue": [{"name": "Record the failure", "ansible.builtin.set_fact": {register: {
            "failed": True, "msg": "{{ ansible_failed_result.msg | default('') }}",
            "task": "{{ ansible_failed_task.name | default('') }}"}}}]}
