# SPDX-License-Identifier: GPL-3.0-or-later
"""Test-only: remember across ansible-playbook runs what compiling the same Python files (parsing the same YAML,
compiling the same Jinja templates) again would give.

Why: the suite runs ansible-playbook hundreds of times over the same files, and these places compile or parse them anew
each time:
- ansible-core's AnsiballZ builder: `module_common.recursive_finder` compiles the AST of every module_util a module
  pulls in (about 80 per gpufleet module, 3 ms each) only to list its imports (about 15 % of the suite's CPU, by py-spy
  and cProfile on tests/reliability/test_rel_two_services.py);
- the module on the target: zipimport compiles every source of the payload on each module run, as it cannot keep
  bytecode in a zip (~120 ms of a gpufleet module's ~200 ms start on this machine, about a third of what the sandbox
  hosts spent on a drain test);
- the collection loader on the controller, which keeps no bytecode either: each forked worker that loads an action
  plugin compiles it and its module_utils again;
- ansible-core's cache of built payloads lives in the run's own temp dir: each ansible-playbook builds (and deflates,
  ~2 MB with the bytecode) each module's payload again, ~0.13 s each;
- PyYAML, constructing what ansible-core parses (each value tagged with its Origin, strings with TrustedAsTemplate):
  config/ansible_builtin_runtime.yml for the collection loader, every plugin's DOCUMENTATION for its config
  definitions, config/base.yml, and in real runs the playbook, its roles' files and vars files: ~0.55 of a no-op
  ansible-playbook's ~0.75 CPU-s under cProfile, ~0.2 s of it without the profiler on this machine;
- Jinja2, compiling each template and expression ansible-core renders (lexer, parser, code generator and Python's
  compile): about 18 % of the controller's samples under py-spy on tests/rollout/test_rollout_check.py. Each forked
  worker compiles a role's variables again, and every ansible-playbook starts with none compiled.

What:
- a memo of `ModuleDepFinder`'s two outputs (`submodules`, `optional_imports`) keyed by the sha256 of the file's source,
  its fully qualified name, whether it is a package `__init__`, and the versions of ansible-core and Python. Which file
  an import resolves to (collection paths, redirects), what goes into the zip and the module itself (its metadata comes
  from its real AST) stay ansible-core's own. A file whose content changes gets a new key;
- beside each .py of a payload, its .pyc (hash-based and checked: zipimport compares it with the .py beside it and
  compiles the source where they differ; a target interpreter with another magic number ignores it). The sources are
  byte-for-byte the ones ansible-core puts there without the memo; a module's __file__ ends in .pyc, and its code
  objects name the file /gpufleet-suite-bytecode/<path in the zip> (the payload's real path on the target is a new temp
  dir on each run);
- the collection loader's code objects, marshalled, keyed by source, file name and magic number;
- ansible-core's own cache of built payloads (its file format and lock), in a directory named by what the payload is
  made of: the module's source, ansible-core's and Python's versions and, for a gpufleet module, every file of the
  collection's plugins/module_utils and meta/runtime.yml; an ansible-core module's by ansible-core's install. Other
  collections' modules are built as ansible-core builds them (their module_utils may come from a third collection);
- what `yaml.load` returns for ansible-core's loaders (AnsibleLoader, AnsibleInstrumentedLoader) and PyYAML's
  (C)BaseLoader and (C)SafeLoader, pickled (ansible-core's tagged types pickle: task results cross process queues with
  them), keyed by the sha256 of the exact text, the loader's class and, for ansible-core's loaders, the state their
  constructor takes from the stream (the Origin its tags start from: path, line, column; whether strings are trusted as
  templates; what a duplicate key does), with the versions of ansible-core, PyYAML and Python. Each call unpickles a
  new object. The first parse of a key only marks it (a test's own playbook in its temp dir is parsed once per run: no
  pickling for it); the second pickles it, and stores it only where unpickling gives back the same types, values and
  tags (Origin, TrustedAsTemplate) all the way down, shared containers alike. A file given to a plain loader
  (ansible-core reads config/base.yml so) is read and parsed from a buffer of its name. Never memoised: a text under
  200 characters, a file given to ansible-core's loaders, a stream with other tags (a decrypted vault file), a result
  with anything else in it (an !vault EncryptedString, a set), a parse that warned (a duplicate key: a later run must
  warn again), a parse that failed. This one patch sits on PyYAML's `load` rather than on ansible-core's entry points
  (`from_yaml`, `_meta_yml_to_dict`, `_load_config_defs`, DataLoader): all of them, and `yaml_load`, call it;
- the code object jinja2's `Environment.compile` gives ansible-core's AnsibleEnvironment (its `from_string`: every
  template) and its `compile_expression` (conditionals), marshalled, keyed by the sha256 of the exact source, name,
  file name and defer_init with everything the lexer, parser and code generator read from the environment: the
  delimiters and lexer settings (what a `#jinja2:` header's overlay changes), optimized, is_async, the sandbox's
  intercepted operators, autoescape, finalize and how it takes its argument, the environment's, code generator's,
  context's, template's and undefined's classes, whether ansible-core escapes backslashes in this compile (its lexer
  reads _TemplateCompileContext) and lets constants be templates (ALLOW_EMBEDDED_TEMPLATES, AnsibleCodeGenerator),
  with the versions of ansible-core, jinja2 and Python. The code generator looks each filter and test up (a missing
  one fails the compile outside a conditional; how the plugin takes its first argument shapes the call): the memo
  keeps those lookups and their answers, makes them again on a hit (loading the plugins as a compile would) and
  compiles where any answer differs. A key seen for the first time only marks it; the second compile stores it. Never
  memoised: raw=True (the Python source), a compile that fails, an environment with extensions, a callable
  autoescape or a finalize called at compile time, ansible-core's template debugging, a compile inside another.
tests/foundation/test_ansiballz_memo.py checks each.

How it attaches: scripts/setup puts a .pth file into .venv that imports this file; it does nothing unless
GPUFLEET_ANSIBALLZ_MEMO names a directory (tests/conftest.py sets it for the suite), and then only patches
`ansible.executor.module_common`, the collection loader, `yaml.load` and AnsibleEnvironment (with the filter and test
maps' `get`) when a process imports them. Product code never sees it. Unset the variable (or set it empty) to run the suite without it.
"""
from __future__ import annotations

