# SPDX-License-Identifier: GPL-3.0-or-later
"""The execution environment (execution-environment.yml, scripts/build-ee): it builds with podman from a local base
image, and the rollout run in it by `ansible-runner run --process-isolation --container-image` against the sandbox
fleet gives the same exit code, summary and artifacts as the same rollout through ansible-runner outside it; the
rollout run in it by docs/ci.md's `ansible-navigator run ... --eei IMAGE --mode stdout` (AAP's command-line tool) gives
ansible-playbook's exit status and the summary.

How the container reaches the sandbox hosts: they live in network namespaces behind the fleet's hub namespace (the
controller's ssh goes through `ip netns exec <hub> nc` as a ProxyCommand, which a container cannot run). The EE
container joins the hub's network namespace instead (`--container-option=--network=ns:/run/netns/<hub>`), where every
host's address is directly routable, so its inventory is the fleet's without the ProxyCommand; the fleet's ssh key is
mounted read-only at its path. Rootful podman here: the private data dir belongs to root, so the container runs as
root (`--user=0`, what ansible-runner itself passes to docker as `--user=$(id -u)`).

Needs root, podman, runc, and debootstrap unless the base image or its cached rootfs exists; skipped with the reason
otherwise. Slow: 3.3 min on this 2-core machine with the base image cached and podman's layer cache cold (build 73 s:
ansible-builder 65 s; four ansible-runner runs 2 min), 40-90 s with the layers cached (only the collections changed),
about 3 min more on a fresh machine (debootstrap of the base). It runs in CI, beside the other test files
(scripts/test runs files in parallel).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from gpufleet_ci import sandbox  # noqa: E402
from collection_copy import private_collections  # noqa: E402

IMAGE = "localhost/gpufleet-ee:test"
BIN = Path(sys.executable).parent
HOSTS = ["host1", "host2"]
# Inside the fleet's hub subnet, never given to a host: unreachable.
UNUSED_ADDR = "10.200.0.250"


def _skip_reason() -> t.Optional[str]:
    if os.geteuid() != 0:
        return "needs root (rootful podman, the sandbox fleet)"
    missing = [c for c in ("podman", "runc") if not (shutil.which(c) or os.access("/usr/sbin/" + c, os.X_OK))]
    if missing:
        return "the execution environment needs %s (apt: podman runc)" % ", ".join(missing)
    if not (shutil.which("debootstrap") or os.access("/usr/sbin/debootstrap", os.X_OK)):
        if not list((ROOT / ".cache" / "podman").glob("gpufleet-ee-base-*.tar")):
            return "no cached EE base rootfs and no debootstrap to make it (apt: debootstrap)"
    return None


_SKIP = _skip_reason()
pytestmark = [pytest.mark.sandbox, pytest.mark.slow, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


def _containers_conf(tmp: Path) -> Path:
    # Rootful podman on this kind of machine: runc, cgroupfs and explicit ulimits (tests/sandbox/podman_fleet.py).
    p = tmp / "containers.conf"
    p.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
                 '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n')
    return p


@pytest.fixture(scope="module")
def ee_image(tmp_path_factory) -> t.Dict[str, t.Any]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "build-ee"), "--tag", IMAGE], cwd=str(ROOT),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800, check=False)
    assert p.returncode == 0, p.stdout[-6000:]
    info = json.loads(p.stdout.strip().splitlines()[-1])
    info["build_s"] = time.monotonic() - t0
    print("EE build: %.1fs %s" % (info["build_s"], info["steps"]))
    return info


def _inventories(fleet, workdir: Path, unreachable: t.Sequence[str] = ()) -> t.Tuple[Path, Path]:
    """(outside, inside): the fleet's inventory plus the servers group; inside drops the ProxyCommand."""
    inv = yaml.safe_load(fleet.inventory.read_text())
    servers = sandbox.servers_inventory(HOSTS, sandbox.server_vars(fleet.python))
    out = {}
    for where in ("outside", "inside"):
        d = workdir / ("inv-" + where)
        d.mkdir()
        hosts = json.loads(json.dumps(inv))
        for name, hv in hosts["all"]["hosts"].items():
            if name in unreachable:
                hv["ansible_host"] = UNUSED_ADDR
            if where == "inside":
                hv["ansible_ssh_common_args"] = ("-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                                 "-o LogLevel=ERROR -o ConnectTimeout=10")
        (d / "fleet.yml").write_text(yaml.safe_dump(hosts))
        (d / "servers.yml").write_text(servers)
        out[where] = d
    return out["outside"], out["inside"]


def _prepare(inv: Path, pdd: Path, inside: bool) -> None:
    """gpufleet_ci's private_data_dir; inside the EE, the collection is the image's and the summary goes to /runner."""
    import argparse
    from gpufleet_ci.__main__ import prepare
    prepare(argparse.Namespace(private_data_dir=str(pdd), playbook="rollout", inventory=str(inv),
                               collections_path=str(private_collections()), forks=32,
                               extra_vars=json.dumps({"gpufleet_rollout_serial": ["100%"]}), check=False, diff=False,
                               limit=None, vault_password_file=None))
    if inside:
        envvars = yaml.safe_load((pdd / "env" / "envvars").read_text())
        del envvars["ANSIBLE_COLLECTIONS_PATH"]  # /usr/share/ansible/collections, the image's
        envvars["GPUFLEET_SUMMARY_DIR"] = "/runner/artifacts/summary"
        (pdd / "env" / "envvars").write_text(yaml.safe_dump(envvars))


def _runner(fleet, pdd: Path, ident: str, image: t.Optional[str], conf: Path) -> subprocess.CompletedProcess:
    argv = [str(BIN / "ansible-runner"), "run", str(pdd), "-p", "site.yml", "--ident", ident]
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"]))
    if image:
        key = yaml.safe_load(fleet.inventory.read_text())["all"]["hosts"]["host1"]["ansible_ssh_private_key_file"]
        argv += ["--process-isolation", "--process-isolation-executable", "podman", "--container-image", image,
                 "--container-option=--network=ns:/run/netns/%s" % fleet.hub, "--container-option=--user=0",
                 "--container-volume-mount", "%s:%s:ro" % (key, key)]
        env["CONTAINERS_CONF"] = str(conf)
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600, check=False)
    print("ansible-runner %s (%s): rc=%d in %.1fs" % (ident, image or "no EE", p.returncode, time.monotonic() - t0))
    return p


