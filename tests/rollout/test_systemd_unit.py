# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpu_server role's systemd unit template, rendered by ansible's template module (no systemd is run).

The unit is checked with `systemd-analyze verify` when that exists, and parsed here with systemd's rules
(specifiers, quoting, C escapes, $-substitution in ExecStart) to prove that the process would get exactly
the argv and environment of the inventory.
"""
from __future__ import annotations

import json
import os
import re
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
"""

# Values that need systemd quoting: spaces, quotes, backslashes, %, $ (ExecStart expands $VAR).
COMMAND = ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/Kimi K2.5", "--tp", "8",
           "--chat-template", 'say "hi" to 100% of $USER and ${HOME} \\n', "--api-key=$$secret", "-"]
ENV = {"HF_HUB_OFFLINE": "1", "NCCL_DEBUG_FILE": "/var/log/gpufleet/nccl.%h.%p.log", "QUOTED": 'a "b" \\ c $X',
       "NCCL_PROTO": "Simple"}
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


def test_unit_renders_valid_syntax_with_exact_argv_and_environment(tmp_path):
    unit = parse_unit(render(tmp_path))
    assert list(unit) == ["Unit", "Service", "Install"]
    svc = unit["Service"]
    one = {k: v for k, v in svc if k != "Environment"}
    assert one["Type"] == "simple" and one["User"] == "root" and one["WorkingDirectory"] == "/srv"
    assert one["KillMode"] == "control-group", "workers (and orphans) must die with the unit"
    assert one["TimeoutStopSec"] == "30" and one["Restart"] == "no"
    assert one["StandardOutput"] == one["StandardError"] == "append:/var/log/gpufleet/sglang.log"
    argv = [exec_substitute(w) for w in words(specifiers(one["ExecStart"]))]
    assert argv == COMMAND
    env: t.Dict[str, str] = {}
    for k, v in svc:
        if k == "Environment":
            for w in words(specifiers(v)):
                name, value = w.split("=", 1)
                env[name] = value
    # the tag, the NCCL tuning as a layer under the server's own env (the inventory wins)
    assert env == dict(NCCL, **ENV, GPUFLEET_SERVICE="sglang")
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
