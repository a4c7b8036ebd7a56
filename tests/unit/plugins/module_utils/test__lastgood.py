# SPDX-License-Identifier: GPL-3.0-or-later
"""The last known good generations beside a service's state file."""
from __future__ import annotations

import json
import os
import stat

from ansible_collections.gpufleet.serving.plugins.module_utils import _lastgood

P = {"launcher": "process", "command": ["python3", "-m", "sglang.launch_server"], "env": {"HF_TOKEN": "hf_secret"},
     "env_passthrough": [], "user": "root", "workdir": "/", "umask": "0022", "tag_name": "GPUFLEET_SERVICE",
     "systemd": None, "name": "ignored"}


def test_the_file_lies_beside_the_state_file():
    assert _lastgood.path_for("/var/lib/gpufleet/sglang.json") == "/var/lib/gpufleet/sglang.last_good.json"
    assert _lastgood.path_for("/var/lib/gpufleet/state") == "/var/lib/gpufleet/state.last_good.json"


def test_generations_newest_first_one_per_fingerprint_bounded_and_root_only(tmp_path):
    path = str(tmp_path / "sglang.last_good.json")
    for fp in ("a", "b", "a", "c", "d"):
        gens = _lastgood.keep(path, _lastgood.generation(P, fp, {"median": 1.0}, {"nccl_conf": {"env": {}}}), 3)
    assert [g["fingerprint"] for g in gens] == ["d", "c", "a"]
    assert json.loads(open(path).read())["generations"] == gens
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    g = gens[0]
    assert g["command"] == P["command"] and g["env"] == {"HF_TOKEN": "hf_secret"} and g["layers"] and "name" not in g
    shown = _lastgood.summary(gens)
    assert shown[0] == {"fingerprint": "d", "recorded_at": g["recorded_at"], "gate_median": 1.0}
    assert "hf_secret" not in json.dumps(shown)


def test_an_unreadable_file_is_no_generations_and_is_replaced(tmp_path):
    path = tmp_path / "x.last_good.json"
    for text in ("not json", '{"generations": "x"}', "[1]"):
        path.write_text(text)
        assert _lastgood.read(str(path)) == []
    gens = _lastgood.keep(str(path), _lastgood.generation(P, "a", None, None), 3)
    assert [g["fingerprint"] for g in gens] == ["a"] and gens[0]["gate"] is None and gens[0]["layers"] is None
