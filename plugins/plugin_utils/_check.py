# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_server role's decision after its check of a host, on the controller (the server_state action, O(decide)).

Pure functions of the check's result and the run's inputs: whether the host is restarted, what its summary row starts
with, whether a host an earlier run left drained only goes back into rotation, and the refusals that come before any
of it. They were role tasks (a `fail` or `set_fact` each, one task execution per host even when skipped: issue 25);
here they are one call and unit-tested.
"""

from __future__ import annotations

import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils._balancer import foreign_text, other_server
from ansible_collections.gpufleet.serving.plugins.module_utils._rotation import stale

Result = t.Dict[str, t.Any]


def unknown_nccl_refusal(profile: str) -> str:
    """The inventory asks for a profile but this run does not know its variables: the fingerprint and the workers'
    check need them, and a restart would record a different fingerprint and flap."""
    return ("gpufleet_nccl_profile is %s but this run does not know its NCCL variables: the nccl_tuning role did not run "
            "on this host before this check (this play does not include it, or --tags/--skip-tags left it out); the "
            "server's fingerprint and the workers' check need them. Include the gpufleet.serving.nccl_tuning role before "
            "gpu_server in this play (and select its nccl_tuning tag), or run the gpufleet.serving.rollout playbook, "
            "which tunes under the host lock and, when --tags leave the role out, knows the variables of an explicit "
            "profile (pcie_only, nvlink, none, custom; not auto)." % profile)


def stale_layers(check: t.Mapping[str, t.Any]) -> t.List[str]:
    """The NCCL layers the check found not as asked (its O(nccl_layers) answer), in its order."""
    layers = check.get("nccl_layers") or {}
    return [k for k, v in layers.items()
            if k != "up_to_date" and not (isinstance(v, t.Mapping) and v.get("up_to_date"))]


def stale_layers_refusal(profile: str, names: t.Sequence[str]) -> str:
    return ("the NCCL layers on this host are not what gpufleet_nccl_profile %s asks for (%s would change), and this run "
            "left the nccl_tuning role out (--tags/--skip-tags): a restart now would launch workers without the "
            "tuning. Run with the nccl_tuning tag too." % (profile, ", ".join(names)))


def workers_verified(check: t.Mapping[str, t.Any]) -> int:
    """The GPU-holding workers whose environment the check found as expected. A server kept because its restart is
    refused before the kill still counts them; a restart reports its own."""
    if not check.get("running"):
        return 0
    bad = set((check.get("env_problems") or {}).keys())
    return sum(1 for w in check.get("workers") or [] if w.get("holds_gpu") and str(w.get("pid")) not in bad)


def refusal(check: t.Mapping[str, t.Any], force: bool, locked_run: bool, profile: t.Optional[str]) -> t.Optional[str]:
    """A restart onto NCCL layers this run did not apply (the check verified them because the nccl_tuning role was
    left out) would launch workers without the tuning. Only for a run that may restart (not the read-only audit,
    which reports the layers' drift itself)."""
    if not locked_run or "nccl_layers" not in check:
        return None
    if (check["nccl_layers"] or {}).get("up_to_date", True):
        return None
    if not (force or check.get("needs_restart")):
        return None
    stale = stale_layers(check)
    # A layer whose check could not decide (another service's run is changing the layers, a file it cannot read)
    # says why: "would change" would be untrue.
    errors = [str(check["nccl_layers"][k]["error"]) for k in stale
              if isinstance(check["nccl_layers"].get(k), t.Mapping) and check["nccl_layers"][k].get("error")]
    if errors:
        return ("the NCCL layers on this host cannot be checked against gpufleet_nccl_profile %s: %s; a restart now "
                "could launch workers without the tuning" % (profile, "; ".join(errors)))
    return stale_layers_refusal(str(profile), stale)


def decide(check: t.Mapping[str, t.Any], force: bool, balancers: t.Sequence[str], locked_run: bool,
           check_mode: bool, idents: t.Optional[t.Mapping[str, t.Any]] = None, service: str = "") -> Result:
    """What the role does with the host: `do_restart`, the summary row it starts (`result`), and its place in the
    balancers (`rotation`, the gpufleet_server_rotation fact, {} for a host whose balancers are not touched):
    - a restart with balancers starts its drain from here (in rotation, nothing drained yet); the drain reads the
      check's drain records (a failed earlier run's drains tell gpufleet's from an operator's);
    - an up-to-date host that an earlier run left out of rotation on gpufleet's drain record (`return_only`) goes
      back into the entries the record names, no others.
    `error` fails the host: a drain record that cannot be read when the drain or the return would need it, or a
    record of another server (`idents`, entry name to the server it names for this host) that the return would act on.
    `service` (the server's name) names the row: a host may run several services (the summary keeps a row each)."""
    idents = idents or {}
    do_restart = bool(force or check.get("needs_restart"))
    result: Result = dict(service=service, restarted=False, reasons=["forced"] if force else list(check.get("reasons") or []),
                          workers=len(check.get("workers") or []), workers_verified=workers_verified(check),
                          record_missing=str(check.get("record_missing") or ""))
    if isinstance(check.get("rollback"), t.Mapping):
        # The rollback by hand (server_state's rollback): the generation it goes to, for the summary, also when the
        # host already runs it.
        result["rollback_to"] = {k: check["rollback"].get(k) for k in ("fingerprint", "recorded_at", "from",
                                                                       "inventory_fingerprint")}
    if not do_restart and "nccl_layers" in check and not (check["nccl_layers"] or {}).get("up_to_date", True):
        # A host kept as it runs while its layers are not what the inventory asks (this run left the nccl_tuning role
        # out): said, not silent; the server is right, the layers are the drift.
        result["nccl_stale"] = stale_layers(check)
    out: Result = dict(do_restart=do_restart, result=result, return_only=False, rotation={})
    if not locked_run or not balancers:
        return out
    if do_restart:
        # Check mode drains nothing (the summary says would-drain), but the real run would fail on a record it cannot
        # read: so does --check (helper-40).
        if check.get("drain_record_error"):
            out["error"] = str(check["drain_record_error"])
        # The entries an earlier run's drain record (this host's own) says gpufleet took the host out of (a clean, a
        # failed run): still out if this run fails before its put-back, and put back by it otherwise (helper-45: the
        # summary said neither).
        out["rotation"] = dict(out_of=[], balancers=list(balancers), would_drain=check_mode, drained=False, found={},
                               left_as_found={}, renamed={}, recorded=recorded_drains(check, balancers, idents))
        return out
    if check.get("drain_record_error"):
        out["error"] = str(check["drain_record_error"])
        return out
    records = check.get("drain_records") or {}
    names = [n for n in balancers if n in records]
    if not names:
        return out
    # A record of another server under an entry's name is not this host's drain (helper-38): the put-back would refuse
    # it after the check, and --check would predict a put-back (helper-39). Refused here, in both, nothing touched.
    foreign = [f for f in (foreign_text(n, records[n], str(idents[n])) for n in names if n in idents) if f]
    if foreign:
        out["error"] = "; ".join(foreign) + "; nothing was touched"
        return out
    first = records[names[0]] if isinstance(records[names[0]], t.Mapping) else {}
    result["reasons"] = result["reasons"] + [
        "out of rotation on %s since run %s (drain record): %s, no restart needed"
        % (", ".join(names), first.get("run", "?"), "would be put back" if check_mode else "put back")]
    out["return_only"] = True
    out["rotation"] = dict(
        out_of=names, balancers=list(balancers), would_drain=False, drained=False, left_as_found={}, returned=names,
        would_return=check_mode,
        found={n: (records[n].get("found", "UP") if isinstance(records[n], t.Mapping) else "UP") for n in names})
    return out


def recorded_drains(check: t.Mapping[str, t.Any], balancers: t.Sequence[t.Any],
                    idents: t.Optional[t.Mapping[str, t.Any]] = None) -> t.List[str]:
    """The host's entries (in their order) that its drain record says gpufleet took it out of: the check's
    `drain_records`, a record of another server under an entry's name excluded (`idents`: not this host's drain)."""
    records = check.get("drain_records")
    if not isinstance(records, t.Mapping):
        return []
    idents = idents or {}
    return [str(n) for n in balancers if isinstance(records.get(str(n)), t.Mapping)
            and not (str(n) in idents and other_server(records[str(n)], str(idents[str(n)])))]


def stale_records(check: t.Mapping[str, t.Any], balancers: t.Sequence[t.Any]) -> t.List[str]:
    """Warnings for the drains the host's record keeps of entries it no longer has (removed or renamed): no run puts
    it back there, and the rollout would otherwise pass it in silence (helper-37; the audit reports them as drift)."""
    records = check.get("drain_records")
    if check.get("drain_record_error") and not balancers:
        # With balancers the host fails on it (decide); without, no run reads it again: said, not silent.
        return ["%s; the host has no balancer in gpufleet_server_balancers, so no rollout reads it: if gpufleet took the "
                "host out of a balancer, put it back by hand, then remove the file" % check["drain_record_error"]]
    if not isinstance(records, t.Mapping):
        return []
    # Every drain of a host with no balancer left is one no run puts back.
    return stale(records, [str(b) for b in balancers])


def fast_verdict(check: t.Mapping[str, t.Any], balancers: t.Sequence[t.Any], name: str) -> Result:
    """The rollout's fast path after its read-only check (the rollout_check action): a host is up to date only when the
    check says so and no drain record of gpufleet's names one of its balancers (an earlier run died after its drain:
    the roles put the host back). A server that cannot be launched fails the host, before anything on it changes. Any
    other outcome, a failed check included, leaves the host to the roles, which report it."""
    if check.get("launch_problems"):
        return {"failed": True, "msg": "%s: %s" % (name, check.get("msg", "")), "launch_problems": check["launch_problems"]}
    drained = set(check.get("drain_records") or {}) & {str(b) for b in balancers}
    if check.get("failed") or not check.get("up_to_date") or drained:
        return {"up_to_date": False}
    workers = check.get("workers") or []
    return {"up_to_date": True,
            "gpufleet_server_result": {"service": name, "restarted": False, "reasons": [], "workers": len(workers),
                                       "workers_verified": len([w for w in workers if w.get("holds_gpu")])},
            "gpufleet_nccl_changed": False}


def tags_select(tags: t.Iterable[str], only: t.Iterable[str], skip: t.Iterable[str]) -> bool:
    """Whether ansible-core would run a task carrying `tags` (its own and those it inherits) under --tags `only` and
    --skip-tags `skip` (ansible_run_tags, ansible_skip_tags), by the rules of ansible.playbook.taggable.Taggable's
    evaluate_tags. The gpu_server role's one call that takes the lock, writes the NCCL layers and checks the server
    (the server_state action's O(tune)) is tagged always; it runs each step only where --tags and --skip-tags would have
    run that step as a task of its own (the tags it had then: nccl_tuning and configure for the write, gpufleet_server
    for the check), since each of those tasks was a task execution of every host (issue 25)."""
    tagset = set(tags) or {"untagged"}
    only_set, skip_set = set(only or ["all"]), set(skip or [])
    run = ("always" in tagset or ("all" in only_set and "never" not in tagset) or not tagset.isdisjoint(only_set)
           or ("tagged" in only_set and tagset != {"untagged"} and "never" not in tagset))
    if run and skip_set:
        if "all" in skip_set:
            run = "always" in tagset and "always" not in skip_set
        elif not tagset.isdisjoint(skip_set) or ("tagged" in skip_set and tagset != {"untagged"}):
            run = False
    return run
