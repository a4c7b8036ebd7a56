# SPDX-License-Identifier: GPL-3.0-or-later
"""The docs' commands cannot rot.

- Every ```sh block of these pages carries a marker: `<!-- test: run -->` blocks are executed, in order,
  in one bash per page (so `cd` carries over, like a reader's terminal), from the repo root with a
  throw-away HOME; `<!-- test: skip (reason) -->` blocks need GPU hosts, so their commands are checked
  statically: playbooks and modules exist, module options and -e variables are documented ones,
  gpufleet_ci flags exist.
- docs/ci.md's private_data_dir layout is compared with what gpufleet_ci really writes.
- Relative links (and #anchors) resolve.
The quickstart's ./scripts/demo is run by test_demo.py (slow); docs/options/ freshness by the README's
`scripts/gen-docs --check` block.
"""
from __future__ import annotations

import json
import re
import shlex
import typing as t


import pytest
import yaml

from release_helpers import BIN, ROOT, clean_env, private_collection, run

PAGES = ["README.md", "quickstart.md", "concepts.md", "runbook.md", "ci.md"]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(?:<!-- test: (?P<marker>[^>]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)```", re.S)


def blocks(page: str) -> t.List[t.Tuple[str, str, str]]:
    """(marker, language, body) of every fenced block."""
    return [(m.group("marker") or "", m.group("lang"), m.group("body")) for m in BLOCK.finditer((DOCS / page).read_text())]


def commands(body: str) -> t.List[str]:
    """Shell command lines of a block: continuations joined, comments and heredoc bodies dropped."""
    out, heredoc = [], None
    for line in body.replace("\\\n", " ").splitlines():
        if heredoc:
            if line.strip() == heredoc:
                heredoc = None
            continue
        m = re.search(r"<<-?'?(\w+)'?", line)
        if m:
            heredoc = m.group(1)
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


@pytest.mark.parametrize("page", PAGES)
def test_every_shell_block_is_marked(page):
    for marker, lang, body in blocks(page):
        if lang != "sh":
            continue
        assert marker == "run" or re.match(r"skip \(.+\)$", marker), (
            "%s: mark this block <!-- test: run --> or <!-- test: skip (reason) -->:\n%s" % (page, body))


def test_the_quickstart_and_maintenance_commands_are_run():
    runs = {page: [b for m, lang, b in blocks(page) if lang == "sh" and m == "run"] for page in PAGES}
    quick = "".join(runs["quickstart.md"])
    for must in ("ansible-galaxy collection build", "ansible-galaxy collection install", "ansible-inventory",
                 "ansible-playbook gpufleet.serving.rollout", "ansible-doc -t role"):
        assert must in quick, must
    assert "scripts/gen-docs --check" in "".join(runs["README.md"])
    assert "python -m gpufleet_ci --help" in "".join(runs["ci.md"])


@pytest.mark.parametrize("page", [p for p in PAGES if any(m == "run" for m, lang, _body in blocks(p) if lang == "sh")])
def test_run_blocks(page, tmp_path):
    script = "set -euo pipefail\n" + "\n".join(b for m, lang, b in blocks(page) if lang == "sh" and m == "run")
    home = tmp_path / "home"
    home.mkdir()
    r = run(["bash", "-c", script], cwd=ROOT, env=clean_env(HOME=str(home)), timeout=400)
    assert r.returncode == 0, "%s: a documented command failed:\n%s" % (page, r.stdout[-5000:])
    if page == "quickstart.md":
        # It built and installed the tarball into the throw-away HOME, and ran from it.
        assert list((home / "gpufleet-dist").glob("gpufleet-serving-*.tar.gz"))
        assert (home / ".ansible/collections/ansible_collections/gpufleet/serving/MANIFEST.json").is_file()
        assert "@gpufleet_servers:" in r.stdout and "|--@pcie_sglang:" in r.stdout, r.stdout[-3000:]
        assert '"gpufleet_server_name": "sglang"' in r.stdout
        # The syntax check resolved the playbook by FQCN from the installed tarball.
        assert re.search(r"playbook: %s/\.ansible/collections/ansible_collections/gpufleet/serving/playbooks/rollout\.yml"
                         % re.escape(str(home)), r.stdout), r.stdout[-3000:]
        assert "ENTRY POINT: *main*" in r.stdout
    if page == "README.md":
        assert "docs/options is up to date" in r.stdout, r.stdout


# --- static checks of the blocks that need GPU hosts ---------------------------------------------------

def _module_options(module: str) -> t.Set[str]:
    """Top-level options of a module, as ansible-doc resolved them (docs/options/<module>.md)."""
    page = (DOCS / "options" / (module + ".md")).read_text()
    table = page.split("## Options", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([a-z_0-9]+)` \|", table, re.M)}


def _documented_variables() -> t.Set[str]:
    names = set()
    for spec in ROOT.glob("roles/*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            names.update(entry["options"])
    for pb in ROOT.glob("playbooks/*.yml"):  # play-level variables, documented in the playbooks' comments
        names.update(re.findall(r"^#\s+(gpufleet_\w+)\s", pb.read_text(), re.M))
    return names


def _args(value: str) -> t.Dict[str, t.Any]:
    if value.lstrip().startswith("{"):
        return json.loads(value)
    return dict(kv.split("=", 1) for kv in shlex.split(value))


def _check_command(line: str, variables: t.Set[str], ci_help: str) -> None:
    argv = shlex.split(line)
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        argv.pop(0)
    prog = argv[0]
    opts = dict(zip(argv, argv[1:]))
    for flag in ("-e", "--extra-vars"):
        if flag in opts:
            extra = json.loads(opts[flag])
            assert isinstance(extra, dict)
            unknown = set(extra) - variables
            assert not unknown, "%s: undocumented variables %s" % (line, unknown)
    if prog == "ansible-playbook":
        name = argv[1]
        assert name.startswith("gpufleet.serving."), line
        assert (ROOT / "playbooks" / (name.split(".")[-1] + ".yml")).is_file(), line
    elif prog == "ansible":
        module = opts["-m"]
        assert module.startswith("gpufleet.serving."), line
        short = module.split(".")[-1]
        assert (ROOT / "plugins" / "modules" / (short + ".py")).is_file(), line
        if "-a" in opts:
            unknown = set(_args(opts["-a"])) - _module_options(short)
            assert not unknown, "%s: %s has no options %s" % (line, module, unknown)
    elif prog == "python" and argv[1:3] == ["-m", "gpufleet_ci"]:
        assert argv[3] in ("rollout", "restart", "clean", "audit"), line
        for a in argv[4:]:
            if a.startswith("--"):
                assert a in ci_help, "%s: gpufleet_ci has no %s" % (line, a)
    elif prog.startswith("./"):
        assert (ROOT / prog).is_file(), line
    else:
        raise AssertionError("no static check for %r; run it or teach this test" % line)


def test_skipped_commands_use_real_playbooks_modules_options_and_variables():
    variables = _documented_variables()
    assert {"gpufleet_rollout_serial", "gpufleet_nccl_profile", "gpufleet_server_force_restart"} <= variables
    ci_help = run([str(BIN / "python"), "-m", "gpufleet_ci", "--help"]).stdout
    checked = 0
    for page in PAGES:
        for marker, lang, body in blocks(page):
            if lang == "sh" and marker.startswith("skip"):
                for line in commands(body):
                    _check_command(line, variables, ci_help)
                    checked += 1
    assert checked >= 8


def test_static_check_catches_a_wrong_option():
    variables = _documented_variables()
    with pytest.raises(AssertionError, match="has no options"):
        _check_command("ansible h -m gpufleet.serving.nccl_conf -a 'name=nccl state=absent colour=red'", variables, "")
    with pytest.raises(AssertionError, match="undocumented variables"):
        _check_command("""ansible-playbook gpufleet.serving.rollout -e '{"gpufleet_nccl_profil": "none"}'""", variables, "")


# --- docs/ci.md layout ---------------------------------------------------------------------------------

def test_ci_private_data_dir_layout_is_what_gpufleet_ci_writes(tmp_path):
    layout = next(b for m, lang, b in blocks("ci.md") if m.startswith("layout"))
    documented = [line.split()[0].replace("/ID/", "/docrun/") for line in layout.splitlines() if line.strip()]
    inv = tmp_path / "hosts.yml"
    # One host nobody listens for: the run touches nothing and ends unreachable.
    inv.write_text("all:\n  children:\n    gpufleet_servers:\n      hosts:\n        nobody:\n"
                   "          ansible_host: 127.0.0.1\n          ansible_port: 9\n          ansible_user: nobody\n")
    base = private_collection(tmp_path / "collections")
    pdd = tmp_path / "pdd"
    r = run([str(BIN / "python"), "-m", "gpufleet_ci", "audit", "--inventory", str(inv), "--private-data-dir", str(pdd),
             "--ident", "docrun", "--collections-path", str(base), "--json", str(tmp_path / "r.json")],
            env=clean_env(HOME=str(tmp_path)), timeout=180)
    assert r.returncode == 2, r.stdout  # unreachable host: documented exit status
    for path in documented:
        p = pdd / path
        assert (p.is_dir() and any(p.iterdir())) if path.endswith("/") else p.is_file(), "ci.md lists %s; missing" % path
    assert (pdd / "artifacts" / "docrun" / "status").read_text().strip() in ("failed", "successful")
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report) == {"playbook", "status", "rc", "ident", "artifacts", "ok", "halted", "hosts"}
    assert report["hosts"][0]["status"] == "unreachable" and report["ok"] is False
    documented_keys = re.search(r"\(per host: (.*?)\)", (DOCS / "ci.md").read_text(), re.S).group(1)
    for key in re.findall(r"`(\w+)`", documented_keys):
        assert key in report["hosts"][0], key


# --- links ---------------------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _sep, anchor = target.partition("#")
        dest = (DOCS / path).resolve() if path else DOCS / page
        assert dest.exists(), "%s links to missing %s" % (page, target)
        if anchor:
            headings = re.findall(r"^#+ (.*)$", dest.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, "%s: no heading for #%s in %s" % (page, anchor, path)


def _repo_cfg() -> str:
    return (ROOT / "ansible.cfg").read_text()


def _quickstart_cfg() -> str:
    text = (DOCS / "quickstart.md").read_text()
    return re.search(r"cat > ansible.cfg <<'EOF'\n(.*?)\nEOF\n", text, re.S).group(1)


def _ci_cfg() -> str:
    return next(body for _m, lang, body in blocks("ci.md") if lang == "ini" and "[ssh_connection]" in body)


@pytest.mark.parametrize("where", ["ansible.cfg", "quickstart.md", "ci.md"])
def test_the_recommended_ansible_cfg_bounds_a_host_that_goes_away(where, tmp_path):
    """Issue 24: with ssh's defaults a canary whose network went away mid-restart hung the run for the whole outage and
    about 2 minutes after. The repo's ansible.cfg and the ones the docs recommend set ServerAlive* in ssh_args (keeping
    ansible's default options, which setting ssh_args replaces), and ansible reads them as the ssh connection's
    ssh_args; the docs state the bound they give."""
    text = {"ansible.cfg": _repo_cfg, "quickstart.md": _quickstart_cfg, "ci.md": _ci_cfg}[where]()
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(text)
    r = run([str(BIN / "ansible-config"), "dump", "--only-changed", "-t", "connection"], cwd=tmp_path,
            env=clean_env(ANSIBLE_CONFIG=str(cfg), HOME=str(tmp_path)), timeout=120)
    m = re.search(r"^ssh_args\(.*\) = (.*)$", r.stdout, re.M)
    assert m, r.stdout
    opts = dict(o.split("=", 1) for o in shlex.split(m.group(1)) if "=" in o)
    assert opts == {"ControlMaster": "auto", "ControlPersist": "60s", "ServerAliveInterval": "15",
                    "ServerAliveCountMax": "4"}, m.group(1)
    assert "-C" in shlex.split(m.group(1))
    bound = int(opts["ServerAliveInterval"]) * (int(opts["ServerAliveCountMax"]) + 1)
    assert "= %d s after the host went silent" % bound in (DOCS / "quickstart.md").read_text()
