# SPDX-License-Identifier: GPL-3.0-or-later
"""What the gpu_server role's restart counts as a started server, and what it leaves when the start fails (issue 24,
items 5, 8 and 10). Each case is one real ansible-playbook run of the role on localhost (fake GPUs, the sandbox's demo
server launched by the role, the rollout summary callback on):

- a foreign listener (user nobody, 200 to every request) on the server's port: the restart fails in its preflight,
  naming the listener, and stops nothing;
- a relaunch whose /health says 200 but whose real request hangs: the failed new server is stopped and its GPUs
  verified clean, and the summary says so in the runbook's terms;
- a tensor-parallel-1 server with gpufleet_server_gpus unset on a 2-GPU host: the busy wait fails early, naming the
  idle GPU and the gpufleet_server_gpus to set, not after the start timeout.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import pytest

from helpers import FAKE_NVML_DIR, PY, FakeGpus, pid_alive, wait_for
from rel_helpers import local_play, role_cases

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

from rollout_helpers import FOREIGN_LISTENER, BalancerRecorder  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "sandbox" / "demo_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tagged(name: str) -> t.Set[int]:
    out = set()
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                env = open("/proc/%s/environ" % n, "rb").read().split(b"\0")
            except OSError:
                continue
            if ("GPUFLEET_SERVICE=%s" % name).encode() in env:
                out.add(int(n))
    return out


def _kill_tagged(name: str) -> None:
    for pid in _tagged(name):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


class Host:
    """Fake GPUs, the role's directories and the variables of a demo server on `port` (GPU 0, tp 1)."""

    def __init__(self, base: Path, name: str, gpus: int = 2) -> None:
        self.base, self.name = base, name
        self.fg = FakeGpus(base / "nvml")
        self.fg.configure(gpus=gpus)
        self.run, self.log, self.state = base / "run", base / "log", base / "state"
        for d in (self.run, self.log, self.state):
            d.mkdir()

    def command(self, port: int, *flags: str) -> t.List[str]:
        return [PY, str(DEMO), "--host", "127.0.0.1", "--port", str(port), "--tp", "1", "--gpus", "0", "--mib", "1000",
                "--state-dir", str(self.base / ("demo-%d" % port))] + list(flags)

    def vars(self, port: int, *flags: str, **over: t.Any) -> t.Dict[str, t.Any]:
        v = {
            "gpufleet_server_name": self.name,
            "gpufleet_server_command": self.command(port, *flags),
            "gpufleet_server_env": {"FAKE_NVML_CONFIG": str(self.fg.config), "PYTHONPATH": str(FAKE_NVML_DIR)},
            "gpufleet_server_gpus": [0],
            "gpufleet_server_health_url": "http://127.0.0.1:%d/health" % port,
            "gpufleet_server_start_timeout": 60, "gpufleet_server_clean_timeout": 10, "gpufleet_server_kill_grace": 2,
            "gpufleet_server_kill_final_wait": 2, "gpufleet_server_verify_env": False,
            "gpufleet_server_force_restart": True,
            "gpufleet_server_run_dir": str(self.run), "gpufleet_server_log_dir": str(self.log),
            "gpufleet_server_state_dir": str(self.state),
        }
        v.update(over)
        return v

    def start_old(self, port: int) -> subprocess.Popen:
        """The server running before the rollout, started by hand with the launch tag (the kill selects it)."""
        p = subprocess.Popen(self.command(port), env=dict(self.fg.env, GPUFLEET_SERVICE=self.name),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: self.holders(0), 60, "the old server holding GPU 0", interval=0.05)
        return p

    def holders(self, gpu: int) -> t.List[int]:
        """Live pids holding fake memory on `gpu` (the fake NVML's hold-GPU-PID-START files, as the modules read them)."""
        out = []
        for f in self.fg.state.glob("hold-%d-*" % gpu) if self.fg.state.exists() else []:
            _h, _g, pid, start = f.name.split("-")[:4]
            if pid_alive(int(pid)) and open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[19] == start:
                out.append(int(pid))
        return out

    def play(self, gv: t.Dict[str, t.Any]) -> t.Tuple[t.Dict[str, t.Any], t.Dict[str, t.Any], float]:
        """One ansible-playbook run of the role; (its failure, its summary row, seconds)."""
        env = dict(self.fg.env, GPUFLEET_SUMMARY_DIR=str(self.base / "summary"))
        t0 = time.monotonic()
        res = role_cases(self.base, "gpufleet.serving.gpu_server", gv, [("case", {})], env,
                         registers=["gpufleet_server_result"])
        took = time.monotonic() - t0
        summary = json.loads((self.base / "summary" / "rollout-summary.json").read_text())
        return res["case"], summary["hosts"][0], took


