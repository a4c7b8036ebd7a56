# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a gpufleet playbook through ansible-runner, stream per-host progress, write a summary.

    python -m gpufleet_ci rollout --inventory inventories/example --json report.json --markdown report.md

Lays out an ansible-runner private_data_dir:
    project/site.yml        one import_playbook of gpufleet.serving.<playbook>
    inventory/              the given inventory (copied)
    env/envvars             collections path, summary callback, ssh settings
    env/extravars           --extra-vars
    env/cmdline             --check / --diff / --limit / --vault-password-file
and exits non-zero when the run failed, a host failed or was unreachable, or a host was not run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import types
import typing as t

import yaml

PLAYBOOKS = ("rollout", "restart", "clean", "audit", "rollback")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prepare(args: argparse.Namespace) -> str:
    pdd = os.path.abspath(args.private_data_dir or tempfile.mkdtemp(prefix="gpufleet-runner-"))
    for d in ("project", "inventory", "env"):
        os.makedirs(os.path.join(pdd, d), exist_ok=True)
    with open(os.path.join(pdd, "project", "site.yml"), "w") as f:
        f.write("---\n- name: gpufleet %s\n  ansible.builtin.import_playbook: gpufleet.serving.%s\n" % (args.playbook, args.playbook))
    inv_dst = os.path.join(pdd, "inventory")
    for n in os.listdir(inv_dst):
        p = os.path.join(inv_dst, n)
        shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    if os.path.isdir(args.inventory):
        shutil.copytree(args.inventory, inv_dst, dirs_exist_ok=True)
    else:
        shutil.copy(args.inventory, os.path.join(inv_dst, os.path.basename(args.inventory)))
    summary_dir = os.path.join(pdd, "artifacts", "summary")
    envvars = {
        "ANSIBLE_COLLECTIONS_PATH": os.path.abspath(args.collections_path),
        "ANSIBLE_CALLBACKS_ENABLED": "gpufleet.serving.rollout_summary",
        "GPUFLEET_SUMMARY_DIR": summary_dir,
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_GATHERING": "explicit",
        "ANSIBLE_FORKS": str(args.forks),
        "ANSIBLE_NOCOLOR": "1",
    }
    with open(os.path.join(pdd, "env", "envvars"), "w") as f:
        yaml.safe_dump(envvars, f)
    extra = json.loads(args.extra_vars) if args.extra_vars else {}
    with open(os.path.join(pdd, "env", "extravars"), "w") as f:
        yaml.safe_dump(extra, f)
    cmd = []
    if args.check:
        cmd.append("--check")
    if args.diff:
        cmd.append("--diff")
    if args.limit:
        cmd += ["--limit", args.limit]
    if args.vault_password_file:
        # The file's path only: the password stays out of the private data dir (and its artifacts).
        cmd += ["--vault-password-file", shlex.quote(os.path.abspath(args.vault_password_file))]
    with open(os.path.join(pdd, "env", "cmdline"), "w") as f:
        f.write(" ".join(cmd))
    return pdd


class Progress:
    """Prints one line per host and task as runner events arrive."""

    def __init__(self, out: t.TextIO) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.hosts: t.Dict[str, str] = {}

    def __call__(self, event: t.Dict[str, t.Any]) -> bool:
        ev = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if ev in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped") and host:
            status = {"runner_on_ok": "changed" if (data.get("res") or {}).get("changed") else "ok",
                      "runner_on_failed": "FAILED", "runner_on_unreachable": "UNREACHABLE",
                      "runner_on_skipped": "skipped"}[ev]
            if ev == "runner_on_failed" and data.get("ignore_errors"):
                status = "failed (ignored)"
            if status != "skipped":
                self.out.write("[%6.1fs] %-14s %-11s %s\n" % (time.monotonic() - self.t0, host, status, data.get("task", "")))
                self.out.flush()
        return True  # keep the event in artifacts/job_events


