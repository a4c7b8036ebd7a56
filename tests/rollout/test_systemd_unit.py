# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_server role's systemd unit and environment file templates, rendered by ansible's template module (no
systemd is run; tests/reliability/test_rel_security_rollout.py runs them under a real systemd).

The unit is checked with `systemd-analyze verify` when that exists, and both are parsed here with systemd's rules
(specifiers, quoting, C escapes, $-substitution in ExecStart, EnvironmentFile= parsing) to prove that the process
would get exactly the argv and environment of the inventory, and that the unit holds none of the server's
environment values (they are secret; the unit is world-readable).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import typing as t

import pytest

from collection_copy import private_collections
from rollout_helpers import ROOT
from helpers import PY, run_playbook

RENDER = """
- name: Render the gpu_server systemd unit
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Load the role defaults
      ansible.builtin.include_vars:
        file: "{{ role_dir }}/defaults/main.yml"
    - name: Load the role vars
      ansible.builtin.include_vars:
        file: "{{ role_dir }}/vars/main.yml"
    - name: Render the unit
      ansible.builtin.template:
        src: "{{ role_dir }}/templates/gpufleet-server.service.j2"
        dest: "{{ out }}/{{ _gpufleet_server_unit }}"
        mode: "0644"
    - name: Render the environment file
      ansible.builtin.template:
        src: "{{ role_dir }}/templates/gpufleet-server.env.j2"
        dest: "{{ out }}/{{ gpufleet_server_name }}.env"
        mode: "0600"
"""

# Values that need systemd quoting: spaces, quotes, backslashes, %, $ (ExecStart expands $VAR).
COMMAND = ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/Kimi K2.5", "--tp", "8",
           "--chat-template", 'say "hi" to 100% of $USER and ${HOME} \\n', "--api-key=$$secret", "-"]
ENV = {"HF_HUB_OFFLINE": "1", "NCCL_DEBUG_FILE": "/var/log/gpufleet/nccl.%h.%p.log", "QUOTED": 'a "b" \\ c $X',
       "NCCL_PROTO": "Simple", "HF_TOKEN": "hf_s3cr3t-value", "API_KEY": " sp$ce `x` ${HOME} 'q' #not-a-comment \\n"}
NCCL = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "16"}


def render(tmp_path, **overrides) -> str:
    pb = tmp_path / "render.yml"
    pb.write_text(RENDER)
    role = private_collections() / "ansible_collections" / "gpufleet" / "serving" / "roles" / "gpu_server"
    ev = {"role_dir": str(role), "out": str(tmp_path), "ansible_python_interpreter": PY,
          "gpufleet_server_name": "sglang", "gpufleet_server_command": COMMAND, "gpufleet_server_env": ENV,
          "gpufleet_nccl_effective_env": NCCL, "gpufleet_server_user": "root", "gpufleet_server_workdir": "/srv"}
    ev.update(overrides)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(private_collections()))
    r = run_playbook(pb, extra_vars=ev, env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:]
    return (tmp_path / "gpufleet-sglang.service").read_text()


# ---------------------------------------------------------------- systemd's parsing rules (subset we emit)

def specifiers(s: str) -> str:
    """%% -> %; any other %X is a specifier systemd would replace: fail loudly."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "%":
            assert s[i + 1:i + 2] == "%", "unescaped specifier %r in %r" % (s[i:i + 2], s)
            out.append("%")
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


_ESC = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "a": "\a", "b": "\b", "f": "\f", "r": "\r",
        "v": "\v", "s": " "}


def words(s: str) -> t.List[str]:
    """systemd extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE) over a whole line."""
    out: t.List[str] = []
    i, n = 0, len(s)
    while True:
        while i < n and s[i] in " \t":
            i += 1
        if i >= n:
            return out
        w, quote, started = [], None, False
        while i < n:
            c = s[i]
            if quote is None and c in " \t":
                break
            if c == "\\":
                e = s[i + 1]
                assert e in _ESC, "unknown escape \\%s in %r" % (e, s)
                w.append(_ESC[e])
                i += 2
                continue
            if quote is None and c in "\"'":
                quote, started = c, True
            elif c == quote:
                quote = None
            else:
                w.append(c)
            i += 1
        assert quote is None, "unterminated quote in %r" % s
        out.append("".join(w) if (w or started) else "")


def exec_substitute(word: str) -> str:
    """ExecStart's environment substitution: $$ -> $; $NAME / ${NAME} would be replaced (fail loudly)."""
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            nxt = word[i + 1:i + 2]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            assert not (nxt == "{" or re.match(r"[A-Za-z_]", nxt)), "systemd would expand %r in %r" % (word[i:], word)
        out.append(word[i])
        i += 1
    return "".join(out)