@pytest.fixture
def host(tmp_path):
    made = []

    def make(name: str, gpus: int = 2) -> Host:
        h = Host(tmp_path / name, name, gpus)
        made.append(h)
        return h
    yield make
    for h in made:
        _kill_tagged(h.name)
        h.fg.cleanup()


def _foreign(port: int) -> subprocess.Popen:
    """FOREIGN_LISTENER as user nobody on 127.0.0.1:`port`, once it answers."""
    def demote():
        os.setgid(65534)
        os.setuid(65534)
    foreign = subprocess.Popen(["/usr/bin/python3", "-c", FOREIGN_LISTENER, str(port), "127.0.0.1"], preexec_fn=demote, cwd="/",
                               start_new_session=True)
    wait_for(lambda: subprocess.run(["curl", "-sf", "http://127.0.0.1:%d/health" % port],
                                    capture_output=True, check=False).returncode == 0, 30, "the foreign listener",
             interval=0.05)
    return foreign


@pytest.mark.reliability(
    section="fault", case="A foreign listener on the server's port",
    provoked="a process of user nobody answers 200 to every request on the port of gpufleet_server_health_url; the "
             "old tagged server runs (on another port) and the new definition moves it to that port",
    outcome="the restart fails in its preflight, before the kill, naming the listener's pid, user (nobody) and "
            "command line; the old server and the listener are alive (never killed), nothing was launched")
def test_a_foreign_listener_on_the_port_fails_the_host_before_the_kill(host):
    h = host("relport")
    old = h.start_old(_free_port())
    running = _tagged(h.name)
    port = _free_port()
    foreign = _foreign(port)
    try:
        failure, row, _took = h.play(h.vars(port))
        assert failure["failed"] is True, failure
        assert "port %d of http://127.0.0.1:%d/health is held by pid %d (nobody: /usr/bin/python3 -c " % (
            port, port, foreign.pid) in failure["msg"], failure["msg"]
        assert "Nothing was stopped" in failure["msg"], failure["msg"]
        assert foreign.poll() is None and old.poll() is None and _tagged(h.name) == running
        assert row["status"] == "failed" and row["restart"] == "no" and row["killed"] == 0, row
        assert "==== gpufleet launch" not in ((h.log / ("%s.log" % h.name)).read_text()
                                              if (h.log / ("%s.log" % h.name)).exists() else "")
    finally:
        foreign.kill()
        foreign.wait()


@pytest.mark.reliability(
    section="fault", case="A foreign listener on the server's port, behind a load balancer",
    provoked="as above, with an http balancer entry (a recorder of its API calls on the controller) and "
             "gpufleet_server_health_request POST /generate on the same port; then the same run with the old server "
             "itself on that port (its own listener)",
    outcome="the role's check (server_state, before the drain) fails the host in phase preflight with the restart's "
            "own preflight message ('port N ... is held by pid P (nobody: ...', 'Nothing was stopped'): the balancer "
            "API gets no call, the old server and the listener keep running (same pids), the summary says not out of "
            "rotation; the old server's own listener on the port refuses nothing (the restart runs, drained and put "
            "back: DELETE then PUT)")
