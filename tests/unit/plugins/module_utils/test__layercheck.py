# SPDX-License-Identifier: GPL-3.0-or-later
"""_layercheck, server_state's "are the NCCL layers already as asked?": the layer modules' own code in check mode on
real files: up to date only after the layer module wrote them, and again not once a value, the file or (for
sitecustomize) what the interpreter sees differs; bad layer options are an error, not a crash."""
from __future__ import annotations

import sys

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.serving.plugins.module_utils import _layercheck
from ansible_collections.gpufleet.serving.plugins.modules import nccl_conf, sitecustomize_env

ENV = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}


def up_to_date(layers):
    with patch_module_args({"nccl_layers": layers}):
        m = AnsibleModule(argument_spec=dict(nccl_layers=dict(type="dict", options=_layercheck.argument_spec())),
                          supports_check_mode=True)
        return _layercheck.up_to_date({k: v for k, v in m.params["nccl_layers"].items() if v is not None})


def test_no_layer_asked_is_up_to_date():
    assert up_to_date({}) == {"up_to_date": True}


def test_nccl_conf_layer(tmp_path, run_module):
    conf = {"path": str(tmp_path / "nccl.conf"), "env": ENV}
    assert up_to_date({"nccl_conf": conf})["up_to_date"] is False  # no file yet
    assert not (tmp_path / "nccl.conf").exists()  # the check wrote nothing
    assert run_module(nccl_conf.main, conf)["changed"] is True
    got = up_to_date({"nccl_conf": conf})
    assert got == {"up_to_date": True, "nccl_conf": {"up_to_date": True, "files": [conf["path"]]}}
    assert up_to_date({"nccl_conf": dict(conf, env=dict(ENV, NCCL_PROTO="LL"))})["up_to_date"] is False
    assert up_to_date({"nccl_conf": dict(conf, state="absent")})["up_to_date"] is False


def test_nccl_conf_layer_with_a_file_others_cannot_read_names_the_access_fix(tmp_path, run_module):
    conf = {"path": str(tmp_path / "nccl.conf"), "env": ENV}
    run_module(nccl_conf.main, conf)
    (tmp_path / "nccl.conf").chmod(0o600)
    got = up_to_date({"nccl_conf": conf})
    assert got["up_to_date"] is False and got["nccl_conf"]["access"], got


@pytest.mark.parametrize("layer,params,msg", [
    ("nccl_conf", {"env": ENV, "state": "gone"}, "state"),
    ("nccl_conf", {"env": ENV, "bogus": 1}, "bogus"),
    ("sitecustomize", {"env": ENV, "mode": "replace"}, "mode"),
])
def test_bad_layer_options_are_an_error_of_that_layer(layer, params, msg):
    got = up_to_date({layer: params})
    assert got["up_to_date"] is False and msg in got[layer]["error"], got


def test_a_layer_whose_module_fails_is_not_up_to_date(tmp_path):
    got = up_to_date({"sitecustomize": {"path": str(tmp_path / "ld.so.preload"), "env": ENV,
                                        "interpreters": [sys.executable]}})
    assert got["up_to_date"] is False and "path must name a sitecustomize.py" in got["sitecustomize"]["error"], got


def test_sitecustomize_layer_is_up_to_date_only_where_the_interpreter_sees_it(tmp_path, run_module):
    site = tmp_path / "site"
    site.mkdir()
    layer = {"path": str(site / "sitecustomize.py"), "env": ENV, "interpreters": [sys.executable],
             "probe_env": {"PYTHONPATH": str(site)}}
    assert up_to_date({"sitecustomize": layer})["up_to_date"] is False
    assert run_module(sitecustomize_env.main, layer)["changed"] is True
    got = up_to_date({"sitecustomize": layer})
    assert got["up_to_date"] is True and got["sitecustomize"]["files"] == [layer["path"]], got
    # The same file, but the interpreter does not import it: written, not effective, so not up to date.
    got = up_to_date({"sitecustomize": dict(layer, probe_env={})})
    assert got["up_to_date"] is False, got
