# SPDX-License-Identifier: GPL-3.0-or-later
"""TEST DOUBLE of the `nvidia-smi` executable (the GPU boundary), written to a tmp dir per test.

`write_smi(dir, spec)` creates DIR/nvidia-smi, a real executable that answers
`--query-gpu=...` / `--query-compute-apps=...` with `--format=csv,noheader,nounits` from `spec`:
  {"gpus": [{"index": "0", "uuid": ..., "name": ..., "pci.bus_id": ..., "memory.total": ...,
             "memory.used": ..., "memory.free": ..., "memory.reserved": ..., "driver_version": ...}],
   "apps": [{"gpu_uuid": ..., "pid": ..., "used_memory": ...}],
   "unknown_fields": ["memory.reserved"],   # fields this (old) nvidia-smi rejects, like the real one
   "fail": "message"}                        # exit 9 with this message on every call
Each call's argv is appended to DIR/calls.log.
"""
from __future__ import annotations

import json
import os
import sys
import typing as t
from pathlib import Path

_SCRIPT = r'''#!%(python)s
import json, sys
spec = json.load(open(%(spec)r))
with open(%(log)r, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
if spec.get("fail"):
    sys.stderr.write(spec["fail"] + "\n")
    sys.exit(9)
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
if args.get("--format") != "csv,noheader,nounits":
    sys.stderr.write("unexpected format\n")
    sys.exit(3)
if "--query-gpu" in args:
    rows, fields = spec.get("gpus", []), args["--query-gpu"].split(",")
elif "--query-compute-apps" in args:
    rows, fields = spec.get("apps", []), args["--query-compute-apps"].split(",")
else:
    sys.exit(4)
for f in fields:
    if f in spec.get("unknown_fields", []):
        print('Field "%%s" is not a valid field to query.' %% f)
        print()
        sys.exit(2)
for r in rows:
    print(", ".join(str(r.get(f, "[N/A]")) for f in fields))
'''


def gpu_row(index: int, used: t.Any = 0, reserved: t.Any = 615, total: int = 143771, name: str = "NVIDIA H200") -> t.Dict[str, t.Any]:
    return {"index": str(index), "uuid": "GPU-smi-%d" % index, "name": name, "pci.bus_id": "00000000:%02X:00.0" % (0x18 + index),
            "memory.total": total, "memory.used": used, "memory.free": "[N/A]" if used == "[N/A]" else total - 615 - int(used),
            "memory.reserved": reserved, "driver_version": "550.54.15"}


def write_smi(d: t.Union[str, Path], spec: t.Dict[str, t.Any]) -> Path:
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    (d / "spec.json").write_text(json.dumps(spec))
    exe = d / "nvidia-smi"
    exe.write_text(_SCRIPT % {"python": sys.executable, "spec": str(d / "spec.json"), "log": str(d / "calls.log")})
    os.chmod(exe, 0o755)
    return exe


def calls(d: t.Union[str, Path]) -> t.List[t.List[str]]:
    p = Path(d) / "calls.log"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