# Exact type checks on purpose: a tagged str subclass, a proxy or another mapping must not pass for the plain value a
# memo's key or result was made from.
# pylint: disable=unidiomatic-typecheck
# Every .venv interpreter imports this file (the .pth): the module level stays cheap, the rest is imported in patch().
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing alone costs every interpreter start ~10 ms
    import typing as t

_TARGET = "ansible.executor.module_common"
_ENV = "GPUFLEET_ANSIBALLZ_MEMO"
_PYC_FILENAME_PREFIX = "/gpufleet-suite-bytecode"
_MEMO_FORMAT = "1"  # bump when what the memo stores changes shape


def _write_atomic(path: str, data: bytes) -> None:
    """Write a memo file whole or not at all (another process may read it at any time); a failed write is no memo."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


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
        _write_atomic(path, json.dumps({"submodules": sorted(self.submodules),
                                        "optional_imports": sorted(self.optional_imports)}).encode())

    module_common._compile_module_ast = compile_module_ast
    orig_finder.__init__ = finder_init
    module_common._get_module_metadata = get_module_metadata

    orig_add = getattr(module_common, "_add_module_to_zip", None)
    if orig_add is None:
        return

    def add_module_to_zip(zf: t.Any, *args: t.Any, **kwargs: t.Any) -> None:
        orig_add(zf, *args, **kwargs)  # the payload's last file: every .py is in it now
        add_bytecode(zf, memo_dir)

    module_common._add_module_to_zip = add_module_to_zip

    orig_fmu = getattr(module_common, "_find_module_utils", None)
    consts = getattr(module_common, "C", None)
    if orig_fmu is None or consts is None:
        return

    def find_module_utils(*args: t.Any, **kwargs: t.Any) -> t.Any:
        key = built_key(kwargs.get("module_path"), kwargs.get("b_module_data"), salt)
        if key is None or args:
            return orig_fmu(*args, **kwargs)
        # ansible-core keeps what it built in DEFAULT_LOCAL_TMP/ansiballz_cache for the rest of this run, its lock and
        # file format its own: the same, in a directory named by everything the payload is made of, for later runs too.
        module_common.C = _Constants(consts, os.path.join(memo_dir, "built", key))
        try:
            return orig_fmu(*args, **kwargs)
        finally:
            module_common.C = consts

    module_common._find_module_utils = find_module_utils


class _Constants:
    """ansible.constants with another DEFAULT_LOCAL_TMP, for one call of _find_module_utils (a worker runs one task)."""

    def __init__(self, consts: t.Any, local_tmp: str) -> None:
        self._consts, self._local_tmp = consts, local_tmp

    def __getattr__(self, name: str) -> t.Any:
        return self._local_tmp if name == "DEFAULT_LOCAL_TMP" else getattr(self._consts, name)


_TREE_HASHES: t.Dict[str, str] = {}


def _tree_hash(root: str) -> str:
    """sha256 over every file's path (relative) and content under `root`, walked in sorted order."""
    import hashlib
    if root in _TREE_HASHES:
        return _TREE_HASHES[root]
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            path = os.path.join(d, f)
            h.update(os.path.relpath(path, root).encode("utf-8", "surrogateescape") + b"\0")
            with open(path, "rb") as fh:
                h.update(hashlib.sha256(fh.read()).digest())
    _TREE_HASHES[root] = h.hexdigest()
    return _TREE_HASHES[root]


