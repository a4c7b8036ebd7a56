# SPDX-License-Identifier: GPL-3.0-or-later
"""Secrets through whole rollouts: a token-shaped HF_TOKEN in gpufleet_server_env and an Authorization header in
gpufleet_server_health_request, through `gpufleet.serving.rollout` with both launchers, by the ansible-playbook
CLI (-vvv/-vvvv, --diff, ANSIBLE_LOG_PATH), ansible-runner and `python -m gpufleet_ci`; plain in the inventory (as
the issue reported it) and vault-encrypted. Every output and artifact is searched for the secrets, and so is every
file the hosts wrote (only a root-owned 0600 file may hold one). The process launcher runs on the sandbox fleet
(tests/sandbox/fleet.py), the systemd launcher on podman hosts with systemd as PID 1 (tests/sandbox/podman_fleet.py).
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from collection_copy import private_collections
from gpufleet_ci import sandbox
from rel_helpers import (ROLLOUT_SITE, ROOT, VENV_BIN, reset_host, runner_play, summary, vault_password_file,
                         vaulted_yaml)

pytestmark = pytest.mark.sandbox

HF_MARK, BEARER_MARK = "@hf_token@", "@bearer@"
ENV_FILE = "/etc/gpufleet/demo.env"
# The last known good generations keep the unit's files, the environment file's secrets included (issue 26), root-only.
LAST_GOOD = "/var/lib/gpufleet/demo.last_good.json"
TRICKY = ' a "b" \\ c $X ${HOME} `id` %h \'q\' #x \\n '
UNIT_FILE = "/etc/systemd/system/gpufleet-demo.service"

# Runs on a host: every regular file under the given roots (not /proc, /sys, /dev) that holds one of the needles,
# with its mode and owner. Roots that are overlays of the machine's own dirs are searched in their upper dirs instead.
SCAN = r"""
import json, os, stat, sys
needles = [n.encode() for n in json.loads(sys.argv[1])]
hits = []
for root in json.loads(sys.argv[2]):
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if os.path.join(d, x) not in ("/proc", "/sys", "/dev")]
        for f in files:
            p = os.path.join(d, f)
            try:
                st = os.lstat(p)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 64 << 20:
                    continue
                with open(p, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            if any(n in data for n in needles):
                hits.append([p, "%04o" % stat.S_IMODE(st.st_mode), st.st_uid])
print(json.dumps(hits))
"""


def _tokens() -> t.Dict[str, str]:
    return {"hf": "hf_" + secrets.token_hex(17), "bearer": "sk-" + secrets.token_hex(20)}


def _needles(*tokens: t.Dict[str, str]) -> t.List[str]:
    """Each secret, and a 16-character piece of it (a truncated echo is a leak too)."""
    out = []
    for tok in tokens:
        for v in tok.values():
            out += [v, v[3:19]]
    return out


def _server_vars(fleet: t.Any, **over: t.Any) -> t.Dict[str, t.Any]:
    gv = sandbox.server_vars(fleet.python, mib=1000)
    gv["gpufleet_server_env"] = dict(gv["gpufleet_server_env"], HF_TOKEN=HF_MARK, HF_HUB_OFFLINE="1")
    req = dict(gv["gpufleet_server_health_request"])
    req["headers"] = dict(req["headers"], Authorization=BEARER_MARK)
    gv["gpufleet_server_health_request"] = req
    # Quick on 2 cores; the adopted stale server is not what these tests are about.
    gv.update(gpufleet_server_kill_grace=2, gpufleet_server_clean_timeout=5, gpufleet_server_ready_interval=0.1,
              gpufleet_server_adopt_cmdline_regex="")
    gv.update(over)
    return gv


def _servers_inventory(path: Path, hosts: t.Sequence[str], gv: t.Dict[str, t.Any], tok: t.Dict[str, str],
                       vault: t.Optional[Path]) -> Path:
    """The gpufleet_servers group with the secrets in the clear (vault None) or as `!vault |` values."""
    values = {HF_MARK: tok["hf"], BEARER_MARK: "Bearer " + tok["bearer"]}
    inv = {"gpufleet_servers": {"hosts": {h: None for h in hosts}, "vars": gv}}
    if vault is None:
        text = json.dumps(inv, indent=1)
        for mark, value in values.items():
            text = text.replace(mark, value)
    else:
        text = vaulted_yaml(inv, values, vault)
    path.write_text(text)
    return path


def _grep_tree(root: Path, needles: t.Sequence[str], skip: t.Sequence[Path] = ()) -> t.List[str]:
    """Files under root holding a needle, except the given inventories (the input, with the secret in the clear)."""
    hits = []
    skipped = {Path(p).resolve() for p in skip}
    for p in Path(root).rglob("*"):
        if p.is_file() and not p.is_symlink() and p.resolve() not in skipped:
            data = p.read_bytes()
            if any(n.encode() in data for n in needles):
                hits.append(str(p))
    return hits


def _pieces(needles: t.Sequence[str], size: int = 8) -> t.List[str]:
    """Every `size`-character piece of the needles: what a message cut through a secret could leave of it (the
    modules mask a piece of 8 characters or more). Only for the run's own output and files: on a host's whole tree a
    random 8-character hex piece could turn up by chance (a package's md5sums)."""
    return sorted({n[i:i + size] for n in needles for i in range(len(n) - size + 1)})


def _assert_nowhere(needles: t.Sequence[str], texts: t.Mapping[str, str], root: Path, skip: t.Sequence[Path] = ()) -> None:
    pieces = _pieces(needles)
    for name, text in texts.items():
        found = [n for n in pieces if n in text]
        assert not found, "a secret (or an 8-character piece of one) is in %s" % name
    assert _grep_tree(root, pieces, skip) == []


def _cli(fleet: t.Any, workdir: Path, name: str, inventories: t.Sequence[Path], *args: str,
         extra_vars: t.Optional[t.Dict[str, t.Any]] = None) -> t.Tuple[subprocess.CompletedProcess, Path, Path]:
    """ansible-playbook gpufleet.serving.rollout (the real CLI) with ANSIBLE_LOG_PATH and the summary callback."""
    log, summary_dir = workdir / ("%s.log" % name), workdir / ("summary-%s" % name)
    ev = dict({"gpufleet_rollout_serial": ["100%"]}, **(extra_vars or {}))
    argv = [str(VENV_BIN / "ansible-playbook"), "gpufleet.serving.rollout", "-e", json.dumps(ev)] + list(args)
    for inv in inventories:
        argv += ["-i", str(inv)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_LOG_PATH=str(log), GPUFLEET_SUMMARY_DIR=str(summary_dir),
               ANSIBLE_COLLECTIONS_PATH=str(private_collections()))
    p = subprocess.run(argv, cwd=str(workdir), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=400, check=False)
    (workdir / ("%s.out" % name)).write_text(p.stdout)
    return p, log, summary_dir


def _summary_hosts(summary_dir: Path) -> t.Dict[str, t.Dict[str, t.Any]]:
    return {h["host"]: h for h in json.loads((summary_dir / "rollout-summary.json").read_text())["hosts"]}


def _launcher_env(run_on: t.Callable[[str], str], pidfile: str,
                  keys: t.Sequence[str] = ("HF_TOKEN", "GPUFLEET_SERVICE")) -> t.Dict[str, str]:
    """These variables of the process the pidfile names (read as root on the host)."""
    out = run_on("python3 -c 'import json, sys; pid = open(sys.argv[1]).read().split()[0]; "
                 "env = dict(kv.split(\"=\", 1) for kv in open(\"/proc/%%s/environ\" %% pid).read().split(\"\\0\") if \"=\" in kv); "
                 "print(json.dumps({k: env.get(k) for k in json.loads(sys.argv[2])}))' %s %s" % (pidfile, _q(json.dumps(list(keys)))))
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------ process launcher (sandbox fleet)

HOSTS = ["host1", "host2"]


@pytest.fixture(scope="module")
def fleet(sandbox_fleet_module):
    return sandbox_fleet_module(hosts=2, gpus=2)


@pytest.fixture
def bare(fleet):
    for h in HOSTS:
        reset_host(fleet, h)
    return fleet


def _sandbox_scan(fleet: t.Any, host: str, needles: t.Sequence[str]) -> t.List[t.List[t.Any]]:
    """Files `host` wrote that hold a needle: its overlay upper dirs (searched from here) and its tmpfs dirs."""
    upper = fleet._fleet.host_dir(host) / "upper"
    p = subprocess.run([sys.executable, "-c", SCAN, json.dumps(list(needles)), json.dumps([str(upper)])],
                       stdout=subprocess.PIPE, text=True, timeout=120, check=True)
    hits = [[h[0][len(str(upper)):], h[1], h[2]] for h in json.loads(p.stdout)]
    p = fleet.host_run(host, [fleet.python, "-c", SCAN, json.dumps(list(needles)),
                              json.dumps(["/tmp", "/run", "/var/tmp", "/dev/shm"])], timeout=120)
    assert p.returncode == 0, p.stderr
    return hits + json.loads(p.stdout)


# The last known good generations (issue 26): the server's definition with its environment's values, what a rollback
# relaunches. Root-only by design, as the systemd launcher's environment file: a hit there counts only when it is
# 0600 and root's.
LAST_GOOD = "/var/lib/gpufleet/demo.last_good.json"


def _outside_root_only_last_good(hits: t.List[t.List[t.Any]]) -> t.List[t.List[t.Any]]:
    return [h for h in hits if not (h[0] == LAST_GOOD and h[1] == "0600" and h[2] == 0)]


def _sandbox_sh(fleet: t.Any, host: str) -> t.Callable[[str], str]:
    def run(cmd: str) -> str:
        p = fleet.host_run(host, ["/bin/sh", "-c", cmd.replace("python3", fleet.python, 1)])
        assert p.returncode == 0, p.stderr
        return p.stdout
    return run


@pytest.mark.reliability(
    section="security", case="A server secret never leaves a process-launcher rollout (CLI -vvv/-vvvv, --diff, log)",
    provoked="HF_TOKEN=hf_<random> in gpufleet_server_env (with HF_HUB_OFFLINE '1') and Authorization: Bearer "
             "sk-<random> in gpufleet_server_health_request, in the clear in the inventory; ansible-playbook "
             "gpufleet.serving.rollout -vvv --diff with ANSIBLE_LOG_PATH on 2 sandbox hosts; then new secrets, "
             "vault-encrypted (--vault-password-file), at -vvvv --diff",
    outcome="both runs restart both servers (the new secret changes the fingerprint) and each server runs with the "
            "current HF_TOKEN; neither the old nor the new secrets appear in stdout, the ansible log, the summary, any "
            "other file of the run or any file a host wrote (state, pidfile, lock, server log) but the last known good "
            "generations, root-only (0600, root's) by design")
def test_process_rollout_cli_keeps_the_secrets(bare, tmp_path):
    fleet = bare
    tok1, tok2 = _tokens(), _tokens()
    pw = vault_password_file(tmp_path)
    plain = _servers_inventory(tmp_path / "servers-plain.json", HOSTS, _server_vars(fleet), tok1, None)

    p1, log1, sum1 = _cli(fleet, tmp_path, "plain", [fleet.inventory, plain], "-vvv", "--diff")

    assert p1.returncode == 0, p1.stdout[-6000:]
    assert "ESTABLISH SSH CONNECTION" in p1.stdout and "EXEC ssh" in p1.stdout  # really -vvv
    s1 = _summary_hosts(sum1)
    states1 = {}
    for h in HOSTS:
        assert s1[h]["status"] == "ok" and s1[h]["restarted"] is True, s1[h]
        assert _launcher_env(_sandbox_sh(fleet, h), "/run/gpufleet/demo.pid") == {"HF_TOKEN": tok1["hf"], "GPUFLEET_SERVICE": "demo"}
        states1[h] = json.loads(fleet.host_run(h, ["cat", "/var/lib/gpufleet/demo.json"]).stdout)

    vaulted = _servers_inventory(tmp_path / "servers-vault.yml", HOSTS, _server_vars(fleet), tok2, pw)
    p2, log2, sum2 = _cli(fleet, tmp_path, "vault", [fleet.inventory, vaulted], "-vvvv", "--diff",
                          "--vault-password-file", str(pw))

    assert p2.returncode == 0, p2.stdout[-6000:]
    s2 = _summary_hosts(sum2)
    for h in HOSTS:
        assert s2[h]["status"] == "ok" and s2[h]["restarted"] is True, s2[h]
        assert _launcher_env(_sandbox_sh(fleet, h), "/run/gpufleet/demo.pid") == {"HF_TOKEN": tok2["hf"], "GPUFLEET_SERVICE": "demo"}
        state = json.loads(fleet.host_run(h, ["cat", "/var/lib/gpufleet/demo.json"]).stdout)
        assert state["fingerprint"] != states1[h]["fingerprint"], "a new secret must change the fingerprint"
    needles = _needles(tok1, tok2)
    _assert_nowhere(needles, {"stdout -vvv": p1.stdout, "stdout -vvvv": p2.stdout, "log -vvv": log1.read_text(),
                              "log -vvvv": log2.read_text()}, tmp_path, skip=[plain])
    for h in HOSTS:
        assert _outside_root_only_last_good(_sandbox_scan(fleet, h, needles)) == [], h


@pytest.mark.reliability(
    section="security", case="A token the server printed before crashing is masked in the cut start-up message",
    provoked="HF_TOKEN=hf_<random>, 30 characters, in gpufleet_server_env; the server prints 'loading with "
             "token=$HF_TOKEN', then 270 characters, and exits 1; ansible-playbook gpufleet.serving.rollout -vvv with "
             "ANSIBLE_LOG_PATH (the start-up failure message keeps the log tail's last 297 characters, which cut the "
             "token and leave 24 of its characters)",
    outcome="the host fails with 'exited during start-up' and the masked piece in its message; no 8-character piece "
            "of the token is in stdout, the ansible log, the summary or any other file of the run")
def test_a_token_cut_by_the_start_up_failure_message_is_masked(bare, tmp_path):
    fleet, host = bare, HOSTS[0]
    token = "hf_" + secrets.token_hex(14)[:27]
    assert len(token) == 30
    gv = _server_vars(fleet, gpufleet_server_command=[
        "/bin/sh", "-c", 'echo "loading with token=$HF_TOKEN"; printf "A%.0s" $(seq 270); echo; exit 1'])
    plain = _servers_inventory(tmp_path / "servers-plain.json", [host], gv, {"hf": token, "bearer": "sk-x"}, None)

    p, log, sums = _cli(fleet, tmp_path, "crash", [fleet.inventory, plain], "-vvv")

    assert p.returncode != 0, p.stdout[-6000:]
    failure = _summary_hosts(sums)[host]["failure"]
    assert "exited during start-up" in failure and "********" in failure and "A" * 100 in failure, failure
    assert token in fleet.host_run(host, ["cat", "/var/log/gpufleet/demo.log"]).stdout  # the server did print it
    _assert_nowhere([token], {"stdout -vvv": p.stdout, "log -vvv": log.read_text()}, tmp_path, skip=[plain])


@pytest.mark.reliability(
    section="security", case="A server secret never leaves a rollout through ansible-runner or gpufleet_ci",
    provoked="the same secrets, vault-encrypted in the inventory: gpufleet.serving.rollout through ansible-runner at "
             "default verbosity with --diff; then new secrets through `python -m gpufleet_ci rollout "
             "--vault-password-file`, --check --diff first (CI's gate), then for real",
    outcome="the gate reports both hosts would restart; both real runs restart both servers with the current "
            "HF_TOKEN; no secret is in runner's stdout, artifacts/<ident>/job_events or any other file of the private "
            "data dirs, gpufleet_ci's output and its JSON and Markdown reports, the summary, or any file a host wrote but "
            "the last known good generations, root-only (0600, root's) by design")
def test_process_rollout_runner_and_gpufleet_ci_keep_the_secrets(bare, tmp_path):
    fleet = bare
    tok1, tok2 = _tokens(), _tokens()
    pw = vault_password_file(tmp_path)
    inv1 = _servers_inventory(tmp_path / "servers-1.yml", HOSTS, _server_vars(fleet), tok1, pw)

    run = runner_play(tmp_path, ROLLOUT_SITE, [fleet.inventory, inv1], extravars={"gpufleet_rollout_serial": ["100%"]},
                      cmdline="--diff --vault-password-file %s" % pw, ident="runner")

    assert run.rc == 0, run.stdout[-6000:]
    assert list((run.artifacts / "job_events").iterdir())
    for h in HOSTS:
        assert summary(run)[h]["restarted"] is True, summary(run)[h]
        assert _launcher_env(_sandbox_sh(fleet, h), "/run/gpufleet/demo.pid")["HF_TOKEN"] == tok1["hf"]

    invdir = tmp_path / "inv-ci"
    invdir.mkdir()
    (invdir / "fleet.yml").write_text(Path(fleet.inventory).read_text())
    _servers_inventory(invdir / "servers.yml", HOSTS, _server_vars(fleet), tok2, pw)

    def gpufleet_ci(ident: str, *args: str) -> t.Tuple[subprocess.CompletedProcess, t.Dict[str, t.Any]]:
        out = tmp_path / ("ci-" + ident)
        argv = [sys.executable, "-m", "gpufleet_ci", "rollout", "--inventory", str(invdir), "--ident", ident,
                "--private-data-dir", str(out / "pdd"), "--json", str(out / "report.json"), "--markdown",
                str(out / "report.md"), "--collections-path", str(private_collections()), "--vault-password-file",
                str(pw), "-e", json.dumps({"gpufleet_rollout_serial": ["100%"]})] + list(args)
        p = subprocess.run(argv, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400,
                           check=False)
        assert p.returncode == 0, p.stdout[-6000:]
        return p, json.loads((out / "report.json").read_text())

    # The CI gate first (--check --diff), then the rollout.
    gate, report = gpufleet_ci("gate", "--check", "--diff")
    assert report["ok"] and all(h["would_restart"] is True for h in report["hosts"]), report
    ci, report = gpufleet_ci("ci")
    assert report["ok"] and all(h["restarted"] is True for h in report["hosts"]), report
    for h in HOSTS:
        assert _launcher_env(_sandbox_sh(fleet, h), "/run/gpufleet/demo.pid")["HF_TOKEN"] == tok2["hf"]
    needles = _needles(tok1, tok2)
    _assert_nowhere(needles, {"runner stdout": run.stdout, "gpufleet_ci --check --diff output": gate.stdout,
                              "gpufleet_ci output": ci.stdout}, tmp_path)
    for h in HOSTS:
        assert _outside_root_only_last_good(_sandbox_scan(fleet, h, needles)) == [], h


# ------------------------------------------------------------------ systemd launcher (podman hosts, systemd as PID 1)

def _ssh(fleet: t.Any, host: str) -> t.Callable[[str], str]:
    def run(cmd: str) -> str:
        return fleet.ssh(host, cmd, check=True, timeout=120).stdout
    return run


@pytest.mark.reliability(
    section="security", case="A server secret never leaves a systemd-launcher rollout; it is only in 0600 root files",
    provoked="gpufleet_server_launcher systemd on a podman host booting systemd; HF_TOKEN=hf_<random> in "
             "gpufleet_server_env and an Authorization header, in the clear; ansible-playbook gpufleet.serving.rollout "
             "-vvv --diff with ANSIBLE_LOG_PATH; then new secrets, vault-encrypted, through ansible-runner with --diff",
    outcome="the unit runs the server with the current HF_TOKEN from EnvironmentFile=/etc/gpufleet/demo.env "
            "(root:root 0600; with the last known good generations, /var/lib/gpufleet/demo.last_good.json, 0600 root, which "
            "keep the unit's files for a rollback, the only files on the host holding a secret); the unit file and `systemctl show "
            "-p Environment` (readable by every user) hold the tag and NCCL variables, no secret; no secret in "
            "stdout, the ansible log, the job events, any file of either run or the host's journal (ansible-core's "
            "'Invoked with' entries)")
def test_systemd_rollout_keeps_the_secrets_in_a_root_only_environment_file(systemd_host, tmp_path):
    fleet = systemd_host
    host = fleet.hosts[0]
    sh = _ssh(fleet, host)
    tok1, tok2 = _tokens(), _tokens()
    pw = vault_password_file(tmp_path)
    gv = dict(_server_vars(fleet, gpufleet_server_launcher="systemd"), ansible_python_interpreter="/usr/bin/python3")
    # What systemd's EnvironmentFile= parsing must give back unchanged (quotes, backslashes, $, `, %, spaces).
    gv["gpufleet_server_env"]["TRICKY"] = TRICKY
    plain = _servers_inventory(tmp_path / "servers-plain.json", [host], gv, tok1, None)

    p1, log1, sum1 = _cli(fleet, tmp_path, "systemd", [fleet.inventory, plain], "-vvv", "--diff")

    assert p1.returncode == 0, p1.stdout[-6000:]
    assert _summary_hosts(sum1)[host]["restarted"] is True
    assert _launcher_env(sh, "/run/gpufleet/demo.pid", ("HF_TOKEN", "GPUFLEET_SERVICE", "TRICKY", "HF_HUB_OFFLINE")) == {
        "HF_TOKEN": tok1["hf"], "GPUFLEET_SERVICE": "demo", "TRICKY": TRICKY, "HF_HUB_OFFLINE": "1"}
    unit = sh("cat %s" % UNIT_FILE)
    assert "EnvironmentFile=%s\n" % ENV_FILE in unit and "HF_TOKEN" not in unit, unit
    shown = sh("systemctl show -p Environment -p EnvironmentFiles gpufleet-demo.service")
    assert "GPUFLEET_SERVICE=demo" in shown and "NCCL_PROTO=LL" in shown and ENV_FILE in shown, shown
    assert sh("stat -c '%%a %%U %%G' %s" % ENV_FILE).split() == ["600", "root", "root"]
    found1 = json.loads(sh("python3 -c %s %s %s" % (_q(SCAN), _q(json.dumps(_needles(tok1))), _q(json.dumps(
        ["/etc", "/var", "/run", "/tmp", "/root", "/home", "/srv", "/opt"])))))
    assert sorted(found1) == sorted([[ENV_FILE, "0600", 0], [LAST_GOOD, "0600", 0]]), found1

    vaulted = _servers_inventory(tmp_path / "servers-vault.yml", [host], gv, tok2, pw)
    run = runner_play(tmp_path, ROLLOUT_SITE, [fleet.inventory, vaulted], extravars={"gpufleet_rollout_serial": ["100%"]},
                      cmdline="--diff --vault-password-file %s" % pw, ident="systemd")

    assert run.rc == 0, run.stdout[-6000:]
    assert summary(run)[host]["restarted"] is True
    assert _launcher_env(sh, "/run/gpufleet/demo.pid") == {"HF_TOKEN": tok2["hf"], "GPUFLEET_SERVICE": "demo"}
    assert sh("stat -c '%%a %%U %%G' %s" % ENV_FILE).split() == ["600", "root", "root"]
    needles = _needles(tok1, tok2)
    found = json.loads(sh("python3 -c %s %s %s" % (_q(SCAN), _q(json.dumps(needles)), _q(json.dumps(
        ["/etc", "/var", "/run", "/tmp", "/root", "/home", "/srv", "/opt"])))))
    assert sorted(found) == sorted([[ENV_FILE, "0600", 0], [LAST_GOOD, "0600", 0]]), found
    # The host's journal, where ansible-core logs each module's arguments ("Invoked with ..."), readable by the adm
    # group: the environment file's content went there in a dict option, its lines unmasked (new-user pass, issue 26).
    journal = sh("journalctl --no-pager -o short 2>/dev/null; true")
    assert "Invoked with" in journal and "systemd_env_content=NOT_LOGGING_PARAMETER" in journal, journal[-3000:]
    assert not [n for n in needles if n in journal], [ln for ln in journal.splitlines() if any(n in ln for n in needles)][:3]
    _assert_nowhere(needles, {"stdout -vvv": p1.stdout, "log -vvv": log1.read_text(), "runner stdout": run.stdout},
                    tmp_path, skip=[plain])


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"
