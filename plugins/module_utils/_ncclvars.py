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
import json
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _envblock
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError

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

# Variables that change how every process on the host, the Python interpreter or the dynamic loader behaves. The
# layers write host-wide (every Python process; nccl.conf: NCCL setenv()s every NAME=VALUE line, NCCL_* or not), so
# these are refused even when listed in allow_vars: set them for one service instead (its launcher's environment).
# The loader's list is glibc's "unsecure" variables, the ones it drops for setuid programs
# (https://sourceware.org/git/?p=glibc.git;a=blob;f=sysdeps/generic/unsecvars.h).
_LOADER = "the dynamic loader or the C library reads it in every program"
_PYTHON = "the Python interpreter reads it when any Python process starts"
_PROCESS = "every program or shell reads it for its command search, home, temporary files, locale or time zone"
_RUNTIME = "another language runtime reads it to load code or options into each of its processes"
_NETWORK = "it redirects the network traffic or the TLS trust of every program that honours it"

FORBIDDEN_PREFIXES: t.Dict[str, str] = {
    "LD_": _LOADER, "MALLOC_": _LOADER, "PYTHON": _PYTHON, "LC_": _PROCESS, "BASH_FUNC_": _PROCESS,
}
FORBIDDEN_NAMES: t.Dict[str, str] = dict(
    [(n, _LOADER) for n in ("GLIBC_TUNABLES", "GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
                            "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR")]
    + [(n, _PROCESS) for n in ("PATH", "HOME", "SHELL", "IFS", "ENV", "BASH_ENV", "CDPATH", "PS4", "TMPDIR", "TMP",
                               "TEMP", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME")]
    + [(n, _RUNTIME) for n in ("PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH",
                               "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")]
    + [(n, _NETWORK) for n in ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE",
                               "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")])

ALLOW_OPTION = "allow_vars"


def forbidden_reason(name: str) -> t.Optional[str]:
    """Why `name` may never be written host-wide, or None. Case-insensitive: http_proxy is read as well as
    HTTP_PROXY, and no lower-case spelling of the others is worth allowing."""
    up = name.upper()
    if up in FORBIDDEN_NAMES:
        return FORBIDDEN_NAMES[up]
    for prefix, why in FORBIDDEN_PREFIXES.items():
        if up.startswith(prefix):
            return why
    return None


class NotAllowed(Exception):
    """Variable names the layers refuse to write host-wide; nothing has been changed when it is raised."""

    def __init__(self, msg: str, forbidden: t.Dict[str, str], not_allowed: t.List[str], bad_allow: t.List[str]) -> None:
        super().__init__(msg)
        self.extra: t.Dict[str, t.Any] = dict(forbidden_vars=forbidden, not_allowed_vars=not_allowed,
                                              bad_allow_vars=bad_allow)


def _are(items: t.Sized) -> str:
    return "is" if len(items) == 1 else "are"


def check_allowed(names: t.Iterable[str], allow: t.Optional[t.Iterable[t.Any]], option: str = ALLOW_OPTION) -> None:
    """Raise NotAllowed unless every name is NCCL_* or listed (exactly) in `allow`, and neither a name nor an allowed
    one is forbidden. `option` names the allow-list in the message (the module option or the role variable)."""
    allow = list(allow or [])
    bad_allow = sorted({repr(a) for a in allow if not isinstance(a, str) or not _envblock.ENV_NAME_RE.fullmatch(a)})
    allowed = {a for a in allow if isinstance(a, str)}
    names = sorted(set(names))
    forbidden = {n: why for n in sorted(set(names) | allowed) for why in [forbidden_reason(n)] if why}
    not_allowed = [n for n in names if not n.startswith("NCCL_") and n not in allowed and n not in forbidden]
    parts = []
    if bad_allow:
        parts.append("%s must list exact variable names (no patterns), got %s" % (option, ", ".join(bad_allow)))
    if forbidden:
        parts.append("%s %s never written host-wide, even when listed in %s; set %s in the service's own environment"
                     % (", ".join("%s (%s)" % kv for kv in forbidden.items()), _are(forbidden), option,
                        "it" if len(forbidden) == 1 else "them"))
    if not_allowed:
        parts.append("%s %s (NCCL_*); list each exact name in %s to write it host-wide"
                     % (", ".join(not_allowed), "is not an NCCL variable" if len(not_allowed) == 1
                        else "are not NCCL variables", option))
    if parts:
        raise NotAllowed("Refused variable name(s), nothing was changed: %s" % "; ".join(parts),
                         forbidden, not_allowed, bad_allow)


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


def check_names(names: t.Iterable[str], allow: t.Iterable[str] = ()) -> NameReport:
    """Only NCCL_* names are judged; other variables (CUDA_*, TORCH_NCCL_*) pass untouched. A name in `allow` is
    not called unknown (an NCCL variable newer than KNOWN)."""
    unknown: t.Dict[str, t.List[str]] = {}
    knobs: t.List[str] = []
    dep: t.Dict[str, str] = {}
    allowed = set(allow)
    for n in sorted(set(names)):
        if not n.startswith("NCCL_"):
            continue
        if n not in KNOWN and n not in allowed:
            unknown[n] = suggest(n)
            continue
        if n in DEBUG_KNOBS:
            knobs.append(n)
        if n in DEPRECATED:
            dep[n] = DEPRECATED[n]
    return NameReport(unknown, knobs, dep)


def apply_name_policy(warn: t.Callable[[str], None], names: t.Iterable[str], policy: str,
                      allow: t.Iterable[str] = ()) -> NameReport:
    """policy ignore|warn|fail: warn passes each warning to `warn`; fail refuses unknown names (StepError, before any
    change)."""
    report = check_names(names, allow)
    if policy == "ignore":
        return report
    if policy == "fail" and report.unknown:
        raise StepError("Unknown NCCL variable name(s): %s" % "; ".join(
            unknown_message(n, c) for n, c in sorted(report.unknown.items())), unknown_vars=report.unknown)
    for w in report.warnings():
        warn(w)
    return report


def role_names_refused(env: t.Any, profile: t.Any, allow_vars: t.Any, unknown_vars: t.Any = "warn") -> str:
    """The nccl_tuning role's refusal of gpufleet_nccl_env / gpufleet_nccl_allow_vars, before the host is touched:
    one sentence per rule broken, "" when the names are fine (the gpufleet.serving.nccl_names_refused filter).

    The same rules as check_allowed (which the layer modules apply), worded for the role's variables. Only names the
    modules would judge: none with profile none (the blocks are removed), none that are not valid names (the modules
    name those); input of the wrong type is the role's other check's to report. With unknown_vars "fail", unknown
    NCCL_* names too (the modules' nccl_names=fail): refused here, in the rollout's pre-tasks, a typo fails its host
    before any host of its batch is locked or changed, so max_fail_percentage stops the batch at once."""
    if profile == "none":
        return ""
    judged = sorted((str(k) for k in env if _envblock.ENV_NAME_RE.fullmatch(str(k))), key=str.lower) \
        if isinstance(env, t.Mapping) else []
    allowed = [a for a in allow_vars if isinstance(a, str)] \
        if isinstance(allow_vars, t.Sequence) and not isinstance(allow_vars, (str, bytes)) else []
    bad_allow = [a for a in allowed if not _envblock.ENV_NAME_RE.fullmatch(a)]
    # Each spelling by itself: http_proxy and HTTP_PROXY are both named.
    # A stable sort of an ordered de-duplication: spellings that differ only in case (http_proxy, HTTP_PROXY) keep
    # the user's order, not a set's hash order (which changes with PYTHONHASHSEED).
    forbidden = sorted(dict.fromkeys(n for n in judged + allowed if forbidden_reason(n)), key=str.lower)
    not_allowed = [n for n in judged if not n.startswith("NCCL_") and n not in allowed and n not in forbidden]
    parts = []
    if bad_allow:
        parts.append("gpufleet_nccl_allow_vars must list exact variable names (no patterns), got "
                     + ", ".join(json.dumps(a) for a in bad_allow))
    if forbidden:
        parts.append("%s %s never written host-wide, even when listed in gpufleet_nccl_allow_vars; give %s to the "
                     "server alone (gpufleet_server_env)"
                     % (", ".join("%s (%s)" % (n, forbidden_reason(n)) for n in forbidden), _are(forbidden),
                        "it" if len(forbidden) == 1 else "them"))
    if not_allowed:
        parts.append("%s in gpufleet_nccl_env %s (NCCL_*): list each exact name in gpufleet_nccl_allow_vars to write "
                     "it host-wide, or give it to the server alone (gpufleet_server_env)"
                     % (", ".join(not_allowed), "is not an NCCL variable" if len(not_allowed) == 1
                        else "are not NCCL variables"))
    if unknown_vars == "fail":
        unknown = check_names(judged, allowed).unknown
        if unknown:
            parts.append("unknown NCCL variable name(s) with gpufleet_nccl_unknown_vars=fail: %s" % "; ".join(
                unknown_message(n, c) for n, c in sorted(unknown.items())))
    return "; ".join(parts)


def auto_profile(gpu_info: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """What gpufleet_nccl_profile auto resolves to from a host's gpu_info result: `profile`, pcie_only when no NVLink is
    active, else nvlink; `warning`, why nvlink was chosen when the NVLink state is unknown (None otherwise). The one
    rule, for the nccl_tuning role (the nccl_auto_profile filter) and the rollout's check (the rollout_check action)."""
    active = gpu_info.get("nvlink_active")
    warning = None
    if active is None:
        warning = ("gpu_info could not tell whether NVLink is active (backend %s); the auto profile chose nvlink, which "
                   "sets no protocol or algorithm overrides. Set gpufleet_nccl_profile to pcie_only explicitly on "
                   "PCIe-only boxes." % gpu_info.get("backend"))
    return {"profile": "pcie_only" if active is False else "nvlink", "warning": warning}
