# SPDX-License-Identifier: GPL-3.0-or-later
"""Two gpufleet services on one sandbox host (issue 24, items 1 and 2), each rolled out by its own real rollout
(gpufleet.serving.rollout through ansible-runner, its own inventory), as two teams sharing a box would:

- `sglang` on GPU 0 / port 30000 and `sgb` on GPU 1 / port 30001, with the same adopt regex in group_vars
  (`demo_server\\.py`, which matches both servers' command lines) and the same NCCL tuning (pcie_only);
- each service is rolled out, then `sglang` is restarted again (forced): neither restart may touch the other
  service's launcher or workers (same pids, same start times);
- then `sgb` asks for other NCCL values: the host-wide layers would change under the running `sglang`, so its run
  fails before anything is written (check mode predicts it), and the same tuning again changes nothing.
"""
from __future__ import annotations

import json
import threading

import pytest

from gpufleet_ci import sandbox
from rel_helpers import (DEMO, FAKE_GPU, ROLLOUT_SITE, gpu_holders, host_py, ps, read_host_file, runner_play, sh, start_bg,
                         summary, wait_for)

pytestmark = pytest.mark.sandbox

RESTART_TASK = "Restart the server (kill, verify clean, launch, wait ready, verify the workers' environment, record)"
H = "host1"
SITE_CODE = r"""
import json, os, sysconfig
p = os.path.realpath(os.path.join(sysconfig.get_paths()["stdlib"], "sitecustomize.py"))
print(json.dumps({"path": p, "text": open(p).read() if os.path.exists(p) else None}))
"""


def _service(py, name, gpu, port):
    v = sandbox.server_vars(py, gpus=1, mib=1000)
    v.update(
        gpufleet_server_name=name,
        gpufleet_server_command=[py, DEMO, "--port", str(port), "--tp", "1", "--gpus", str(gpu), "--mib", "1000",
                                 "--state-dir", "/var/lib/demo-%s" % name],
        gpufleet_server_gpus=[gpu],
        gpufleet_server_health_url="http://127.0.0.1:%d/health" % port,
        gpufleet_server_health_request=dict(v["gpufleet_server_health_request"],
                                            url="http://127.0.0.1:%d/generate" % port),
        gpufleet_server_nccl_log="/var/log/gpufleet/%s.log" % name,
    )
    # The quickstart's pattern, in the host's group_vars: it matches both services' servers.
    assert v["gpufleet_server_adopt_cmdline_regex"] == r"demo_server\.py" and v["gpufleet_nccl_profile"] == "pcie_only"
    return v


def _tree(fleet, service):
    """(pid, start time) of every process carrying the service's launch tag."""
    return sorted((p["pid"], p["start"]) for p in ps(fleet, H).values() if p.get("tag") == service)


@pytest.fixture(scope="module")
def two(sandbox_fleet_module, tmp_path_factory):
    fleet = sandbox_fleet_module(hosts=1, gpus=2)
    work = tmp_path_factory.mktemp("rel-two-services")
    invs = {}
    for name, gpu, port in (("sglang", 0, 30000), ("sgb", 1, 30001)):
        invs[name] = work / ("%s.yml" % name)
        invs[name].write_text(sandbox.servers_inventory([H], _service(fleet.python, name, gpu, port)))
    runs = {}

    def rollout(ident, service, extravars=None, cmdline=""):
        runs[ident] = runner_play(work, ROLLOUT_SITE, [fleet.inventory, invs[service]], extravars=extravars,
                                  cmdline=cmdline, ident=ident)
        return runs[ident]

    st = {}
    rollout("sglang-1", "sglang")
    st["sglang_after_own"] = _tree(fleet, "sglang")
    rollout("sgb-1", "sgb")
    st["sglang_after_sgb"] = _tree(fleet, "sglang")
    st["sgb_after_own"] = _tree(fleet, "sgb")
    rollout("sglang-2", "sglang", extravars={"gpufleet_server_force_restart": True})
    st["sgb_after_sglang"] = _tree(fleet, "sgb")
    st["sglang_after_restart"] = _tree(fleet, "sglang")

    # Item 2: sgb asks for other values of two of the profile's variables.
    other = {"gpufleet_nccl_env": {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}}
    st["site_before"] = host_py(fleet, H, SITE_CODE)
    rollout("sgb-other-check", "sgb", extravars=other, cmdline="--check")
    rollout("sgb-other", "sgb", extravars=other)
    st["site_after_refusal"] = host_py(fleet, H, SITE_CODE)
    st["trees_after_refusal"] = (_tree(fleet, "sglang"), _tree(fleet, "sgb"))
    rollout("sgb-same", "sgb")
    st["site_after_same"] = host_py(fleet, H, SITE_CODE)
    st["trees_after_same"] = (_tree(fleet, "sglang"), _tree(fleet, "sgb"))
    return dict(fleet=fleet, runs=runs, work=work, invs=invs, rollout=rollout, **st)


