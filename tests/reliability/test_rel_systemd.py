# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd launcher as a production service, on a podman host booting systemd 252 as PID 1
(tests/sandbox/podman_fleet.py): the first rollout in check mode on a host without the unit, one stop contract
(TERM -> the kill grace -> KILL, the grace in the unit), a unit restarted by hand, drop-ins and a unit edited by hand,
enablement, and what a start failure says. Every rollout and audit is a real ansible-runner run of the collection's
playbooks; every assertion reads systemd (`systemctl show`, the unit file) or /proc on the host.
"""
from __future__ import annotations

import typing as t
from pathlib import Path

import pytest

from gpufleet_ci import sandbox
from rel_helpers import ROLLOUT_SITE, runner_play, summary

pytestmark = pytest.mark.sandbox

UNIT = "gpufleet-demo.service"
UNIT_FILE = "/etc/systemd/system/" + UNIT
DROPIN = "/etc/systemd/system/%s.d/override.conf" % UNIT
AUDIT_SITE = "- name: gpufleet audit\n  ansible.builtin.import_playbook: gpufleet.serving.audit\n"


def _vars(fleet: t.Any, **over: t.Any) -> t.Dict[str, t.Any]:
    gv = sandbox.server_vars(fleet.python, mib=1000)
    gv.update(gpufleet_server_launcher="systemd", ansible_python_interpreter="/usr/bin/python3",
              gpufleet_server_kill_grace=2, gpufleet_server_clean_timeout=10, gpufleet_server_ready_interval=0.1,
              gpufleet_server_adopt_cmdline_regex="")
    gv.update(over)
    return gv


def _run(fleet: t.Any, tmp_path: Path, ident: str, site: str = ROLLOUT_SITE, cmdline: str = "", **over: t.Any) -> t.Any:
    inv = tmp_path / ("servers-%s.json" % ident)
    inv.write_text(sandbox.servers_inventory(fleet.hosts, _vars(fleet, **over)))
    return runner_play(tmp_path, site, [fleet.inventory, inv], extravars={"gpufleet_rollout_serial": ["100%"]},
                       cmdline=cmdline, ident=ident, timeout=400)


def _sh(fleet: t.Any, cmd: str, check: bool = True) -> str:
    return fleet.ssh(fleet.hosts[0], cmd, check=check, timeout=120).stdout


def _show(fleet: t.Any) -> t.Dict[str, str]:
    out = _sh(fleet, "systemctl show -p ActiveState -p MainPID -p UnitFileState -p KillMode -p TimeoutStopUSec "
                     "-p DropInPaths -p LoadState %s" % UNIT)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _wait_healthy(fleet: t.Any) -> None:
    """Until the demo server answers its health URL on the host (its workers up after a restart by hand)."""
    code = ("import time, urllib.request as u\n"
            "for i in range(200):\n"
            "    try:\n"
            "        u.urlopen('http://127.0.0.1:%d/health', timeout=1)\n"
            "        break\n"
            "    except Exception:\n"
            "        time.sleep(0.1)\n" % sandbox.PORT)
    _sh(fleet, "python3 -c \"%s\"" % code)


def _host(run: t.Any, fleet: t.Any) -> t.Dict[str, t.Any]:
    return summary(run)[fleet.hosts[0]]


def _reset(fleet: t.Any) -> None:
    """A host without the unit, its files or any demo server (systemd forgets the unit)."""
    _sh(fleet, "systemctl stop %s; systemctl disable %s; rm -rf %s %s.d /etc/gpufleet /run/gpufleet /var/lib/gpufleet "
               "/var/log/gpufleet; systemctl daemon-reload; systemctl reset-failed; pkill -9 -f demo_server.py; true"
        % (UNIT, UNIT, UNIT_FILE, UNIT_FILE), check=False)


@pytest.fixture
def host(systemd_host):
    _reset(systemd_host)
    return systemd_host


@pytest.fixture
def running(host, tmp_path):
    """A host where the first rollout installed and started the unit."""
    run = _run(host, tmp_path, "first")
    assert run.rc == 0, run.stdout[-6000:]
    return host


@pytest.mark.reliability(
    section="systemd", case="Check mode on a host without the unit, then the first rollout: enabled, grace in the unit",
    provoked="gpufleet_server_launcher systemd, a fresh host (no unit): rollout --check --diff, then the rollout",
    outcome="--check passes reporting a restart and creates no unit; the rollout starts the unit, enables it "
            "(UnitFileState enabled), KillMode=mixed, TimeoutStopSec = the kill grace; summary timings kill, launch, "
            "ready all measured by the same engine as the process launcher")
def test_check_mode_on_a_fresh_host_then_the_first_rollout(host, tmp_path):
    check = _run(host, tmp_path, "check", cmdline="--check --diff")

    assert check.rc == 0, check.stdout[-6000:]
    assert _host(check, host)["would_restart"] is True
    assert _sh(host, "test -e %s && echo present || echo absent" % UNIT_FILE).strip() == "absent"

    run = _run(host, tmp_path, "first")

    assert run.rc == 0, run.stdout[-6000:]
    show = _show(host)
    assert show["ActiveState"] == "active" and int(show["MainPID"]) > 0, show
    assert show["UnitFileState"] == "enabled", show
    assert show["KillMode"] == "mixed" and show["TimeoutStopUSec"] == "2s", show
    pid = int(_sh(host, "cat /run/gpufleet/demo.pid").split()[0])
    assert pid == int(show["MainPID"])
    h = _host(run, host)
    # A fresh host: nothing to stop, but the stop was still timed, like the launch and the readiness wait.
    assert h["kill_s"] is not None and h["launch_s"] > 0 and h["ready_s"] > 0, h


@pytest.mark.reliability(
    section="systemd", case="The kill grace is the grace with the systemd launcher, and changing it is applied",
    provoked="a server whose launcher and workers ignore SIGTERM (--ignore-term) under the systemd launcher, "
             "gpufleet_server_kill_grace 2, forced restart; then gpufleet_server_kill_grace 1 with nothing else changed",
    outcome="the stop takes the grace (about 2 s, not a 30 s TimeoutStopSec) and the summary's kill time says so; "
            "the grace change rewrites the unit (TimeoutStopSec=1s) and restarts, as any unit setting does")
def test_a_server_ignoring_sigterm_is_killed_after_the_grace(host, tmp_path):
    cmd = sandbox.server_vars(host.python, mib=1000)["gpufleet_server_command"] + ["--ignore-term"]
    first = _run(host, tmp_path, "first", gpufleet_server_command=cmd)
    assert first.rc == 0, first.stdout[-6000:]

    forced = _run(host, tmp_path, "forced", gpufleet_server_command=cmd, gpufleet_server_force_restart=True)

    assert forced.rc == 0, forced.stdout[-6000:]
    kill_s = _host(forced, host)["kill_s"]
    assert 1.8 <= kill_s <= 8, kill_s

    changed = _run(host, tmp_path, "grace1", gpufleet_server_command=cmd, gpufleet_server_kill_grace=1)

    assert changed.rc == 0, changed.stdout[-6000:]
    h = _host(changed, host)
    assert h["restarted"] is True, h
    assert any("differs from the desired unit" in r for r in h["reasons"]), h["reasons"]
    assert _show(host)["TimeoutStopUSec"] == "1s"
    assert 0.8 <= h["kill_s"] <= 6, h


@pytest.mark.reliability(
    section="systemd", case="A drop-in setting TimeoutStopSec=infinity, and a server ignoring SIGTERM",
    provoked="a server whose launcher and workers ignore SIGTERM (--ignore-term), gpufleet_server_kill_grace 2; a "
             "drop-in of the unit with TimeoutStopSec=infinity (systemctl daemon-reload); a forced restart",
    outcome="the stop is bounded by the grace and a 5 s margin, then the unit's whole cgroup gets SIGKILL (a warning "
            "says so): the restart passes with kill_s under 12 s (before: systemctl stop waited for ever, the host "
            "drained and locked)")
def test_a_stop_is_bounded_by_the_grace_whatever_a_dropin_sets(host, tmp_path):
    cmd = sandbox.server_vars(host.python, mib=1000)["gpufleet_server_command"] + ["--ignore-term"]
    first = _run(host, tmp_path, "first", gpufleet_server_command=cmd, gpufleet_server_kill_grace=2)
    assert first.rc == 0, first.stdout[-6000:]
    d = "/etc/systemd/system/%s.d" % UNIT
    _sh(host, "mkdir -p %s && printf '[Service]\\nTimeoutStopSec=infinity\\n' > %s/slowstop.conf && "
              "systemctl daemon-reload" % (d, d))
    try:
        assert _show(host)["TimeoutStopUSec"] == "infinity"
        forced = _run(host, tmp_path, "forced", gpufleet_server_command=cmd, gpufleet_server_kill_grace=2,
                      gpufleet_server_force_restart=True)
        assert forced.rc == 0, forced.stdout[-6000:]
        h = _host(forced, host)
        assert h["restarted"] is True and h["kill_s"] <= 12, h
        assert "its whole cgroup was sent SIGKILL" in " ".join(forced.stdout.split()), forced.stdout[-4000:]
    finally:
        _sh(host, "rm -rf %s && systemctl daemon-reload" % d)


@pytest.mark.reliability(
    section="systemd", case="A `systemctl restart` by hand is not a dead server",
    provoked="after a rollout, `systemctl restart gpufleet-demo` (the pidfile still names the old main pid); "
             "the audit, then the rollout",
    outcome="the audit passes (a note says the unit was restarted outside gpufleet, no orphans, no 'not running'); "
            "the rollout restarts nothing (the same main pid before and after)")
def test_a_hand_restart_reads_as_running(running, tmp_path):
    host = running
    before = int(_show(host)["MainPID"])
    _sh(host, "systemctl restart %s" % UNIT)
    after = int(_show(host)["MainPID"])
    assert after != before
    # The workers of the new main process must be up before the audit reads them.
    _wait_healthy(host)

    audit = _run(host, tmp_path, "audit", site=AUDIT_SITE)

    assert audit.rc == 0, audit.stdout[-6000:]
    assert "restarted outside gpufleet" in audit.stdout
    rollout = _run(host, tmp_path, "again")
    assert rollout.rc == 0, rollout.stdout[-6000:]
    assert _host(rollout, host)["restarted"] is False
    assert int(_show(host)["MainPID"]) == after


@pytest.mark.reliability(
    section="systemd", case="A drop-in or a unit edited by hand is drift; the rollout corrects what it owns",
    provoked="`systemctl edit`-style drop-in (Environment=, TimeoutStopSec=300) + daemon-reload: audit, rollout "
             "(default warn), rollout with gpufleet_server_systemd_dropins remove; then Restart=always edited into "
             "the unit + daemon-reload: audit, rollout",
    outcome="the audit fails naming the drop-in; the default rollout warns and keeps it (no restart); remove "
            "deletes it and restarts onto the role's unit; the edited unit fails the audit and the rollout rewrites "
            "it and restarts (Restart=no again)")
def test_dropins_and_edited_units_are_drift(running, tmp_path):
    host = running
    _sh(host, "mkdir -p %s.d && printf '[Service]\\nEnvironment=EXTRA=1\\nTimeoutStopSec=300\\n' > %s && "
              "systemctl daemon-reload" % (UNIT_FILE, DROPIN))
    pid = int(_show(host)["MainPID"])

    audit = _run(host, tmp_path, "audit-dropin", site=AUDIT_SITE)
    assert audit.rc != 0 and DROPIN in audit.stdout, audit.stdout[-4000:]
    warn = _run(host, tmp_path, "warn")
    assert warn.rc == 0, warn.stdout[-6000:]
    assert _host(warn, host)["restarted"] is False and int(_show(host)["MainPID"]) == pid
    assert DROPIN in warn.stdout  # the warning
    assert _sh(host, "test -e %s && echo kept" % DROPIN, check=False).strip() == "kept"

    remove = _run(host, tmp_path, "remove", gpufleet_server_systemd_dropins="remove")

    assert remove.rc == 0, remove.stdout[-6000:]
    assert _host(remove, host)["restarted"] is True
    show = _show(host)
    assert show["DropInPaths"] == "" and show["TimeoutStopUSec"] == "2s", show
    assert "EXTRA" not in _sh(host, "cat /proc/%s/environ | tr '\\0' '\\n'" % show["MainPID"])

    _sh(host, "sed -i 's/^Restart=no$/Restart=always/' %s && systemctl daemon-reload" % UNIT_FILE)
    audit = _run(host, tmp_path, "audit-edited", site=AUDIT_SITE)
    assert audit.rc != 0 and "differs from the desired unit" in audit.stdout, audit.stdout[-4000:]
    fixed = _run(host, tmp_path, "fixed")
    assert fixed.rc == 0, fixed.stdout[-6000:]
    assert _host(fixed, host)["restarted"] is True
    assert "Restart=no" in _sh(host, "cat %s" % UNIT_FILE)
    assert _sh(host, "systemctl show -p Restart %s" % UNIT).strip() == "Restart=no"


@pytest.mark.reliability(
    section="systemd", case="A disabled unit is drift, enabled again without a restart",
    provoked="`systemctl disable gpufleet-demo` after a rollout: audit, rollout",
    outcome="the audit fails saying the unit would not come back after a reboot; the rollout enables it and "
            "restarts nothing (same main pid)")
def test_a_disabled_unit_is_enabled_without_a_restart(running, tmp_path):
    host = running
    _sh(host, "systemctl disable %s" % UNIT)
    pid = int(_show(host)["MainPID"])

    audit = _run(host, tmp_path, "audit-disabled", site=AUDIT_SITE)
    assert audit.rc != 0 and "not enabled" in audit.stdout, audit.stdout[-4000:]
    check = _run(host, tmp_path, "enable-check", cmdline="--check --diff")
    assert check.rc == 0 and "would enable %s (now disabled)" % UNIT in check.stdout, check.stdout[-4000:]
    assert _show(host)["UnitFileState"] == "disabled"
    run = _run(host, tmp_path, "enable")

    assert run.rc == 0, run.stdout[-6000:]
    assert _host(run, host)["restarted"] is False
    show = _show(host)
    assert show["UnitFileState"] == "enabled" and int(show["MainPID"]) == pid, show


@pytest.mark.reliability(
    section="systemd", case="A unit that fails at start says systemd's exit status and journal",
    provoked="after a rollout, the systemd launcher with a server that exits 1 at start-up (--fail-at-startup); the "
             "audit; then a command whose interpreter does not exist (exec fails: 203/EXEC)",
    outcome="the host fails in phase startup; the message names the exit status (status=1) and systemd's "
            "journal lines, and the summary's kill/launch timings are measured; the audit says the last launch did "
            "not pass its checks; the second failure's log tail is its own, not the first one's RuntimeError")
def test_a_start_failure_names_the_exit_status_and_the_journal(running, tmp_path):
    host = running
    cmd = sandbox.server_vars(host.python, mib=1000)["gpufleet_server_command"] + ["--fail-at-startup"]

    run = _run(host, tmp_path, "fail", gpufleet_server_command=cmd)

    assert run.rc != 0
    h = _host(run, host)
    assert h["status"] == "failed" and h["phase"] == "startup", h
    assert "status=1" in h["failure"] and "journal" in h["failure"], h["failure"]
    assert h["launch_s"] is not None, h
    audit = _run(host, tmp_path, "audit-failed", site=AUDIT_SITE)
    assert audit.rc != 0 and "the last launch by gpufleet did not pass its checks" in audit.stdout, audit.stdout[-3000:]

    # The next failure is another one (exec of a missing interpreter: 203/EXEC): its log tail must not show the
    # previous launch's RuntimeError, which is still in the log file systemd appends to.
    _sh(host, "printf '#!/nonexistent/python3\\n' > /usr/local/bin/badshebang && chmod 0755 /usr/local/bin/badshebang")
    again = _run(host, tmp_path, "fail-exec", gpufleet_server_command=["/usr/local/bin/badshebang"])

    h = _host(again, host)
    assert h["phase"] == "startup" and "status=203" in h["failure"], h
    assert "RuntimeError" not in h["failure"] and "fail-at-startup" not in h["failure"], h["failure"]


CLEAN_SITE = "- name: gpufleet clean\n  ansible.builtin.import_playbook: gpufleet.serving.clean\n"
ENV_FILE = "/etc/gpufleet/demo.env"
PREFIX_DROPIN = "/etc/systemd/system/gpufleet-.service.d/50-prefix.conf"


@pytest.mark.reliability(
    section="systemd", case="The environment file, a prefix drop-in, a runtime-only enable, and a reboot",
    provoked="after a rollout: HF_TOKEN edited by hand in /etc/gpufleet/demo.env and the file made 0644, a drop-in "
             "for every gpufleet-*.service, `systemctl enable --runtime` after a disable; audit, rollout; then the "
             "pidfile's /run directory wiped and the unit restarted by systemd (what a reboot leaves); audit, rollout",
    outcome="the audit names all three; the rollout rewrites the env file (0600, the inventory's value, the server "
            "restarted onto it), enables the unit for good and warns about the prefix drop-in; after the 'reboot' "
            "the audit passes with a note and the rollout restarts nothing")
def test_env_file_prefix_dropins_runtime_enable_and_a_reboot(running, tmp_path):
    host = running
    _sh(host, "sed -i 's/^NCCL_DEBUG=.*/NCCL_DEBUG=\"WARN\"/' %s && chmod 0644 %s && mkdir -p %s && "
              "printf '[Service]\\nNice=5\\n' > %s && systemctl disable %s && systemctl enable --runtime %s && "
              "systemctl daemon-reload" % (ENV_FILE, ENV_FILE, PREFIX_DROPIN.rsplit("/", 1)[0], PREFIX_DROPIN, UNIT, UNIT))
    try:
        audit = _run(host, tmp_path, "audit-env", site=AUDIT_SITE)
        assert audit.rc != 0, audit.stdout[-4000:]
        for why in ("environment file %s differs" % ENV_FILE, PREFIX_DROPIN, "unit is enabled-runtime, not enabled"):
            assert why in audit.stdout, (why, audit.stdout[-4000:])

        run = _run(host, tmp_path, "fix-env")

        assert run.rc == 0, run.stdout[-6000:]
        assert _host(run, host)["restarted"] is True
        assert "drop-ins gpufleet did not write change the unit: %s" % PREFIX_DROPIN in run.stdout
        assert _sh(host, "stat -c '%%a %%u' %s" % ENV_FILE).split() == ["600", "0"]
        assert 'NCCL_DEBUG="INFO"' in _sh(host, "cat %s" % ENV_FILE)
        assert _show(host)["UnitFileState"] == "enabled"
    finally:
        _sh(host, "rm -rf %s && systemctl daemon-reload" % PREFIX_DROPIN.rsplit("/", 1)[0])

    before = int(_show(host)["MainPID"])
    _sh(host, "rm -rf /run/gpufleet && systemctl restart %s" % UNIT)
    _wait_healthy(host)
    after = int(_show(host)["MainPID"])
    assert after != before

    audit = _run(host, tmp_path, "audit-reboot", site=AUDIT_SITE)
    assert audit.rc == 0 and "restarted outside gpufleet" in audit.stdout, audit.stdout[-4000:]
    again = _run(host, tmp_path, "after-reboot")
    assert again.rc == 0 and _host(again, host)["restarted"] is False, again.stdout[-4000:]
    assert int(_show(host)["MainPID"]) == after


@pytest.mark.reliability(
    section="systemd", case="The clean playbook stops a unit with the restart's stop; leaving systemd retires the unit",
    provoked="a systemd server ignoring SIGTERM, grace 2: gpufleet.serving.clean --check, then clean; a rollout "
             "back; then gpufleet_server_launcher process",
    outcome="--check says 'would stop' and stops nothing; clean stops the unit in about the grace and the summary "
            "says stopped with its kill time; the switch to the process launcher disables the unit and deletes its "
            "unit and environment files (no second server at the next boot) and runs the server itself")
def test_clean_stops_the_unit_and_a_launcher_switch_retires_it(host, tmp_path):
    cmd = sandbox.server_vars(host.python, mib=1000)["gpufleet_server_command"] + ["--ignore-term"]
    first = _run(host, tmp_path, "first", gpufleet_server_command=cmd)
    assert first.rc == 0, first.stdout[-6000:]
    pid = int(_show(host)["MainPID"])

    check = _run(host, tmp_path, "clean-check", site=CLEAN_SITE, cmdline="--check", gpufleet_server_command=cmd)
    assert check.rc == 0, check.stdout[-4000:]
    assert _host(check, host)["restart"] == "would stop" and int(_show(host)["MainPID"]) == pid

    clean = _run(host, tmp_path, "clean", site=CLEAN_SITE, gpufleet_server_command=cmd)

    assert clean.rc == 0, clean.stdout[-6000:]
    h = _host(clean, host)
    assert h["restart"] == "stopped" and h["killed"] >= 1 and 1.8 <= h["kill_s"] <= 8, h
    assert _show(host)["ActiveState"] in ("inactive", "failed")

    back = _run(host, tmp_path, "back")
    assert back.rc == 0, back.stdout[-6000:]
    switched = _run(host, tmp_path, "to-process", gpufleet_server_launcher="process")

    assert switched.rc == 0, switched.stdout[-6000:]
    assert _host(switched, host)["restarted"] is True
    show = _show(host)
    assert show["LoadState"] == "not-found" and show["UnitFileState"] == "", show
    assert _sh(host, "ls %s %s 2>/dev/null; true" % (UNIT_FILE, ENV_FILE)).strip() == ""
    launcher = int(_sh(host, "cat /run/gpufleet/demo.pid").split()[0])
    assert "system.slice/%s" % UNIT not in _sh(host, "cat /proc/%d/cgroup" % launcher)


@pytest.mark.reliability(
    section="systemd",
    case="What systemd runs, not only the file: an overriding unit, a file restored behind a reload, runtime links",
    provoked="after a rollout: (1) a copy of the unit with Restart=always under /etc/systemd/system.control + "
             "daemon-reload; rollout; (2) that copy removed, the unit edited (TimeoutStopSec=300) + daemon-reload and "
             "the original file put back with its old mtime (no reload pending); audit, rollout; (3) `systemctl enable "
             "--runtime` and gpufleet_server_systemd_enabled false; rollout",
    outcome="(1) the host fails before anything is stopped, naming the overriding file (no restart loop); (2) the "
            "audit reports the loaded TimeoutStopUSec, the rollout reloads and restarts onto the file (2 s again); "
            "(3) the unit ends disabled, runtime link included")
def test_what_systemd_runs_is_checked_not_only_the_file(running, tmp_path):
    host = running
    pid = int(_show(host)["MainPID"])
    control = "/etc/systemd/system.control/" + UNIT
    _sh(host, "mkdir -p /etc/systemd/system.control && sed 's/^Restart=no$/Restart=always/' %s > %s && "
              "systemctl daemon-reload" % (UNIT_FILE, control))
    try:
        run = _run(host, tmp_path, "control")
        assert run.rc != 0
        assert "systemd loads %s from %s" % (UNIT, control) in _host(run, host)["failure"], _host(run, host)
        assert int(_show(host)["MainPID"]) == pid
    finally:
        _sh(host, "rm -f %s && systemctl daemon-reload" % control)

    _sh(host, "cp -a %s /root/unit.bak && sed -i 's/^TimeoutStopSec=.*/TimeoutStopSec=300/' %s && systemctl daemon-reload "
              "&& cp -a /root/unit.bak %s" % (UNIT_FILE, UNIT_FILE, UNIT_FILE))
    assert _show(host)["TimeoutStopUSec"] == "5min"
    audit = _run(host, tmp_path, "audit-loaded", site=AUDIT_SITE)
    assert audit.rc != 0 and "with TimeoutStopUSec=5min" in audit.stdout, audit.stdout[-3000:]
    fixed = _run(host, tmp_path, "loaded")
    assert fixed.rc == 0 and _host(fixed, host)["restarted"] is True, fixed.stdout[-4000:]
    assert _show(host)["TimeoutStopUSec"] == "2s"

    _sh(host, "systemctl enable --runtime %s" % UNIT)
    off = _run(host, tmp_path, "disable", gpufleet_server_systemd_enabled=False)
    assert off.rc == 0, off.stdout[-4000:]
    assert _sh(host, "systemctl is-enabled %s; true" % UNIT).strip() == "disabled"


@pytest.mark.reliability(
    section="systemd", case="A failed restart goes back to the last known good unit, its drop-in and its environment file",
    provoked="a drop-in of the unit (Environment=EXTRA=1) and HF_TOKEN old in gpufleet_server_env: the first rollout "
             "(the last known good); then a server that exits at start-up (--fail-at-startup), HF_TOKEN new and "
             "gpufleet_server_systemd_dropins remove, with gpufleet_server_rollback on (the role's default)",
    outcome="the host fails with 'rolled back to the last known good FINGERPRINT'; the unit file, the drop-in and the "
            "environment file (0600, the old HF_TOKEN) are as the first rollout left them, the unit runs a new main "
            "pid (the pidfile names it) whose environment has EXTRA=1, the server answers; no HF_TOKEN value in the "
            "output")
def test_a_failed_restart_rolls_back_to_the_last_known_good_unit_files(host, tmp_path):
    _sh(host, "mkdir -p %s.d && printf '[Service]\\nEnvironment=EXTRA=1\\n' > %s" % (UNIT_FILE, DROPIN))
    env = dict(sandbox.server_vars(host.python)["gpufleet_server_env"], HF_TOKEN="hf_old_8d1f")
    first = _run(host, tmp_path, "first", gpufleet_server_env=env, gpufleet_server_rollback=True)
    assert first.rc == 0, first.stdout[-6000:]
    files = {f: _sh(host, "cat %s" % f) for f in (UNIT_FILE, DROPIN, ENV_FILE)}
    before = int(_show(host)["MainPID"])

    cmd = sandbox.server_vars(host.python, mib=1000)["gpufleet_server_command"] + ["--fail-at-startup"]
    bad = _run(host, tmp_path, "bad", gpufleet_server_command=cmd, gpufleet_server_rollback=True,
               gpufleet_server_env=dict(env, HF_TOKEN="hf_new_27ac"), gpufleet_server_systemd_dropins="remove")

    assert bad.rc != 0
    h = _host(bad, host)
    assert h["status"] == "failed" and h["failure"].startswith("rolled back to the last known good "), h
    assert {f: _sh(host, "cat %s" % f) for f in files} == files
    assert _sh(host, "stat -c '%%a %%U' %s" % ENV_FILE).strip() == "600 root"
    show = _show(host)
    assert show["ActiveState"] == "active" and int(show["MainPID"]) not in (0, before), show
    assert show["DropInPaths"] == DROPIN, show
    assert int(_sh(host, "cat /run/gpufleet/demo.pid").split()[0]) == int(show["MainPID"])
    assert "EXTRA=1" in _sh(host, "cat /proc/%s/environ | tr '\\0' '\\n'" % show["MainPID"]).splitlines()
    _wait_healthy(host)
    assert "hf_old_8d1f" not in bad.stdout + first.stdout and "hf_new_27ac" not in bad.stdout


ROLLBACK_SITE = "- name: gpufleet rollback\n  ansible.builtin.import_playbook: gpufleet.serving.rollback\n"


@pytest.mark.reliability(
    section="systemd", case="The rollback playbook puts a systemd unit back to its last known good, and again is a no-op",
    provoked="two rollouts with the systemd launcher: definition A (HF_TOKEN a), then B (another server flag, HF_TOKEN "
             "b); then gpufleet.serving.rollback --check, the rollback, and the rollback again",
    outcome="--check changes nothing; the rollback writes A's unit file and environment file back (0600), restarts the "
            "unit onto them (a new main pid, the pidfile names it) and says 'rolled back to' A's fingerprint; the second "
            "rollback restarts nothing (the same main pid); no HF_TOKEN value in any output")
def test_the_rollback_playbook_puts_a_unit_back_to_its_last_known_good(host, tmp_path):
    base = sandbox.server_vars(host.python)["gpufleet_server_env"]
    a = _run(host, tmp_path, "a", gpufleet_server_env=dict(base, HF_TOKEN="hf_gen_a_5e1"))
    assert a.rc == 0, a.stdout[-6000:]
    files_a = {f: _sh(host, "cat %s" % f) for f in (UNIT_FILE, ENV_FILE)}
    cmd_b = sandbox.server_vars(host.python, mib=1000)["gpufleet_server_command"] + ["--startup-delay", "0.1"]
    b_vars = dict(gpufleet_server_command=cmd_b, gpufleet_server_env=dict(base, HF_TOKEN="hf_gen_b_9c2"))
    b = _run(host, tmp_path, "b", **b_vars)
    assert b.rc == 0, b.stdout[-6000:]
    files_b = {f: _sh(host, "cat %s" % f) for f in files_a}
    assert files_b != files_a
    pid_b = int(_show(host)["MainPID"])

    check = _run(host, tmp_path, "rollback-check", site=ROLLBACK_SITE, cmdline="--check", **b_vars)
    assert check.rc == 0, check.stdout[-6000:]
    assert {f: _sh(host, "cat %s" % f) for f in files_a} == files_b and int(_show(host)["MainPID"]) == pid_b

    back = _run(host, tmp_path, "rollback", site=ROLLBACK_SITE, **b_vars)
    assert back.rc == 0, back.stdout[-6000:]
    assert {f: _sh(host, "cat %s" % f) for f in files_a} == files_a
    assert _sh(host, "stat -c '%%a %%U' %s" % ENV_FILE).strip() == "600 root"
    show = _show(host)
    assert show["ActiveState"] == "active" and int(show["MainPID"]) not in (0, pid_b), show
    assert int(_sh(host, "cat /run/gpufleet/demo.pid").split()[0]) == int(show["MainPID"])
    assert "rolled back to" in back.stdout, back.stdout[-3000:]
    _wait_healthy(host)

    again = _run(host, tmp_path, "rollback-again", site=ROLLBACK_SITE, **b_vars)
    assert again.rc == 0, again.stdout[-6000:]
    assert int(_show(host)["MainPID"]) == int(show["MainPID"]) and _host(again, host)["restarted"] is False
    out = a.stdout + b.stdout + check.stdout + back.stdout + again.stdout
    assert "hf_gen_a_5e1" not in out and "hf_gen_b_9c2" not in out
