# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout's pre-flight of each host is one task (gpu_server tasks/rollout_check.yml, the rollout_check action,
issue 25): bad input of every kind fails the host there, with the roles' own messages, before anything on any host is
read or changed; a no-op rollout costs each host three task executions, counted by bench/callback/task_counts.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rollout_helpers import PCIE_ONLY, RolloutFleet, nccl, tasks_run, workers

ROOT = Path(__file__).resolve().parents[2]
ALL = ["host1", "host2", "host3"]
CHECK = "gpufleet.serving.gpu_server : Validate the host's input and check in one call whether it is already right"


def _failed_in_the_check(rf: RolloutFleet, host_vars: dict, expect: dict) -> None:
    before = rf.snapshot()
    run = rf.playbook("rollout", host_vars=host_vars, extra_vars={"gpufleet_rollout_max_fail_percentage": 100})
    assert run.rc == 2, run.tail()
    after = rf.snapshot()
    for h, text in expect.items():
        assert run.recap[h]["failed"] == 1 and run.recap[h]["changed"] == 0, (h, run.recap)
        assert tasks_run(run.out, h)[-1] == CHECK, (h, tasks_run(run.out, h))  # its last: the batch's bookkeeping before
        failure = " ".join(run.summary[h]["failure"].split())
        assert text in failure, (h, failure)
        assert after.identities(h) == before.identities(h), h
        assert after[h]["files"] == before[h]["files"], h
        assert after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"], h