def built_key(module_path: t.Any, module_data: t.Any, salt: str) -> t.Optional[str]:
    """What a built payload is made of, for this suite's modules: the module's source; for a gpufleet module, every
    file of its collection's plugins/module_utils and meta/runtime.yml (its imports resolve there and to ansible-core;
    recursive_finder follows them); for an ansible-core module, ansible-core itself (the version in `salt`). None for
    any other module (another collection's module_utils may come from a third collection): built as ansible-core does."""
    import hashlib
    if not isinstance(module_path, str) or not isinstance(module_data, bytes):
        return None
    h = hashlib.sha256(("%s\0%s\0" % (salt, _MEMO_FORMAT)).encode())
    h.update(hashlib.sha256(module_data).digest())
    marker = os.sep + os.path.join("ansible_collections", "gpufleet", "serving", "plugins", "modules") + os.sep
    if marker in module_path:
        root = module_path[:module_path.index(marker)] + os.sep + os.path.join("ansible_collections", "gpufleet", "serving")
        h.update(_tree_hash(os.path.join(root, "plugins", "module_utils")).encode())
        runtime = os.path.join(root, "meta", "runtime.yml")
        if os.path.exists(runtime):
            with open(runtime, "rb") as fh:
                h.update(hashlib.sha256(fh.read()).digest())
        return h.hexdigest()
    import ansible
    core = os.path.dirname(os.path.abspath(ansible.__file__)) + os.sep
    if os.path.abspath(module_path).startswith(core):
        h.update(core.encode("utf-8", "surrogateescape"))
        return h.hexdigest()
    return None


def _pyc(memo_dir: str, name: str, source: bytes) -> bytes:
    """A checked hash-based .pyc of `source` for this interpreter, compiled once per source and memoised."""
    import hashlib
    import importlib.util
    import marshal
    import _imp
    filename = "%s/%s" % (_PYC_FILENAME_PREFIX, name)
    key = hashlib.sha256(source + b"\0" + filename.encode() + b"\0" + importlib.util.MAGIC_NUMBER).hexdigest()
    path = os.path.join(memo_dir, key + ".pyc")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        pass
    # The file name tracebacks show: the payload's real path differs on every run (a temp dir on the target). It keeps
    # the '/ansible_collections/NS/COLL/plugins/...' shape ansible-core's deprecator reads from a frame.
    code = compile(source, filename, "exec", dont_inherit=True)
    data = bytes(importlib.util.MAGIC_NUMBER) + (0b11).to_bytes(4, "little") + \
        _imp.source_hash(importlib.util._RAW_MAGIC_NUMBER, source) + marshal.dumps(code)  # type: ignore[attr-defined]
    _write_atomic(path, data)
    return data


def add_bytecode(zf: t.Any, memo_dir: str) -> None:
    """Beside each .py of an AnsiballZ payload, its .pyc: zipimport on the target then loads the bytecode instead of
    compiling about 80 sources on every module run (~120 ms of a module's ~200 ms start on this machine; zipimport
    cannot cache bytecode in a zip). The .pyc is hash-based and checked: zipimport compares it with the .py beside it,
    and an interpreter with another magic number (another Python minor version on the target) ignores it and compiles
    the .py as without it. Module code, __name__ and imports are the same; __file__ of a module ends in .pyc."""
    import zipfile
    names = set(zf.namelist())
    for info in list(zf.infolist()):
        if not info.filename.endswith(".py") or info.filename + "c" in names:
            continue
        source = zf.read(info.filename)
        zinfo = zipfile.ZipInfo(info.filename + "c", info.date_time)
        zinfo.compress_type = info.compress_type
        zf.writestr(zinfo, _pyc(memo_dir, info.filename, source))


