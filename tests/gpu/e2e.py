#!/usr/bin/env python
# SPDX-License-Identifier: GPL-3.0-or-later
"""Real-GPU end-to-end run of gpufleet.serving through its own playbooks (one command, on a GPU host, as root).

    python3 tests/gpu/e2e.py --out DIR [--workers 2] [--gib 20] [--gpus N]

With one GPU, two workers share GPU 0 (a size-1 NCCL communicator each). With N > 1 GPUs (default: every GPU
nvidia-smi lists), one worker a GPU in ONE communicator (world size N, NCCL all_reduce across GPUs), and the
run also records what `gpu_info` says about NVLink/topology and which profile `auto` resolves to there.
NVLink multicast is off in every environment this run starts (the stale server's and the server's carry
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1, checked in every worker; the
sitecustomize block carries NCCL_NVLS_ENABLE=0 for any other Python process).

Needs: an NVIDIA GPU, torch with NCCL, nvidia-ml-py, ansible-core importable by this python3.
Steps (each recorded in DIR/e2e.json, the playbook outputs in DIR/*.log):
 1. note the system sitecustomize.py (bytes + sha256);
 2. start tests/gpu/real_server.py by hand, untuned and untagged (as the seed did), wait for /health;
 3. rollout (gpufleet.serving.rollout, profile pcie_only, sitecustomize layer): adopt + kill the stale server,
    wait clean on real NVML, write the NCCL block, relaunch, /health + a real /generate, process_env on the
    GPU-holding spawn workers and the NCCL log check;
 4. read every worker's /proc/PID/environ (NCCL keys only) and NCCL's `set by environment` lines per pid;
 5. audit passes; 6. a second rollout is a no-op (changed=0); 7. three forced restarts, timed, for the
    orchestration overhead; 9. the performance gate on real GPU work (fp32 matmuls, TF32 allowed): a baseline, then
    NVIDIA_TF32_OVERRIDE=0 in the server's environment fails the gate and is rolled back to the last known good,
    then the restored server passes the gate; 8. profile none + clean: sitecustomize.py restored byte for byte, GPU
    clean.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
PORT = 30000
TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
         "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
# Always set: NVLink multicast can take a shared host's GPUs out of service. All three in every environment this
# run starts; the NCCL one in the sitecustomize block too (the layers write NCCL names only).
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SAFE = {k: v for k, v in MULTICAST_OFF.items() if k.startswith("NCCL_")}
EXPECTED = dict(TUNED, **SAFE)
AUTO_PLAY = """
- name: What the auto profile resolves to here, and what gpu_info reports
  hosts: gpufleet_servers
  gather_facts: false
  tasks:
    - name: Resolve the profile as the nccl_tuning role does
      ansible.builtin.include_role:
        name: gpufleet.serving.nccl_tuning
        tasks_from: preflight
      vars:
        gpufleet_nccl_profile: auto
    - name: Read the GPUs
      gpufleet.serving.gpu_info:
      register: gi
    - name: Save both
      ansible.builtin.copy:
        content: "{{ {'resolved': gpufleet_nccl_profile_resolved, 'env': _gpufleet_nccl_env, 'gpu_info': gi} | to_nice_json }}"
        dest: "{{ out }}/auto.json"
        mode: "0644"
"""


def sh(argv, **kw):
    return subprocess.run(check=kw.pop("check", False), args=argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def system_sitecustomize() -> str:
    # The file the system python3 imports (Ubuntu: /usr/lib/python3.X/sitecustomize.py -> /etc/python3.X/...).
    out = sh(["/usr/bin/python3", "-c", "import sitecustomize, os; print(os.path.realpath(sitecustomize.__file__))"],
             env={"PATH": "/usr/bin:/bin"})
    return out.stdout.strip().splitlines()[-1]


def health(timeout=0.5) -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % PORT, timeout=timeout) as r:
            return r.status == 200
    except Exception:
        return False


def playbook(out, name, pb, inv, *extra, check_rc=True):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               GPUFLEET_SUMMARY_DIR=os.path.join(out, "summary-" + name),
               # Test-only: each task's wall time (controller clock) to out/NAME-tasks.json.
               ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "tests", "gpu", "callback"),
               ANSIBLE_CALLBACKS_ENABLED="gpufleet.serving.rollout_summary,task_times",
               GPUFLEET_TASK_TIMES=os.path.join(out, name + "-tasks.json"))
    t0 = time.monotonic()
    r = sh([PY, "-m", "ansible.cli.playbook", pb, "-i", inv] + list(extra), cwd=ROOT, env=env)
    wall = time.monotonic() - t0
    with open(os.path.join(out, name + ".log"), "w") as f:
        f.write(r.stdout)
    recap = {}
    for m in re.finditer(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", r.stdout, re.M):
        recap[m.group(1)] = {"ok": int(m.group(2)), "changed": int(m.group(3)), "failed": int(m.group(5))}
    res = {"rc": r.returncode, "wall_s": round(wall, 3), "recap": recap}
    print("%-12s rc=%d wall=%.1fs recap=%s" % (name, r.returncode, wall, recap), flush=True)
    if check_rc and r.returncode != 0:
        print(r.stdout[-6000:])
        raise SystemExit("%s failed (rc %d)" % (name, r.returncode))
    return res


def summary_row(out, name, host="localhost"):
    """The rollout summary's JSON row of `host` for the playbook run `name` ({} when there is none)."""
    try:
        with open(os.path.join(out, "summary-" + name, "rollout-summary.json")) as f:
            return next((r for r in json.load(f)["hosts"] if r["host"] == host), {})
    except (OSError, ValueError, KeyError):
        return {}