# Each case: three hosts, each with one kind of bad input (host vars), and what its failure says. "ENV" stands for the
# fleet's own gpufleet_server_env, with one value added.
CASES = {
    "specs-names-rules": (
        {"host1": {"gpufleet_server_start_timeout": "soon"},              # gpu_server's argument spec (type)
         "host2": {"gpufleet_nccl_env": {"LD_PRELOAD": "/tmp/evil.so"}},  # nccl_tuning's names (the filter)
         "host3": {"gpufleet_server_env": {"BAD NAME": "1"}}},            # gpu_server's rules (server_problems)
        {"host1": "Validation of arguments failed (role gpu_server, argument spec 'preflight'): argument "
                  "'gpufleet_server_start_timeout' is of type str and we were unable to convert to float: str cannot be "
                  "converted to a float",
         "host2": "LD_PRELOAD (the dynamic loader or the C library reads it in every program) is never written host-wide",
         "host3": 'invalid variable name(s) "BAD NAME"'}),
    "form-spec-command": (
        {"host1": {"gpufleet_nccl_profile": "custom", "gpufleet_nccl_env": {}},  # nccl_tuning's form (vars/main.yml)
         "host2": {"gpufleet_nccl_backup": "maybe"},                             # nccl_tuning's argument spec (type)
         "host3": {"gpufleet_server_command": []}},                              # gpu_server's rules
        {"host1": "Invalid NCCL tuning input: gpufleet_nccl_profile must be auto, pcie_only, nvlink, none or custom "
                  "(custom needs gpufleet_nccl_env)",
         "host2": "Validation of arguments failed (role nccl_tuning, argument spec 'validate')",
         "host3": "gpufleet_server_command must not be empty and its first element must be the executable"}),
    # A list value used to pass the pre-flight and fail only in server_restart, after the lock and the drain (a new
    # user's pass, session 22); an undefined variable in a value was named, not the setting it is in.
    "value-types-undefined": (
        {"host1": {"gpufleet_server_env": "ENV", "HF_TOKEN": ["hf_SECRET123456789"]},
         "host2": {"gpufleet_server_health_url": "{{ nope_undefined }}"},
         "host3": {"gpufleet_nccl_env": {"NCCL_PROTO": "{{ nope_undefined }}"}}},
        {"host1": "gpufleet_server_env: value of HF_TOKEN must be a string or a number, got list",
         "host2": "gpufleet_server_health_url cannot be templated: 'nope_undefined' is undefined",
         "host3": "Invalid NCCL tuning input: gpufleet_nccl_env cannot be templated: 'nope_undefined' is undefined"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_fails_each_host_in_its_one_check_with_the_roles_message_and_changes_nothing(rolled_out, case):
    rf = rolled_out("clean")
    host_vars, expect = CASES[case]
    env = rf.server_vars()["gpufleet_server_env"]
    host_vars = {h: ({"gpufleet_server_env": dict(env, HF_TOKEN=v["HF_TOKEN"])} if v.get("gpufleet_server_env") == "ENV"
                     else v) for h, v in host_vars.items()}
    _failed_in_the_check(rf, host_vars, expect)
    rf.state = "clean"


def test_a_noop_rollout_is_two_task_executions_per_host(rolled_out, tmp_path):
    rf = rolled_out("clean")
    before = rf.snapshot()
    counts = tmp_path / "counts.json"
    run = rf.playbook("rollout", env={"GPUFLEET_TASK_COUNTS": str(counts),
                                      "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "bench" / "callback"),
                                      "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.serving.rollout_summary,task_counts"})
    assert run.rc == 0, run.tail()
    hosts = json.loads(counts.read_text())["hosts"]
    # host1 also ran the batch's run_once bookkeeping; the others ran only their own two.
    for h in ("host2", "host3"):
        assert [task[0] for task in hosts[h]["tasks"]] == [
            CHECK, "Tune NCCL, restart, verify and record the server where needed, under the host lock"], hosts[h]
        assert [task[1] for task in hosts[h]["tasks"]] == ["ok", "skipped"], hosts[h]
    after = rf.snapshot()
    for h in ("host1", "host2", "host3"):
        assert run.summary[h]["restarted"] is False and run.summary[h]["workers_verified"] == 2, run.summary[h]
        assert after.identities(h) == before.identities(h)
    rf.state = "clean"


def test_the_auto_profile_resolves_on_the_host_in_the_check_and_an_up_to_date_host_takes_the_fast_path(rolled_out, tmp_path):
    """profile auto, resolved by the rollout's check on the host (gpu_info: no NVLink on these fake PCIe GPUs, so
    pcie_only, what the fleet runs): the hosts are already right and skip the roles, two task executions each. A host
    whose GPUs gpu_info cannot read (a backend it does not have) fails in the same check, nothing on it changed."""
    rf = rolled_out("clean")
    before = rf.snapshot()
    counts = tmp_path / "counts.json"
    run = rf.playbook("rollout", vars_override={"gpufleet_nccl_profile": "auto"},
                      env={"GPUFLEET_TASK_COUNTS": str(counts), "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "bench" / "callback"),
                           "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.serving.rollout_summary,task_counts"})
    assert run.rc == 0, run.tail()
    hosts = json.loads(counts.read_text())["hosts"]
    for h in ("host2", "host3"):
        assert [task[1] for task in hosts[h]["tasks"]] == ["ok", "skipped"], hosts[h]
    for h in ALL:
        assert run.summary[h]["status"] == "ok" and run.summary[h]["restarted"] is False, run.summary[h]

    run = rf.playbook("rollout", vars_override={"gpufleet_nccl_profile": "auto"},
                      host_vars={"host3": {"gpufleet_nccl_gpu_backend": "nvidia-smi"}})
    assert run.rc == 2, run.tail()
    assert ("gpufleet_nccl_profile auto: gpu_info could not read this host's GPUs to choose between pcie_only and nvlink"
            in run.summary["host3"]["failure"]), run.summary["host3"]
    after = rf.snapshot()
    for h in ALL:
        assert after.identities(h) == before.identities(h)
        assert after[h]["files"] == before[h]["files"] and after[h]["sitecustomize_sha"] == before[h]["sitecustomize_sha"]
    rf.state = "clean"


def test_an_auto_rollout_writes_the_profile_it_resolved_under_the_lock_and_restarts_onto_it(rolled_out):
    """From the nvlink profile (no NCCL overrides in the layers) back to auto on these PCIe-only hosts: the check
    resolves pcie_only on each host, the roles write its layers in the check's own call, under the lock, and restart
    onto them; every spawn worker has the pcie_only values, and the layers are byte for byte the explicit profile's."""
    rf = rolled_out("clean")
    tuned = rf.snapshot()
    run = rf.playbook("rollout", vars_override={"gpufleet_nccl_profile": "nvlink"})
    assert run.rc == 0, run.tail()
    untuned = rf.snapshot()
    rf.state = "unknown"

    run = rf.playbook("rollout", vars_override={"gpufleet_nccl_profile": "auto"})

    assert run.rc == 0, run.tail()
    after = rf.snapshot()
    for h in ALL:
        assert run.summary[h]["restarted"] is True and run.summary[h]["nccl_changed"] is True, run.summary[h]
        assert untuned[h]["sitecustomize_sha"] != tuned[h]["sitecustomize_sha"]
        assert after[h]["sitecustomize_sha"] == tuned[h]["sitecustomize_sha"], h
        ws = workers(after, h)
        assert ws, h
        for w in ws:
            assert nccl(w["env"]) == dict(PCIE_ONLY, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV"), (h, w)
        assert not after[h]["files"].get("lock"), after[h]["files"]
    rf.state = "clean"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