def patch_collection_loader(finder: t.Any, memo_dir: str) -> None:
    """The collection loader compiles a collection's Python file from source on every import (it keeps no bytecode):
    in every ansible-playbook, and again in each forked worker that loads an action plugin and its module_utils. Its
    code objects, marshalled, are memoised by source, file name and magic number: what it returns is what compile()
    returns for that source and name."""
    base = getattr(finder, "_AnsibleCollectionPkgLoaderBase", None)
    orig_get_code = getattr(base, "get_code", None)
    if orig_get_code is None or not hasattr(base, "get_source") or not hasattr(base, "get_filename"):
        return

    def get_code(self: t.Any, fullname: str) -> t.Any:
        if getattr(self, "_compiled_code", None):
            return self._compiled_code
        filename = self.get_filename(fullname) or "<string>"
        source = self.get_source(fullname)
        if source is None or not isinstance(source, (str, bytes)):
            return orig_get_code(self, fullname)
        import hashlib
        import importlib.util
        import marshal
        data = source if isinstance(source, bytes) else source.encode("utf-8", "surrogateescape")
        key = hashlib.sha256(data + b"\0" + filename.encode("utf-8", "surrogateescape") + b"\0" +
                             importlib.util.MAGIC_NUMBER).hexdigest()
        path = os.path.join(memo_dir, key + ".code")
        try:
            with open(path, "rb") as f:
                self._compiled_code = marshal.loads(f.read())
            return self._compiled_code
        except (OSError, ValueError, EOFError, TypeError):
            pass
        code = orig_get_code(self, fullname)
        if code is not None:
            try:
                data = marshal.dumps(code)
            except ValueError:  # an object marshal cannot write: not memoised
                return code
            _write_atomic(path, data)
        return code

    base.get_code = get_code


_YAML_MIN_CHARS = 200  # a shorter document parses faster than its memo file is found and read
_YAML_TAG_TYPES = ("Origin", "TrustedAsTemplate")  # the tags ansible-core's YAML constructor puts on what it builds
_YAML_LOADERS = {
    # type(loader) -> whether its results carry ansible-core's data tags; any other loader: parsed as without the memo
    ("ansible._internal._yaml._loader", "AnsibleLoader"): True,
    ("ansible._internal._yaml._loader", "AnsibleInstrumentedLoader"): True,
    ("yaml.cyaml", "CBaseLoader"): False,
    ("yaml.cyaml", "CSafeLoader"): False,
    ("yaml.loader", "BaseLoader"): False,
    ("yaml.loader", "SafeLoader"): False,
}


class _CountingDisplay:
    """ansible-core's YAML constructor's `display`, counting what it reports (a duplicate key, a deprecated tag): a
    parse that reported anything is not memoised, as a later run would not see it."""

    reported = 0

    def __init__(self, display: t.Any) -> None:
        self._display = display

    def __getattr__(self, name: str) -> t.Any:
        attr = getattr(self._display, name)
        if not callable(attr):
            return attr

        def reporting(*args: t.Any, **kwargs: t.Any) -> t.Any:
            _CountingDisplay.reported += 1
            return attr(*args, **kwargs)

        return reporting


