# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-only: remember across ansible-playbook runs what ansible-core's AnsiballZ builder learns from parsing a file.

Why: every ansible-playbook run builds each module's AnsiballZ payload anew, and most of that is
`module_common.recursive_finder` compiling the AST of every module_util file (about 80 per gpufleet module, 3 ms each)
only to list its imports. The suite runs ansible-playbook hundreds of times over the same files, so about 15 % of its
CPU went to parsing the same sources again (py-spy and cProfile on tests/reliability/test_rel_two_services.py).

What: a memo of `ModuleDepFinder`'s two outputs (`submodules`, `optional_imports`) keyed by the sha256 of the file's
source, its fully qualified name, whether it is a package `__init__`, and the versions of ansible-core and Python.
Everything else stays ansible-core's own: which file an import resolves to (collection paths, redirects), what goes into
the zip, the module itself (its metadata comes from its real AST). A file whose content changes gets a new key. The
payloads are byte-for-byte the ones ansible-core builds without it (tests/foundation/test_ansiballz_memo.py).

How it attaches: scripts/setup puts a .pth file into .venv that imports this file; it does nothing unless
GPUFLEET_ANSIBALLZ_MEMO names a directory (tests/conftest.py sets it for the suite), and then only patches
`ansible.executor.module_common` when a controller process imports it. Product code never sees it. Unset the variable
(or set it empty) to run the suite without it.
"""
from __future__ import annotations

# Every .venv interpreter imports this file (the .pth): the module level stays cheap, the rest is imported in patch().
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing alone costs every interpreter start ~10 ms
    import typing as t

_TARGET = "ansible.executor.module_common"
_ENV = "GPUFLEET_ANSIBALLZ_MEMO"


class _Deferred:
    """What `_compile_module_ast` returns for a module_util: the source, compiled only if the memo misses."""

    __slots__ = ("name", "source")

    def __init__(self, name: str, source: t.Union[str, bytes]) -> None:
        self.name = name
        self.source = source


def _key(salt: str, fqn: str, is_pkg: bool, source: t.Union[str, bytes]) -> str:
    import hashlib
    data = source if isinstance(source, bytes) else str(source).encode("utf-8", "surrogateescape")
    h = hashlib.sha256(data)
    h.update(("\0%s\0%s\0%s" % (salt, fqn, is_pkg)).encode())
    return h.hexdigest()


def patch(module_common: t.Any, memo_dir: str) -> None:
    """Wrap module_common's AST compile and ModuleDepFinder for module_utils files; anything unexpected: no memo."""
    import inspect
    import json
    orig_compile = getattr(module_common, "_compile_module_ast", None)
    orig_finder = getattr(module_common, "ModuleDepFinder", None)
    version = getattr(module_common, "__version__", None)
    if orig_compile is None or orig_finder is None or version is None:
        return  # another ansible-core layout: build as ansible-core does
    try:
        params = inspect.signature(orig_finder.__init__).parameters
    except (TypeError, ValueError):
        return
    if list(params)[:3] != ["self", "module_fqn", "tree"]:
        # ansible-core 2.20+ compiles inside ModuleDepFinder and also collects embedded resources: not memoised.
        return
    salt = "%s/%s" % (version, sys.version.split()[0])

    orig_metadata = getattr(module_common, "_get_module_metadata", None)
    if orig_metadata is None:
        return

    def compile_module_ast(module_name: str, source_code: t.Union[str, bytes]) -> _Deferred:
        # Compiled only where a consumer needs the tree: ModuleDepFinder on a memo miss, the module's metadata.
        return _Deferred(module_name, source_code)

    def get_module_metadata(tree: t.Any) -> t.Any:
        if isinstance(tree, _Deferred):
            tree = orig_compile(tree.name, tree.source)
        return orig_metadata(tree)

    orig_init = orig_finder.__init__

    def finder_init(self: t.Any, module_fqn: str, tree: t.Any, is_pkg_init: bool = False, *args: t.Any, **kwargs: t.Any) -> None:
        # The class stays ansible-core's (its __init__ calls super(ModuleDepFinder, self)); only a deferred tree is memoised.
        if not isinstance(tree, _Deferred):
            orig_init(self, module_fqn, tree, is_pkg_init, *args, **kwargs)
            return
        path = os.path.join(memo_dir, _key(salt, module_fqn, bool(is_pkg_init), tree.source) + ".json")
        try:
            with open(path, encoding="utf-8") as f:
                got = json.load(f)
            submodules = {tuple(m) for m in got["submodules"]}
            optional_imports = {tuple(m) for m in got["optional_imports"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        else:
            self.submodules, self.optional_imports = submodules, optional_imports
            self.module_fqn, self.is_pkg_init = module_fqn, is_pkg_init
            return
        orig_init(self, module_fqn, orig_compile(tree.name, tree.source), is_pkg_init, *args, **kwargs)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"submodules": sorted(self.submodules), "optional_imports": sorted(self.optional_imports)}, f)
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    module_common._compile_module_ast = compile_module_ast
    orig_finder.__init__ = finder_init
    module_common._get_module_metadata = get_module_metadata


class _Hook:
    """Patches module_common right after it is first imported; every other import passes through untouched."""

    def __init__(self, memo_dir: str) -> None:
        self.memo_dir = memo_dir

    def find_spec(self, fullname: str, path: t.Any = None, target: t.Any = None) -> t.Any:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        memo_dir = self.memo_dir

        def exec_then_patch(module: t.Any) -> None:
            exec_module(module)
            patch(module, memo_dir)

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    memo_dir = os.environ.get(_ENV, "")
    if not memo_dir or not os.path.isdir(memo_dir) or _TARGET in sys.modules:
        return
    sys.meta_path.insert(0, _Hook(memo_dir))


install()
