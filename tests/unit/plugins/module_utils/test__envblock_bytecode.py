# SPDX-License-Identifier: GPL-3.0-or-later
"""A sitecustomize.py written again within the same second, with a value of the same length, must not run its old
content from a cached .pyc (real interpreter, real __pycache__, imported through a symlink as on Ubuntu)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock


def _exported(site_dir: str) -> str:
    """NCCL_NTHREADS as a fresh interpreter sees it after `import sitecustomize` from site_dir (bytecode cached)."""
    code = "import sys; sys.path.insert(0, %r); import sitecustomize, os; print(os.environ.get('NCCL_NTHREADS'))" % site_dir
    return subprocess.run([sys.executable, "-c", code], env={"PATH": os.environ.get("PATH", "")}, capture_output=True,
                          text=True, check=True).stdout.strip()


def _setup(tmp_path):
    real_dir, site_dir = tmp_path / "etc", tmp_path / "lib"
    real_dir.mkdir()
    site_dir.mkdir()
    real = real_dir / "sitecustomize.py"
    real.write_text("import os\nos.environ['NCCL_NTHREADS'] = '512'\n")
    (site_dir / "sitecustomize.py").symlink_to(real)
    assert _exported(str(site_dir)) == "512"  # compiled into lib/__pycache__
    return str(real), str(site_dir)


def test_a_restore_within_the_second_is_not_shadowed_by_the_cached_bytecode(tmp_path):
    real, site_dir = _setup(tmp_path)
    snap = tmp_path / "snap.json"
    old = open(real, "rb").read()
    st = os.stat(real)
    snap.write_text(json.dumps({"files": [{"path": real, "content": base64.b64encode(old).decode(), "mode": 0o644,
                                           "uid": st.st_uid, "gid": st.st_gid}]}))
    # 128: the same length as 512. Written and imported (compiled) within the same second as the restore below.
    new = old.replace(b"512", b"128")
    _envblock.write_atomic(real, new, 0o644)
    os.utime(real, ns=(st.st_atime_ns, st.st_mtime_ns))  # as a write within the same second leaves it
    assert _exported(site_dir) == "512"  # what Python does with a same-second, same-size source: the stale .pyc
    _envblock.write_atomic(real, new, 0o644)
    _envblock.outdate_bytecode(real, st.st_mtime_ns)
    assert _exported(site_dir) == "128"
    before = os.stat(real).st_mtime_ns
    res = _envblock.restore_previous(str(snap))
    assert res["restored"] == [real]
    assert os.stat(real).st_mtime_ns // 10**9 > before // 10**9
    assert _exported(site_dir) == "512"


def test_install_dates_the_new_file_after_the_one_it_replaced(tmp_path):
    real, site_dir = _setup(tmp_path)
    before = os.stat(real).st_mtime_ns

    class Files:
        def backup_local(self, fn):
            raise AssertionError("no backup asked")

        def atomic_move(self, src, dest, unsafe_writes=False, keep_dest_attrs=True):
            os.replace(src, dest)

    tmp = _envblock.write_temp(real, open(real).read().replace("512", "128"))
    _envblock.install(Files(), real, tmp, existed=True, backup=False)
    assert os.stat(real).st_mtime_ns // 10**9 > before // 10**9
    assert _exported(site_dir) == "128"