def parse_unit(text: str) -> t.Dict[str, t.List[t.Tuple[str, str]]]:
    sections: t.Dict[str, t.List[t.Tuple[str, str]]] = {}
    cur = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        m = re.match(r"^\[([A-Za-z]+)\]$", line)
        if m:
            cur = sections.setdefault(m.group(1), [])
            continue
        m = re.match(r"^([A-Za-z][A-Za-z0-9]*)=(.*)$", line)
        assert m and cur is not None, "not a unit line: %r" % line
        cur.append((m.group(1), m.group(2)))
    return sections


def parse_env_file(text: str) -> t.Dict[str, str]:
    """systemd's EnvironmentFile= parsing of the lines we emit: NAME="VALUE" with backslash escapes of backslash,
    double quote, $ and backtick (any other backslash stays), comments, no expansion."""
    env: t.Dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        m = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="(.*)"\s*$', line)
        assert m, "not a NAME=\"VALUE\" line: %r" % line
        raw, out, i = m.group(2), [], 0
        while i < len(raw):
            c = raw[i]
            if c == "\\":
                nxt = raw[i + 1]
                out.append(nxt if nxt in '"\\`$' else "\\" + nxt)
                i += 2
                continue
            assert c != '"', "unescaped quote in %r" % line
            out.append(c)
            i += 1
        env[m.group(1)] = "".join(out)
    return env


def test_unit_renders_valid_syntax_with_exact_argv_and_environment(tmp_path):
    text = render(tmp_path)
    unit = parse_unit(text)
    assert list(unit) == ["Unit", "Service", "Install"]
    svc = unit["Service"]
    one = {k: v for k, v in svc if k != "Environment"}
    assert one["Type"] == "simple" and one["User"] == "root" and one["WorkingDirectory"] == "/srv"
    # TERM to the launcher (it drains and stops its workers), KILL of the whole cgroup (orphans too) after the grace.
    assert one["KillMode"] == "mixed", "workers (and orphans) must die with the unit"
    assert one["TimeoutStopSec"] == "15000ms" and one["Restart"] == "no"
    assert one["StandardOutput"] == one["StandardError"] == "append:/var/log/gpufleet/sglang.log"
    argv = [exec_substitute(w) for w in words(specifiers(one["ExecStart"]))]
    assert argv == COMMAND
    env: t.Dict[str, str] = {}
    for k, v in svc:
        if k == "Environment":
            for w in words(specifiers(v)):
                name, value = w.split("=", 1)
                env[name] = value
    # The unit (world-readable, and `systemctl show` prints Environment= to every user): the tag and the NCCL
    # tuning the server's env does not override; none of the server's env.
    assert env == {"GPUFLEET_SERVICE": "sglang", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "16"}
    assert one["EnvironmentFile"] == "/etc/gpufleet/sglang.env"
    for value in ENV.values():
        if len(value) > 1:
            assert value not in text, value
    # systemd reads EnvironmentFile= after Environment= and its values win: the NCCL tuning as a layer under the
    # server's own env (the inventory wins), the tag set last.
    file_env = parse_env_file((tmp_path / "sglang.env").read_text())
    assert file_env == ENV
    assert dict(env, **file_env) == dict(NCCL, **ENV, GPUFLEET_SERVICE="sglang")
    assert unit["Install"] == [("WantedBy", "multi-user.target")]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    render(tmp_path)
    p = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "gpufleet-sglang.service")], check=False,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    # Only its own unit's lines matter (a host's other units may warn).
    ours = [line for line in p.stdout.splitlines() if "gpufleet-sglang" in line]
    assert p.returncode == 0 and not ours, p.stdout


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_would_catch_a_broken_unit(tmp_path):
    """The check above can fail: a unit naming a missing executable is refused."""
    render(tmp_path, gpufleet_server_command=["/nonexistent/gpufleet/python", "-m", "x"])
    p = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "gpufleet-sglang.service")], check=False,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode != 0 and "/nonexistent/gpufleet/python" in p.stdout, p.stdout


