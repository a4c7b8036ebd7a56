# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""sitecustomize_env: environment variables exported by every Python process at start-up.

Why sitecustomize: torch.multiprocessing 'spawn' workers start a fresh interpreter from the
launcher's os.environ, and the launcher may be started by anything (systemd, a shell, a
scheduler). Only a block in the sitecustomize.py that the interpreter imports at start-up
reaches all of them. /proc/PID/environ of the launcher itself will not show the variables
(they are set after exec); its spawned workers will (see process_env).
"""

from __future__ import annotations

import ast
import glob
import io
import json
import os
import re
import subprocess
import tokenize
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock, _layershare, _ncclvars
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step

HEADER = "# Created by gpufleet.serving.sitecustomize_env; removed with its last gpufleet block.\n"
DEFAULT_GLOBS = ["/usr/bin/python3*", "/usr/local/bin/python3*"]
_PY_NAME_RE = re.compile(r"python3(\.[0-9]+)?")
_PROBE_TIMEOUT = 60

# Runs inside each target interpreter, started like any process on the host (empty environment,
# cwd /). It reports which sitecustomize start-up imported, or where `import sitecustomize`
# would look, and any copies later on sys.path that the first one shadows. It prints only paths.
_PROBE = r"""
import sys, os, json, sysconfig
from importlib.machinery import PathFinder
mod = sys.modules.get("sitecustomize")
origin = getattr(mod, "__file__", None) if mod is not None else None
path = [p for p in sys.path if p]
if origin is None:
    spec = PathFinder.find_spec("sitecustomize", path)
    origin = spec.origin if spec is not None else None
found = []
for p in path:
    for cand in (os.path.join(p, "sitecustomize.py"), os.path.join(p, "sitecustomize", "__init__.py")):
        if os.path.isfile(cand):
            found.append(os.path.abspath(cand))