def run(args: argparse.Namespace) -> int:
    import ansible_runner

    pdd = prepare(args)
    # ansible-runner execs ansible-playbook from PATH: use the one beside this interpreter.
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    ident = args.ident or time.strftime("%Y%m%dT%H%M%S")
    r = ansible_runner.run(private_data_dir=pdd, playbook="site.yml", ident=ident, quiet=True,
                           event_handler=Progress(sys.stdout))
    summary_path = os.path.join(pdd, "artifacts", "summary", "rollout-summary.json")
    hosts: t.List[t.Dict[str, t.Any]] = []
    halted = None
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            callback_summary = json.load(f)
        hosts, halted = callback_summary["hosts"], callback_summary.get("halted")
    else:
        # Not a gpufleet_server run (e.g. audit): fall back to runner's per-host stats.
        stats = r.stats or {}
        names = set()
        for k in ("ok", "failures", "dark", "skipped", "changed", "processed"):
            names.update((stats.get(k) or {}).keys())
        for n in sorted(names):
            status = "unreachable" if n in (stats.get("dark") or {}) else ("failed" if n in (stats.get("failures") or {}) else "ok")
            # No restart facts without the callback's summary: the restarted column reads "-".
            hosts.append({"host": n, "status": status, "restarted": None, "restart": None, "failure": None})
    bad = [h for h in hosts if h["status"] != "ok"]
    report = {"playbook": args.playbook, "status": r.status, "rc": r.rc, "ident": ident,
              "artifacts": os.path.join(pdd, "artifacts", ident), "hosts": hosts, "halted": halted,
              "ok": r.rc == 0 and r.status == "successful" and not bad}
    md = render_markdown(report, args.collections_path)
    sys.stdout.write("\n" + md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    return 0 if report["ok"] else 2


def summary_renderer(collections_path: t.Optional[str] = None) -> types.ModuleType:
    """The rollout_summary callback's module, whose render_markdown writes the table: the one renderer of the per-host
    summary. Loaded by file from the collection that ran the playbook (the callback that wrote the rows), else from
    this checkout; it needs only ansible-core, which ansible-runner's ansible-playbook runs from anyway."""
    rel = os.path.join("plugins", "callback", "rollout_summary.py")
    candidates = [os.path.join(collections_path, "ansible_collections", "gpufleet", "serving", rel)] if collections_path else []
    path = next((c for c in candidates + [os.path.join(ROOT, rel)] if os.path.isfile(c)), None)
    if path is None:
        raise SystemExit("cannot find the gpufleet.serving rollout_summary callback (%s)" % ", ".join(candidates + [ROOT]))
    spec = importlib.util.spec_from_file_location("gpufleet_rollout_summary", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def render_markdown(report: t.Dict[str, t.Any], collections_path: t.Optional[str] = None) -> str:
    """The report's title line, then the callback's summary (table and notes) of report["hosts"]."""
    title = "### gpufleet %s: %s (rc %s)" % (report["playbook"], "OK" if report["ok"] else "FAILED", report["rc"])
    renderer = summary_renderer(collections_path)
    return title + "\n\n" + renderer.render_markdown(report["hosts"], report.get("halted"), report.get("playbook"))


def main(argv: t.Optional[t.List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpufleet_ci", description=__doc__.split("\n\n")[0])
    ap.add_argument("playbook", choices=PLAYBOOKS)
    ap.add_argument("--inventory", "-i", required=True)
    ap.add_argument("--extra-vars", "-e", help="JSON object of extra variables")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--diff", action="store_true")
    ap.add_argument("--limit")
    ap.add_argument("--vault-password-file", help="decrypts the inventory's vault-encrypted values (ansible-vault)")
    ap.add_argument("--forks", type=int, default=32)
    ap.add_argument("--json", help="write the per-host summary as JSON here")
    ap.add_argument("--markdown", help="write the per-host summary as a Markdown table here")
    ap.add_argument("--private-data-dir", help="ansible-runner private_data_dir (default: a new temp dir)")
    ap.add_argument("--ident", help="runner ident (default: a timestamp); artifacts/<ident>/ holds rc, status, job_events")
    ap.add_argument("--collections-path", default=os.path.join(ROOT, "collections"))
    args = ap.parse_args(argv)
    if args.extra_vars:
        try:
            if not isinstance(json.loads(args.extra_vars), dict):
                ap.error("--extra-vars must be a JSON object")
        except ValueError as e:
            ap.error("--extra-vars is not valid JSON: %s" % e)
    if not os.path.exists(args.inventory):
        ap.error("inventory %s does not exist" % args.inventory)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
