# SPDX-License-Identifier: GPL-3.0-or-later
"""Faults on one sandbox host, provoked before one real rollout (gpufleet.serving.rollout through ansible-runner):

- a TERM-ignoring demo server carrying the launch tag (escalated to SIGKILL after the grace);
- the spawn workers of a tagged server whose launcher was SIGKILLed (orphans still holding fake GPU memory);
- the role's pidfile naming a live, unrelated process with another start time (a reused pid);
- another user's python, and a monitoring agent named nvidia_gpu_exporter with the NVML config open.

Each test below checks one of these in the events of that single rollout and on the host afterwards.
"""
from __future__ import annotations

import json

import pytest

from gpufleet_ci import sandbox
from rel_helpers import (DEMO, ROLLOUT_SITE, gpu_holders, host_py, ps, read_host_file, runner_play, sh, start_bg,
                         summary, wait_for)

pytestmark = pytest.mark.sandbox

RESTART_TASK = "Restart the server (kill, verify clean, launch, wait ready, verify the workers' environment, record)"
GRACE = 2.0
EXPORTER = """#!/usr/bin/python3
# Stand-in for a GPU monitoring agent: keeps the NVML config open and polls, like nvidia_gpu_exporter.
import time
f = open("/opt/gpufleet-fake/fake_nvml.json")
while True:
    time.sleep(3600)
"""

# The system interpreter's sitecustomize.py (Debian: /etc/python3.X/sitecustomize.py through a link): path and bytes.
SITE_CODE = r"""
import json, os, sysconfig
p = os.path.realpath(os.path.join(sysconfig.get_paths()["stdlib"], "sitecustomize.py"))
print(json.dumps({"path": p, "text": open(p).read() if os.path.exists(p) else None}))
"""


def _demo_argv(python, port, state_dir, *flags):
    return [python, DEMO, "--port", str(port), "--tp", "2", "--gpus", "0,1", "--mib", "1000",
            "--state-dir", state_dir] + list(flags)


def _launcher(fleet, host, state_dir):
    txt = read_host_file(fleet, host, state_dir + "/launcher.json")
    if not txt:
        return None
    st = json.loads(txt)
    return st if st.get("ready") else None


