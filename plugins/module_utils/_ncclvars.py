# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Known NCCL environment variables, tuning profiles, and name checks.

Names come from NVIDIA's "Environment Variables" page of the NCCL user guide
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, releases 2.4 to 2.2x),
including renamed and deprecated ones that older NCCL releases still read.
"""

from __future__ import annotations

import difflib
import typing as t

KNOWN: t.FrozenSet[str] = frozenset("""
NCCL_ALGO NCCL_ALLOC_P2P_NET_LL_BUFFERS NCCL_BUFFSIZE NCCL_CGA_CLUSTER_SIZE NCCL_CHECK_POINTERS
NCCL_CHECKS_DISABLE NCCL_COLLNET_ENABLE NCCL_COLLNET_NODE_THRESHOLD NCCL_COMM_BLOCKING NCCL_COMM_ID
NCCL_COMM_SPLIT_SHARE_RESOURCES NCCL_CONF_FILE NCCL_CROSS_NIC NCCL_CTA_POLICY NCCL_CUMEM_ENABLE
NCCL_CUMEM_HOST_ENABLE NCCL_DEBUG NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT
NCCL_DEBUG_TIMESTAMP_LEVELS NCCL_DMABUF_ENABLE NCCL_GDRCOPY_ENABLE NCCL_GDRCOPY_FIFO_ENABLE
NCCL_GDRCOPY_FLUSH_ENABLE NCCL_GDRCOPY_SYNC_ENABLE NCCL_GRAPH_DUMP_FILE NCCL_GRAPH_FILE NCCL_GRAPH_HELPER_DISABLE
NCCL_GRAPH_MIXING_SUPPORT NCCL_GRAPH_REGISTER NCCL_HOSTID NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ADDR_FAMILY
NCCL_IB_ADDR_RANGE NCCL_IB_AR_THRESHOLD NCCL_IB_CUDA_SUPPORT NCCL_IB_DATA_DIRECT NCCL_IB_DISABLE NCCL_IB_ECE_ENABLE
NCCL_IB_FIFO_TC NCCL_IB_GDR_LEVEL NCCL_IB_GID_INDEX NCCL_IB_HCA NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS
NCCL_IB_OOO_RQ NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_PKEY NCCL_IB_QPS_PER_CONNECTION NCCL_IB_RETRY_CNT
NCCL_IB_RETURN_ASYNC_EVENTS NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_TC
NCCL_IB_TIMEOUT NCCL_IB_USE_INLINE NCCL_IGNORE_CPU_AFFINITY NCCL_IGNORE_DISABLED_P2P NCCL_LAUNCH_MODE
NCCL_LAUNCH_ORDER_IMPLICIT NCCL_LL128_BUFFSIZE NCCL_LL128_NTHREADS NCCL_LL_BUFFSIZE NCCL_LL_THRESHOLD
NCCL_LOCAL_REGISTER NCCL_MAX_CTAS NCCL_MAX_NCHANNELS NCCL_MAX_NRINGS NCCL_MAX_P2P_NCHANNELS NCCL_MEM_SYNC_DOMAIN
NCCL_MIN_CTAS NCCL_MIN_NCHANNELS NCCL_MIN_NRINGS NCCL_MIN_P2P_NCHANNELS NCCL_MNNVL_ENABLE NCCL_MNNVL_UUID
NCCL_MNNVL_CLIQUE_ID NCCL_NCHANNELS_PER_NET_PEER NCCL_NET NCCL_NET_DISABLE_INTRA NCCL_NET_FORCE_FLUSH
NCCL_NET_GDR_C2C NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_MERGE_LEVEL NCCL_NET_OVERHEAD NCCL_NET_PLUGIN
NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS NCCL_NSOCKS_PERTHREAD NCCL_NTHREADS NCCL_NVB_DISABLE
NCCL_NVB_PRECONNECT NCCL_NVLS_CHUNKSIZE NCCL_NVLS_ENABLE NCCL_NVLS_NCHANNELS NCCL_NVLSTREE_MAX_CHUNKSIZE
NCCL_P2P_DIRECT_DISABLE NCCL_P2P_DISABLE NCCL_P2P_LEVEL NCCL_P2P_LL_THRESHOLD NCCL_P2P_NET_CHUNKSIZE
NCCL_P2P_NVL_CHUNKSIZE NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_PXN_LEVEL NCCL_P2P_READ_ENABLE NCCL_P2P_USE_CUDA_MEMCPY
NCCL_PROFILER_PLUGIN NCCL_PROTO NCCL_PXN_C2C NCCL_PXN_DISABLE NCCL_RAS_ADDR NCCL_RAS_ENABLE
NCCL_RAS_TIMEOUT_FACTOR NCCL_RINGS NCCL_RUNTIME_CONNECT NCCL_SET_STACK_SIZE NCCL_SET_THREAD_NAME
NCCL_SHM_DISABLE NCCL_SHM_LOCALITY NCCL_SHM_MEMCPY_MODE NCCL_SHM_USE_CUDA_MEMCPY NCCL_SINGLE_RING_THRESHOLD
NCCL_SOCKET_FAMILY NCCL_SOCKET_IFNAME NCCL_SOCKET_NTHREADS NCCL_SOCKET_RETRY_CNT NCCL_SOCKET_RETRY_SLEEP_MSEC
NCCL_TOPO_DUMP_FILE NCCL_TOPO_FILE NCCL_TREE_THRESHOLD NCCL_TUNER_CONFIG_FILE NCCL_TUNER_PLUGIN
NCCL_WARN_ENABLE_DEBUG_INFO NCCL_WORK_FIFO_BYTES NCCL_WORK_FIFO_DEPTH
""".split())

# NVIDIA's env page files these under "Debugging": not for production, and
# "keeping them set may result in sub-optimal behavior, crashes, or hangs".
DEBUG_KNOBS: t.FrozenSet[str] = frozenset([
    "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_NTHREADS",
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_PROTO", "NCCL_SHM_DISABLE",
])

DEPRECATED: t.Dict[str, str] = {
    "NCCL_MAX_NCHANNELS": "NCCL_MAX_NCHANNELS is deprecated since NCCL 2.17 in favour of NCCL_MAX_CTAS",
    "NCCL_MIN_NCHANNELS": "NCCL_MIN_NCHANNELS is deprecated since NCCL 2.17 in favour of NCCL_MIN_CTAS",
    "NCCL_IB_GDR_LEVEL": "NCCL_IB_GDR_LEVEL was renamed NCCL_NET_GDR_LEVEL (NCCL 2.4)",
    "NCCL_RINGS": "NCCL_RINGS was removed in NCCL 2.5 (rings are computed from the topology)",
    "NCCL_MAX_NRINGS": "NCCL_MAX_NRINGS was renamed NCCL_MAX_NCHANNELS, itself deprecated for NCCL_MAX_CTAS",
    "NCCL_MIN_NRINGS": "NCCL_MIN_NRINGS was renamed NCCL_MIN_NCHANNELS, itself deprecated for NCCL_MIN_CTAS",
}

# The seed's measured set: 94 vs 59 tok/s on a PCIe-only 8-GPU box.
PROFILES: t.Dict[str, t.Dict[str, str]] = {
    "pcie_only": {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    },
    # NVLink boxes: NCCL's own topology detection is right; no protocol/algorithm overrides.
    "nvlink": {},
    "none": {},
    "custom": {},
}
PROFILE_CHOICES = ["auto", "pcie_only", "nvlink", "none", "custom"]


def auto_profile(nvlink_active: t.Optional[bool]) -> t.Tuple[str, t.Optional[str]]:
    """(profile, note) from gpu_info's nvlink_active: pcie_only only when NVLink is known to be absent."""
    if nvlink_active is False:
        return "pcie_only", None
    if nvlink_active is True:
        return "nvlink", None
    return "nvlink", "NVLink state is unknown (nvidia-smi backend?); auto chose nvlink, which sets no overrides"