def _yaml_key(loader: t.Any, stream: t.Union[str, bytes], salt: str) -> t.Optional[str]:
    """What a memoised parse is keyed by: the loader's class, the exact text, and for ansible-core's loaders the state its
    constructor builds from the stream (the Origin tags start from, whether strings are trusted as templates, what a
    duplicate key does). None for a loader or state this memo does not know."""
    import dataclasses
    import hashlib
    cls = type(loader)
    tagged = _YAML_LOADERS.get((cls.__module__, cls.__qualname__))
    if tagged is None:
        return None
    h = hashlib.sha256(stream.encode("utf-8", "surrogatepass") if isinstance(stream, str) else bytes(stream))
    parts = [salt, _MEMO_FORMAT, cls.__module__, cls.__qualname__, "str" if isinstance(stream, str) else "bytes"]
    if tagged:
        try:
            origin = loader._origin
            fields = [(f.name, getattr(origin, f.name)) for f in dataclasses.fields(origin)]
            parts += [type(origin).__name__, repr(fields), repr(bool(loader._trusted_as_template)),
                      repr(loader._duplicate_key_mode), repr(getattr(loader, "_unsafe_depth", None))]
        except (AttributeError, TypeError):
            return None
        if any(n not in ("path", "description", "line_num", "col_num") for n, _v in fields):
            return None
    h.update(("\0" + "\0".join(parts)).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


_YAML_SCALARS = None


def _same_yaml(a: t.Any, b: t.Any, tags: t.Any, seen: t.Dict[int, t.Any]) -> bool:
    """Whether `b` (unpickled) is `a` (parsed) again: the same types, values and (`tags` given) data tags all the way
    down, shared containers shared alike. Only what YAML loaders build: anything else (an encrypted string, a set) is
    not memoised."""
    global _YAML_SCALARS
    if _YAML_SCALARS is None:
        import datetime
        _YAML_SCALARS = (str, int, float, bool, type(None), bytes, datetime.date, datetime.datetime)
    if type(a) is not type(b):
        return False
    native = type(a)
    if tags is not None:
        tag_set = tags.tags(a)
        if tag_set != tags.tags(b) or any(type(tg).__name__ not in _YAML_TAG_TYPES for tg in tag_set):
            return False
        native = tags.base_type(a)
        if not isinstance(a, native):
            return False
    if native in (dict, list):
        if id(a) in seen:
            return seen[id(a)] is b
        seen[id(a)] = b
        if len(a) != len(b):
            return False
        if native is dict:
            return all(_same_yaml(ka, kb, tags, seen) and _same_yaml(va, vb, tags, seen)
                       for (ka, va), (kb, vb) in zip(a.items(), b.items()))
        return all(_same_yaml(x, y, tags, seen) for x, y in zip(a, b))
    return native in _YAML_SCALARS and a == b


def patch_yaml(yaml: t.Any, memo_dir: str) -> None:
    """PyYAML's `load`, for the loaders ansible-core parses with: a parse already seen twice (same loader, text, origin
    and trust) is unpickled from the memo, a fresh object on every call; what ansible-core's loaders build carries its
    data tags (Origin with path, line and column, TrustedAsTemplate), which pickle keeps (task results cross process
    queues with them). Anything unexpected: parsed as without the memo."""
    orig_load = getattr(yaml, "load", None)
    code = getattr(orig_load, "__code__", None)
    if code is None or code.co_varnames[:2] != ("stream", "Loader") or not hasattr(yaml, "__version__"):
        return
    salt = "%s/%s/%s" % (sys.version.split()[0], yaml.__version__, getattr(yaml, "__with_libyaml__", None))

    def load(stream: t.Any, Loader: t.Any) -> t.Any:
        import io
        text = stream
        if isinstance(stream, (io.BufferedReader, io.TextIOWrapper)) and isinstance(getattr(stream, "name", None), str) \
                and _YAML_LOADERS.get((getattr(Loader, "__module__", None), getattr(Loader, "__qualname__", None))) is False:
            # A plain loader given a file (ansible-core's config/base.yml): its text, in a buffer of the file's name (the
            # name a parse error shows); an ansible-core loader takes its Origin from a file: parsed as without the memo.
            name, text = stream.name, stream.read()
            stream = io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text)
            stream.name = name
        if not isinstance(text, (str, bytes)) or len(text) < _YAML_MIN_CHARS:
            return orig_load(stream, Loader)
        loader = Loader(stream)  # what yaml.load does, with the loader's state at hand
        try:
            return load_with(loader, text)
        finally:
            loader.dispose()

    def load_with(loader: t.Any, stream: t.Union[str, bytes]) -> t.Any:
        import pickle
        tagged = _YAML_LOADERS.get((type(loader).__module__, type(loader).__qualname__))
        tags = constructor = None
        if tagged:
            core = sys.modules.get("ansible.release")
            datatag = sys.modules.get("ansible.module_utils._internal._datatag")
            constructor = sys.modules.get("ansible._internal._yaml._constructor")
            if core is None or datatag is None or constructor is None or not hasattr(constructor, "display"):
                return loader.get_single_data()
            tags = datatag.AnsibleTagHelper
            if any(type(tg).__name__ not in _YAML_TAG_TYPES for tg in tags.tags(stream)):
                return loader.get_single_data()  # a decrypted vault file (SourceWasEncrypted) never goes to disk
            if not isinstance(constructor.display, _CountingDisplay):
                constructor.display = _CountingDisplay(constructor.display)
            key = _yaml_key(loader, stream, "%s/%s" % (salt, core.__version__))
        else:
            key = _yaml_key(loader, stream, salt)
        if key is None:
            return loader.get_single_data()
        path = os.path.join(memo_dir, key + ".yaml.pickle")
        try:
            with open(path, "rb") as f:
                return pickle.loads(f.read())
        except Exception:  # none yet, or one pickle cannot read back: parsed as without it
            pass
        reported = _CountingDisplay.reported
        data = loader.get_single_data()
        seen = path[:-len(".pickle")] + ".seen"
        if _CountingDisplay.reported != reported:
            return data  # it warned: a later run must warn again
        if not os.path.exists(seen):
            # The first parse of this key only marks it: a file parsed once per run (a test's own playbook in its temp
            # dir) costs no pickling; one parsed again (a role, a plugin's DOCUMENTATION) is memoised on its second parse.
            _write_atomic(seen, b"")
            return data
        try:
            blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
            same = _same_yaml(data, pickle.loads(blob), tags, {})
        except Exception:  # RecursionError, an object pickle refuses: not memoised
            return data
        if same:
            _write_atomic(path, blob)
        return data

    yaml.load = load