@pytest.fixture(scope="module")
def scenario(sandbox_fleet_module, tmp_path_factory):
    fleet = sandbox_fleet_module(hosts=1, gpus=2)
    py = fleet.python
    h = "host1"
    tag = {"GPUFLEET_SERVICE": "demo"}

    # 1. Orphans: a tagged server whose launcher dies by SIGKILL; its spawn workers keep their GPU memory.
    start_bg(fleet, h, _demo_argv(py, 30001, "/var/lib/demo-orphan"), env=tag)
    orphan_st = wait_for(lambda: _launcher(fleet, h, "/var/lib/demo-orphan"), 90, "orphan-to-be server ready")
    sh(fleet, h, "kill -KILL %d" % orphan_st["pid"])
    wait_for(lambda: orphan_st["pid"] not in ps(fleet, h), 60, "launcher gone")
    orphans = orphan_st["workers"]

    # 2. A tagged server that ignores SIGTERM (launcher and workers).
    start_bg(fleet, h, _demo_argv(py, 30002, "/var/lib/demo-stuck", "--ignore-term"), env=tag)
    stuck_st = wait_for(lambda: _launcher(fleet, h, "/var/lib/demo-stuck"), 90, "TERM-ignoring server ready")
    stuck = [stuck_st["pid"]] + stuck_st["workers"]

    # 3. Unrelated processes: another user's python, a monitoring agent, and a process whose pid the role's
    #    pidfile names with another start time (the pid was reused after the old server died).
    sh(fleet, h, "id reltest >/dev/null 2>&1 || useradd -M -s /bin/sh reltest")
    start_bg(fleet, h, [py, "-c", "import time; time.sleep(3600)", "other-user-python"], user="reltest", log="/tmp/rel-bg.log")
    sh(fleet, h, "cat > /usr/local/bin/nvidia_gpu_exporter <<'EOF'\n%sEOF\nchmod 755 /usr/local/bin/nvidia_gpu_exporter" % EXPORTER)
    start_bg(fleet, h, ["/usr/local/bin/nvidia_gpu_exporter", "--web.listen-address=:9835"])
    start_bg(fleet, h, ["sleep", "3601"])

    def find(pred, what):
        try:
            return wait_for(lambda: [p for p in ps(fleet, h).values() if pred(p)], 60, what)[0]
        except AssertionError as e:
            procs = sorted(p["cmd"][:80] for p in ps(fleet, h).values())
            raise AssertionError("%s; processes: %s; log: %s" % (e, procs, read_host_file(fleet, h, "/tmp/rel-bg.log")))

    # The python itself, not the root `sh -c ... setpriv ...` that execs into it (same pid, root until setpriv switches):
    # found at that stage on a loaded machine, its uid read 0.
    other = find(lambda p: "other-user-python" in p["cmd"] and p["cmd"].startswith(py), "another user's python")
    exporter = find(lambda p: "nvidia_gpu_exporter" in p["cmd"], "the exporter")
    reused = find(lambda p: p["cmd"] == "sleep 3601", "the sleep")
    sh(fleet, h, "mkdir -p /run/gpufleet && echo '%d %d' > /run/gpufleet/demo.pid" % (reused["pid"], reused["start"] + 7))
    bystanders = {"other": other, "exporter": exporter, "reused": reused}
    before = ps(fleet, h)
    holders_before = gpu_holders(fleet, h)
    site_before = host_py(fleet, h, SITE_CODE)

    work = tmp_path_factory.mktemp("rel-host")
    gv = sandbox.server_vars(py)
    gv.pop("gpufleet_nccl_profile")  # NCCL tuning is not what these faults are about
    # Every kill step runs: tag + pidfile + adopt regex, then the stray GPU holders.
    gv.update(gpufleet_server_kill_grace=GRACE, gpufleet_server_kill_final_wait=5, gpufleet_server_kill_gpu_strays=True)
    inv = work / "servers.yml"
    inv.write_text(sandbox.servers_inventory([h], gv))
    run = runner_play(work, ROLLOUT_SITE, [fleet.inventory, inv])
    return dict(fleet=fleet, run=run, orphans=orphans, stuck=stuck, stuck_launcher=stuck_st["pid"],
                bystanders=bystanders, before=before, after=ps(fleet, h), holders_before=holders_before,
                holders_after=gpu_holders(fleet, h), site_before=site_before, site_after=host_py(fleet, h, SITE_CODE))


def _killed(sc):
    return {p["pid"]: p for p in sc["run"].res("host1", RESTART_TASK)["kill"]["processes"]}


@pytest.mark.reliability(
    section="fault", case="Server ignores SIGTERM",
    provoked="a tagged demo server started with --ignore-term (launcher and spawn workers ignore TERM); rollout with kill grace 2 s",
    outcome="the kill step (process_kill's code, in server_restart) sends SIGTERM, waits the grace, sends SIGKILL; each such process is reported with "
            "signals_sent [SIGTERM, SIGKILL] and exited_after_s >= grace; the new server is launched")
def test_term_ignoring_server_is_escalated_to_sigkill_and_reported(scenario):
    run = scenario["run"]
    assert run.rc == 0, run.stdout[-3000:]
    killed = _killed(scenario)
    for pid in scenario["stuck"]:
        assert pid in killed, "TERM-ignoring pid %d was not selected: %s" % (pid, sorted(killed))
        k = killed[pid]
        assert k["signals_sent"] == ["SIGTERM", "SIGKILL"], k
        assert k["survived"] is False and k["exited_after_s"] >= GRACE, k
        assert pid not in scenario["after"]
    assert run.res("host1", RESTART_TASK)["kill"]["elapsed_s"] >= GRACE
    assert summary(run)["host1"]["restarted"] is True


@pytest.mark.reliability(
    section="fault", case="Launcher SIGKILLed earlier, workers orphaned holding GPU memory",
    provoked="a tagged demo server whose launcher is killed with SIGKILL; its spawn workers live on (reparented) "
             "holding fake GPU memory",
    outcome="the rollout finds the orphans by the launch tag (matched_by tag), TERM ends them, the GPUs verify clean "
            "and the new server holds them")