def _ok(run):
    assert run.rc == 0 and not run.failed(H), (run.rc, [f["res"].get("msg") for f in run.failed(H)], run.stdout[-3000:])


@pytest.mark.reliability(
    section="security", case="Two services on one host, one adopt regex matching both servers",
    provoked="services sglang (GPU 0, port 30000) and sgb (GPU 1, port 30001) on one sandbox host, each rolled out by "
             "its own rollout with the same gpufleet_server_adopt_cmdline_regex (demo_server\\.py, matching both "
             "servers); then sglang restarted again (forced)",
    outcome="each restart kills its own server only: the other service's launcher and workers keep their pids and start "
            "times; its launcher is listed in the kill's excluded as \"a process of gpufleet service <other> "
            "(GPUFLEET_SERVICE=<other>), not of <this>\" (the adopt regex, the stray kill, pids, a pidfile, sessions "
            "and trees never select another service's tagged process)")
def test_restarting_one_service_leaves_the_other_services_server_alone(two):
    for ident in ("sglang-1", "sgb-1", "sglang-2"):
        _ok(two["runs"][ident])
    sglang, sgb = two["sglang_after_own"], two["sgb_after_own"]
    assert len(sglang) >= 2 and len(sgb) >= 2, (sglang, sgb)  # launcher + worker each
    # sgb's first rollout (its regex matches sglang's launcher) left sglang's server exactly as it was.
    assert two["sglang_after_sgb"] == sglang
    kill = two["runs"]["sgb-1"].res(H, RESTART_TASK)["kill"]
    assert not {p["pid"] for p in kill["processes"]} & {pid for pid, _cmd in sglang}, kill["processes"]
    reasons = {x["pid"]: x["reason"] for x in kill["excluded"]}
    assert any(r == "a process of gpufleet service sglang (GPUFLEET_SERVICE=sglang), not of sgb: another service's "
               "launch tag" for pid, r in reasons.items() if pid in {p for p, _cmd in sglang}), reasons
    # sglang's forced restart replaced its own server and left sgb's exactly as it was.
    assert summary(two["runs"]["sglang-2"])[H]["restarted"] is True
    assert not set(two["sglang_after_restart"]) & set(sglang)
    assert two["sgb_after_sglang"] == sgb
    kill = two["runs"]["sglang-2"].res(H, RESTART_TASK)["kill"]
    assert {x["pid"] for x in kill["excluded"]} & {pid for pid, _cmd in sgb}, kill["excluded"]


@pytest.mark.reliability(
    section="input", case="Two services on one host, different NCCL tuning",
    provoked="sglang and sgb running on one sandbox host with the same profile (pcie_only); sgb's rollout then asks for "
             "NCCL_PROTO and NCCL_ALGO values of its own (gpufleet_nccl_env), with --check and for real; then sgb's "
             "rollout with the shared tuning again",
    outcome="both runs with other values fail on the host before anything is written: \"NCCL layers are host-wide "
            "(<sitecustomize.py>): service sglang (pid N) runs on this host and starts workers with what the layers "
            "hold; changing "
            "NCCL_ALGO, NCCL_PROTO for sgb would change sglang's next start too. Give every service on a host the same "
            "gpufleet_nccl_* ...\" (variable names only, never values); the system sitecustomize.py is byte-for-byte "
            "unchanged and both servers run on; the shared tuning passes and changes nothing (no restart)")
def test_a_second_service_with_other_nccl_values_is_refused_and_the_same_values_pass(two):
    site = two["site_before"]
    assert site["text"] and "('NCCL_PROTO', 'LL')" in site["text"], site
    launcher = min(two["sglang_after_restart"], key=lambda p: (p[1], p[0]))[0]  # the oldest: the launcher
    want = ("NCCL layers are host-wide (%s): service sglang (pid %d) runs on this host and starts workers with what "
            "the layers hold; changing NCCL_ALGO, NCCL_PROTO for sgb would change sglang's next start too. Give every service on a host "
            "the same gpufleet_nccl_* (the host's group_vars), or stop sglang first (gpufleet.serving.clean); nothing "
            "was changed" % (site["path"], launcher))
    for ident in ("sgb-other-check", "sgb-other"):
        run = two["runs"][ident]
        assert run.rc != 0, run.stdout[-2000:]
        msgs = [f["res"].get("msg", "") for f in run.failed(H)]
        assert "sitecustomize: " + want in msgs, (ident, msgs)  # the layer that refuses, then why
        assert "Simple" not in " ".join(msgs) and "Tree" not in " ".join(msgs), msgs
        assert RESTART_TASK not in run.tasks_seen(H)  # the host failed at the tuning, before its server was touched
    assert two["site_after_refusal"] == site  # byte for byte
    assert two["trees_after_refusal"] == (two["sglang_after_restart"], two["sgb_after_sglang"])
    # The shared tuning again: nothing to change, no restart, both servers as they were.
    same = two["runs"]["sgb-same"]
    _ok(same)
    assert summary(same)[H]["restarted"] is False, summary(same)
    assert two["site_after_same"] == site
    assert two["trees_after_same"] == two["trees_after_refusal"]


