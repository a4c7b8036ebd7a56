# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers of the NCCL tuning tests: throw-away "system" interpreters and playbook runs with results."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import typing as t
from pathlib import Path

import yaml

from helpers import run_playbook

HERE = Path(__file__).resolve().parent
ORIGINAL_SITECUSTOMIZE = (
    "# install the apport exception handler if available\n"
    "try:\n    import apport_python_hook\nexcept ImportError:\n    pass\nelse:\n    apport_python_hook.install()\n"
)


def base_python() -> t.Tuple[str, str, str]:
    """(interpreter binary, its stdlib dir, 'X.Y') of the host's system python3, else of this venv's base."""
    for cand in ("/usr/bin/python3", getattr(sys, "_base_executable", sys.executable)):
        if not os.path.exists(cand):
            continue
        r = subprocess.run([cand, "-S", "-c", "import sys, sysconfig; print(sys.executable); "
                            "print(sysconfig.get_paths()['stdlib']); print('%d.%d' % sys.version_info[:2])"],
                           env={}, stdout=subprocess.PIPE, text=True, check=False)
        if r.returncode == 0:
            exe, stdlib, ver = r.stdout.split()
            return os.path.realpath(exe), stdlib, ver
    raise RuntimeError("no base python found")


class SysPython:
    """A real interpreter laid out like Debian's system python, inside a test directory:

    PREFIX/bin/pythonX.Y (a hard link or copy of the real binary, so its prefix is PREFIX),
    PREFIX/lib/pythonX.Y/* (symlinks to the real stdlib entries, except sitecustomize.py),
    PREFIX/lib/pythonX.Y/sitecustomize.py -> ../../etc/pythonX.Y/sitecustomize.py (root-owned, 0644).
    Writing its sitecustomize never touches the host's own python.
    """

    def __init__(self, prefix: Path, binary: str, stdlib: str, ver: str, with_link: bool = True) -> None:
        self.prefix = prefix
        self.ver = ver
        bindir = prefix / "bin"
        bindir.mkdir(parents=True)
        self.python = bindir / ("python" + ver)
        try:
            os.link(binary, self.python)
        except OSError:
            shutil.copy2(binary, self.python)
        self.stdlib = prefix / "lib" / ("python" + ver)
        self.stdlib.mkdir(parents=True)
        for name in os.listdir(stdlib):
            if name.startswith("sitecustomize"):
                continue
            (self.stdlib / name).symlink_to(os.path.join(stdlib, name))
        self.etc_dir = prefix / "etc" / ("python" + ver)
        self.etc_file = self.etc_dir / "sitecustomize.py"
        self.link = self.stdlib / "sitecustomize.py"
        if with_link:
            self.etc_dir.mkdir(parents=True)
            self.etc_file.write_text(ORIGINAL_SITECUSTOMIZE)
            os.chmod(self.etc_file, 0o644)
            self.link.symlink_to("../../etc/python%s/sitecustomize.py" % ver)

    def venv(self, path: Path, shadow: bool = True) -> Path:
        subprocess.run([str(self.python), "-m", "venv", "--without-pip", str(path)], env={}, check=True)
        if shadow:
            sp = path / "lib" / ("python" + self.ver) / "site-packages"
            (sp / "sitecustomize.py").write_text("raise SystemExit('the shadowed copy must never run')\n")
        return path / "bin" / "python"

    def env_of(self, interp: t.Union[str, Path], keys: t.Sequence[str], env: t.Optional[t.Dict[str, str]] = None) -> t.Dict[str, t.Optional[str]]:
        """What a process of this interpreter, started with an empty environment, sees."""
        r = subprocess.run([str(interp), "-c", "import os, sys, json; print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))",
                            *keys], env=env or {}, cwd="/", stdout=subprocess.PIPE, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])


def play(tmp_path: Path, tasks: t.List[t.Dict[str, t.Any]], registers: t.Sequence[str], name: str = "play",
         **kw: t.Any) -> t.Tuple[subprocess.CompletedProcess, t.Dict[str, t.Any]]:
    """Run the tasks on localhost with the real ansible-playbook; return the process and the registered results."""
    out = tmp_path / ("%s-results.json" % name)
    if out.exists():
        out.unlink()
    dump = {
        "name": "Dump the registered results",
        "ansible.builtin.copy": {"content": "{{ dict(%s) | to_nice_json }}" % ", ".join("%s=%s" % (r, r) for r in registers),
                                 "dest": str(out), "mode": "0600"},
        "check_mode": False,
        "diff": False,
        "changed_when": False,
    }
    pb = tmp_path / ("%s.yml" % name)
    pb.write_text(yaml.safe_dump([{"name": name, "hosts": "localhost", "gather_facts": False,
                                   "tasks": list(tasks) + ([dump] if registers else [])}], sort_keys=False))
    proc = run_playbook(pb, **kw)
    results = json.loads(out.read_text()) if out.exists() else {}
    return proc, results