def test_orphaned_workers_are_found_by_tag_and_killed(scenario):
    killed = _killed(scenario)
    before = scenario["before"]
    for pid in scenario["orphans"]:
        assert before[pid]["ppid"] == 1 and before[pid]["tag"] == "demo", before[pid]  # orphaned to the host's PID 1
        assert any(pid in pids for pids in scenario["holders_before"].values()), "orphan %d held no GPU" % pid
        assert pid in killed and "tag" in " ".join(killed[pid]["matched_by"]), killed.get(pid)
        assert killed[pid]["signals_sent"] == ["SIGTERM"] and not killed[pid]["survived"]
        assert pid not in scenario["after"]
    # Every GPU is now held by the new server's tagged workers only.
    after = scenario["after"]
    for gpu, pids in scenario["holders_after"].items():
        assert pids and all(after[p]["tag"] == "demo" for p in pids), (gpu, pids)
        assert not set(pids) & set(before), "GPU %d still held by an old process" % gpu


@pytest.mark.reliability(
    section="fault", case="Stale pidfile whose pid now belongs to an unrelated process",
    provoked="the role's pidfile (/run/gpufleet/demo.pid) names a live `sleep` with a different start time",
    outcome="the pidfile is reported stale in the kill step's notes, the `sleep` survives, the server is launched "
            "and the pidfile rewritten")
def test_stale_pidfile_process_survives(scenario):
    reused = scenario["bystanders"]["reused"]
    res = scenario["run"].res("host1", RESTART_TASK)["kill"]
    assert reused["pid"] not in _killed(scenario)
    assert any("is stale: pid %d now belongs to another process" % reused["pid"] in n for n in res["notes"]), res["notes"]
    assert scenario["after"].get(reused["pid"], {}).get("start") == reused["start"]
    pidfile = read_host_file(scenario["fleet"], "host1", "/run/gpufleet/demo.pid").split()
    assert int(pidfile[0]) != reused["pid"] and int(pidfile[0]) in scenario["after"]


@pytest.mark.reliability(
    section="fault", case="Unrelated processes (another user's python, a GPU monitoring agent)",
    provoked="a python process of user `reltest` (useradd on the host) and a process named nvidia_gpu_exporter "
             "holding the NVML config open, on the host during a rollout that kills by tag, pidfile and adopt regex, "
             "then the stray GPU holders (gpufleet_server_kill_gpu_strays)",
    outcome="neither is selected by any kill step; both are alive with the same pid and start time afterwards "
            "(an agent that does hold GPU memory is covered by the clean-gate case)")
def test_unrelated_processes_survive_the_rollout(scenario):
    killed = _killed(scenario)
    strays = scenario["run"].res("host1", RESTART_TASK)["strays"]
    killed.update({p["pid"]: p for p in strays["processes"]})
    after = scenario["after"]
    for name in ("other", "exporter"):
        p = scenario["bystanders"][name]
        assert p["pid"] not in killed, (name, killed[p["pid"]])
        assert after.get(p["pid"], {}).get("start") == p["start"], "%s was killed" % name
    assert scenario["bystanders"]["other"]["uid"] != 0


@pytest.mark.reliability(
    section="input", case="Rollout without gpufleet_nccl_profile",
    provoked="the same rollout with no NCCL profile in the inventory or extra vars",
    outcome="the nccl_tuning role is skipped on every task and the interpreter's sitecustomize.py is byte for byte "
            "unchanged (the role's own default, profile auto, must not switch tuning on)")
def test_rollout_without_a_profile_leaves_the_nccl_layers_alone(scenario):
    run = scenario["run"]
    assert scenario["site_after"] == scenario["site_before"]
    assert "BEGIN gpufleet" not in (scenario["site_after"]["text"] or "")
    nccl = [e for e in run.host_events("host1") if (e["event_data"].get("role") or "").endswith("nccl_tuning")
            and e["event"] in ("runner_on_ok", "runner_on_failed")]
    assert nccl == [], [e["event_data"]["task"] for e in nccl]