_JINJA_ENV_ATTRS = (
    # what Environment.compile's lexer, parser and code generator read from the environment (jinja2 3.1: lexer.get_lexer,
    # compiler.CodeGenerator, nodes.EvalContext); the lexer's settings are also ansible-core's `#jinja2:` overrides
    "block_start_string", "block_end_string", "variable_start_string", "variable_end_string", "comment_start_string",
    "comment_end_string", "line_statement_prefix", "line_comment_prefix", "trim_blocks", "lstrip_blocks",
    "newline_sequence", "keep_trailing_newline", "optimized", "is_async", "sandboxed", "autoescape",
)
_JINJA_ENV_CLASSES = ("code_generator_class", "context_class", "template_class", "undefined", "concat")
_JINJA_TLS = None  # threading.local(): the plugin lookups a compile makes, while one is recorded


def _qualname(obj: t.Any) -> str:
    obj = getattr(obj, "__func__", obj)
    return "%s.%s" % (getattr(obj, "__module__", "?"), getattr(obj, "__qualname__", type(obj).__qualname__))


class _JinjaMemoHit:
    """What the memo hands `compile` through ansible-core's from_string for an expression it remembers."""

    __slots__ = ("code",)

    def __init__(self, code: t.Any) -> None:
        self.code = code


def patch_jinja(jinja_bits: t.Any, memo_dir: str) -> None:
    """jinja2's `Environment.compile` for ansible-core's AnsibleEnvironment (`from_string`, so each template and
    variable expression ansible-core compiles) and its `compile_expression` (conditionals): the code object, marshalled,
    keyed by everything compile reads (see _jinja_key); what a compile looked up (each filter and test the code
    generator resolves, and how it passes its first argument) is looked up again on a hit, and the memo is used only
    where the answers are the same. Anything unexpected: the real compile."""
    global _JINJA_TLS
    import threading
    import types
    try:
        import jinja2
        from jinja2.environment import Environment, TemplateExpression
        from jinja2.utils import _PassArg, internalcode
    except ImportError:
        return
    env_cls = getattr(jinja_bits, "AnsibleEnvironment", None)
    intercept = getattr(jinja_bits, "JinjaPluginIntercept", None)
    config = getattr(jinja_bits, "_TemplateConfig", None)
    tcc_cls = getattr(jinja_bits, "_TemplateCompileContext", None)
    csc_cls = getattr(jinja_bits, "_CompileStateSmugglingCtx", None)
    field_names = getattr(jinja_bits, "_TEMPLATE_OVERRIDE_FIELD_NAMES", None)
    core = sys.modules.get("ansible.release")
    if None in (env_cls, intercept, config, tcc_cls, csc_cls, field_names, core) or \
            not jinja2.__version__.startswith("3.1.") or "compile" in env_cls.__dict__ or \
            env_cls.compile is not Environment.compile or "get" in intercept.__dict__ or \
            Environment.compile.__code__.co_varnames[:6] != ("self", "source", "name", "filename", "raw", "defer_init") or \
            "compile_expression" not in env_cls.__dict__:
        return  # another ansible-core or jinja2 layout: compiled as without the memo
    import importlib.util
    salt = "%s/%s/%s/%s" % (core.__version__, jinja2.__version__, sys.version.split()[0], importlib.util.MAGIC_NUMBER.hex())
    _JINJA_TLS = tls = threading.local()
    orig_compile = Environment.compile
    orig_get = intercept.get
    orig_expression = env_cls.compile_expression

    def get(self: t.Any, key: t.Any, default: t.Any = None) -> t.Any:
        func = orig_get(self, key, default)
        lookups = getattr(tls, "lookups", None)
        if lookups is not None:
            lookups.append((id(self), key, func is None, repr(_PassArg.from_obj(func))))
        return func

    def same_lookups(env: t.Any, recorded: t.Any) -> bool:
        # the lookups the code generator made, again (each also loads its plugin, as the real compile would)
        for kind, name, missing, pass_arg in recorded:
            func = getattr(env, kind).get(name)
            if (func is None) != missing or repr(_PassArg.from_obj(func)) != pass_arg:
                return False
        return True

    def key_of(env: t.Any, kind: str, source: t.Any, name: t.Any, filename: t.Any, raw: t.Any, defer_init: t.Any) -> t.Optional[str]:
        if not isinstance(source, str) or raw or defer_init not in (False, True) or \
                not (name is None or type(name) is str) or not (filename is None or type(filename) is str) or \
                getattr(env, "_debuggable_template_source", True) or csc_cls.current(optional=True) is not None or \
                getattr(tls, "lookups", None) is not None:
            return None
        return _jinja_key(env, kind, source, name, filename, defer_init, salt, config, tcc_cls, field_names, intercept)

    def load(path: str, env: t.Any) -> t.Any:
        import marshal
        try:
            with open(path, "rb") as f:
                fmt, lookups, code = marshal.loads(f.read())
            if fmt != _MEMO_FORMAT or type(code) is not types.CodeType or not same_lookups(env, lookups):
                return None
        except Exception:  # none yet, unreadable, or a lookup that fails: compiled (and fails there as without the memo)
            return None
        return code

    def record(env: t.Any, path: str, compile_: t.Callable[[], t.Any]) -> t.Any:
        """Run the real compile, noting the plugins it looks up; store its code object on a key's second sight."""
        import marshal
        tls.lookups, tls.code, tls.compiles = [], None, 0
        try:
            result = compile_()
            lookups, code, compiles = tls.lookups, tls.code, tls.compiles
        finally:
            tls.lookups = tls.code = None
        kinds = {id(env.filters): "filters", id(env.tests): "tests"}
        if type(code) is not types.CodeType or compiles != 1 or any(i not in kinds for i, _n, _m, _p in lookups):
            return result  # a lookup of another mapping: not memoised
        seen = path[:-len(".code")] + ".seen"
        if not os.path.exists(seen):
            _write_atomic(seen, b"")  # a template compiled once (a test's own play) costs no store
            return result
        try:
            data = marshal.dumps((_MEMO_FORMAT, tuple((kinds[i], n, m, p) for i, n, m, p in lookups), code))
        except ValueError:
            return result
        _write_atomic(path, data)
        return result

    @internalcode
    def compile(self: t.Any, source: t.Any, name: t.Any = None, filename: t.Any = None, raw: bool = False,
                defer_init: bool = False) -> t.Any:
        if type(source) is _JinjaMemoHit:
            return source.code
        if getattr(tls, "lookups", None) is not None:  # recording a miss: the real compile, once (a nested one: not stored)
            code = orig_compile(self, source, name, filename, raw, defer_init)
            tls.code, tls.compiles = code, tls.compiles + 1
            return code
        key = key_of(self, "template", source, name, filename, raw, defer_init)
        if key is None:
            return orig_compile(self, source, name, filename, raw, defer_init)
        path = os.path.join(memo_dir, key + ".jinja.code")
        code = load(path, self)
        if code is not None:
            return code
        return record(self, path, lambda: compile(self, source, name, filename, raw, defer_init))

    def compile_expression(self: t.Any, source: t.Any, undefined_to_none: bool = True) -> t.Any:
        key = key_of(self, "expression", source, None, None, False, False)
        if key is None:
            return orig_expression(self, source, undefined_to_none)
        path = os.path.join(memo_dir, key + ".jinja.code")
        code = load(path, self)
        if code is None:
            return record(self, path, lambda: orig_expression(self, source, undefined_to_none))
        # jinja2 3.1's compile_expression past its parse: the template of the expression's code, through from_string
        return TemplateExpression(self.from_string(_JinjaMemoHit(code)), undefined_to_none)

    intercept.get = get
    env_cls.compile = compile
    env_cls.compile_expression = compile_expression