CLEAN_SITE = "- name: gpufleet clean\n  ansible.builtin.import_playbook: gpufleet.serving.clean\n"
# A play of the user's that runs both services of the host (helper-44): the tuning, sglang (the inventory's), then sgb
# (the include's vars), forced.
BOTH_SERVICES = """
- name: Both services of the host in my own play
  hosts: gpufleet_servers
  gather_facts: false
  tasks:
    - name: The NCCL tuning
      ansible.builtin.include_role:
        name: gpufleet.serving.nccl_tuning
    - name: sglang
      ansible.builtin.include_role:
        name: gpufleet.serving.gpu_server
    - name: sgb, restarted
      ansible.builtin.include_role:
        name: gpufleet.serving.gpu_server
      vars: %s
"""
CLEAN_THEN_ROLLOUT = CLEAN_SITE + ROLLOUT_SITE


def _summary_rows(run):
    return json.loads((run.artifacts.parent.parent / "summary" / "rollout-summary.json").read_text())


@pytest.mark.reliability(
    section="input", case="Two services of one host in one play, and clean then rollout in one playbook",
    provoked="the user's own play includes gpu_server for sglang (up to date) and then for sgb (forced restart) on one "
             "host; then one playbook that imports gpufleet.serving.clean and gpufleet.serving.rollout for sgb",
    outcome="the summary has a row per service, named host1/sglang (not restarted) and host1/sgb (restarted), in the "
            "table and the JSON (each with its `service`); the clean-then-rollout row says what the last play left "
            "(restarted, not stopped) (helper-44: both merged into one host row, its fields from both)")
def test_the_summary_keeps_a_row_per_service_and_the_last_plays_outcome(two):
    fleet = two["fleet"]
    sgb = dict(_service(fleet.python, "sgb", 1, 30001), gpufleet_server_force_restart=True)
    before = _tree(fleet, "sglang")
    run = runner_play(two["work"], BOTH_SERVICES % json.dumps(sgb), [fleet.inventory, two["invs"]["sglang"]],
                      ident="both-services")
    _ok(run)
    data = _summary_rows(run)
    rows = {r["name"]: r for r in data["hosts"]}
    assert sorted(rows) == ["%s/sgb" % H, "%s/sglang" % H], data["hosts"]
    assert (rows["%s/sglang" % H]["service"], rows["%s/sglang" % H]["restarted"]) == ("sglang", False), rows
    assert (rows["%s/sgb" % H]["service"], rows["%s/sgb" % H]["restarted"]) == ("sgb", True), rows
    assert rows["%s/sgb" % H]["reasons"] == ["forced"] and rows["%s/sglang" % H]["reasons"] == [], rows
    assert _tree(fleet, "sglang") == before
    table = run.stdout[run.stdout.index("GPUFLEET ROLLOUT SUMMARY"):]
    assert "| %s/sglang " % H in table and "| %s/sgb " % H in table, table

    both = runner_play(two["work"], CLEAN_THEN_ROLLOUT, [fleet.inventory, two["invs"]["sgb"]], ident="sgb-clean-rollout")
    _ok(both)
    (row,) = _summary_rows(both)["hosts"]
    assert (row["name"], row["service"], row["restarted"], row["stopped"], row["restart"]) == (
        H, "sgb", True, False, "yes"), row
    assert _tree(fleet, "sgb"), "sgb runs again"


@pytest.mark.reliability(
    section="input", case="A service launched while another service's run has changed the NCCL layers",
    provoked="sgb stopped (gpufleet.serving.clean), sglang running; a GPU holder no kill ends on sglang's GPU; "
             "sglang's rollout with NCCL_PROTO Simple writes the layers (its snapshot kept) and waits at its clean gate "
             "(gpufleet_server_clean_timeout 25); meanwhile sgb's rollout with the same new values (no change to "
             "write)",
    outcome="sgb's run fails on the host before anything is launched: \"... service sglang (its host lock held by run "
            "R) changed them and has not finished its restart on this host; ... sgb would then run with values the "
            "file no longer holds\"; sglang's restart is refused at its clean gate and the layers are put back byte "
            "for byte; no sgb process runs with values the files do not hold (before: sgb launched with Simple and "
            "was left with it after the put-back)")
