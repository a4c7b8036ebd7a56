# SPDX-License-Identifier: GPL-3.0-or-later
"""_ncclconf: values NCCL can read back exactly, and the file read the way NCCL's setEnvFile reads it."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock, _ncclconf


@pytest.mark.parametrize("value,why", [
    ("a\nb", "line break"), ("a\rb", "line break"), (" LL", "whitespace"), ("LL ", "whitespace"),
    ("", "empty"), ("x" * 1024, "1023 bytes"),
])
def test_unreadable_values_are_refused(value, why):
    with pytest.raises(_envblock.BlockError, match=why):
        _ncclconf.check_values({"NCCL_PROTO": value})


def test_values_nccl_keeps_are_accepted():
    _ncclconf.check_values({"NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA": "^mlx5_0:1,mlx5_1", "X": "x" * 1023})


def test_parse_like_nccl():
    text = ("# comment NCCL_PROTO=Simple\n"
            "NCCL_SOCKET_IFNAME==ens1f0\n"
            "no equals sign here\n"
            "NCCL_PROTO=LL\r\n"
            "NCCL_PROTO=Simple\n"
            "NCCL_DEBUG=WARN")
    got = _ncclconf.parse_conf(text)
    assert got == {"NCCL_SOCKET_IFNAME": ("=ens1f0", 2), "NCCL_PROTO": ("LL", 4), "NCCL_DEBUG": ("WARN", 6)}


def test_rendered_block_reads_back_and_markers_are_invisible_to_nccl():
    env = {"NCCL_PROTO": "LL", "NCCL_SOCKET_IFNAME": "=eth0", "NCCL_BUFFSIZE": "16777216"}
    text = _envblock.replace_block(None, "nccl", _ncclconf.render_body(env), _ncclconf.HEADER)
    # Old NCCL releases do not skip '#' lines, only lines without '=': keep '=' out of every comment line.
    assert all("=" not in line for line in text.splitlines() if line.startswith("#"))
    assert {k: v for k, (v, _line) in _ncclconf.parse_conf(text).items()} == env