def suggest(name: str) -> t.List[str]:
    return difflib.get_close_matches(name, sorted(KNOWN), n=3, cutoff=0.75)


class NameReport(t.NamedTuple):
    unknown: t.Dict[str, t.List[str]]  # name -> close matches
    debug_knobs: t.List[str]
    deprecated: t.Dict[str, str]

    def warnings(self) -> t.List[str]:
        out = []
        for name, close in sorted(self.unknown.items()):
            out.append(unknown_message(name, close))
        if self.debug_knobs:
            out.append(
                "%s %s NCCL debugging knobs: NVIDIA's NCCL documentation says they should not be used in production "
                "and that keeping them set may cause sub-optimal behaviour, crashes or hangs; keep them only where a "
                "benchmark on that hardware justifies them" % (", ".join(self.debug_knobs),
                                                               "is an" if len(self.debug_knobs) == 1 else "are"))
        for name in sorted(self.deprecated):
            out.append(self.deprecated[name])
        return out


def unknown_message(name: str, close: t.Sequence[str]) -> str:
    hint = " (did you mean %s?)" % " or ".join(close) if close else ""
    return "%s is not a known NCCL environment variable%s" % (name, hint)


def check_names(names: t.Iterable[str]) -> NameReport:
    """Only NCCL_* names are judged; other variables (CUDA_*, TORCH_NCCL_*) pass untouched."""
    unknown: t.Dict[str, t.List[str]] = {}
    knobs: t.List[str] = []
    dep: t.Dict[str, str] = {}
    for n in sorted(set(names)):
        if not n.startswith("NCCL_"):
            continue
        if n not in KNOWN:
            unknown[n] = suggest(n)
            continue
        if n in DEBUG_KNOBS:
            knobs.append(n)
        if n in DEPRECATED:
            dep[n] = DEPRECATED[n]
    return NameReport(unknown, knobs, dep)


def apply_name_policy(module: t.Any, names: t.Iterable[str], policy: str) -> NameReport:
    """policy ignore|warn|fail: warn emits module warnings; fail refuses unknown names (before any change)."""
    report = check_names(names)
    if policy == "ignore":
        return report
    if policy == "fail" and report.unknown:
        module.fail_json(msg="Unknown NCCL variable name(s): %s" % "; ".join(
            unknown_message(n, c) for n, c in sorted(report.unknown.items())), unknown_vars=report.unknown)
    for w in report.warnings():
        module.warn(w)
    return report