def test_a_foreign_listener_behind_a_balancer_is_refused_before_the_drain(host):
    h = host("rellb")
    port = _free_port()
    rec = BalancerRecorder(add_status=204)
    lb = {"type": "http", "name": "lb-api", "remove": {"url": rec.url, "method": "DELETE"},
          "add": {"url": rec.url, "method": "PUT", "body": "{}"}}
    old = h.start_old(_free_port())
    running = _tagged(h.name)
    foreign = _foreign(port)
    try:
        gv = h.vars(port, gpufleet_server_balancers=[lb], gpufleet_server_health_request={
            "url": "http://127.0.0.1:%d/generate" % port, "body": '{"text": "ping"}'})
        failure, row, _took = h.play(gv)
        assert failure["failed"] is True, failure
        assert failure["msg"].startswith("%s: port %d of http://127.0.0.1:%d/health is held by pid %d (nobody: "
                                         "/usr/bin/python3 -c " % (h.name, port, port, foreign.pid)), failure["msg"]
        assert "Nothing was stopped" in failure["msg"], failure["msg"]
        assert row["phase"] == "preflight" and row["restart"] == "no" and row["killed"] == 0, row
        assert not row["out_of_rotation"], row
        assert rec.calls == [], rec.calls
        assert foreign.poll() is None and old.poll() is None and _tagged(h.name) == running
    finally:
        foreign.kill()
        foreign.wait()
    # The old server on that very port: its own listener, which the kill ends, refuses nothing.
    old.kill()
    old.wait()
    _kill_tagged(h.name)
    h.start_old(port)
    try:
        failure, row, _took = h.play(gv)
        assert failure["failed"] is False, failure
        assert row["restart"] == "yes", row
        assert [c[0] for c in rec.calls] == ["DELETE", "PUT"], rec.calls
    finally:
        rec.close()


@pytest.mark.reliability(
    section="fault", case="GPU holders no kill would end, behind a load balancer",
    provoked="an untagged process (started by hand, no adopt regex, gpufleet_server_kill_gpu_strays false) holds fake "
             "GPU 0 beside the running tagged server; a restart is forced behind an http balancer entry (a recorder of "
             "its API calls on the controller), gpufleet_server_clean_timeout 1",
    outcome="the role's check (server_state, before the drain) fails the host with the restart's own message and "
            "phase, clean ('fails at the clean gate, before the kill: GPUs not clean after 1.0 s, held by processes the "
            "kill would not end: ... pid P ...; nothing was stopped. None is gpufleet's: adopt ...'): the balancer API "
            "gets no call, the old server and the holder keep running (same pids), the summary says not out of rotation")
def test_gpu_holders_no_kill_would_end_are_refused_before_the_drain(host):
    h = host("relhold")
    port = _free_port()
    rec = BalancerRecorder(add_status=204)
    lb = {"type": "http", "name": "lb-api", "remove": {"url": rec.url, "method": "DELETE"},
          "add": {"url": rec.url, "method": "PUT", "body": "{}"}}
    old = h.start_old(port)
    running = _tagged(h.name)
    ready = h.base / "holder-ready"
    holder = subprocess.Popen([PY, str(FAKE_NVML_DIR / "fake_gpu.py"), "hold", "--gpu", "0", "--mib", "100",
                               "--ready-file", str(ready)], env=h.fg.env, start_new_session=True)
    try:
        wait_for(ready.exists, 60, "the holder")
        failure, row, _took = h.play(h.vars(port, gpufleet_server_balancers=[lb], gpufleet_server_clean_timeout=1))
        assert failure["failed"] is True, failure
        assert failure["msg"].startswith("%s: fails at the clean gate, before the kill: GPUs not clean after 1.0 s, "
                                         "held by processes the kill would not end: " % h.name), failure["msg"]
        assert "pid %d" % holder.pid in failure["msg"] and "nothing was stopped" in failure["msg"], failure["msg"]
        assert row["phase"] == "clean" and row["restart"] == "no" and row["killed"] == 0, row
        assert not row["out_of_rotation"], row
        assert rec.calls == [], rec.calls
        assert holder.poll() is None and old.poll() is None and _tagged(h.name) == running
    finally:
        holder.kill()
        holder.wait()
        rec.close()


def _refused(case: str, provoked: str, problem: str) -> t.Any:
    return pytest.param(provoked, problem, id=case.split(" ", 1)[0], marks=pytest.mark.reliability(
        section="fault", case="%s, behind a load balancer" % case,
        provoked="a restart forced behind an http balancer entry (a recorder of its API calls on the controller), the "
                 "old tagged server running; %s" % provoked,
        outcome="the role's check (server_state, before the drain) fails the host in phase preflight with the restart's "
                "own words, from the one function both call (_server.restart_problems): 'cannot run this server, "
                "nothing was stopped: %s': the balancer API gets no call, the old server keeps running (same pids), the "
                "summary says not out of rotation and not restarted" % problem))


