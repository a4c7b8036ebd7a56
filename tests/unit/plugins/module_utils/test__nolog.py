# SPDX-License-Identifier: GPL-3.0-or-later
"""_nolog.NoLogModule: no_log options masked in `invocation` whatever their length; elsewhere in the result only
values of MIN_MASKED characters or more, so a short value ("1") leaves the result's numbers alone."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _nolog

SPEC = dict(
    env=dict(type="dict", default={}, no_log=True),
    name=dict(type="str", default="x"),
    wait=dict(type="dict", options=dict(
        request=dict(type="dict", options=dict(url=dict(type="str"), headers=dict(type="dict", no_log=True))),
    )),
    items=dict(type="list", elements="dict", options=dict(secret=dict(type="str", no_log=True), n=dict(type="int"))),
)
SECRET = "hf_0123456789abcdef"
BEARER = "Bearer sk-abcdef0123456789"


def module_main(result, fail=False):
    def main():
        m = _nolog.NoLogModule(argument_spec=SPEC)
        if fail:
            m.fail_json(msg=result.pop("msg"), **result)
        m.exit_json(**result)
    return main


ARGS = {"env": {"HF_TOKEN": SECRET, "HF_HUB_OFFLINE": "1", "N": 7}, "name": "demo",
        "wait": {"request": {"url": "http://127.0.0.1/", "headers": {"Authorization": BEARER, "Accept": "*/*"}}},
        "items": [{"secret": "s3cr3t-item-value", "n": 1}, {"secret": "ab", "n": 2}]}


@pytest.mark.parametrize("fail", [False, True])
def test_invocation_masks_every_no_log_value_and_the_rest_of_the_result_keeps_its_numbers(run_module, fail):
    res = run_module(module_main({"msg": "log tail: token=%s 1 of 1" % SECRET, "pid": 12345, "timings": {"kill_s": 0.1},
                                  "count": 1}, fail=fail), ARGS)
    inv = res["invocation"]["module_args"]
    assert inv["env"] == {"HF_TOKEN": _nolog.MASK, "HF_HUB_OFFLINE": _nolog.MASK, "N": _nolog.MASK}
    assert inv["wait"]["request"] == {"url": "http://127.0.0.1/", "headers": {"Authorization": _nolog.MASK, "Accept": _nolog.MASK}}
    assert inv["items"] == [{"secret": _nolog.MASK, "n": 1}, {"secret": _nolog.MASK, "n": 2}]
    assert inv["name"] == "demo"
    # A long value is masked anywhere, by substring, as ansible's no_log does it; "1" is not.
    assert res["msg"] == "log tail: token=******** 1 of 1"
    assert (res["pid"], res["timings"], res["count"]) == (12345, {"kill_s": 0.1}, 1)
    assert res.get("failed", False) is fail
    assert SECRET not in str(res) and "sk-abcdef" not in str(res) and "s3cr3t-item-value" not in str(res)


def test_a_validation_failure_masks_as_ansible_does(run_module):
    """Before validation ends the module is a plain AnsibleModule: every no_log value is masked."""
    res = run_module(module_main({}), dict(ARGS, name=["not", "a", "str"], items=[{"n": "x"}]))
    assert res["failed"] is True and SECRET not in str(res)


def test_mask_no_log_follows_suboptions_and_lists():
    masked, found = _nolog.mask_no_log(SPEC, ARGS)
    assert sorted(found) == sorted([SECRET, "1", "7", BEARER, "*/*", "s3cr3t-item-value", "ab"])
    assert masked["name"] == "demo" and masked["wait"]["request"]["url"] == "http://127.0.0.1/"
    assert ARGS["env"]["HF_TOKEN"] == SECRET  # the params themselves are left alone
    assert _nolog.mask_no_log(SPEC, {"env": None, "wait": None}) == ({"env": None, "wait": None}, [])


TOKEN30 = "hf_PVbYcfn9Nvx65ZRgpczxWICGmwo2kM"[:30]


@pytest.mark.parametrize("fail", [False, True])
def test_a_piece_of_a_secret_left_by_truncation_is_masked(run_module, fail):
    """A message cut through a printed secret ("..." + the last 297 characters) keeps only a piece of it, which a
    substring match of the whole value misses: what a cut leaves of a long secret, 8 characters or more, is masked."""
    assert len(TOKEN30) == 30
    args = dict(ARGS, env={"HF_TOKEN": TOKEN30, "HF_HUB_OFFLINE": "1", "HF_HOME": "/data/models/hf"})
    res = run_module(module_main({"msg": "exited; log tail: ...%s | AAAA" % TOKEN30[-24:],
                                  "head": "token=%s" % TOKEN30[:10], "nested": {"k": ["x %s (cut)" % TOKEN30[:12]]},
                                  "word": "password", "pid": 12345, "count": 1, "tail": "1 of 1",
                                  "path": "log at /data/models/x.log"}, fail=fail), args)
    assert res["msg"] == "exited; log tail: ...******** | AAAA"
    assert res["head"] == "token=********" and res["nested"] == {"k": ["x ******** (cut)"]}
    # An unrelated 8-character word, numbers, a short value ("1") and a path that shares a directory with a
    # path-valued secret are kept.
    assert (res["word"], res["pid"], res["count"], res["tail"]) == ("password", 12345, 1, "1 of 1")
    assert res["path"] == "log at /data/models/x.log"
    text = str({k: v for k, v in res.items() if k != "invocation"})
    assert not any(TOKEN30[i:i + 8] in text for i in range(len(TOKEN30) - 7))


def test_mask_fragment_text():
    secrets = ["abcdefghijkl", "1", "short"]
    m = _nolog.mask_fragment_text
    assert m("x ...efghijkl y", secrets) == "x ...******** y"  # its end, after a cut
    assert m("x abcdefgh", secrets) == "x ********" and m("abcdefghi (", secrets) == "******** ("  # its beginning
    assert m("zabcdefghijklz", secrets) == "z********z"  # the whole secret, anywhere
    assert m("xefghijkl abcdefghx", secrets) == "xefghijkl abcdefghx"  # a run inside a word is no cut
    assert m("bcdefghijk", secrets) == "bcdefghijk"  # a middle piece: not what one cut leaves
    assert m("abcdefg", secrets) == "abcdefg" and m("...fghijkl", secrets) == "...fghijkl"  # 7 characters
    assert m("abcdefghijkl|efghijkl", secrets) == "********|********"
    assert m("cdefghijklabcdefghij", ["abcdefghijkl"]) == "********"  # adjacent pieces masked as one
    assert m("...ghijkl abcdefghijkl", ["abcdefghijkl"]) == "...ghijkl ********"
    assert _nolog.mask_fragments({"abcdefghi": ("1", 2)}, secrets) == {"********": ("1", 2)}
    assert _nolog.mask_fragments("abcdefgh", []) == "abcdefgh"
