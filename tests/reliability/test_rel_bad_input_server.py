# SPDX-License-Identifier: GPL-3.0-or-later
"""Bad server definitions given to the gpufleet.serving.gpu_server role on a host whose server is running.

One ansible-playbook run (localhost, fake GPUs) plays the role once per bad definition. Every case must fail with a
message naming the variable, before the host lock and the kill, and the host must be exactly as before: the running
(tagged) server process, its pidfile, log and state file, the lock directory.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import typing as t
from pathlib import Path

import pytest

from helpers import FAKE_NVML_DIR, PY, FakeGpus, pid_alive, wait_for
from rel_helpers import role_cases

NAME = "relbad"
ARGSPEC = "Validating arguments against arg spec 'main' - Restart a GPU inference server safely: kill, verify clean, launch, ready, verify env"
ASSERT_DEF = "Assert the server definition is usable"
ASSERT_ENV = ASSERT_DEF  # the environment is checked in the same task (one task result per host fewer), its own message
FAIL_HOST = "Release the host lock, and fail the host where its flow failed"  # after the role's rescue: the failure of its lock/check/restart block

# id -> (variables, task that must fail, text the message must contain)
CASES: t.Dict[str, t.Tuple[t.Dict[str, t.Any], str, str]] = {
    "command-empty-list": ({"gpufleet_server_command": []}, ASSERT_DEF,
                           "gpufleet_server_command must not be empty and its first element must be the executable"),
    "command-empty-executable": ({"gpufleet_server_command": [""]}, ASSERT_DEF,
                                 "gpufleet_server_command must not be empty and its first element must be the executable"),
    "start-timeout-zero": ({"gpufleet_server_start_timeout": 0}, ASSERT_DEF, "gpufleet_server_start_timeout must be > 0."),
    "start-timeout-negative": ({"gpufleet_server_start_timeout": -5}, ASSERT_DEF, "gpufleet_server_start_timeout must be > 0."),
    "clean-timeout-zero": ({"gpufleet_server_clean_timeout": 0}, ASSERT_DEF, "gpufleet_server_clean_timeout must be > 0."),
    "kill-grace-negative": ({"gpufleet_server_kill_grace": -1}, ASSERT_DEF, "gpufleet_server_kill_grace must be >= 0."),
    # The argument spec turns a list into its text for a str option; the name rule then refuses it, saying the type.
    "name-list-for-string": ({"gpufleet_server_name": ["a", "b"]}, ASSERT_DEF,
                             'gpufleet_server_name must be a string of 1 to 200 letters, digits, "_", "." and "-" (got list ["a", "b"])'),
    "timeout-string-for-number": ({"gpufleet_server_start_timeout": "soon"}, ARGSPEC, "gpufleet_server_start_timeout"),
    "gpus-string-for-list-of-int": ({"gpufleet_server_gpus": "zero"}, ARGSPEC, "gpufleet_server_gpus"),
    # One name that no file name can hold (the lock, pidfile and unit are named after it) and a parent directory.
    "name-too-long": ({"gpufleet_server_name": "n" * 201}, ASSERT_DEF, "gpufleet_server_name must be a string of 1 to 200"),
    "name-dot-dot": ({"gpufleet_server_name": ".."}, ASSERT_DEF, "gpufleet_server_name must be a string of 1 to 200"),
    "name-trailing-newline": ({"gpufleet_server_name": NAME + "\n"}, ASSERT_DEF, "gpufleet_server_name must be a string of"),
    "env-name-space": ({"gpufleet_server_env": {"BAD NAME": "1"}}, ASSERT_ENV, 'invalid variable name(s) "BAD NAME"'),
    "env-name-equals": ({"gpufleet_server_env": {"A=B": "1"}}, ASSERT_ENV, 'invalid variable name(s) "A=B"'),
    "env-name-quote": ({"gpufleet_server_env": {'Q"X': "1"}}, ASSERT_ENV, "invalid variable name(s) "),
    "env-name-unicode": ({"gpufleet_server_env": {"NCCL_\u00c9": "1"}}, ASSERT_ENV, "invalid variable name(s) "),
    "env-name-leading-digit": ({"gpufleet_server_env": {"1NCCL": "1"}}, ASSERT_ENV, 'invalid variable name(s) "1NCCL"'),
    "systemd-env-newline": ({"gpufleet_server_launcher": "systemd",
                             "gpufleet_server_env": {"X": "a\nExecStartPre=/bin/touch /tmp/pwned"}},
                            ASSERT_ENV, "X contain a line break"),
    "gpu-index-missing": ({"gpufleet_server_gpus": [7]}, FAIL_HOST, "gpus: GPU index 7 does not exist on this host (it has 2 GPUs: 0..1); nothing was stopped"),
    # The check step (server_state launchable) fails before it takes the lock; the rescue re-raises it.
    "executable-missing": ({"gpufleet_server_command": ["/nonexistent/python3", "-V"]}, FAIL_HOST,
                           "cannot run this server: command[0] /nonexistent/python3 is not an executable file."),
    "executable-directory": ({"gpufleet_server_command": ["/usr/bin", "-V"]}, FAIL_HOST,
                             "cannot run this server: command[0] /usr/bin is not an executable file."),
    "user-missing": ({"gpufleet_server_user": "no-such-user-rel"}, FAIL_HOST,
                     "cannot run this server: user no-such-user-rel does not exist."),
    "workdir-missing": ({"gpufleet_server_workdir": "/nonexistent/dir"}, FAIL_HOST,
                        "cannot run this server: workdir /nonexistent/dir is not a directory."),
    # The role's argument spec checks the gate's options first (before gate_problems, the preflight's rules):
    # ansible-core 2.19-2.21 also print the class of the tagged string there, after naming option and type.
    "gate-min-ratio-string": ({"gpufleet_server_gate": {"request": {"url": "http://127.0.0.1:9/generate"},
                                                        "min_ratio": "abc"}}, ARGSPEC,
                              "argument 'min_ratio' is of type str found in 'gpufleet_server_gate'. and we were "
                              "unable to convert to float"),
}


def _tagged() -> t.Set[int]:
    out = set()
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                env = open("/proc/%s/environ" % n, "rb").read().split(b"\0")
            except OSError:
                continue
            if ("GPUFLEET_SERVICE=%s" % NAME).encode() in env:
                out.add(int(n))
    return out


def _host_state(dirs: t.Sequence[Path], holder: subprocess.Popen) -> t.Dict[str, t.Any]:
    files = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            files[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return {"files": files, "holder_alive": pid_alive(holder.pid), "tagged": _tagged(),
            "pwned": os.path.exists("/tmp/pwned")}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    base = tmp_path_factory.mktemp("rel-badsrv")
    fg = FakeGpus(base / "nvml")
    fg.configure(gpus=2)
    run, log, state = base / "run", base / "log", base / "state"
    for d in (run, log, state):
        d.mkdir()
    ready = base / "ready"
    holder = subprocess.Popen([PY, str(FAKE_NVML_DIR / "fake_gpu.py"), "hold", "--gpu", "0", "--mib", "100",
                               "--ready-file", str(ready)], env=dict(fg.env, GPUFLEET_SERVICE=NAME), start_new_session=True)
    try:
        wait_for(ready.exists, 60, "the running server")
        start = int(open("/proc/%d/stat" % holder.pid).read().rsplit(")", 1)[1].split()[19])
        (run / ("%s.pid" % NAME)).write_text("%d %d\n" % (holder.pid, start))
        (log / ("%s.log" % NAME)).write_text("==== gpufleet launch earlier\nserving\n")
        (state / ("%s.json" % NAME)).write_text('{"fingerprint": "recorded-earlier"}\n')
        good = {
            "gpufleet_server_name": NAME,
            "gpufleet_server_command": [PY, str(FAKE_NVML_DIR / "fake_gpu.py"), "hold", "--gpu", "0", "--mib", "100"],
            "gpufleet_server_health_url": "http://127.0.0.1:9/health",
            "gpufleet_server_start_timeout": 5, "gpufleet_server_clean_timeout": 2, "gpufleet_server_kill_grace": 0.5,
            "gpufleet_server_kill_final_wait": 1, "gpufleet_server_verify_env": False,
            "gpufleet_server_expect_gpu_processes": 0,
            "gpufleet_server_run_dir": str(run), "gpufleet_server_log_dir": str(log), "gpufleet_server_state_dir": str(state),
        }
        before = _host_state([run, log, state], holder)
        assert before["tagged"] == {holder.pid} and not before["pwned"]
        res = role_cases(base, "gpufleet.serving.gpu_server", good, [(k, v[0]) for k, v in CASES.items()], fg.env)
        after = _host_state([run, log, state], holder)
        yield {"res": res, "before": before, "after": after}
    finally:
        holder.kill()
        holder.wait()


def _check(outcome, ids):
    res = outcome["res"]
    for cid in ids:
        _vars, task, text = CASES[cid]
        r = res[cid]
        assert r["failed"] is True, "%s was accepted:\n%s" % (cid, res["_stdout"][-3000:])
        assert r["task"] == task, (cid, r)
        assert text in r["msg"], (cid, r["msg"])
        if "invalid server definition" in r["msg"]:  # one message per broken rule: nothing about the rules that hold
            assert r["msg"].count("; ") == 0 and r["msg"].count("gpufleet_server_") == 1, (cid, r["msg"])
    assert outcome["after"] == outcome["before"], "the host changed"


@pytest.mark.reliability(
    section="input", case="Environment names with spaces, '=', quotes, unicode, leading digits (server env)",
    provoked="gpufleet_server_env with the name 'BAD NAME', 'A=B', 'Q\"X', 'NCCL_\u00c9' or '1NCCL', with a tagged server "
             "running",
    outcome="the role fails in its preflight ('gpufleet_server_env: invalid variable name(s) ...'), before the lock "
            "and the kill; server process, pidfile, log and state file unchanged")
def test_bad_env_names_are_refused_before_the_kill(outcome):
    _check(outcome, [k for k in CASES if k.startswith("env-name-")])


@pytest.mark.reliability(
    section="input", case="Wrong types (list for a string, string for a number)",
    provoked="gpufleet_server_name: [a, b]; gpufleet_server_start_timeout: soon; gpufleet_server_gpus: zero",
    outcome="the role's argument spec validation fails naming the variable (a list given for the name is turned into "
            "its text by the spec and refused by the name rule); nothing changed on the host")
def test_wrong_types_fail_argument_validation(outcome):
    _check(outcome, ["name-list-for-string", "timeout-string-for-number", "gpus-string-for-list-of-int"])


@pytest.mark.reliability(
    section="input", case="Empty command",
    provoked="gpufleet_server_command: [] and [\"\"]",
    outcome="preflight fails: 'gpufleet_server_command must not be empty and its first element must be the "
            "executable' (that rule alone); nothing changed on the host")
def test_empty_command_is_refused(outcome):
    _check(outcome, ["command-empty-list", "command-empty-executable"])


@pytest.mark.reliability(
    section="input", case="Negative or zero timeouts",
    provoked="gpufleet_server_start_timeout 0 and -5, gpufleet_server_clean_timeout 0, gpufleet_server_kill_grace -1",
    outcome="preflight fails naming only the broken rule ('gpufleet_server_start_timeout must be > 0.', "
            "'gpufleet_server_kill_grace must be >= 0.'); nothing changed on the host (module-level: gpu_wait/server_ready "
            "refuse timeout <= 0 too, see test_rel_gpu_hosts.py)")
def test_negative_or_zero_timeouts_are_refused(outcome):
    _check(outcome, ["start-timeout-zero", "start-timeout-negative", "clean-timeout-zero", "kill-grace-negative"])


@pytest.mark.reliability(
    section="input", case="Non-existent GPU index",
    provoked="gpufleet_server_gpus: [7] on a host with 2 GPUs",
    outcome="the check step fails before it takes the lock, with the restart's preflight message: 'gpus: GPU index 7 "
            "does not exist on this host (it has 2 GPUs: 0..1); nothing was stopped'; nothing is killed")
def test_nonexistent_gpu_index_fails_before_the_kill(outcome):
    _check(outcome, ["gpu-index-missing"])


@pytest.mark.reliability(
    section="input", case="Non-existent server executable, user or workdir",
    provoked="gpufleet_server_command[0] /nonexistent/python3 or /usr/bin (a directory); gpufleet_server_user "
             "no-such-user-rel; gpufleet_server_workdir /nonexistent/dir",
    outcome="the check step (server_state launchable, one call with the lock) fails naming what is missing and its "
            "value, before it takes the lock and before the kill (the running server stays up instead of being killed "
            "for a launch that cannot work)")
def test_unlaunchable_definition_fails_before_the_kill(outcome):
    _check(outcome, ["executable-missing", "executable-directory", "user-missing", "workdir-missing"])


@pytest.mark.reliability(
    section="input", case="Line breaks where a line-based format is written (name, systemd unit)",
    provoked="gpufleet_server_name 'relbad\\n' (YAML block scalar slip), 201 characters, or '..'; gpufleet_server_env value "
             "'a\\nExecStartPre=/bin/touch /tmp/pwned' with gpufleet_server_launcher systemd",
    outcome="preflight refuses both (no extra unit directive can be injected); /tmp/pwned absent; nothing changed")
def test_line_breaks_cannot_inject_into_names_or_units(outcome):
    _check(outcome, ["name-trailing-newline", "systemd-env-newline", "name-too-long", "name-dot-dot"])
    assert not outcome["after"]["pwned"]


@pytest.mark.reliability(
    section="input", case="A performance gate option of the wrong type",
    provoked="gpufleet_server_gate: {request: {url: ...}, min_ratio: abc}, with a tagged server running",
    outcome="the role's argument spec validation fails naming the option, the gate and the type ('argument "
            "'min_ratio' is of type str found in 'gpufleet_server_gate'. and we were unable to convert to float', "
            "ansible-core's words); nothing changed on the host")
def test_a_gate_option_of_the_wrong_type_is_refused_by_the_argument_spec(outcome):
    _check(outcome, ["gate-min-ratio-string"])