def workers_env(tag="GPUFLEET_SERVICE=gpu-e2e", full=False):
    """NCCL_* keys of every process carrying the launch tag (tag None: every spawn worker), never other values
    (`full`: also every variable's name)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
            cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode()[:160]
        except OSError:
            continue
        env = dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)
        tagged = "GPUFLEET_SERVICE" in env and "GPUFLEET_SERVICE=" + env["GPUFLEET_SERVICE"] == tag
        if tagged or (tag is None and "spawn_main" in cmd):
            out[pid] = {"cmdline": cmd, "nccl": {k: v for k, v in env.items() if k in EXPECTED},
                        "nccl_debug": {k: v for k, v in env.items() if k.startswith("NCCL_DEBUG")}}
            if full:  # the names only (values may be secret), for a check that a variable is gone
                out[pid]["env"] = sorted(env)
    return out


def nccl_lines(log_path, pids):
    rx = re.compile(r"^[^:\s]+:(\d+):\d+ .*NCCL INFO (NCCL_\w+) set by environment to (\S+?)\.?$")
    got = {}
    import glob
    for path in glob.glob(log_path):
        with open(path, errors="replace") as f:
            for line in f:
                m = rx.match(line.strip())
                if m and m.group(1) in pids:
                    got.setdefault(m.group(1), {})[m.group(2)] = m.group(3)
    return got


def group_vars(server_cmd: list, ngpu: int) -> dict:
    """The inventory's gpufleet_servers variables (tests/gpu/test_harness.py checks the multicast-off variables)."""
    server_env = dict(MULTICAST_OFF, GPUFLEET_TEST_GPUS=str(ngpu))
    gv = {
        "gpufleet_nccl_profile": "pcie_only",
        "gpufleet_nccl_env": SAFE,
        "gpufleet_nccl_layers": ["sitecustomize"],
        "gpufleet_server_name": "gpu-e2e",
        "gpufleet_server_command": server_cmd,
        # NCCL's own file per process: stdout to a file is block-buffered, so lines there show up late.
        "gpufleet_server_env": dict(server_env, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV",
                                    NCCL_DEBUG_FILE="/var/log/gpufleet/nccl.%h.%p.log"),
        "gpufleet_server_health_url": "http://127.0.0.1:%d/health" % PORT,
        "gpufleet_server_health_request": {"url": "http://127.0.0.1:%d/generate" % PORT, "method": "POST",
                                           "body": "{}", "timeout": 60, "expect_regex": "pong"},
        "gpufleet_server_adopt_cmdline_regex": r"real_server\.py",
        "gpufleet_server_start_timeout": 300,
        "gpufleet_server_kill_grace": 10,
        "gpufleet_server_clean_timeout": 30,
        "gpufleet_server_nccl_log": "/var/log/gpufleet/nccl.*.log",
        # The workers must carry the two that are not NCCL's (the NCCL one is checked with the tuning).
        "gpufleet_server_expected_env": {k: v for k, v in MULTICAST_OFF.items() if k not in SAFE},
    }
    return gv


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gib", type=float, default=20)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: every GPU nvidia-smi lists)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.environ.update(MULTICAST_OFF)
    ngpu = a.gpus or len([ln for ln in sh(["nvidia-smi", "-L"]).stdout.splitlines() if ln.startswith("GPU ")])
    multi = ngpu > 1
    workers = ngpu if multi else a.workers
    ev = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpus": ngpu, "workers": workers,
          "mode": "one communicator, a rank a GPU" if multi else "size-1 communicators sharing GPU 0"}
    ev["topo"] = sh(["nvidia-smi", "topo", "-m"]).stdout
    ev["nvidia_smi"] = sh(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,memory.used",
                           "--format=csv,noheader"]).stdout.strip()
    ev["torch"] = sh([PY, "-c", "import torch; print(torch.__version__, torch.cuda.nccl.version())"]).stdout.strip()
    site = system_sitecustomize()
    original = open(site, "rb").read()
    ev["sitecustomize"] = {"path": site, "link": "/usr/lib/python%d.%d/sitecustomize.py" % sys.version_info[:2],
                           "sha256_before": hashlib.sha256(original).hexdigest(), "bytes_before": len(original)}
    shutil.copy(site, os.path.join(a.out, "sitecustomize.before.py"))

    for old in __import__("glob").glob("/var/log/gpufleet/nccl.*.log"):
        os.unlink(old)
    srv_dir = "/opt/gpufleet-gpu"
    os.makedirs(srv_dir, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "tests", "gpu", "real_server.py"), srv_dir)
    inv_dir = os.path.join(a.out, "inventory")
    os.makedirs(os.path.join(inv_dir, "group_vars"), exist_ok=True)
    with open(os.path.join(inv_dir, "hosts.yml"), "w") as f:
        json.dump({"gpufleet_servers": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": PY}}}}, f)
    server_cmd = [PY, srv_dir + "/real_server.py", "--port", str(PORT), "--workers", str(workers), "--gib", str(a.gib)]
    server_cmd += ["--one-communicator"] if multi else []
    gv = group_vars(server_cmd, ngpu)
    with open(os.path.join(inv_dir, "group_vars", "gpufleet_servers.json"), "w") as f:
        json.dump(gv, f, indent=1)

    # 2. the seed's situation: a server started by hand, untuned, untagged.
    t0 = time.monotonic()
    stale = subprocess.Popen(server_cmd, stdout=open(os.path.join(a.out, "stale-server.log"), "w"),
                             stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
                             env=dict(os.environ, **MULTICAST_OFF, GPUFLEET_TEST_GPUS=str(ngpu)))
    while not health() and time.monotonic() - t0 < 240:
        time.sleep(0.5)
    ev["stale_server"] = {"pid": stale.pid, "ready_s": round(time.monotonic() - t0, 2), "healthy": health(),
                          "workers_env_untuned": {p: v["nccl"] for p, v in workers_env(None).items()}}
    ev["gpu_before"] = sh(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"]).stdout.strip()

    pb = "gpufleet.serving.rollout"
    ev["rollout_1"] = playbook(a.out, "rollout-1", pb, inv_dir)
    ev["stale_server"]["alive_after"] = stale.poll() is None
    wenv = workers_env()
    ev["workers"] = wenv
    logged = nccl_lines("/var/log/gpufleet/nccl.*.log", set(wenv))
    ev["nccl_logged"] = logged
    verdict = {}
    for pid, vals in logged.items():
        for k, v in vals.items():
            if k in TUNED:
                verdict.setdefault(k, set()).add("confirmed" if v == EXPECTED[k] else "CONTRADICTED " + v)
    ev["nccl_verdict"] = {k: sorted(v) for k, v in verdict.items()}
    gpu_workers = [p for p, v in wenv.items() if "spawn_main" in v["cmdline"]]
    ev["checks"] = {
        "stale_server_killed": not ev["stale_server"]["alive_after"],
        "spawn_workers": len(gpu_workers),
        "every_spawn_worker_tuned": bool(gpu_workers) and all(wenv[p]["nccl"] == EXPECTED for p in gpu_workers),
        "nccl_log_files": sorted(__import__("glob").glob("/var/log/gpufleet/nccl.*.log")),
        "nccl_logged_something_in_every_worker": bool(gpu_workers) and all(p in logged for p in gpu_workers),
        "nccl_nothing_contradicted": not any("CONTRADICTED" in s for v in verdict.values() for s in v),
    }
    shutil.copy("/var/log/gpufleet/gpu-e2e.log", os.path.join(a.out, "server-after-rollout-1.log"))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    pe = sh([PY, "-m", "ansible.cli.adhoc", "localhost", "-c", "local", "-i", "localhost,", "-e",
             "ansible_python_interpreter=" + PY, "-m", "gpufleet.serving.process_env", "-a",
             json.dumps({"tag": "GPUFLEET_SERVICE=gpu-e2e", "expected": EXPECTED,
                         "nccl_log": ["/var/log/gpufleet/nccl.*.log"]})], cwd=ROOT, env=env)
    with open(os.path.join(a.out, "process_env.log"), "w") as f:
        f.write(pe.stdout)
    ev["checks"]["process_env_module_passed"] = pe.returncode == 0
    ev["checks"]["spawn_workers_one_per_worker"] = len(gpu_workers) == workers

    # gpu_info while the server runs: every GPU and its holder; the auto profile's choice on this topology.
    with open(os.path.join(a.out, "auto.yml"), "w") as f:
        f.write(AUTO_PLAY)
    ev["auto_play"] = playbook(a.out, "auto", os.path.join(a.out, "auto.yml"), inv_dir, "-e", "out=" + a.out,
                               check_rc=False)
    try:
        with open(os.path.join(a.out, "auto.json")) as f:
            auto = json.load(f)
    except (OSError, ValueError):
        auto = {}
    gi = auto.get("gpu_info", {})
    ev["auto_profile"] = {"resolved": auto.get("resolved"), "env": auto.get("env"),
                          "nvlink_active": gi.get("nvlink_active"), "backend": gi.get("backend")}
    ev["gpu_holders"] = {str(g["index"]): {"name": g["name"], "used_mib": g["used_mib"], "nvlink": g["nvlink"],
                                           "errors": g.get("errors"),
                                           "holders": sorted(str(p["pid"]) for p in g["processes"])}
                         for g in gi.get("gpus", [])}
    held = [set(v["holders"]) for v in ev["gpu_holders"].values()]
    ev["checks"]["gpu_info_every_gpu_held_by_a_worker"] = (
        len(held) == ngpu and all(h and h <= set(gpu_workers) for h in held)
        and (not multi or all(len(h) == 1 for h in held) and len(set().union(*held)) == ngpu))
    if multi:
        # NVLink-connected GPUs must resolve to nvlink (no protocol/algorithm overrides); PCIe-only ones to pcie_only.
        want = "nvlink" if gi.get("nvlink_active") else "pcie_only"
        ev["checks"]["auto_profile_matches_topology"] = auto.get("resolved") == want
        # The server's /generate went through an all_reduce over every GPU: sum of 1.0 from each rank.
        try:
            req = urllib.request.Request("http://127.0.0.1:%d/generate" % PORT, data=b"{}", method="POST")
            with urllib.request.urlopen(req, timeout=60) as r:
                sums = json.loads(r.read())["sums"]
        except Exception as e:  # recorded, and the check fails
            sums = [repr(e)]
        ev["generate_sums"] = sums
        ev["checks"]["all_reduce_across_every_gpu"] = sums == [float(ngpu)] * ngpu
    ev["audit"] = playbook(a.out, "audit", "gpufleet.serving.audit", inv_dir, check_rc=False)
    ev["rollout_2"] = playbook(a.out, "rollout-2", pb, inv_dir)
    ev["checks"]["audit_passed"] = ev["audit"]["rc"] == 0
    ev["checks"]["second_rollout_noop"] = all(h["changed"] == 0 for h in ev["rollout_2"]["recap"].values())

    restarts = []
    for i in range(a.restarts):
        r = playbook(a.out, "restart-%d" % i, "gpufleet.serving.restart", inv_dir)
        with open("/var/lib/gpufleet/gpu-e2e.json") as f:
            st = json.load(f)
        startup = None
        with open("/var/log/gpufleet/gpu-e2e.log") as f:
            for line in f:
                m = re.search(r"startup_s=([\d.]+)", line)
                if m:
                    startup = float(m.group(1))  # the last one is this restart's
        # The restart task (kill -> clean -> launch -> ready -> busy -> env check -> record, one module call) as the
        # controller saw it, ansible's task start included; minus the server's own start-up = orchestration overhead.
        with open(os.path.join(a.out, "restart-%d-tasks.json" % i)) as f:
            tasks = json.load(f)
        task_s = [t["duration_s"] for t in tasks if "Restart the server (" in t["task"]][0]
        # A module call's floor on this machine (ansible's task start, the module's transfer and its Python start):
        # the check task, one server_state call that reads the host and returns.
        check_s = [t["duration_s"] for t in tasks if "Check the running server against" in t["task"]]
        restarts.append({"playbook_wall_s": r["wall_s"], "timings": st["timings"], "server_startup_s": startup,
                         "restart_task_s": task_s, "overhead_s": round(task_s - (startup or 0), 3),
                         "check_task_s": check_s[0] if check_s else None})
    ev["restarts"] = restarts

    # 9. the performance gate and the automatic rollback (issue 26) on real GPU work: /generate with max_new_tokens
    # runs fp32 matmuls with TF32 allowed; NVIDIA_TF32_OVERRIDE=0 in the server's environment really slows them.
    gate = {"request": {"url": "http://127.0.0.1:%d/generate" % PORT, "body": {"max_new_tokens": 32}},
            "warmup": 1, "requests": 6, "concurrency": 1, "rounds": 3, "timeout": 120, "min_ratio": 0.7}
    slow_env = dict(gv["gpufleet_server_env"], NVIDIA_TF32_OVERRIDE="0")
    g = ev["gate"] = {"definition": gate}
    g["baseline_run"] = playbook(a.out, "gate-baseline", pb, inv_dir, "-e",
                                 json.dumps({"gpufleet_server_gate": gate, "gpufleet_server_force_restart": True}))
    g["baseline"] = summary_row(a.out, "gate-baseline")
    g["slow_run"] = playbook(a.out, "gate-tf32-off", pb, inv_dir, "-e",
                             json.dumps({"gpufleet_server_gate": gate, "gpufleet_server_env": slow_env,
                                         "gpufleet_server_rollback": True}), check_rc=False)
    g["slow"] = summary_row(a.out, "gate-tf32-off")
    wenv = workers_env(full=True)
    g["workers_after_rollback"] = {p: sorted(k for k in v["env"] if k == "NVIDIA_TF32_OVERRIDE") for p, v in wenv.items()}
    with open("/var/lib/gpufleet/gpu-e2e.json") as f:
        g["record_after_rollback"] = {k: v for k, v in json.load(f).items() if k in ("fingerprint", "verified")}
    g["restored_run"] = playbook(a.out, "gate-restored", pb, inv_dir, "-e",
                                 json.dumps({"gpufleet_server_gate": gate, "gpufleet_server_force_restart": True}),
                                 check_rc=False)
    g["restored"] = summary_row(a.out, "gate-restored")
    bg, sg, rg = (g["baseline"].get("gate") or {}), (g["slow"].get("gate") or {}), (g["restored"].get("gate") or {})
    ev["checks"]["gate_baseline_recorded"] = g["baseline_run"]["rc"] == 0 and bool(bg.get("passed")) \
        and bg.get("baseline") is None and (bg.get("median") or 0) > 0
    ev["checks"]["tf32_off_fails_the_gate_and_is_rolled_back"] = (
        g["slow_run"]["rc"] == 2 and sg.get("passed") is False and (sg.get("ratio") or 1) < gate["min_ratio"]
        and str(g["slow"].get("failure") or "").startswith("rolled back to the last known good")
        and (g["slow"].get("rolled_back") or {}).get("fingerprint") == g["record_after_rollback"].get("fingerprint"))
    ev["checks"]["rolled_back_workers_lack_the_override"] = bool(wenv) and not any(g["workers_after_rollback"].values())
    ev["checks"]["restored_speed_passes_the_gate"] = g["restored_run"]["rc"] == 0 and bool(rg.get("passed")) \
        and (rg.get("ratio") or 0) >= gate["min_ratio"]

    # 8. roll the tuning back and stop: the file must be byte-for-byte the original.
    ev["rollback"] = playbook(a.out, "rollback", pb, inv_dir, "-e", json.dumps({"gpufleet_nccl_profile": "none"}),
                              "--tags", "nccl_tuning")
    ev["clean"] = playbook(a.out, "clean", "gpufleet.serving.clean", inv_dir)
    gw = sh([PY, "-m", "ansible.cli.adhoc", "localhost", "-c", "local", "-i", "localhost,", "-e",
             "ansible_python_interpreter=" + PY, "-m", "gpufleet.serving.gpu_wait", "-a",
             json.dumps({"state": "clean", "timeout": 10})], cwd=ROOT, env=env)
    ev["clean_every_gpu"] = gw.stdout[-3000:]
    ev["checks"]["every_gpu_clean_after"] = gw.returncode == 0
    after = open(site, "rb").read()
    ev["sitecustomize"]["sha256_after"] = hashlib.sha256(after).hexdigest()
    ev["checks"]["sitecustomize_restored_byte_for_byte"] = after == original
    ev["gpu_after"] = sh(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"]).stdout.strip()
    ev["ok"] = all(v for k, v in ev["checks"].items() if k not in ("spawn_workers", "nccl_log_files")) and ev["checks"]["spawn_workers"] >= 1
    with open(os.path.join(a.out, "e2e.json"), "w") as f:
        json.dump(ev, f, indent=1, default=sorted)
    print(json.dumps(ev["checks"], indent=1))
    print("E2E", "PASSED" if ev["ok"] else "FAILED")
    return 0 if ev["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