def test_a_service_is_not_launched_onto_layers_another_services_unfinished_run_wrote(two):
    fleet, rollout = two["fleet"], two["rollout"]
    runner_play(two["work"], CLEAN_SITE, [fleet.inventory, two["invs"]["sgb"]], ident="sgb-clean")
    assert _tree(fleet, "sgb") == []
    site = host_py(fleet, H, SITE_CODE)
    start_bg(fleet, H, [fleet.python, FAKE_GPU, "hold", "--gpu", "0", "--mib", "200"])
    holder = wait_for(lambda: [p for p in gpu_holders(fleet, H)[0] if not ps(fleet, H).get(p, {"tag": 1})["tag"]], 60,
                      "a holder of GPU 0")[0]
    other = {"gpufleet_nccl_env": {"NCCL_PROTO": "Simple"}}
    snapshot = "/run/gpufleet/sglang.layers-previous.json"
    try:
        first = threading.Thread(target=rollout, args=("sglang-stalled", "sglang"),
                                 kwargs={"extravars": dict(other, gpufleet_server_clean_timeout=25)})
        first.start()
        try:
            wait_for(lambda: read_host_file(fleet, H, snapshot) is not None, 60, "sglang's run writing the layers")
            assert host_py(fleet, H, SITE_CODE)["text"] != site["text"]  # Simple, for now

            late = rollout("sgb-onto-changed", "sgb", extravars=other)
        finally:
            first.join(120)
    finally:
        sh(fleet, H, "kill -9 %d" % holder, check=False)
    assert late.rc != 0, late.stdout[-3000:]
    msgs = " ".join(f["res"].get("msg", "") for f in late.failed(H))
    assert "service sglang (its host lock held by run " in msgs and "changed them and has not finished its restart" in msgs \
        and "sgb would then run with values the file no longer holds" in msgs, msgs
    assert RESTART_TASK not in late.tasks_seen(H) and _tree(fleet, "sgb") == []
    stalled = two["runs"]["sglang-stalled"]
    assert stalled.rc != 0 and summary(stalled)[H]["restarted"] is False, summary(stalled)
    assert host_py(fleet, H, SITE_CODE) == site and read_host_file(fleet, H, snapshot) is None  # put back


ROLLBACK_SITE = "- name: gpufleet rollback\n  ansible.builtin.import_playbook: gpufleet.serving.rollback\n"


@pytest.mark.reliability(
    section="input", case="The rollback playbook for one of two services, to NCCL values the other does not run with",
    provoked="sgb stopped; sglang rolled out with NCCL_BUFFSIZE 4194304 (its newest last known good; the one before has "
             "the profile's value); sgb rolled out with the same NCCL_BUFFSIZE; then gpufleet.serving.rollback for "
             "sglang, whose last known good before puts the profile's value back",
    outcome="the rollback fails on the host at its check, before the drain and the kill: 'rollback: the NCCL layers of "
            "the last known good FINGERPRINT cannot be put back: ... service sgb (pid N) runs on this host ...'; "
            "sglang's server runs on (same pids), the layers are unchanged (before: sglang was killed, then its "
            "launch was refused, 'killed, not relaunched')")
def test_a_rollback_that_would_change_the_layers_under_another_service_is_refused_before_the_kill(two):
    fleet, rollout = two["fleet"], two["rollout"]
    runner_play(two["work"], CLEAN_SITE, [fleet.inventory, two["invs"]["sgb"]], ident="sgb-clean-2")
    buff = {"gpufleet_nccl_env": {"NCCL_BUFFSIZE": "4194304"}}
    _ok(rollout("sglang-buff", "sglang", extravars=buff))
    _ok(rollout("sgb-buff", "sgb", extravars=buff))
    site, sglang = host_py(fleet, H, SITE_CODE), _tree(fleet, "sglang")
    assert "4194304" in site["text"] and _tree(fleet, "sgb"), site
    run = runner_play(two["work"], ROLLBACK_SITE, [fleet.inventory, two["invs"]["sglang"]], extravars=buff,
                      ident="sglang-rollback")
    assert run.rc != 0, run.stdout[-3000:]
    msgs = " ".join(f["res"].get("msg", "") for f in run.failed(H))
    assert "rollback: the NCCL layers of the last known good " in msgs and " cannot be put back: " in msgs \
        and "service sgb (pid " in msgs and "runs on this host" in msgs, msgs
    assert RESTART_TASK not in run.tasks_seen(H), run.tasks_seen(H)
    assert _tree(fleet, "sglang") == sglang and host_py(fleet, H, SITE_CODE) == site