def _jinja_key(env: t.Any, kind: str, source: str, name: t.Any, filename: t.Any, defer_init: bool, salt: str, config: t.Any,
               tcc_cls: t.Any, field_names: t.Any, intercept: t.Any) -> t.Optional[str]:
    """The sha256 of the exact source, name, file name, kind (template, expression) and defer_init, with everything about
    the environment that changes the code jinja2 generates from it: the lexer's settings (ansible-core's `#jinja2:`
    overrides make an overlay of them), the code generator's (optimized, is_async, sandboxed and its intercepted
    operators, autoescape, finalize and how it is passed its argument), the classes it names, whether ansible-core
    escapes backslashes in this compile (its lexer reads _TemplateCompileContext) and lets constants be templates
    (AnsibleCodeGenerator.visit_Const). None where the memo cannot tell: an environment with extensions, an autoescape
    or finalize the code generator calls at compile time, filters or tests that are not ansible-core's plugin maps."""
    import hashlib
    from jinja2.utils import _PassArg
    if env.extensions or callable(env.autoescape) or type(env.filters) is not intercept or type(env.tests) is not intercept:
        return None
    finalize = env.finalize
    if finalize is not None and _PassArg.from_obj(finalize) is None:
        return None  # a plain finalize is called on constants while compiling
    tcc = tcc_cls.current(optional=True)
    parts = [salt, _MEMO_FORMAT, kind, repr(name), repr(filename), repr(bool(defer_init)), _qualname(type(env)),
             repr(getattr(config, "allow_embedded_templates", None)), repr(None if tcc is None else tcc.escape_backslashes),
             repr(None if finalize is None else (_qualname(finalize), repr(_PassArg.from_obj(finalize)))),
             repr(sorted(getattr(env, "intercepted_binops", ()))), repr(sorted(getattr(env, "intercepted_unops", ())))]
    parts += [repr(getattr(env, a)) for a in _JINJA_ENV_ATTRS + tuple(field_names)]
    parts += [_qualname(getattr(env, a)) for a in _JINJA_ENV_CLASSES]
    h = hashlib.sha256(source.encode("utf-8", "surrogatepass"))
    h.update(("\0" + "\0".join(parts)).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


_PATCHES = {
    _TARGET: "patch",
    "ansible.utils.collection_loader._collection_finder": "patch_collection_loader",
    "yaml": "patch_yaml",
    "ansible._internal._templating._jinja_bits": "patch_jinja",
}


class _Hook:
    """Patches module_common, the collection loader, PyYAML and ansible-core's Jinja environment right after each is
    first imported; every other import passes through untouched."""

    def __init__(self, memo_dir: str) -> None:
        self.memo_dir = memo_dir
        self.pending = dict(_PATCHES)

    def find_spec(self, fullname: str, path: t.Any = None, target: t.Any = None) -> t.Any:
        patch_name = self.pending.pop(fullname, None)
        if patch_name is None:
            return None
        if not self.pending:
            sys.meta_path.remove(self)
        import importlib.util
        # find_spec below runs the other finders (this one answers None for a name it has done)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        memo_dir = self.memo_dir
        patcher = globals()[patch_name]

        def exec_then_patch(module: t.Any) -> None:
            exec_module(module)
            patcher(module, memo_dir)

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    memo_dir = os.environ.get(_ENV, "")
    if not memo_dir or not os.path.isdir(memo_dir) or _TARGET in sys.modules:
        return
    sys.meta_path.insert(0, _Hook(memo_dir))


install()
