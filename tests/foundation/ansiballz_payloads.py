# SPDX-License-Identifier: GPL-3.0-or-later
"""Run by tests/foundation/test_ansiballz_memo.py in a fresh interpreter: build the AnsiballZ zip of every module of the
installed gpufleet collection as ansible-core's _find_module_utils does (recursive_finder, then _add_module_to_zip),
print each zip's files (names and sha256) and how many sources were compiled, as JSON. Whether the memo is in use is
the environment's choice (GPUFLEET_ANSIBALLZ_MEMO). A second argument: a directory to write each zip to."""
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
    fqn = "ansible_collections.gpufleet.serving.plugins.modules." + path.stem
    when = datetime.datetime(2026, 1, 1)
    with zipfile.ZipFile(buf, "w") as zf:
        # As module_common._find_module_utils builds a payload: the module_utils, then the module and its packages.
        module_common.recursive_finder(path.stem, fqn, path.read_bytes(), zf, when, _builder.ExtensionManager.create(task_vars={}))
        module_common._add_module_to_zip(zf, when, fqn, path.read_bytes(), str(path), _builder.ExtensionManager.create(task_vars={}))
    if len(sys.argv) > 2:  # where to leave each zip, for a test that imports from it
        Path(sys.argv[2], path.stem + ".zip").write_bytes(buf.getvalue())
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        out["modules"][path.stem] = {n: hashlib.sha256(zf.read(n)).hexdigest() for n in sorted(zf.namelist())}
out["compiled"] = len(compiled)
out["compiled_names"] = sorted(set(compiled))
print(json.dumps(out))
