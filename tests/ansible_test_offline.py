# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The set-up tests/run_sanity.py, tests/run_units.py and tests/run_integration.py share: ansible-test run offline
(no Docker, no ci-files.testing.ansible.com) on a throw-away installed copy of this checkout.

The ansible-test run is the one installed beside the interpreter that runs the script (its venv's bin/), and
--python defaults to that interpreter's version: run a script with a venv's python to test that venv's core.

1. `copy_for` copies the checkout (scripts/install-collection; a real copy, tests/ included) to
   DIR/ansible_collections/gpufleet/serving and commits it to a throw-away git repo there, so ansible-test lists
   exactly the files of the copy. DIR defaults to ~/.cache/gpufleet-<command>-<core>: one copy per command and
   ansible-core, reused between runs (ansible-test's delegation venv lives in its tests/output), locked for a run.
2. Offline, ansible-test's venv bootstrap (`--venv`) downloads get-pip.py from ci-files.testing.ansible.com and
   fails. It first looks in ~/.ansible/test/cache/get_pip_<pip version>.py (the version is read from the installed
   ansible_test), so a stand-in is written there that runs ensurepip and then installs the requested pip from the
   package index. ensurepip wipes the PIP_* variables and sets PIP_CONFIG_FILE=/dev/null (dropping the machine's
   index/CA settings): the stand-in restores os.environ.
3. `ansible_test` runs it in the copy with the venv's bin/ first on PATH and without the caller's variables that
   would point it at another collection (ANSIBLE_COLLECTIONS_PATH) or the test fakes (each script names its own).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import typing as t
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Its text is what ensure_get_pip_stand_in compares with the cached file (and its first line what tells it from a real
# get-pip.py): kept as it was written when this lived in tests/run_sanity.py, so existing caches stay valid.
GET_PIP_STAND_IN = '''# get-pip.py stand-in written by gpufleet tests/run_sanity.py (offline ansible-test bootstrap).
import os
import subprocess
import sys


def main():
    saved = dict(os.environ)
    import ensurepip
    ensurepip.bootstrap(upgrade=True)
    # ensurepip removes PIP_* and sets PIP_CONFIG_FILE=/dev/null; the install below needs the machine's settings.
    os.environ.clear()
    os.environ.update(saved)
    args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args))


if __name__ == "__main__":
    main()
'''


def pip_bootstrap_version() -> str:
    import ansible_test

    # python_requirements.get_venv_packages(): default_packages = dict(pip='24.2', ...)
    src = (Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
    m = re.search(r"""default_packages\s*=\s*dict\(\s*pip=['"]([0-9.]+)['"]""", src)
    if not m:
        raise SystemExit("cannot find ansible-test's pip bootstrap version in python_requirements.py")
    return m.group(1)


def core_version() -> str:
    from ansible.release import __version__

    return ".".join(__version__.split(".")[:2])


def ensure_get_pip_stand_in() -> Path:
    version = pip_bootstrap_version()
    cache = Path.home() / ".ansible" / "test" / "cache" / ("get_pip_%s.py" % version.replace(".", "_"))
    cache.parent.mkdir(parents=True, exist_ok=True)
    if not cache.exists() or cache.read_text() != GET_PIP_STAND_IN:
        if cache.exists() and "gpufleet" not in cache.read_text():
            return cache  # a real get-pip.py someone downloaded: use it
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(GET_PIP_STAND_IN)
        tmp.replace(cache)
    return cache


def copy_collection(base: Path) -> Path:
    # Keep tests/output across runs: ansible-test's delegation venv lives there (a warm run is much faster).
    dest = base / "ansible_collections" / "gpufleet" / "serving"
    kept = base / "output-kept"
    if (dest / "tests" / "output").is_dir():
        shutil.rmtree(kept, ignore_errors=True)
        (dest / "tests" / "output").rename(kept)
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "install-collection"), str(base)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout.strip()
    assert Path(out) == dest, out
    if kept.is_dir():
        shutil.rmtree(dest / "tests" / "output", ignore_errors=True)  # a stray one copied from the checkout
        kept.rename(dest / "tests" / "output")
    # ansible-test lists git's tracked AND untracked files: keep its own output out of the listing.
    (dest / ".gitignore").write_text("/tests/output/\n")
    env = dict(os.environ, GIT_AUTHOR_NAME="sanity", GIT_AUTHOR_EMAIL="sanity@invalid",
               GIT_COMMITTER_NAME="sanity", GIT_COMMITTER_EMAIL="sanity@invalid")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "sanity snapshot"]):
        subprocess.run(cmd, cwd=str(dest), check=True, env=env, stdout=subprocess.DEVNULL)
    return dest


class Session(t.NamedTuple):
    dest: Path  # the copy: DIR/ansible_collections/gpufleet/serving
    python: str  # --python
    rest: t.List[str]  # the arguments left for ansible-test


@contextlib.contextmanager
def copy_for(command: str, doc: str, argv: t.Optional[t.List[str]], get_pip: bool) -> t.Iterator[Session]:
    """Parse the scripts' common options (--python, --dir; the rest goes to ansible-test), then hold the copy's lock
    while the caller runs ansible-test in a fresh copy. `get_pip`: ansible-test will bootstrap a venv (--venv)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default="%d.%d" % sys.version_info[:2])
    # One copy per command and ansible-core: its delegation venv belongs to that ansible-test, and two cores' runs
    # must not wait on each other's lock.
    ap.add_argument("--dir", default=str(Path.home() / ".cache" / ("gpufleet-%s-%s" % (command, core_version()))),
                    help="where the copy (and ansible-test's cached delegation venv) lives; reused between runs")
    a, rest = ap.parse_known_args(argv)
    if get_pip:
        ensure_get_pip_stand_in()
    base = Path(a.dir)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run at a time per copy
        yield Session(copy_collection(base), a.python, rest)


def ansible_test(s: Session, args: t.List[str], unset: t.Sequence[str] = ()) -> int:
    """Run the venv's ansible-test with `args`, then the caller's own arguments (s.rest), in the copy, without
    ANSIBLE_COLLECTIONS_PATH and the `unset` variables; return its exit status."""
    env = dict(os.environ)
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    for k in ("ANSIBLE_COLLECTIONS_PATH",) + tuple(unset):
        env.pop(k, None)
    dest = s.dest
    cmd = [str(BIN / "ansible-test")] + args + ["--python", s.python, "--color", "no"] + s.rest
    print("+ (cd %s && %s)" % (dest, " ".join(cmd)), flush=True)
    return subprocess.call(cmd, cwd=str(dest), env=env)