@pytest.mark.parametrize("provoked, problem", [
    _refused("log path under a regular file", "gpufleet_server_log_dir under a regular file of the host",
             "log_path PLAIN/log/NAME.log lies under PLAIN, which is not a directory"),
    _refused("state file under a regular file", "gpufleet_server_state_dir under a regular file of the host",
             "record.state_file PLAIN/state/NAME.json lies under PLAIN, which is not a directory"),
    _refused("command not on the server's PATH", "gpufleet_server_command[0] a bare name on no directory of the "
             "server's PATH (gpufleet_server_env PATH)", "command[0] no-such-server-rel is not found on the server's "
             "PATH (********)"),  # its env's values are hidden (no_log), in the restart's words as in the check's
])
def test_what_only_the_restart_refused_is_refused_before_the_drain(host, provoked, problem):
    """issue 24: server_restart's preflight refused these once the host was drained; the check now refuses them
    before the drain, in the restart's words."""
    h = host("relpath")
    port = _free_port()
    rec = BalancerRecorder(add_status=204)
    lb = {"type": "http", "name": "lb-api", "remove": {"url": rec.url, "method": "DELETE"},
          "add": {"url": rec.url, "method": "PUT", "body": "{}"}}
    old = h.start_old(port)
    running = _tagged(h.name)
    plain = h.base / "plain"
    plain.write_text("")
    gv = h.vars(port, gpufleet_server_balancers=[lb])
    if "log_dir" in provoked:
        gv["gpufleet_server_log_dir"] = str(plain / "log")
    elif "state_dir" in provoked:
        gv["gpufleet_server_state_dir"] = str(plain / "state")
    else:
        gv["gpufleet_server_command"] = ["no-such-server-rel"] + gv["gpufleet_server_command"][1:]
        gv["gpufleet_server_env"] = dict(gv["gpufleet_server_env"], PATH="/nonexistent/bin")
    try:
        failure, row, _took = h.play(gv)
        problem = problem.replace("PLAIN", str(plain)).replace("NAME", h.name)
        assert failure["failed"] is True, failure
        assert failure["msg"] == "%s: cannot run this server, nothing was stopped: %s" % (h.name, problem), failure
        assert row["phase"] == "preflight" and row["restart"] == "no" and row["killed"] == 0, row
        assert not row["out_of_rotation"], row
        assert rec.calls == [], rec.calls
        assert old.poll() is None and _tagged(h.name) == running
    finally:
        rec.close()


@pytest.mark.reliability(
    section="fault", case="A relaunch that fails its readiness (health 200, the real request hangs)",
    provoked="the new command gets --hang-after-health, gpufleet_server_health_request POST /generate (1 s per try), "
             "start timeout 8 s; the old tagged server runs",
    outcome="the host fails in phase ready; the failed new server is stopped (no process carries the launch tag) and "
            "its GPU verified clean; the failure ends with what was left and, the rollback being on by default, '(no "
            "rollback: this host has no last known good generation yet)'; the summary says 'killed, not serving "
            "(failed new server stopped)'")
def test_a_relaunch_failing_its_readiness_is_stopped_and_the_summary_says_what_was_left(host):
    h = host("relhang")
    port = _free_port()
    old = h.start_old(port)
    gv = h.vars(port, "--hang-after-health", gpufleet_server_start_timeout=8, gpufleet_server_health_request={
        "url": "http://127.0.0.1:%d/generate" % port, "body": '{"text": "ping"}', "timeout": 1})
    failure, row, _took = h.play(gv)
    assert failure["failed"] is True, failure
    assert "/health answered 200 but the real request did not succeed" in failure["msg"], failure["msg"]
    # Its launcher, its worker and multiprocessing's resource tracker.
    # gpufleet_server_rollback is on by default; a host whose server was started by hand has nothing to go back to.
    assert re.search(r"\. The failed new server was stopped \(3 process\(es\) ended\) and its GPUs are clean: nothing "
                     r"of this service runs on the host, which is not serving \(no rollback: this host has no last known "
                     r"good generation yet\)$", failure["msg"]), failure["msg"]
    assert old.wait(timeout=10) is not None
    assert _tagged(h.name) == set() and h.holders(0) == []
    assert row["status"] == "failed" and row["phase"] == "ready", row
    assert row["restart"] == "killed, not serving (failed new server stopped)", row
    assert row["new_server"] == {"kept": False, "stopped": True, "killed": 3, "error": None}, row  # the 3 the message names