print(json.dumps({
    "executable": sys.executable,
    "version": "%d.%d.%d" % sys.version_info[:3],
    "prefix": sys.prefix,
    "base_prefix": getattr(sys, "base_prefix", sys.prefix),
    "stdlib": sysconfig.get_paths()["stdlib"],
    "imported": mod is not None,
    "origin": os.path.abspath(origin) if origin else None,
    "candidates": found,
    "no_site": bool(sys.flags.no_site),
    # The managed keys as this process sees them after site ran: an unchanged file needs no second start.
    "environ": {k: os.environ.get(k) for k in json.loads(sys.argv[1])} if len(sys.argv) > 1 else {},
}))
"""

_READ_ENV = "import os, json, sys; print(json.dumps({k: os.environ.get(k) for k in json.loads(sys.argv[1])}))"

# Executes the candidate file the way site.py does (as module 'sitecustomize'), then reports the
# managed keys. Started with -S so the currently installed sitecustomize does not run first; the
# site-packages directories are added as site.main() would (venv included), so existing content that
# imports from them still works.
_IMPORT_TEST = (
    "import os, sys, json, runpy, site\n"
    "known = site.removeduppaths()\n"
    "if hasattr(site, 'venv'):\n"
    "    known = site.venv(known)\n"
    "site.addsitepackages(known)\n"
    "runpy.run_path(sys.argv[1], run_name='sitecustomize')\n"
    "print(json.dumps({k: os.environ.get(k) for k in json.loads(sys.argv[2])}))\n"
)


# Runs a sitecustomize that start-up reported broken ("Error in sitecustomize", with no line) the way site.py does, and
# reports where it fails: the line in that file and the exception line, never the source line (it may hold a secret).
_WHERE_IT_FAILS = (
    "import os, sys, json, site, traceback\n"
    "known = site.removeduppaths()\n"
    "if hasattr(site, 'venv'):\n"
    "    known = site.venv(known)\n"
    "site.addsitepackages(known)\n"
    "path = sys.argv[1]\n"
    "out = None\n"
    "try:\n"
    "    code = compile(open(path, 'rb').read(), path, 'exec', dont_inherit=True)\n"
    "    exec(code, {'__name__': 'sitecustomize', '__file__': path, '__builtins__': __builtins__})\n"
    "except SyntaxError as e:\n"
    "    out = {'line': e.lineno, 'error': '%s: %s' % (type(e).__name__, e.msg)}\n"
    "except BaseException as e:\n"
    "    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]\n"
    "    out = {'line': lines[-1] if lines else None, 'error': ('%s: %s' % (type(e).__name__, e))[:300]}\n"
    "print(json.dumps(out))\n"
)


class SiteError(Exception):
    def __init__(self, msg: str, **extra: t.Any) -> None:
        super().__init__(msg)
        self.extra = extra


# --- rendering -------------------------------------------------------------------------

def render_body(env: t.Mapping[str, str], mode: str) -> str:
    """The block's inner lines. Names and values are ASCII Python literals (ascii()), so no
    name or value can become code; the whole body is guarded so it can never raise at import."""
    if mode not in ("setdefault", "override"):
        raise _envblock.BlockError("mode must be setdefault or override, got %r" % (mode,))
    for k in env:
        if not _envblock.ENV_NAME_RE.fullmatch(k):
            raise _envblock.BlockError("env: variable name %r is not a valid name" % (k,))
    pairs = "".join("        (%s, %s),\n" % (ascii(k), ascii(v)) for k, v in sorted(env.items()))
    action = "_gpufleet_os.environ.setdefault(_gpufleet_k, _gpufleet_v)" if mode == "setdefault" \
        else "_gpufleet_os.environ[_gpufleet_k] = _gpufleet_v"
    return (
        "# Managed by Ansible (gpufleet.serving.sitecustomize_env, mode %s); edits inside this block are lost.\n"
        "# A failing sitecustomize breaks every Python process on the host: this block never raises.\n"
        "try:\n"
        "    import os as _gpufleet_os\n"
        "    for _gpufleet_k, _gpufleet_v in (\n"
        "%s"
        "    ):\n"
        "        %s\n"
        "except Exception:\n"
        "    pass\n" % (mode, pairs, action)
    )


_PAIR_RE = re.compile(r"^        (\(.*\)),\s*$")


def parse_body(lines: t.Sequence[str]) -> t.Dict[str, str]:
    """Keys and values of a block this module rendered (used to verify state=absent)."""
    out: t.Dict[str, str] = {}
    for ln in lines:
        m = _PAIR_RE.match(ln)
        if not m:
            continue
        try:
            k, v = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError, TypeError):
            continue
        if isinstance(k, str) and isinstance(v, str):
            out[k] = v
    return out


def check_markers_are_comments(text: t.Optional[str], path: str) -> None:
    """A line that reads like a block marker but is inside a string (a docstring quoting one) is not gpufleet's:
    editing the block there would change the user's code. Refuse instead."""
    marks = ("# BEGIN %s " % _envblock.MARK, "# END %s " % _envblock.MARK)
    lines = [i + 1 for i, ln in enumerate(_envblock.split_lines(text or "")) if ln.startswith(marks)]
    if not lines:
        return
    comments = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and tok.start[1] == 0:
                comments.add(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        return  # a file that does not tokenize is refused by the compile check
    inside = [n for n in lines if n not in comments]
    if inside:
        raise _envblock.BlockError("%s has a line that reads like a gpufleet block marker inside a string (line %s); "
                                   "nothing was changed" % (path, ", ".join(str(n) for n in inside)))


def new_text(current: t.Optional[str], name: str, env: t.Optional[t.Mapping[str, str]], mode: str, path: str) -> t.Optional[str]:
    """New file content (None: no file) for the block set to env, or removed when env is None."""
    body = None if env is None else render_body(env, mode)
    return _envblock.replace_block(current, name, body, HEADER, path)


# --- interpreters ----------------------------------------------------------------------

def discover_interpreters(patterns: t.Sequence[str] = tuple(DEFAULT_GLOBS)) -> t.List[str]:
    """System python3 interpreters: python3 and python3.X under the globs, resolved and de-duplicated."""
    seen: t.Dict[str, str] = {}
    for pat in patterns:
        for p in sorted(glob.glob(pat)):
            if not _PY_NAME_RE.fullmatch(os.path.basename(p)):
                continue
            real = os.path.realpath(p)
            if os.path.isfile(real) and os.access(real, os.X_OK) and real not in seen:
                seen[real] = p
    return sorted(seen)


def _run(argv: t.Sequence[str], env: t.Mapping[str, str], timeout: float = _PROBE_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=dict(env), cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout, check=False)


def _last_error(err: bytes) -> str:
    """The exception line only: a full traceback could quote a line of the file holding a secret."""
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


def _last_json(out: bytes) -> t.Any:
    # Anything a sitecustomize prints itself comes before our line.
    lines = out.decode("utf-8", "replace").strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def probe(interp: str, probe_env: t.Mapping[str, str], keys: t.Sequence[str] = ()) -> t.Dict[str, t.Any]:
    if not os.path.isabs(interp):
        raise SiteError("interpreters: %r is not an absolute path" % interp, interpreter=interp)
    if not (os.path.isfile(interp) and os.access(interp, os.X_OK)):
        raise SiteError("interpreter %s does not exist or is not executable" % interp, interpreter=interp)
    try:
        r = _run([interp, "-c", _PROBE, json.dumps(list(keys))], probe_env)
        info = _last_json(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        raise SiteError("interpreter %s could not be started to locate its sitecustomize: %s" % (interp, e), interpreter=interp)
    if r.returncode != 0 or not isinstance(info, dict):
        raise SiteError("interpreter %s failed to report its sitecustomize (rc %d)" % (interp, r.returncode),
                        interpreter=interp, rc=r.returncode, stderr=_last_error(r.stderr))
    if info["no_site"]:
        raise SiteError("interpreter %s runs without the site module, so it never imports sitecustomize" % interp, interpreter=interp)
    stderr = r.stderr.decode("utf-8", "replace")
    info["interpreter"] = interp
    info["import_error"] = "Error in sitecustomize" in stderr
    origin = info["origin"]
    if origin is None:
        info["sitecustomize"] = os.path.join(info["stdlib"], "sitecustomize.py")
        info["exists"] = False
    else:
        if not origin.endswith(".py"):
            raise SiteError("interpreter %s imports sitecustomize from %s, which is not a .py file this module can edit"
                            % (interp, origin), interpreter=interp)
        info["sitecustomize"] = origin
        info["exists"] = True
    info["shadowed"] = [c for c in info["candidates"] if c != info["sitecustomize"]]
    return info


def read_effective(interp: str, keys: t.Sequence[str], probe_env: t.Mapping[str, str]) -> t.Dict[str, t.Optional[str]]:
    """Start the interpreter like any process (given environment only, normally empty) and read back the keys."""
    try:
        r = _run([interp, "-c", _READ_ENV, json.dumps(list(keys))], probe_env)
        vals = _last_json(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        raise SiteError("interpreter %s could not be started to verify its environment: %s" % (interp, e), interpreter=interp)
    if r.returncode != 0 or not isinstance(vals, dict):
        raise SiteError("interpreter %s failed to start after the change (rc %d)" % (interp, r.returncode),
                        interpreter=interp, rc=r.returncode, stderr=_last_error(r.stderr))
    return vals


def import_test(interp: str, tmp: str, keys: t.Sequence[str], probe_env: t.Mapping[str, str]) -> t.Dict[str, t.Optional[str]]:
    env = {k: v for k, v in probe_env.items() if k not in keys}
    try:
        r = _run([interp, "-S", "-c", _IMPORT_TEST, tmp, json.dumps(list(keys))], env)
        vals = _last_json(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        raise SiteError("interpreter %s could not run the candidate file: %s" % (interp, e), interpreter=interp)
    if r.returncode != 0 or not isinstance(vals, dict):
        raise SiteError("the new sitecustomize fails when %s imports it (rc %d); nothing was changed" % (interp, r.returncode),
                        interpreter=interp, rc=r.returncode, stderr=_last_error(r.stderr))
    return vals


def import_failure(interp: str, path: str, name: str, probe_env: t.Mapping[str, str]) -> str:
    """Why `interp` fails to import the sitecustomize at `path`, for a failure message: the line and the error, and
    whether the line is outside gpufleet's block `name` (an operator's edit, which gpufleet does not touch). Start-up
    only prints "Error in sitecustomize" and goes on without the file, so every variable of the block reads unset."""
    where = None
    try:
        r = _run([interp, "-S", "-c", _WHERE_IT_FAILS, path], probe_env)
        where = _last_json(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    if not isinstance(where, dict):
        return "%s fails to import when %s starts (it prints 'Error in sitecustomize')" % (path, interp)
    line = where.get("line")
    inside = False
    try:
        block = _envblock.find_block(_envblock.split_lines(_envblock.read_text(path) or ""), name, path)
        inside = block is not None and isinstance(line, int) and block.start < line <= block.end + 1
    except (_envblock.BlockError, OSError, ValueError):
        pass
    return "%s fails to import %s gpufleet's block%s: %s" % (
        path, "inside" if inside else "outside", ", at line %d" % line if isinstance(line, int) else "",
        where.get("error") or "unknown error")


# --- the module's work -----------------------------------------------------------------

# The file names Python's site module imports at start-up (`import sitecustomize`, `import usercustomize`).
HOOK_NAMES = ("sitecustomize.py", "usercustomize.py")


def argument_spec() -> t.Dict[str, t.Any]:
    """Options of sitecustomize_env (also server_state's nccl_layers.sitecustomize)."""
    return dict(
        interpreters=dict(type="list", elements="path", default=[]),
        path=dict(type="path"),
        env=dict(type="dict", default={}),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        mode=dict(type="str", choices=["setdefault", "override"], default="setdefault"),
        name=dict(type="str", default="gpufleet"),
        backup=dict(type="bool", default=False),
        probe_env=dict(type="dict", default={}),
        nccl_names=dict(type="str", choices=["ignore", "warn", "fail"], default="ignore"),
        allow_vars=dict(type="list", elements="str", default=[]),
        service_tag=dict(type="str"),
        service_locks=dict(type="path"),
    )


def run(p: t.Mapping[str, t.Any], step: Step = Step()) -> t.Dict[str, t.Any]:
    """sitecustomize_env: make each interpreter's block what `p` asks (nothing in check mode) and return the result;
    StepError when it cannot. `step.files` (the AnsibleModule: backup_local, atomic_move) is needed only to write, so a
    check-mode run (server_state's layer check) passes none."""
    check_mode, diff, warn, files = step.check_mode, step.diff, step.warn, step.files
    try:
        name = _envblock.check_block_name(p["name"])
        env = _envblock.normalize_env(p["env"], "env")
        probe_env = _envblock.normalize_env(p["probe_env"], "probe_env")
    except _envblock.BlockError as e:
        raise StepError(str(e))
    own = _layershare.parse_service_tag(p.get("service_tag"))
    if p["state"] == "present":
        # Every Python process on the host runs this file: only NCCL's names and the ones the user listed
        # (never a loader or interpreter variable). Removal is never refused, so an old block can always go.
        try:
            _ncclvars.check_allowed(env, p["allow_vars"])
        except _ncclvars.NotAllowed as e:
            raise StepError(str(e), **e.extra)
        _ncclvars.apply_name_policy(warn, env, p["nccl_names"], p["allow_vars"])

    if p["path"]:
        # Every Python process runs this file: it must be a Python start-up hook, never an arbitrary file (a path such
        # as /etc/ld.so.preload would put the block where every program, Python or not, reads it).
        bad = [q for q in (p["path"], os.path.realpath(p["path"])) if os.path.basename(q) not in HOOK_NAMES]
        if bad:
            raise StepError("path must name a %s file (got %s); nothing was changed" % (
                " or ".join(HOOK_NAMES), " -> ".join(dict.fromkeys([p["path"], os.path.realpath(p["path"])]))))

    interps = list(dict.fromkeys(p["interpreters"] or []))
    if not interps:
        interps = discover_interpreters()
        if not interps:
            raise StepError("No interpreters given and no python3 found under %s" % ", ".join(DEFAULT_GLOBS))

    result: t.Dict[str, t.Any] = dict(changed=False, interpreters=[], files=[], effective_env={}, shadowed=[],
                                      access_fixes=[], import_failures=[])
    try:
        infos = [probe(i, probe_env, sorted(env) if p["state"] == "present" else ()) for i in interps]
    except SiteError as e:
        raise StepError(str(e), **e.extra)

    # Group interpreters by the file they import (or the explicit path), so a shared file is edited once.
    # Keyed by real path: two spellings of one file (a link and its target) are still one file.
    groups: t.Dict[str, t.List[t.Dict[str, t.Any]]] = {}
    firsts: t.Dict[str, str] = {}
    for info in infos:
        target = p["path"] or info["sitecustomize"]
        target = firsts.setdefault(os.path.realpath(target), target)
        groups.setdefault(target, []).append(info)
        entry = {k: info[k] for k in ("interpreter", "executable", "version", "prefix", "base_prefix", "sitecustomize", "exists", "shadowed")}
        entry["venv"] = info["prefix"] != info["base_prefix"]
        entry["managed_path"] = target
        if info["import_error"]:
            info["import_failure"] = import_failure(info["interpreter"], info["sitecustomize"], name, probe_env)
            if info["import_failure"] not in result["import_failures"]:
                result["import_failures"].append(info["import_failure"])
            warn("%s already prints 'Error in sitecustomize' at start-up: %s"
                 % (info["interpreter"], info["import_failure"]))
        result["interpreters"].append(entry)
        for s in info["shadowed"]:
            msg = "%s: %s is shadowed by %s (import sitecustomize loads the first one on sys.path), so its content never runs" % (
                info["interpreter"], s, info["sitecustomize"])
            if msg not in result["shadowed"]:
                result["shadowed"].append(msg)
                warn(msg)

    diffs = []
    plans = []
    present = p["state"] == "present"
    # Plan every file first; refuse before changing anything.
    for target, members in groups.items():
        real = target
        try:
            real, links = _envblock.resolve_target(target)
            current = _envblock.read_text(real)
            check_markers_are_comments(current, real)
            old_block = _envblock.block_lines(_envblock.split_lines(current or ""), name, real)
            desired = new_text(current, name, env if present else None, p["mode"], real)
            # In the plan, before any file is written (and so in check mode too): another service runs on this host.
            _layershare.refuse_if_shared(own, real, parse_body(old_block), env if present else {},
                                         p.get("service_locks"))
            if desired is not None and desired != current:
                compile(_envblock.encode(desired), real, "exec", dont_inherit=True)
                if present:
                    # The file without the block must compile too, or the block could never be removed cleanly (a
                    # trailing backslash would swallow the BEGIN marker and make a broken file compile for now).
                    without = new_text(current, name, None, p["mode"], real)
                    try:
                        compile(_envblock.encode(without or ""), real, "exec", dont_inherit=True)
                    except SyntaxError as e:
                        raise StepError("%s does not compile without gpufleet's block (%s): fix the file first, or the "
                                        "block could not be removed cleanly later; nothing was changed" % (real, e),
                                        path=real)
            # A server run as another user imports no sitecustomize it cannot read (site.py skips it silently).
            fixes = _envblock.access_fixes(real, links) if present and desired is not None else []
        except _envblock.BlockError as e:
            raise StepError(str(e), path=target)
        except SyntaxError as e:
            raise StepError("%s would not compile after the change (%s); nothing was changed" % (real, e), path=real)
        except (OSError, ValueError) as e:
            raise StepError("cannot read %s: %s" % (target, e), path=target)
        content_changed = desired != current
        changed = content_changed or bool(fixes)
        keys = sorted(env) if present else sorted(set(parse_body(old_block)) | set(env))
        plans.append((target, real, links, members, current, desired, content_changed, fixes, keys))
        if content_changed and diff:
            # Only gpufleet's blocks: the file's other lines are the user's and may export secrets.
            diffs.append(_envblock.diff_entry(real, _envblock.blocks_only(current), _envblock.blocks_only(desired)))
        if diff:
            diffs.extend(_envblock.access_diff(fixes))

    for target, real, links, members, current, desired, content_changed, fixes, keys in plans:
        changed = content_changed or bool(fixes)
        fentry: t.Dict[str, t.Any] = dict(path=target, real_path=real, symlinks=links, changed=changed,
                                          created=content_changed and current is None,
                                          removed=content_changed and desired is None,
                                          interpreters=[m["interpreter"] for m in members], backup_file=None,
                                          access_fixes=fixes)
        result["access_fixes"].extend(fixes)
        if content_changed and not check_mode:
            try:
                if desired is None:
                    fentry["backup_file"] = _envblock.remove(files, real, p["backup"])
                else:
                    tmp = _envblock.write_temp(real, desired)
                    try:
                        for m in members:
                            got = import_test(m["interpreter"], tmp, keys, probe_env)
                            bad = [k for k in keys if present and got.get(k) != env[k]]
                            if bad:
                                raise SiteError("the new %s does not export %s when %s runs it; nothing was changed"
                                                % (real, ", ".join(bad), m["interpreter"]), interpreter=m["interpreter"])
                        fentry["backup_file"] = _envblock.install(files, real, tmp, current is not None, p["backup"])
                    finally:
                        if os.path.exists(tmp):
                            os.unlink(tmp)
            except SiteError as e:
                raise StepError(str(e), **e.extra)
            except OSError as e:
                hint = "; run as root (become: true)" if isinstance(e, PermissionError) else ""
                raise StepError("cannot write %s: %s%s" % (real, e.strerror or e, hint), path=real)
        _envblock.fix_access_or_fail(check_mode, fixes, real)
        result["changed"] = result["changed"] or changed
        result["files"].append(fentry)
        # Prove it: start each interpreter like any process (probe_env only, normally empty) and read the keys back.
        want = _want(p, env, probe_env, keys)
        for m in members:
            try:
                # A file left as it was: the probe's reading (same interpreter, same file, same env) is the proof.
                seen = m.get("environ") or {}
                got = ({k: seen[k] for k in keys} if not changed and all(k in seen for k in keys)
                       else read_effective(m["interpreter"], keys, probe_env))
            except SiteError as e:
                raise StepError(str(e), **dict(e.extra, **result))
            result["effective_env"][m["interpreter"]] = got
            bad = [k for k in keys if got.get(k) != want.get(k)]
            if bad:
                result.setdefault("not_effective", []).append(m["interpreter"])
            if bad and not check_mode:
                why = ("still set after removing the block (set elsewhere in %s?)" % real if not present
                       else "not exported as asked (got %s)" % json.dumps({k: got.get(k) for k in bad}))
                if m.get("import_failure"):
                    # The cause, not its symptom: start-up skips a file that fails to import, block and all.
                    raise StepError("%s; so %s started with an empty environment has %s unset"
                                    % (m["import_failure"], m["interpreter"], ", ".join(bad)), **result)
                raise StepError("%s started with an empty environment has %s %s" % (m["interpreter"], ", ".join(bad), why),
                                **result)
    if diffs:
        result["diff"] = diffs if len(diffs) > 1 else diffs[0]
    return result


def _want(p: t.Mapping[str, t.Any], env: t.Mapping[str, str], probe_env: t.Mapping[str, str],
          keys: t.Sequence[str]) -> t.Dict[str, t.Optional[str]]:
    """What an interpreter started with probe_env must report for each key after the change:
    an explicitly exported value wins in setdefault mode, as it will for real processes."""
    if p["state"] == "absent":
        return {k: probe_env.get(k) for k in keys}
    return {k: probe_env[k] if (p["mode"] == "setdefault" and k in probe_env) else env[k] for k in keys}