def test_example_inventory_units_render(tmp_path):
    """The example inventory's SGLang definition renders to the same argv (its paths need not exist here)."""
    inv = json.loads(subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-inventory"), "-i",
                                     str(ROOT / "inventories" / "example"), "--host", "gpu-pcie-01.example.internal"],
                                    cwd=str(ROOT), stdout=subprocess.PIPE, text=True, check=True).stdout)
    text = render(tmp_path, gpufleet_server_command=inv["gpufleet_server_command"],
                  gpufleet_server_env=inv["gpufleet_server_env"], gpufleet_server_user=inv["gpufleet_server_user"],
                  gpufleet_server_workdir=inv["gpufleet_server_workdir"])
    svc = dict(kv for kv in parse_unit(text)["Service"] if kv[0] != "Environment")
    assert [exec_substitute(w) for w in words(specifiers(svc["ExecStart"]))] == inv["gpufleet_server_command"]
    assert svc["User"] == "serve" and svc["WorkingDirectory"] == "/srv/serve"


FILES = """
- name: Write the systemd files of the gpu_server role
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Write them
      ansible.builtin.include_role:
        name: gpufleet.serving.gpu_server
        tasks_from: systemd_files
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the role writes the files as root:root")
def test_systemd_files_keep_the_env_root_only_and_out_of_the_output(tmp_path):
    """The role's tasks that write the unit and its EnvironmentFile= (paths moved under tmp_path), at -vvv with
    --diff and ANSIBLE_LOG_PATH, twice (the second time with a new secret)."""
    pb = tmp_path / "files.yml"
    pb.write_text(FILES)
    etc = tmp_path / "etc" / "gpufleet"
    log = tmp_path / "ansible.log"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(private_collections()), ANSIBLE_LOG_PATH=str(log))
    tokens = ["hf_" + secrets.token_hex(17), "hf_" + secrets.token_hex(17)]
    outs = []
    for i, token in enumerate(tokens):
        ev = tmp_path / ("vars-%d.json" % i)
        ev.write_text(json.dumps({
            "ansible_python_interpreter": PY, "gpufleet_server_name": "sglang", "gpufleet_server_command": COMMAND,
            # The files are the systemd launcher's (the role renders them for it only).
            "gpufleet_server_launcher": "systemd",
            "gpufleet_server_env": {"HF_TOKEN": token, "HF_HUB_OFFLINE": "1"}, "gpufleet_nccl_effective_env": NCCL,
            "_gpufleet_server_env_file": str(etc / "sglang.env"), "_gpufleet_server_unit_path": str(tmp_path / "unit"),
            "gpufleet_server_log_dir": str(tmp_path / "log")}))
        os.chmod(ev, 0o600)
        r = run_playbook(pb, "-vvv", "--diff", "-e", "@%s" % ev, env=env, timeout=120)
        assert r.returncode == 0, r.stdout[-4000:]
        assert "changed: [localhost]" in r.stdout
        outs.append(r.stdout)
        assert parse_env_file((etc / "sglang.env").read_text()) == {"HF_TOKEN": token, "HF_HUB_OFFLINE": "1"}
    st = (etc / "sglang.env").stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o777)) == (0, 0, "0o600")
    assert oct(etc.stat().st_mode & 0o777) == "0o755" and oct((tmp_path / "unit").stat().st_mode & 0o777) == "0o644"
    unit = (tmp_path / "unit").read_text()
    assert "EnvironmentFile=%s\n" % (etc / "sglang.env") in unit
    for token in tokens:
        assert token not in unit
        assert not [o for o in outs if token in o or token[3:19] in o]
        assert token not in log.read_text() and token[3:19] not in log.read_text()


@pytest.mark.parametrize("umask", [None, "0027"])
def test_unit_sets_the_servers_umask(tmp_path, umask):
    """Issue 16 item 3: the systemd launcher's server gets gpufleet_server_umask too (default 0022), not systemd's
    default by accident, so both launchers give one definition the same file modes."""
    text = render(tmp_path, **({"gpufleet_server_umask": umask} if umask else {}))
    svc = dict((k, v) for k, v in parse_unit(text)["Service"] if k != "Environment")
    assert svc["UMask"] == (umask or "0022")


@pytest.mark.parametrize("grace, expected", [(2.5, "2500ms"), (0, "1ms"), (0.0004, "1ms"), (600, "600000ms")])
def test_unit_stop_timeout_is_the_kill_grace_and_never_infinite(tmp_path, grace, expected):
    """TimeoutStopSec is gpufleet_server_kill_grace (one stop contract for both launchers); 0 would mean no timeout
    at all to systemd, so the grace 0 writes 1 ms."""
    svc = dict((k, v) for k, v in parse_unit(render(tmp_path, gpufleet_server_kill_grace=grace))["Service"]
               if k != "Environment")
    assert svc["TimeoutStopSec"] == expected and svc["KillMode"] == "mixed"
