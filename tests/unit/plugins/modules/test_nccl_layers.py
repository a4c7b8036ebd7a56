# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl_layers: both layers in one call, real files in tmp_path; the interpreter that imports the sitecustomize is
this test's own (probe_env PYTHONPATH). The roles' runs against real hosts are in tests/nccl and tests/rollout."""
from __future__ import annotations

import sys

import pytest

from ansible_collections.gpufleet.serving.plugins.modules import nccl_layers

ENV = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}


@pytest.fixture
def args(tmp_path):
    site = dict(path=str(tmp_path / "sitecustomize.py"), interpreters=[sys.executable],
                probe_env={"PYTHONPATH": str(tmp_path)}, env=dict(ENV))
    return dict(sitecustomize=site, nccl_conf=dict(path=str(tmp_path / "nccl.conf"), env=dict(ENV)))


def test_both_layers_are_written_once_and_check_mode_predicts_it(run_module, args, tmp_path):
    check = run_module(nccl_layers.main, args, check_mode=True)
    assert check["changed"] and not (tmp_path / "sitecustomize.py").exists() and not (tmp_path / "nccl.conf").exists()
    real = run_module(nccl_layers.main, args)
    assert real["changed"] and real["sitecustomize"]["changed"] and real["nccl_conf"]["changed"]
    assert real["sitecustomize"]["effective_env"][sys.executable] == ENV
    assert "NCCL_PROTO=LL" in (tmp_path / "nccl.conf").read_text()
    again = run_module(nccl_layers.main, args)
    assert not again["changed"] and not again["sitecustomize"]["changed"] and not again["nccl_conf"]["changed"]


def test_one_layer_alone_leaves_the_other_alone(run_module, args, tmp_path):
    res = run_module(nccl_layers.main, dict(nccl_conf=args["nccl_conf"]))
    assert res["changed"] and "sitecustomize" not in res and not (tmp_path / "sitecustomize.py").exists()


def test_a_value_nccl_conf_refuses_leaves_both_layers_untouched(run_module, args, tmp_path):
    bad = {"NCCL_SOCKET_IFNAME": " eth0"}  # edge whitespace: sitecustomize would take it, nccl.conf cannot
    res = run_module(nccl_layers.main, dict(sitecustomize=dict(args["sitecustomize"], env=bad),
                                            nccl_conf=dict(args["nccl_conf"], env=bad)))
    assert res["failed"] and res["failed_layer"] == "nccl_conf" and "nothing was changed" in res["msg"]
    assert not (tmp_path / "sitecustomize.py").exists() and not (tmp_path / "nccl.conf").exists()


@pytest.mark.parametrize("layer, extra, says", [
    ("sitecustomize", {"no_such_option": 1}, "no_such_option"),
    ("nccl_conf", {"state": "sideways"}, "state"),
    ("nccl_conf", {"backup": True}, "set backup on the task"),
])
def test_invalid_layer_options_are_refused_naming_the_layer(run_module, args, tmp_path, layer, extra, says):
    res = run_module(nccl_layers.main, dict(args, **{layer: dict(args[layer], **extra)}))
    assert res["failed"] and res["failed_layer"] == layer and res["msg"].startswith(layer + ": ") and says in res["msg"]
    assert not (tmp_path / "sitecustomize.py").exists() and not (tmp_path / "nccl.conf").exists()


def test_no_layer_is_refused(run_module):
    res = run_module(nccl_layers.main, {})
    assert res["failed"] and "sitecustomize" in res["msg"] and "nccl_conf" in res["msg"]


def test_a_refusal_that_says_nothing_was_changed_says_it_once(run_module, args, tmp_path):
    # NCCL takes the first line for a name: a variable set above gpufleet's block would shadow the block's line.
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_PROTO=Simple\n")
    res = run_module(nccl_layers.main, args)
    assert res["failed"] and res["failed_layer"] == "nccl_conf", res
    assert "NCCL_PROTO (line 1)" in res["msg"] and res["msg"].count("nothing was changed") == 1, res["msg"]
    assert conf.read_text() == "NCCL_PROTO=Simple\n" and not (tmp_path / "sitecustomize.py").exists()


def test_the_layers_a_call_changed_are_put_back_byte_for_byte_from_its_snapshot(run_module, args, tmp_path):
    """keep_previous: each file as it was before the call changed it (an existing sitecustomize.py of 0640 with its
    own lines, an absent nccl.conf); restore_previous puts them back (check mode first: it only says so) and drops the
    snapshot. The gpu_server role does it after a restart refused before its kill."""
    site, conf, snap = tmp_path / "sitecustomize.py", tmp_path / "nccl.conf", tmp_path / "run" / "layers.json"
    site.write_bytes(b"import os  # the host's own \xff\n")
    site.chmod(0o640)
    before = site.read_bytes()
    res = run_module(nccl_layers.main, dict(args, keep_previous=str(snap)))
    assert res["changed"] and site.read_bytes() != before and conf.exists() and res["previous_kept"] == str(snap)
    assert oct(snap.stat().st_mode & 0o777) == "0o600"
    check = run_module(nccl_layers.main, {"restore_previous": str(snap)}, check_mode=True)
    assert check["changed"] and sorted(check["restored"]) == sorted([str(site), str(conf)]) and snap.exists()
    res = run_module(nccl_layers.main, {"restore_previous": str(snap)})
    assert res["changed"] and site.read_bytes() == before and oct(site.stat().st_mode & 0o777) == "0o640"
    assert not conf.exists() and not snap.exists()
    again = run_module(nccl_layers.main, {"restore_previous": str(snap)})  # nothing kept: nothing to do
    assert not again["changed"] and again["restored"] == []


def test_a_call_that_changes_nothing_leaves_no_snapshot_and_drops_an_earlier_one(run_module, args, tmp_path):
    snap = tmp_path / "layers.json"
    run_module(nccl_layers.main, args)
    snap.write_text('{"files": [{"path": "%s", "content": null}]}' % (tmp_path / "nccl.conf"))
    res = run_module(nccl_layers.main, dict(args, keep_previous=str(snap)))
    assert not res["changed"] and not snap.exists() and "previous_kept" not in res
    assert not run_module(nccl_layers.main, {"restore_previous": str(snap)})["changed"]
    assert (tmp_path / "nccl.conf").exists()


def test_restore_previous_is_not_mixed_with_layers(run_module, args, tmp_path):
    res = run_module(nccl_layers.main, dict(args, restore_previous=str(tmp_path / "layers.json")))
    assert res["failed"] and "mutually exclusive" in res["msg"]
    assert not (tmp_path / "sitecustomize.py").exists()


@pytest.mark.parametrize("entry", ['{"path": "%s"}', '{"path": "%s", "content": "not base64!", "mode": 420, "uid": 0, '
                                   '"gid": 0}'], ids=["no-content", "bad-base64"])
def test_a_broken_snapshot_is_a_clear_failure_not_a_traceback(run_module, tmp_path, entry):
    target, snap = tmp_path / "nccl.conf", tmp_path / "layers.json"
    target.write_text("NCCL_PROTO=LL\n")
    snap.write_text('{"files": [%s]}' % (entry % target))
    res = run_module(nccl_layers.main, {"restore_previous": str(snap)})
    assert res["failed"] and "is not a snapshot of the NCCL layers" in res["msg"], res
    assert "Traceback" not in res["msg"] and target.read_text() == "NCCL_PROTO=LL\n"