def _result(pdd: Path, ident: str) -> t.Dict[str, t.Any]:
    art = pdd / "artifacts" / ident
    summary = json.loads((pdd / "artifacts" / "summary" / "rollout-summary.json").read_text())
    return {
        "rc": int((art / "rc").read_text()),
        "status": (art / "status").read_text().strip(),
        "hosts": {h["host"]: (h["status"], h["restarted"], h.get("workers_verified")) for h in summary["hosts"]},
        "halted": bool(summary.get("halted")),
        "stdout": (art / "stdout").read_text(),
        "artifact_files": sorted(p.name for p in art.iterdir()),
        "events": sorted({json.loads(p.read_text()).get("event") for p in (art / "job_events").glob("*.json")}),
        "summary_md": (pdd / "artifacts" / "summary" / "rollout-summary.md").exists(),
    }


def test_rollout_in_the_ee_matches_the_rollout_outside_it(ee_image, sandbox_fleet, tmp_path):
    fleet = sandbox_fleet(hosts=2, gpus=2)
    conf = _containers_conf(tmp_path)
    # The image holds this collection and the controller's Python deps, not the hosts' NVML library.
    ls = subprocess.run(["podman", "run", "--rm", IMAGE, "bash", "-c",
                         "ansible-galaxy collection list gpufleet.serving; python3 -c 'import ansible_runner, jinja2';"
                         "python3 -c 'import pynvml' 2>&1 | tail -1"],
                        env=dict(os.environ, CONTAINERS_CONF=str(conf)), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
    assert "gpufleet.serving" in ls.stdout and "No module named 'pynvml'" in ls.stdout, ls.stdout
    # community.general (optional) is in the EE when ./scripts/setup put it in collections/.
    if (ROOT / "collections" / "ansible_collections" / "community" / "general" / "MANIFEST.json").exists():
        assert "/build/collections/community.general" in ee_image["collections"], ee_image
        cg = subprocess.run(["podman", "run", "--rm", IMAGE, "ansible-doc", "-t", "module", "community.general.haproxy"],
                            env=dict(os.environ, CONTAINERS_CONF=str(conf)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
        assert cg.returncode == 0 and "haproxy" in cg.stdout.lower(), cg.stdout[-2000:]
    for h in HOSTS:
        fleet.ssh(h, sandbox.stale_server_cmd(fleet.python), check=True)
    outside, inside = _inventories(fleet, tmp_path)

    # 1. In the EE, on stale hosts: every host restarted and verified.
    _prepare(inside, tmp_path / "ee-first", inside=True)
    p = _runner(fleet, tmp_path / "ee-first", "ee-first", IMAGE, conf)
    first = _result(tmp_path / "ee-first", "ee-first")
    assert (p.returncode, first["rc"], first["status"]) == (0, 0, "successful"), p.stdout[-6000:]
    assert first["hosts"] == {h: ("ok", True, 2) for h in HOSTS}, first["hosts"]
    assert "GPUFLEET ROLLOUT SUMMARY" in first["stdout"] and first["summary_md"]

    # 2. The no-op rollout outside and then inside the EE: the same result, summary and artifacts.
    _prepare(outside, tmp_path / "out-noop", inside=False)
    p_out = _runner(fleet, tmp_path / "out-noop", "noop", None, conf)
    _prepare(inside, tmp_path / "ee-noop", inside=True)
    p_in = _runner(fleet, tmp_path / "ee-noop", "noop", IMAGE, conf)
    out, ins = _result(tmp_path / "out-noop", "noop"), _result(tmp_path / "ee-noop", "noop")
    assert p_out.returncode == p_in.returncode == 0, (p_out.stdout[-3000:], p_in.stdout[-3000:])
    assert out["hosts"] == ins["hosts"] == {h: ("ok", False, 2) for h in HOSTS}, (out["hosts"], ins["hosts"])
    for k in ("rc", "status", "halted", "events", "summary_md"):
        assert out[k] == ins[k], k
    # ansible-runner writes the same files; the container run adds only env.list (the variables it passes in) and
    # callback/ (its event callback plugin, which the container loads from there).
    assert set(ins["artifact_files"]) - set(out["artifact_files"]) <= {"env.list", "callback"}, (out["artifact_files"], ins["artifact_files"])
    assert set(out["artifact_files"]) <= set(ins["artifact_files"])

    # 3. A host that cannot be reached: the same failure inside and outside (exit status 4, status failed).
    (tmp_path / "u").mkdir()
    outside_u, inside_u = _inventories(fleet, tmp_path / "u", unreachable=["host2"])
    _prepare(outside_u, tmp_path / "out-unreach", inside=False)
    p_out = _runner(fleet, tmp_path / "out-unreach", "unreach", None, conf)
    _prepare(inside_u, tmp_path / "ee-unreach", inside=True)
    p_in = _runner(fleet, tmp_path / "ee-unreach", "unreach", IMAGE, conf)
    out, ins = _result(tmp_path / "out-unreach", "unreach"), _result(tmp_path / "ee-unreach", "unreach")
    assert out["rc"] == ins["rc"] == 4 and p_out.returncode == p_in.returncode != 0, (out["rc"], ins["rc"])
    assert out["status"] == ins["status"] == "failed"
    assert out["hosts"] == ins["hosts"], (out["hosts"], ins["hosts"])
    assert ins["hosts"]["host2"][0] == "unreachable" and ins["hosts"]["host1"][0] == "ok", ins["hosts"]


# ansible-navigator, as AAP users run an EE (docs/ci.md): its own venv, as scripts/build-ee keeps ansible-builder out of
# .venv; made on first use from the package index.
NAVIGATOR = "ansible-navigator==26.10.0"


def _navigator() -> Path:
    venv = ROOT / ".cache" / "ee" / "navigator-venv"
    exe = venv / "bin" / "ansible-navigator"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", NAVIGATOR],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, check=False)
        assert p.returncode == 0, p.stdout[-3000:]
    return exe


def _ci_md_block(lang: str, first_line: str) -> str:
    """The fenced block of docs/ci.md in LANG whose first line is FIRST_LINE (the Project's site.yml, ansible.cfg)."""
    text = (ROOT / "docs" / "ci.md").read_text()
    [body] = [b for b in text.split("```" + lang + "\n")[1:] if b.startswith(first_line + "\n")]
    return body.split("```", 1)[0]


def _ci_md_navigator_argv() -> t.List[str]:
    """docs/ci.md's ansible-navigator command (section "ansible-navigator")."""
    [line] = [x for x in (ROOT / "docs" / "ci.md").read_text().splitlines() if x.startswith("ansible-navigator run ")]
    return shlex.split(line)


def test_ansible_navigator_runs_the_rollout_in_the_ee(ee_image, sandbox_fleet, tmp_path):
    """docs/ci.md's `ansible-navigator run site.yml -i inventory --eei IMAGE --mode stdout ...`, in the project docs/ci.md
    shows (its site.yml and ansible.cfg): the rollout runs in the EE, the summary table ends the output, and the exit
    status is ansible-playbook's (0, then 4 with a host that cannot be reached)."""
    documented = _ci_md_navigator_argv()
    assert documented[:3] == ["ansible-navigator", "run", "site.yml"], documented
    assert {"--eei", "-i", "--mode"} <= set(documented) and documented[documented.index("--mode") + 1] == "stdout"
    fleet = sandbox_fleet(hosts=2, gpus=2)
    conf = _containers_conf(tmp_path)
    nav = _navigator()
    # ansible-navigator refuses podman without /dev/mqueue (POSIX message queues); a machine that is itself a
    # container may lack it (this one did).
    Path("/dev/mqueue").mkdir(exist_ok=True)
    project = tmp_path / "project"
    project.mkdir()
    (project / "site.yml").write_text(_ci_md_block("yaml", "# site.yml"))
    (project / "ansible.cfg").write_text(_ci_md_block("ini", "# ansible.cfg"))
    for h in HOSTS:
        fleet.ssh(h, sandbox.stale_server_cmd(fleet.python), check=True)
    _outside, inside = _inventories(fleet, tmp_path)
    (tmp_path / "u").mkdir()
    _outside_u, inside_u = _inventories(fleet, tmp_path / "u", unreachable=["host2"])
    key = yaml.safe_load(fleet.inventory.read_text())["all"]["hosts"]["host1"]["ansible_ssh_private_key_file"]

    def navigator(inventory: Path, summary: Path) -> subprocess.CompletedProcess:
        # The documented command with this fleet's inventory and the test's image, then the sandbox's network (the
        # hub's namespace), rootful podman's user and the fleet's key: the ansible-runner options above, in
        # ansible-navigator's words. The summary files go to the project directory, which ansible-navigator mounts
        # into the container at the same path.
        argv = [str(nav)] + documented[1:]
        argv[argv.index("-i") + 1] = str(inventory)
        argv[argv.index("--eei") + 1] = IMAGE
        argv += ["--container-engine", "podman", "--playbook-artifact-enable", "false",
                 "--log-file", str(tmp_path / "navigator.log"),
                 "--container-options=--network=ns:/run/netns/%s" % fleet.hub, "--container-options=--user=0",
                 "--eev", "%s:%s:ro" % (key, key), "--senv", "GPUFLEET_SUMMARY_DIR=%s" % summary,
                 "-e", json.dumps({"gpufleet_rollout_serial": ["100%"]})]
        t0 = time.monotonic()
        # A user's shell, not this test process's: other test files in this pytest worker set ANSIBLE_* variables
        # (ANSIBLE_COLLECTIONS_PATH to a private copy on this machine), and ansible-navigator hands them to the EE,
        # where that path does not exist and the collection is not found.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        p = subprocess.run(argv, cwd=str(project), env=dict(env, CONTAINERS_CONF=str(conf)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False)
        print("ansible-navigator (%s): rc=%d in %.1fs" % (summary.name, p.returncode, time.monotonic() - t0))
        return p

    def hosts(summary: Path) -> t.Dict[str, t.Any]:
        data = json.loads((summary / "rollout-summary.json").read_text())
        return {h["host"]: (h["status"], h["restarted"], h.get("workers_verified")) for h in data["hosts"]}

    p = navigator(inside, project / "summary")
    assert p.returncode == 0, p.stdout[-6000:]
    assert "GPUFLEET ROLLOUT SUMMARY" in p.stdout, p.stdout[-6000:]
    assert hosts(project / "summary") == {h: ("ok", True, 2) for h in HOSTS}

    p = navigator(inside_u, project / "summary-unreachable")
    assert p.returncode == 4, p.stdout[-6000:]
    assert "GPUFLEET ROLLOUT SUMMARY" in p.stdout, p.stdout[-6000:]
    got = hosts(project / "summary-unreachable")
    assert got["host2"][0] == "unreachable" and got["host1"][0] == "ok", got