@pytest.mark.reliability(
    section="fault", case="A tensor-parallel-1 server with gpufleet_server_gpus unset on a 2-GPU host",
    provoked="the demo server with --tp 1 on GPU 0, gpufleet_server_gpus [] (every GPU), "
             "gpufleet_server_expect_gpu_processes 1, gpufleet_server_start_timeout 150",
    outcome="the host fails in phase busy about 30 s after the server was ready (not after 150 s), with a message "
            "naming GPU 1 as idle, GPU 0 as the server's, and 'set gpus (gpufleet_server_gpus) to [0]'")
def test_gpus_unset_for_a_server_on_one_of_two_gpus_fails_early_naming_the_gpus_to_set(host):
    h = host("relidle")
    port = _free_port()
    failure, row, took = h.play(h.vars(port, gpufleet_server_gpus=[], gpufleet_server_start_timeout=150))
    assert failure["failed"] is True, failure
    assert took < 120, took
    assert "GPU 1 stayed idle" in failure["msg"] and "while its processes hold GPU 0; if the server uses only GPU 0, " \
        "set gpus (gpufleet_server_gpus) to [0] (unset means every GPU of the host)" in failure["msg"], failure["msg"]
    assert row["status"] == "failed" and row["phase"] == "busy", row


@pytest.mark.reliability(
    section="fault", case="A health request body given as a YAML dict",
    provoked="gpufleet_server_health_request POST /generate with body {text: ping, sampling_params: {max_new_tokens: 1}} "
             "(a dict, not a JSON string); the demo server answers 400 to a body that is not JSON",
    outcome="the body is sent as JSON (Content-Type application/json), the real request passes and the host is "
            "restarted (before: the dict was sent as its Python repr, the demo answered 400 'bad request body' and the "
            "relaunch failed in phase ready)")
def test_a_dict_health_request_body_is_sent_as_json(host):
    h = host("relbody")
    port = _free_port()
    h.start_old(port)
    gv = h.vars(port, gpufleet_server_start_timeout=30, gpufleet_server_health_request={
        "url": "http://127.0.0.1:%d/generate" % port, "body": {"text": "ping", "sampling_params": {"max_new_tokens": 1}},
        "timeout": 5})
    failure, row, _took = h.play(gv)
    assert failure["failed"] is False, failure
    assert row["status"] != "failed" and row["restart"] == "yes", row


@pytest.mark.reliability(
    section="fault", case="The clean playbook's stop leaves no stale pidfile",
    provoked="the role launches the demo server (gpufleet.serving.gpu_server, a pidfile in gpufleet_server_run_dir); "
             "then the role's stop (tasks_from stop, what playbooks/clean.yml runs)",
    outcome="the stop kills the server, its GPU is clean, and the pidfile is gone (before: it stayed, naming the "
            "stopped server's pid, which the next process could reuse); no lock is left")
def test_the_stop_removes_the_pidfile_of_the_server_it_stopped(host):
    h = host("relstop")
    port = _free_port()
    gv = h.vars(port)
    failure, row, _took = h.play(gv)
    assert failure["failed"] is False and row["restart"] == "yes", (failure, row)
    pidfile = h.run / ("%s.pid" % h.name)
    assert pidfile.exists() and _tagged(h.name)
    p, res = local_play(h.base, [rescued_stop(gv)], ["_rel_stop"], dict(h.fg.env))
    assert res["_rel_stop"] == {"failed": False}, (res, p.stdout[-3000:])
    assert _tagged(h.name) == set() and h.holders(0) == []
    assert not pidfile.exists(), pidfile.read_text()
    assert not (h.run / ("%s.lock" % h.name)).exists()


def rescued_stop(gv: t.Dict[str, t.Any]) -> t.Dict[str, t.Any]:
    """The role's stop entry point (playbooks/clean.yml's), its failure recorded in _rel_stop."""
    return {"name": "Stop", "vars": gv, "block": [
        {"name": "Include the stop", "ansible.builtin.include_role": {"name": "gpufleet.serving.gpu_server",
                                                                      "tasks_from": "stop"}},
        {"name": "Record success", "ansible.builtin.set_fact": {"_rel_stop": {"failed": False}}}],
        "rescue": [{"name": "Record the failure", "ansible.builtin.set_fact": {"_rel_stop": {
            "failed": True, "msg": "{{ ansible_failed_result.msg | default('') }}"}}}]}
