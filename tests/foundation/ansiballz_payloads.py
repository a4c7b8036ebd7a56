# SPDX-License-Identifier: GPL-3.0-or-later
"""Run by tests/foundation/test_ansiballz_memo.py in a fresh interpreter: build the AnsiballZ zip of every module of the
installed gpufleet collection with ansible-core's recursive_finder, print each zip's files (names and sha256) and how
many sources were compiled, as JSON. Whether the memo is in use is the environment's choice (GPUFLEET_ANSIBALLZ_MEMO)."""
from __future__ import annotations

import datetime
import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

collections_dir = Path(sys.argv[1]).resolve()  # the collection loader refuses relative paths

from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder  # noqa: E402

_AnsibleCollectionFinder(paths=[str(collections_dir)])._install()

from ansible.executor import module_common  # noqa: E402
_builder = module_common._builder  # the ExtensionManager type recursive_finder takes (ansible-core 2.19)

compiled = []
real_compile = compile


def counting_compile(source, filename, *args, **kwargs):
    compiled.append(str(filename))
    return real_compile(source, filename, *args, **kwargs)


# module_common calls compile() by its global name: this shadows the builtin for that module only.
module_common.compile = counting_compile

out = {"memo_patched": module_common.ModuleDepFinder.__init__.__module__ != module_common.__name__, "modules": {}}
modules = collections_dir / "ansible_collections/gpufleet/serving/plugins/modules"
for path in sorted(modules.glob("*.py")):
    if path.name == "__init__.py":
        continue
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        module_common.recursive_finder(
            path.stem, "ansible_collections.gpufleet.serving.plugins.modules." + path.stem, path.read_bytes(), zf,
            datetime.datetime(2026, 1, 1), _builder.ExtensionManager.create(task_vars={}))
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        out["modules"][path.stem] = {n: hashlib.sha256(zf.read(n)).hexdigest() for n in sorted(zf.namelist())}
out["compiled"] = len(compiled)
out["compiled_names"] = sorted(set(compiled))
print(json.dumps(out))
