# SPDX-License-Identifier: GPL-3.0-or-later
"""Unit-test harness.

- Imports go through a private copy of the checkout laid out as ansible_collections/gpufleet/serving
  (collection_copy.py), made before any test module is imported, so `ansible_collections.gpufleet.serving...`
  resolves exactly as it does on a target, and a concurrent pytest run re-copying collections/ cannot race us.
- The test-only fake pynvml (tests/fakes/nvml) is put first on sys.path BEFORE _nvml is imported, so the
  product's `import pynvml` binds to the fake: the only double, at the NVML boundary.
- `run_module` runs a module's real main() in-process with `patch_module_args` (core 2.19+), lets the real
  exit_json/fail_json print their JSON and raise SystemExit, and returns the parsed result.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import typing as t
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible.module_utils.common.parameters import PASS_VARS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from collection_copy import use_private_collections  # noqa: E402
from helpers import FAKE_NVML_DIR, FakeGpus  # noqa: E402

use_private_collections()
# First on sys.path even if another test directory appended it earlier in this process, and drop a real
# nvidia-ml-py (or module_utils bound to it) imported before this conftest, so `import pynvml` is the fake.
while str(FAKE_NVML_DIR) in sys.path:
    sys.path.remove(str(FAKE_NVML_DIR))
sys.path.insert(0, str(FAKE_NVML_DIR))
_real = sys.modules.get("pynvml")
if _real is not None and not str(getattr(_real, "__file__", "")).startswith(str(FAKE_NVML_DIR)):
    for _name in [m for m in sys.modules if m == "pynvml" or m.startswith("ansible_collections.gpufleet.")]:
        del sys.modules[_name]

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # pragma: no cover - ansible-core < 2.19
    import contextlib
    from unittest import mock

    from ansible.module_utils import basic

    @contextlib.contextmanager
    def patch_module_args(args=None):
        data = json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode()
        with mock.patch.object(basic, "_ANSIBLE_ARGS", data):
            yield


# ansible-core 2.21+ returns `invocation` (the masked module args) only when the controller asks, as it does
# with ANSIBLE_INJECT_INVOCATION=true; older cores always return it and refuse the unknown key. Ask, so the
# no_log tests read the same invocation on every core.
_ASKS_FOR_INVOCATION = "inject_invocation" in PASS_VARS


UNIT_DIR = Path(__file__).resolve().parent
FAST_MARKER = "fast: the fast tier (tests/unit and pure tests): `pytest -m fast`, CONTRIBUTING.md"


RELIABILITY_MARKER = "reliability(section, case, provoked, outcome): one row of docs/reliability.md (tests/reliability/gen_table.py)"


def pytest_configure(config):
    # pyproject.toml registers the markers for `pytest`; ansible-test units runs pytest with its own ini file and
    # --strict-markers (a unit test can be a row of docs/reliability.md).
    config.addinivalue_line("markers", FAST_MARKER)
    config.addinivalue_line("markers", RELIABILITY_MARKER)


def pytest_collection_modifyitems(config, items):
    # Every unit test is in the fast tier (the hook sees the whole session's items: mark only ours).
    for item in items:
        if UNIT_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.fast)


@pytest.fixture
def nvml(tmp_path, monkeypatch) -> FakeGpus:
    """Two fake H200s for in-process use; FAKE_NVML_CONFIG is set in this process's environment."""
    fg = FakeGpus(tmp_path / "nvml")
    fg.configure(gpus=2)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(fg.config))
    yield fg
    fg.cleanup()


@pytest.fixture
def run_module(capsys) -> t.Callable[..., t.Dict[str, t.Any]]:
    """Run a module's main() with the given args; return its JSON result (with 'failed' when it failed)."""

    def run(main: t.Callable[[], None], args: t.Dict[str, t.Any], check_mode: bool = False) -> t.Dict[str, t.Any]:
        a = dict(args)
        if _ASKS_FOR_INVOCATION:
            a["_ansible_inject_invocation"] = True
        if check_mode:
            a["_ansible_check_mode"] = True
        capsys.readouterr()
        with patch_module_args(a):
            with pytest.raises(SystemExit) as exc:
                main()
        out = capsys.readouterr().out
        res = json.loads(out)
        assert exc.value.code == (1 if res.get("failed") else 0), out
        return res

    return run


def env_without(*keys: str) -> t.Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in keys}


class _Handler(BaseHTTPRequestHandler):
    # Set per test on the server object: health codes to return in order (last repeats), generate code/body.
    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        s = self.server
        if self.path == "/health":
            code = s.health[min(s.health_calls, len(s.health) - 1)]
            s.health_calls += 1
            self._send(code, "ok" if code == 200 else "loading")
        else:
            self._send(404, "no")

    def do_POST(self):
        s = self.server
        n = int(self.headers.get("Content-Length") or 0)
        s.bodies.append(self.rfile.read(n).decode())
        s.content_types.append(self.headers.get("Content-Type"))
        if s.hang:
            time.sleep(s.hang)
        self._send(s.gen_code, s.gen_body)


@pytest.fixture
def http_server():
    """A real HTTP server in a thread: GET /health answers srv.health codes in turn (the last repeats), POST
    records its body in srv.bodies (its Content-Type in srv.content_types) and answers srv.gen_code/srv.gen_body after srv.hang seconds."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.health, srv.health_calls, srv.bodies, srv.content_types = [200], 0, [], []
    srv.gen_code, srv.gen_body, srv.hang = 200, '{"text": "pong"}', 0
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    srv.url = "http://127.0.0.1:%d" % srv.server_address[1]
    yield srv
    srv.shutdown()
    srv.server_close()
