#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Molecule probe, run on a sandbox host (ansible.builtin.script): what prepare records and verify compares. Test-only.

Prints JSON: `demo` = every demo_server.py process and its descendants as {pid, start} (start = /proc/PID/stat field 22, so a
reused pid differs), `sitecustomize` = {real path: sha256} of each sitecustomize.py on the host python's
sys.path (a file created there shows up too), `files` = {path: exists} of gpufleet's files of the demo server.
"""
import hashlib
import json
import os
import sys

FILES = ["/var/lib/gpufleet/demo.json", "/run/gpufleet/demo.pid", "/run/gpufleet/demo.lock", "/var/log/gpufleet/demo.log",
         "/etc/systemd/system/gpufleet-demo.service"]


def demo_processes():
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % d) as f:
                stat = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != "Z":
            procs[int(d)] = (int(stat[1]), int(stat[19]), any(a.endswith(b"demo_server.py") for a in argv))
    # Launchers (demo_server.py in argv) and their descendants (spawn workers run `python3 -c ...`).
    keep = {pid for pid, (_, _, launcher) in procs.items() if launcher}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in procs.items() if ppid in keep} - keep
        keep |= more
        grew = bool(more)
    return [{"pid": pid, "start": procs[pid][1]} for pid in sorted(keep)]


def sitecustomize():
    out = {}
    for d in sys.path:
        p = os.path.join(d or ".", "sitecustomize.py")
        if os.path.isfile(p):
            real = os.path.realpath(p)
            with open(real, "rb") as f:
                out[real] = hashlib.sha256(f.read()).hexdigest()
    return out


print(json.dumps({"demo": demo_processes(), "sitecustomize": sitecustomize(),
                  "files": {p: os.path.exists(p) for p in FILES}}))
