# SPDX-License-Identifier: GPL-3.0-or-later
"""The sandbox fleet itself (tests/sandbox/fleet.py): real sshd hosts in namespaces, reached by real ansible."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import pid_alive, run_playbook, wait_for
from sandbox import fixtures as sandbox_fixtures

pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parent.parent.parent
FLEET_PY = ROOT / "tests" / "sandbox" / "fleet.py"
DEMO = "/opt/gpufleet-fake/demo_server.py"

GPU_INFO_PLAY = """
- name: Read GPUs on every sandbox host
  hosts: all
  gather_facts: false
  tasks:
    - name: Read GPU facts
      gpufleet.serving.gpu_info:
      register: r
    - name: Save them on the controller
      ansible.builtin.copy:
        content: "{{ r | to_nice_json }}"
        dest: "{{ out }}/{{ inventory_hostname }}.json"
        mode: "0644"
      delegate_to: localhost
"""


@pytest.fixture(scope="module")
def fleet(sandbox_fleet_module):
    return sandbox_fleet_module(hosts=3, gpus=2, nvlink=["host2"])


def gpu_info(fleet, tmp_path):
    pb = tmp_path / "gpu_info.yml"
    pb.write_text(GPU_INFO_PLAY)
    r = run_playbook(pb, inventory=str(fleet.inventory), extra_vars={"out": str(tmp_path)}, timeout=120)
    assert r.returncode == 0, r.stdout
    return {h: json.loads((tmp_path / ("%s.json" % h)).read_text()) for h in fleet.hosts}


def fleet_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(check=False, args=[sys.executable, str(FLEET_PY)] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)


def test_ansible_reaches_every_host_with_its_own_hostname_and_no_address_outside(fleet):
    r = fleet.ansible("all", "ansible.builtin.command", "hostname")
    assert r.returncode == 0, r.stdout
    for h in ("host1", "host2", "host3"):
        assert re.search(r"^%s \| CHANGED \| rc=0 >>\n%s$" % (h, h), r.stdout, re.M), r.stdout
    # Private addresses exist only inside the fleet's namespaces, never in the machine's own.
    own = subprocess.run(["ip", "-o", "addr"], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert "10.200.0." not in own
    assert "inet 10.200.0.11/24" in fleet.ssh("host1", "ip -o addr show eth0", check=True).stdout
    # An empty resolv.conf and an /etc/hosts entry: name lookups answer at once (no DNS stall).
    out = fleet.ssh("host3", "cat /etc/resolv.conf; getent hosts host3 host1", check=True).stdout
    assert out.split("\n")[:2] == ["10.200.0.13     host3", "10.200.0.11     host1"]


def test_each_host_has_its_own_pid_namespace(fleet):
    fleet.ssh("host1", "setsid sleep 4242 </dev/null >/dev/null 2>&1 &", check=True)
    try:
        wait_for(lambda: fleet.ssh("host1", "pgrep -fx 'sleep 4242'").returncode == 0, 10, "sleep on host1")
        assert fleet.ssh("host2", "pgrep -fx 'sleep 4242'").returncode == 1
        assert fleet.ssh("host2", "cat /proc/1/cmdline | tr '\\0' ' '", check=True).stdout.startswith("sshd: /usr/sbin/sshd")
    finally:
        fleet.ssh("host1", "pkill -x -f 'sleep 4242'")


def test_writes_to_usr_stay_in_their_host(fleet):
    site = "/usr/lib/python3.11/sitecustomize.py"
    marker = "# sandbox-write-test %d" % os.getpid()
    fleet.ssh("host1", "echo '%s' >> %s" % (marker, site), check=True)
    try:
        assert marker in fleet.ssh("host1", "cat %s" % site, check=True).stdout
        assert marker not in fleet.ssh("host2", "cat %s 2>/dev/null; true" % site, check=True).stdout
        if os.path.exists(site):
            assert marker not in Path(site).read_text()
        # The write landed in host1's copy-on-write layer inside the state dir (Debian links the file to /etc).
        target = fleet.ssh("host1", "readlink -f %s" % site, check=True).stdout.strip()
        assert marker in (fleet.state_dir / "hosts" / "host1" / "upper" / target.lstrip("/")).read_text()
        # Its own system python picks the fake NVML up without PYTHONPATH.
        out = fleet.ssh("host1", "env -u PYTHONPATH %s -c 'import pynvml; print(pynvml.__file__)'" % fleet.python,
                        check=True).stdout
        assert out.strip() == "/opt/gpufleet-fake/pynvml.py"
    finally:
        fleet.ssh("host1", "sed -i --follow-symlinks '/sandbox-write-test/d' %s" % site)


def _http(fleet, host, method, path, body=None, timeout=5.0):
    code = (
        "import json,sys,urllib.request,urllib.error\n"
        "req=urllib.request.Request(sys.argv[1], data=sys.argv[2].encode() if sys.argv[2] else None, method=sys.argv[3])\n"
        "try:\n"
        "    r=urllib.request.urlopen(req, timeout=float(sys.argv[4])); print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code); print(e.read().decode())\n"
        "except OSError as e:\n"
        "    print(0); print(repr(e))\n")
    url = "http://%s:30000%s" % (fleet.addr(host), path)
    r = fleet.hub_run([sys.executable, "-c", code, url, json.dumps(body) if body is not None else "", method,
                       str(timeout)], timeout=timeout + 10)
    status, _nl, text = r.stdout.partition("\n")
    return int(status), text.strip()


def test_demo_server_workers_hold_fake_gpus_and_serve_over_the_host_address(fleet, tmp_path):
    start = ("cd /; NCCL_DEBUG=INFO NCCL_P2P_LEVEL=SYS NCCL_NVLS_ENABLE=0 GPUFLEET_RUN=t1 SECRET_TOKEN=nope "
             "setsid %s %s --port 30000 --tp 2 --gpus 0,1 --mib 20000 --state-dir /var/lib/demo "
             "</dev/null >/var/log/demo.log 2>&1 &" % (fleet.python, DEMO))
    fleet.ssh("host1", start, check=True)
    try:
        wait_for(lambda: _http(fleet, "host1", "GET", "/health")[0] == 200, 20, "demo /health on host1")
        status, text = _http(fleet, "host1", "POST", "/generate", {"text": "hello fleet", "max_new_tokens": 4})
        assert status == 200, text
        answer = json.loads(text)
        workers = {w["rank"]: w["pid"] for w in answer["meta_info"]["workers"]}
        assert sorted(workers) == [0, 1]

        # The spawn workers (host pids) hold 20000 MiB each, seen through gpu_info over ssh; other hosts are idle
        # and differ in NVLink as configured.
        info = gpu_info(fleet, tmp_path)
        for g in (0, 1):
            procs = info["host1"]["gpus"][g]["processes"]
            assert [(p["pid"], p["used_mib"]) for p in procs] == [(workers[g], 20000)]
            assert info["host1"]["gpus"][g]["used_mib"] == 20000
        for h in ("host2", "host3"):
            assert info[h]["gpu_count"] == 2
            assert all(g["used_mib"] == 0 and g["processes"] == [] for g in info[h]["gpus"])
        assert [info[h]["nvlink_active"] for h in ("host1", "host2", "host3")] == [False, True, False]
        assert len({g["uuid"] for h in info.values() for g in h["gpus"]}) == 6

        # Each worker recorded the NCCL_*/GPUFLEET_* env it saw (and nothing else), and logged NCCL's format.
        rec = json.loads(fleet.ssh("host1", "cat /var/lib/demo/worker-1.json", check=True).stdout)
        assert rec["env"] == {"GPUFLEET_RUN": "t1", "NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "SYS"}
        log = fleet.ssh("host1", "cat /var/log/demo.log", check=True).stdout
        assert re.search(r"^host1:%d:\d+ \[1\] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS$" % workers[1], log, re.M), log
        assert re.search(r"^host1:%d:\d+ \[0\] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0\.$" % workers[0], log, re.M), log

        # SIGKILL of the launcher leaves its workers as orphans, still holding the GPUs (sglang#23627).
        launcher = json.loads(fleet.ssh("host1", "cat /var/lib/demo/launcher.json", check=True).stdout)["pid"]
        fleet.ssh("host1", "kill -9 %d" % launcher, check=True)
        wait_for(lambda: fleet.ssh("host1", "kill -0 %d" % launcher).returncode != 0, 10, "launcher gone")
        alive = fleet.ssh("host1", "ps -o pid=,ppid= -p %d,%d" % (workers[0], workers[1]), check=True).stdout.split()
        assert alive == [str(workers[0]), "1", str(workers[1]), "1"]
    finally:
        fleet.ssh("host1", "pkill -9 -f '[d]emo_server.py'; pkill -9 -f '[m]ultiprocessing'")


def test_up_reuses_a_running_fleet_and_refuses_another_config(fleet):
    pids = [fleet.launcher_pid(h) for h in fleet.hosts]
    r = fleet_cli("up", "--hosts", "3", "--gpus", "2", "--nvlink", "host2", "--state-dir", str(fleet.state_dir))
    assert r.returncode == 0 and "reusing" in r.stderr, r.stderr
    assert [h["pid"] for h in json.loads(fleet_cli("status", "--state-dir", str(fleet.state_dir)).stdout)["hosts"]] == pids
    r = fleet_cli("up", "--hosts", "2", "--state-dir", str(fleet.state_dir))
    assert r.returncode == 1 and "another config is already up" in r.stderr, r.stderr
    r = fleet_cli("up", "--hosts", "2", "--state-dir", "/root/gpufleet-sandbox-x")
    assert r.returncode == 1 and "must not be under /root" in r.stderr, r.stderr
    assert not os.path.exists("/root/gpufleet-sandbox-x")


def _netns():
    try:
        return set(os.listdir("/run/netns"))
    except OSError:
        return set()


def _mounts_under(path: Path) -> list:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out += [ln for ln in Path("/proc/%s/mountinfo" % pid).read_text().splitlines() if str(path) in ln]
            except OSError:
                pass
    return out


def test_down_leaves_nothing_also_after_a_crash_and_fleets_do_not_collide(sandbox_fleet):
    a = sandbox_fleet(hosts=2, gpus=1)
    b = sandbox_fleet(hosts=2, gpus=1)
    assert a.hub != b.hub and a.addr("host1") == b.addr("host1")
    for f in (a, b):
        r = f.ansible("all", "ansible.builtin.ping")
        assert r.returncode == 0 and r.stdout.count("SUCCESS") == 2, r.stdout
    assert list(a.state_dir.glob("cp-*")), "ansible's ssh control sockets should live in the state dir"
    a.ssh("host1", "setsid sleep 4343 </dev/null >/dev/null 2>&1 &", check=True)
    host_pids = [a.launcher_pid(h) for h in a.hosts] + [a.pid1(h) for h in a.hosts]
    mine = {n for n in _netns() if n.startswith(a._fleet.prefix)}
    assert len(mine) == 3

    # A crash: host2's unshare dies; status notices, and a new `up` cleans up and starts over.
    os.kill(a.launcher_pid("host2"), 9)
    wait_for(lambda: fleet_cli("status", "--state-dir", str(a.state_dir)).returncode == 1, 10, "status says down")
    r = fleet_cli("up", "--hosts", "2", "--gpus", "1", "--state-dir", str(a.state_dir))
    assert r.returncode == 0 and "stale or partial" in r.stderr, r.stderr
    a.up(hosts=2, gpus=1)  # reuses it, reloads the state
    host_pids += [a.launcher_pid(h) for h in a.hosts]
    assert a.ssh("host2", "hostname", check=True).stdout.strip() == "host2"

    t0 = time.monotonic()
    a.down()
    assert time.monotonic() - t0 < 5
    assert not {n for n in _netns() if n.startswith(a._fleet.prefix)}
    # (Zombies until this machine's init reaps them count as gone: pid_alive says so.)
    assert not [p for p in host_pids if pid_alive(p)]
    assert subprocess.run(check=False, args=["pgrep", "-f", "sleep 4343"], stdout=subprocess.PIPE).returncode == 1
    assert subprocess.run(check=False, args=["pgrep", "-f", str(a.state_dir)], stdout=subprocess.PIPE).returncode == 1
    assert not _mounts_under(a.state_dir)
    assert not list(a.state_dir.glob("cp-*")) and not (a.state_dir / "hosts").exists()
    # The other fleet is untouched; down twice is harmless.
    assert b.ssh("host2", "hostname", check=True).stdout.strip() == "host2"
    assert fleet_cli("down", "--state-dir", str(a.state_dir)).returncode == 0


def test_longest_allowed_state_dir_works_and_a_longer_one_is_refused_up_front(sandbox_fleet, tmp_path_factory):
    base = tmp_path_factory.mktemp("long")
    # The fleet's arithmetic: DIR + "/cp-" + the longest host address + ssh's ".<16 chars>" temp name <= 107.
    limit = 107 - len("/cp-") - len("10.200.0.210") - 17
    too_long = base / ("e" * (limit - len(str(base))))
    r = fleet_cli("up", "--hosts", "1", "--gpus", "1", "--state-dir", str(too_long))
    assert r.returncode == 1 and "too long for ssh control sockets" in r.stderr and str(limit) in r.stderr, r.stderr
    assert not too_long.exists() and not {n for n in _netns() if n.startswith(sandbox_fixtures._fleet.prefix_for(too_long))}

    f = sandbox_fleet(hosts=1, gpus=1, state_dir=base / ("d" * (limit - len(str(base)) - 1)))
    r = f.ansible("all", "ansible.builtin.ping")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout
    # A master at that path, in the foreground: the fleet's own ssh (the inventory's options, ControlMaster=auto and
    # ControlPersist) reuses the one ansible's ping left, or binds one itself before its session runs. Waiting for
    # ansible's background master alone timed out once after 60 s in a full fresh-clone run (the ping had passed), so
    # the socket is asserted after a connection this test waited for.
    f.ssh("host1", "true", check=True)
    # ssh binds the master's socket under a temporary name first and renames it: look for the final name, whatever
    # else is there for a moment.
    wait_for(lambda: "cp-" + f.addr("host1") in [s.name for s in f.state_dir.glob("cp-*")], 60,
             "the ssh control socket at the longest allowed path")
    # What the arithmetic models: ssh binds the control path plus 17 bytes, and 107 of them is the most.
    argv = f._fleet.ssh_argv("host1", "true")
    for n, ok in ((107 - 17, True), (107 - 17 + 1, False)):
        path = str(f.state_dir / "x") + "x" * (n - len(str(f.state_dir / "x")))
        # ssh takes an option's first value: these go before the fleet's own.
        p = subprocess.run(argv[:1] + ["-o", "ControlPath=" + path, "-o", "ControlPersist=no"] + argv[1:],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30, check=False)
        assert (p.returncode == 0) is ok and (("too long for Unix domain socket" in p.stderr) is not ok), (n, p.stderr)
