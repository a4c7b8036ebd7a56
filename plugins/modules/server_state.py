#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_state
short_description: Decide whether a GPU server must be restarted, record what was launched, and lock the host
version_added: 0.1.0
description:
  - O(action=check) is read-only. It compares the desired O(fingerprint) with the one recorded at the last
    launch, checks that the launcher (pidfile, confirmed as in RV(running)) is alive and is the launch recorded then
    (a later launch whose checks failed is not, as M(gpufleet.serving.server_restart) marks the record unverified
    before each launch), that processes carrying the launch tag hold the GPUs, that no other
    process holds them, and that the GPU-holding workers carry O(expected_env).
    RV(needs_restart) is false only when all of that holds; RV(reasons) says why otherwise.
  - "A running launcher that carries O(fingerprint) in its environment (O(tag_name)C(_FINGERPRINT), set by
    M(gpufleet.serving.server_restart) at a process launch) while the record does not name it, and does not say its
    launch failed its checks, is a verified launch whose record could not be written (a full state filesystem): it
    is not a reason to restart (RV(unrecorded), and a note in RV(notes)). With the lock (O(lock_file) and O(owner))
    the check writes the record again (RV(recorded)); a record that still cannot be written is a warning. Such a
    host is not RV(up_to_date), so the rollout's read-only fast path leaves it to the role's locked check."
  - O(action=record) writes the state file (fingerprint, pid, timings) after a launch. A pidfile naming a live process
    that does not carry the launch tag O(tag_name)=O(name) (or a pid reused since) is refused, not recorded.
  - O(action=lock) and O(action=unlock) take and release a host-side lock so two rollouts never interleave
    kill and launch on one host. A lock past its TTL is stale and is broken. C(changed) says whether the lock file
    changed (taken from nobody or from a stale holder; removed), also in check mode.
  - O(action=check) with O(lock_file) and O(owner) takes the lock first and releases it again when no restart is
    needed (unless O(keep_lock=true)), so an up-to-date host costs one round trip. RV(locked) says whether the
    lock is still held, and C(changed) is true exactly then (the call left a lock file behind); a lock taken and
    released again leaves the host as it was. A lock this O(owner) already held before the call (O(action=lock), or
    an earlier check that kept it) is kept and is no change. In check mode no lock is taken, and C(changed) says
    whether the real call would leave one behind (a restart is needed, or O(keep_lock=true)).
  - O(action=check) with O(launchable) first verifies that the server could be launched (its executable, user
    and working directory exist) and fails, before the lock, when it could not; a server that cannot be
    relaunched must never be stopped. When a restart is wanted (the check finds one needed, or O(keep_lock=true)),
    it also fails when a bare command is not on the server's PATH (O(launchable.path)), or the files the restart
    writes (O(launchable.log_path), O(state_file), O(pidfile), O(lock_file)) or O(rotation_file) could not be
    written (a path under a regular file, an unwritable directory, no room left), as the drain and the restart that
    would follow must not start then (the message, the restart's own, says nothing was stopped), and when a
    process the restart's kill would not end listens on the port of O(launchable.urls) or holds the server's GPUs
    (O(launchable.clean_timeout)), with the messages and phases of M(gpufleet.serving.server_restart), whose own
    checks before its kill would refuse them after the drain; these two only with O(owner) (a run that may restart).
    A O(gpus) index the host lacks fails it before the lock, as the restart's preflight says it.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.NVML
attributes:
  check_mode:
    support: full
    details: V(check) is read-only; V(record), V(lock) and V(unlock) report what they would change.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  action:
    description: What to do.
    type: str
    choices: [check, record, lock, unlock]
    default: check
  name:
    description: Service name (value of the launch tag).
    type: str
    required: true
  tag_name:
    description: Launch tag variable name.
    type: str
    default: GPUFLEET_SERVICE
  state_file:
    description: JSON state file of this service.
    type: path
    required: true
  pidfile:
    description:
      - Pidfile written by the launcher (C(PID START_TIME)).
      - Its process counts as the server only when it carries the launch tag (RV(running)); the recorded start time
        only tells a stale pidfile (a reused pid), it never confirms on its own.
    type: path
  fingerprint:
    description: Hash of the desired state (command, env, user, workdir, launcher, NCCL layers).
    type: str
  launchable:
    version_added: 0.2.0
    description: With V(check), what the launch needs on the host; the check fails naming each one that is missing.
    type: dict
    suboptions:
      command:
        description: The server's executable (its argv[0]); checked when it is an absolute path.
        type: str
        required: true
      user:
        description: User the server runs as (name or uid).
        type: str
        default: root
      workdir:
        description: The server's working directory.
        type: path
        default: /
      path:
        version_added: 0.2.0
        description:
          - The server's C(PATH) (its environment's), on which a bare O(launchable.command) (no C(/)) is looked up
            when a restart is wanted, as M(gpufleet.serving.server_restart)'s preflight looks it up (not with
            O(systemd), whose unit runs the command). Unset means the restart's default C(PATH)
            (C(/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)).
          - A value of the server's environment, which may be secret, so hidden in the output as
            M(gpufleet.serving.server_restart)'s O(gpufleet.serving.server_restart#module:env) hides it.
        type: str
      log_path:
        version_added: 0.2.0
        description:
          - The server's log (M(gpufleet.serving.server_restart)'s O(gpufleet.serving.server_restart#module:log_path)).
          - When a restart is wanted it is checked with the other files the restart writes after its kill (O(state_file),
            O(pidfile), O(lock_file)) and O(launchable.drain_record), as M(gpufleet.serving.server_restart)'s preflight
            checks them, by the same code and words; none may be a directory or lie under a regular file or a directory
            this module may not write in, and their directories need room.
        type: path
      drain_record:
        version_added: 0.3.0
        description:
          - The drain record the restart's drain and return to service write (the gpu_server role sets it for a host
            with balancers only), checked with O(launchable.log_path). Unset, it is not checked, since O(rotation_file)
            is only read (a host with no balancer left has its record read for the warnings, never written).
        type: path
      urls:
        version_added: 0.2.0
        description:
          - The URLs whose port the restart's preflight checks for a foreign listener
            (M(gpufleet.serving.server_restart)'s O(gpufleet.serving.server_restart#module:wait_ready.health_url) and
            O(gpufleet.serving.server_restart#module:wait_ready.request.url), when its
            O(gpufleet.serving.server_restart#module:wait_ready.check_listener) is true); empty ones are skipped.
          - When a restart is wanted and O(owner) is set, a process listening on such a port that the restart's kill
            would not end fails the check with that preflight's message (it says nothing was stopped), before the drain
            and the kill. The server's own processes (those the kill selects, O(launchable.kill)) holding it are fine.
        type: list
        elements: str
        default: []
      clean_timeout:
        version_added: 0.2.0
        description:
          - The restart's O(gpufleet.serving.server_restart#module:wait_clean.timeout). When a restart is wanted and
            O(owner) is set, a process holding the server's GPUs that no kill step of the restart would end (not this service's, not
            matched by O(launchable.kill.cmdline_regex), and O(launchable.kill.gpu_strays) off) fails the check with the
            restart's message (it says nothing was stopped), before the drain and the kill, once it is still there
            after this many seconds, as the restart would fail at its clean gate. Nothing is signalled.
          - Only with O(require_gpu_holders) (the check reads the GPUs).
        type: float
        default: 30
      kill:
        version_added: 0.2.0
        description: What the restart's kill selects besides the launch tag and O(pidfile), as
          M(gpufleet.serving.server_restart)'s O(gpufleet.serving.server_restart#module:kill) says it.
        type: dict
        default: {}
        suboptions:
          cmdline_regex:
            description: The restart's O(gpufleet.serving.server_restart#module:kill.cmdline_regex).
            type: str
          gpu_strays:
            description: The restart's O(gpufleet.serving.server_restart#module:kill.gpu_strays).
            type: bool
            default: false
  gpus:
    description: GPUs the server uses. Empty means all.
    type: list
    elements: int
    default: []
  require_gpu_holders:
    description:
      - With V(check), require that tagged processes hold every GPU in O(gpus).
      - The check then fails on a host without any GPU.
    type: bool
    default: true
  expected_env:
    description: With V(check), variables every GPU-holding worker must carry in /proc/PID/environ.
    type: dict
    default: {}
  timings:
    description: With V(record), timings to store (seconds).
    type: dict
    default: {}
  systemd_env_content:
    description:
      - With O(systemd), the desired environment file of the unit (O(systemd.env_file)); a file that differs, is missing,
        or is not a root-owned 0600 regular file is a reason to restart (the restart rewrites it). Unset skips it.
      - Its values are secret (C(no_log)). A top-level option, not one of O(systemd), because ansible-core's journal
        entry of a module's arguments prints a dict option as text, where a secret of several lines is not masked.
    type: str
    version_added: 0.3.0
  lock_file:
    description:
      - With V(lock)/V(unlock), the lock file.
      - With V(check) and O(owner), the lock to take (see O(keep_lock)).
      - With V(check) and no O(owner), only looked at, never taken or changed; a lock of another run that is not
        past its expiry makes RV(up_to_date) false and is returned in RV(lock_holder) (a host that another run may be
        restarting is not "already right").
    type: path
  owner:
    description: With V(lock)/V(unlock), an id of this run (controller host, pid, time).
    type: str
  rotation_file:
    version_added: 0.2.0
    description:
      - With V(check), the host's drain record (the file M(gpufleet.serving.rotation_record) keeps) to read as well,
        in the same call (the rollout's fast path then costs one round trip per host, balancers or not).
      - Its records are returned in RV(drain_records) (empty when there is no record); a record that cannot be read
        makes RV(up_to_date) false and is said in RV(drain_record_error). Never written.
    type: path
  worker_urls:
    version_added: 0.3.0
    description:
      - With V(check) and O(owner), when a restart is needed (or O(keep_lock)) or the drain record names entries to
        put back, and with V(lock) (the clean playbook's, before its drain), the balancer entries whose worker URL
        was set by hand, as entry name to URL. Each URL's host must resolve on this host to one of its own addresses
        (a bind to it succeeds and, where C(ip_nonlocal_bind) lets any bind succeed, the kernel's table of local
        addresses lists it), else the check fails before the drain with nothing touched (its C(phase) is
        V(preflight)); the message shows the URL's host, never the whole URL. An entry copied from another host's
        variables, its C(server) and C(worker_url) both, would pass the balancer's address check and take that host
        out of rotation while this one is killed.
    type: dict
    default: {}
  lock_ttl:
    description: Seconds after which a lock is stale; must be > 0.
    type: float
    default: 1800
  lock_wait:
    description:
      - Seconds to wait for another run's lock before failing; must be >= 0.
      - Wait-die, when both run ids carry their start time (the gpufleet.serving.run lookup's ids do) - the lock of
        an earlier run fails the call at once, whatever this value ("host is locked by an earlier gpufleet run");
        only the lock of a later run is waited for, and the wait is reported in a warning and in RV(lock_waited). An
        owner id without a start time is waited for as a later run's.
    type: float
    default: 0
  fail_msg:
    version_added: 0.3.0
    description:
      - With V(unlock), read by the action plugin only (the module ignores it) - after the release, the task fails with
        this message. The gpu_server role's last task releases a lock its flow still holds and fails the host whose
        flow failed, in one task execution where it was two (issue 25). A release that fails too is named after it.
    type: str
  break_owner:
    description:
      - With V(lock) or V(check), break a lock held by this owner (a run known to be dead).
      - When the lock names a host process still working under it (a M(gpufleet.serving.server_restart) that goes on
        after its controller died), that process is waited for first, up to O(lock_ttl) seconds; it releases the lock
        itself when done.
    type: str
  keep_lock:
    description: With V(check) and a lock, keep the lock even when no restart is needed.
    type: bool
    default: false
  decide:
    version_added: 0.2.0
    description:
      - With V(check), the action plugin also decides what the gpu_server role does with the host (RV(decision)), on
        the controller, in the same task. The module itself ignores this option.
      - When the check fails because a run of this controller that is gone (Ctrl-C, SIGTERM; the
        P(gpufleet.serving.run#lookup) lookup's V(alive) is V(false)) holds the host lock, the action takes the lock
        over (the check again with O(break_owner)) and says so in the run's output and in RV(took_over_from).
      - It refuses (fails the host, nothing changed) when O(decide.nccl_profile) is set but O(decide.nccl_known) is
        false, and, for a run with O(owner), a restart onto NCCL layers O(nccl_layers) found not as asked.
    type: dict
    suboptions:
      force:
        description: The restart is forced (C(gpufleet_server_force_restart)); the reasons then say V(forced).
        type: bool
        default: false
      balancers:
        description:
          - Names of the host's balancer entries. With O(owner) and no restart needed, the entries the host's drain
            record (O(rotation_file)) names are the ones an earlier run left it out of; RV(decision) then says how it
            goes back (C(return_only), C(rotation)). An unreadable record fails the host.
        type: list
        elements: str
        default: []
      idents:
        version_added: 0.3.0
        description:
          - Entry name to the server that entry names for this host (P(gpufleet.serving.balancer_idents#filter)). A
            record under an entry's name that names another server is not this host's drain, and a return to service
            it would cause fails the host instead, nothing touched (in check mode too).
        type: dict
        default: {}
      nccl_profile:
        description: The NCCL profile the inventory asks for (C(gpufleet_nccl_profile)), unset when it asks for none.
        type: str
      nccl_known:
        description: Whether this run knows the variables of O(decide.nccl_profile) (the nccl_tuning role ran).
        type: bool
        default: true
      tags:
        version_added: 0.3.0
        description:
          - With O(tune), the tags the check carries as a step of its own. The check (and its decision) runs only
            where C(--tags) and C(--skip-tags) select a task with these tags and those the task inherits, by
            ansible-core's rules; RV(checked) is false when they do not. Empty, the check runs whenever the task does.
        type: list
        elements: str
        default: []
  tune:
    version_added: 0.3.0
    description:
      - With V(check), read by the action plugin only (the module ignores it). The gpu_server role's check when the
        rollout writes an explicit profile's NCCL layers under the host lock. Before the check, the action takes the
        host lock (as O(action=lock) does, a dead run's lock of this controller taken over), then writes the layers
        with M(gpufleet.serving.nccl_layers) under it (in check mode it takes no lock and only predicts the write),
        then checks; RV(layers) is that write's result and C(changed) includes it, as its diff does with C(--diff).
        A lock or a write that fails fails the task before the check, with nothing after it done; the lock, once
        taken, is held (RV(locked)) for the role to release.
      - Three task executions of every host were one each (the lock, the write, the check).
    type: dict
    suboptions:
      sitecustomize:
        description: O(gpufleet.serving.nccl_layers#module:sitecustomize).
        type: dict
      nccl_conf:
        description: O(gpufleet.serving.nccl_layers#module:nccl_conf).
        type: dict
      backup:
        description: O(gpufleet.serving.nccl_layers#module:backup).
        type: bool
        default: false
      keep_previous:
        description: O(gpufleet.serving.nccl_layers#module:keep_previous).
        type: path
      tags:
        description:
          - The tags the lock and the write carry as steps of their own. They run only where C(--tags) and
            C(--skip-tags) select a task with these tags and those the task inherits. Empty, they run whenever the
            task does.
        type: list
        elements: str
        default: []
  nccl_layers:
    version_added: 0.2.0
    description:
      - With V(check), also check that the NCCL tuning layers are already as asked, by running the code of
        M(gpufleet.serving.sitecustomize_env) and M(gpufleet.serving.nccl_conf) in check mode (nothing is written).
        RV(up_to_date) is then true only when neither would change, every interpreter already sees the values, and
        no restart is needed, so a rollout can skip an up-to-date host after this one call.
      - A layer whose check fails counts as not up to date; the check itself does not fail for it.
    type: dict
    suboptions:
      sitecustomize:
        description: The options of M(gpufleet.serving.sitecustomize_env) (O(gpufleet.serving.sitecustomize_env#module:backup) excepted).
        type: dict
      nccl_conf:
        description: The options of M(gpufleet.serving.nccl_conf) (O(gpufleet.serving.nccl_conf#module:backup) excepted).
        type: dict
  rollback:
    version_added: 0.2.0
    description:
      - "With V(check), a rollback by hand (the C(gpufleet.serving.rollback) playbook) - the host is compared
        with one of its last known good generations (C(STATE.last_good.json) beside O(state_file)) instead of
        O(fingerprint) and O(expected_env), and O(launchable) checks the generation's command, user and working
        directory. RV(needs_restart) is then false when the host already runs that generation, verified; RV(rollback)
        says which one it is."
      - The generation is O(rollback.to), or the newest one whose fingerprint differs from what the host runs now
        (RV(running_fingerprint); a host that runs no verified server goes back to the newest). A host that an
        earlier rollback by hand put back to what it runs stays there, so running the rollback again is a no-op.
      - When the host has no such generation (none at all, none but the one it runs, not the one named), the check
        fails before it takes the lock or reads anything else, naming the generations the host has; nothing is changed.
        Also when the generation was launched by the other launcher (O(systemd) set or not), or holds nothing to
        launch again (a systemd generation recorded before gpufleet kept its unit's files).
      - With O(systemd), the unit is compared with the generation's unit file and environment file instead of
        O(systemd.unit_content) and O(systemd_env_content).
      - When a restart is needed and O(fingerprint) (the inventory's definition) differs from the generation, a warning
        says that the next rollout restarts the host to the inventory's definition again.
    type: dict
    suboptions:
      to:
        description: The generation's fingerprint, in full or its first 12 or more characters (as the rollout summary
          and the audit show it); empty chooses as described above.
        type: str
        default: ""
  systemd:
    version_added: 0.2.0
    description:
      - With V(check), the server runs as this systemd unit. Its main pid (C(systemctl show)), not the pidfile, is
        the launcher, so a unit systemd started itself (a reboot, C(systemctl restart)) still reads as running; when
        the record is of a verified launch (no gpufleet launch failed or was cut short since), that restart is
        reported in RV(notes), not as a reason.
      - The unit systemd would run is compared with the desired one; see RV(unit).
    type: dict
    suboptions:
      unit:
        description: The unit's name.
        type: str
        required: true
      unit_path:
        description: Where the unit file must be (systemd must load it from there).
        type: path
        required: true
      unit_content:
        description: The desired unit file; a file that differs (or a symlink) is a reason to restart. Unset skips
          the comparison.
        type: str
      env_file:
        description: The unit's environment file.
        type: path
      enabled:
        description: Whether the unit should be enabled; the other state is drift (RV(unit.drift)). Unset skips it.
        type: bool
      loaded:
        description:
          - Properties systemd must have loaded for the unit (C(systemctl show) names and values, C(TimeoutStopUSec) in
            seconds), compared when the unit file is right, no reload is pending and no drop-in changes them (a
            file restored with its old modification time after a reload hides what systemd runs).
          - A unit file of the same name that systemd loads from another place (C(/etc/systemd/system.control)) fails
            the check, as rewriting the desired file would change nothing.
        type: dict
      dropins:
        description:
          - Drop-ins of the unit (C(UNIT.d/*.conf) under C(/etc) or C(/run/systemd/system)) change what it runs;
            gpufleet writes none.
          - Every drop-in in force counts, those of a name prefix (C(gpufleet-.service.d/)) and under C(/usr/lib)
            included; type-wide ones (C(service.d/)) do not.
          - V(warn) reports them as drift (and a warning); V(remove) makes them a reason to restart (the restart
            deletes them, M(gpufleet.serving.server_restart) O(gpufleet.serving.server_restart#module:systemd.remove_dropins)),
            and fails the check when one is not the unit's own under C(/etc) or C(/run/systemd/system); V(fail) fails
            the check.
        type: str
        choices: [warn, remove, fail]
        default: warn
"""

EXAMPLES = r"""
- name: Does the server need a restart?
  gpufleet.serving.server_state:
    name: sglang
    state_file: /var/lib/gpufleet/sglang.json
    pidfile: /run/gpufleet/sglang.pid
    fingerprint: "{{ fingerprint }}"
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    expected_env: {NCCL_PROTO: LL}
  register: st
"""

RETURN = r"""
running_fingerprint:
  version_added: 0.2.0
  description:
    - With V(check), the fingerprint of the definition the host runs now - the one its launcher carries (a process
      launch carries it, O(tag_name)C(_FINGERPRINT)), else the record's when the launcher is the verified launch on
      record; V(null) when no verified server of a known definition runs.
  returned: when action is check
  type: str
last_good:
  version_added: 0.2.0
  description:
    - With V(check), the host's last known good generations and its last gate measurement, as the audit shows them -
      fingerprints, times and numbers, never a definition (its environment values are secret).
  returned: when action is check
  type: dict
  contains:
    newest:
      description: The newest generation (C(fingerprint), C(recorded_at), C(gate_median)), V(null) when there is none.
      type: dict
    generations:
      description: Every generation kept, newest first, as C(newest) shows one.
      type: list
      elements: dict
    rolled_back:
      description: The last rollback by hand (C(from), C(to), C(at)), V(null) when there is none (or a rollout
        recorded another definition since).
      type: dict
    gate:
      description: The record's gate measurement, the host's baseline - C(median), C(metric), C(unit) (V(output tokens/s)
        or V(requests/s)), C(measured_at) and the C(fingerprint) it measured; V(null) when none was recorded.
      type: dict
rollback:
  version_added: 0.2.0
  description:
    - With O(rollback), the generation the host goes back to - C(fingerprint), C(recorded_at), C(from) (what the host
      runs now, RV(running_fingerprint)) and C(inventory_fingerprint) (O(fingerprint) as given).
  returned: when action is check and rollback is set
  type: dict
decision:
  version_added: 0.2.0
  description:
    - With O(decide), what the gpu_server role does with the host (decided by the action plugin on the controller).
    - C(do_restart) (bool); C(result), the host's summary row so far (C(restarted) V(false), C(reasons), C(workers),
      C(workers_verified) - the GPU-holding workers whose environment is as expected, V(0) when the server is not
      running - and C(record_missing)); C(return_only), true for an up-to-date host an earlier run left out of
      rotation on gpufleet's drain record, with C(rotation), the entries it goes back into. C(result.service) is
      O(name).
  returned: when action is check and decide is set
  type: dict
  sample: {do_restart: false, return_only: false,
           result: {service: sglang, restarted: false, reasons: [], workers: 3, workers_verified: 2, record_missing: ""}}
service:
  version_added: 0.3.0
  description:
    - O(name), the service of the host this call was for, also on a failure (the action plugin adds it). The rollout
      summary keeps one row per host and service by it.
  returned: always
  type: str
  sample: sglang
took_over_from:
  version_added: 0.2.0
  description: With O(decide), the owner id of the dead run whose host lock this call took over.
  returned: when it took one over
  type: str
layers:
  version_added: 0.3.0
  description:
    - With O(tune), the result of the NCCL layers' write under the lock (M(gpufleet.serving.nccl_layers)'s return
      values, C(changed) included).
  returned: when O(tune) wrote (or, in check mode, predicted) the layers
  type: dict
  sample: {"changed": true, "previous_kept": "/run/gpufleet/demo.layers-previous.json", "access_fixes": []}
checked:
  version_added: 0.3.0
  description: With O(tune), false when C(--tags)/C(--skip-tags) left the check out (O(decide.tags)); the lock and
    the write may still have run.
  returned: when O(tune) is set and the check did not run
  type: bool
  sample: false
unrecorded:
  description: With V(check), the running server is a verified launch of O(fingerprint) that the record does not name.
  returned: when action is check and it is so
  type: bool
  version_added: 0.2.0
recorded:
  description:
    - With V(check), the record of an RV(unrecorded) server was written again by this call.
    - When the restart that verified this server could not write its record, it put the server's last known good
      generation aside beside O(pidfile) (C(NAME.last_good-pending.json), 0600); this call then also makes it the
      newest generation (RV(last_good) shows it) and removes the pending file.
  returned: when action is check and it was
  type: bool
  version_added: 0.2.0
last_good_pending:
  description:
    - With V(check), the record names the running server, but its last known good generation is still put aside
      beside O(pidfile) (its restart, or the check that wrote its record again, could not write the last known good
      file). The host is then not RV(up_to_date), and the rollout's locked check keeps the generation.
  returned: when action is check and it is so
  type: bool
  version_added: 0.3.0
last_good_kept:
  description: With V(check), the generation put aside for the running server was made the newest last known good by
    this call (under the lock), and the file it was put aside in removed.
  returned: when action is check and it was
  type: bool
  version_added: 0.3.0
record_missing:
  description: With V(check), why the record of an RV(unrecorded) server still could not be written (the file and the
    error, a full filesystem say); the server is kept, and the sentence is also a warning.
  returned: when action is check and it is so
  type: str
  version_added: 0.2.0
needs_restart:
  description: With V(check), whether the server must be (re)started.
  returned: when action is check
  type: bool
reasons:
  description: Why a restart is needed.
  returned: when action is check
  type: list
  elements: str
running:
  description:
    - Whether the process named by the pidfile is alive and confirmed to be the server by the launch tag in its
      environment (every server gpufleet launches carries it, with either launcher).
    - A pidfile naming a process without the launch tag is never taken for the server, even when it records that
      process's real start time (C(PID START_TIME), as gpufleet writes it); the start time only tells a stale pidfile.
      See RV(pidfile).
  returned: when action is check
  type: bool
pidfile:
  version_added: 0.2.0
  description:
    - With V(check) and O(pidfile), what the pidfile names - C(path), C(pid), C(status), C(reason), C(confirmed_by)
      (V(tag) when confirmed, else V(null)), and the C(user) and C(cmdline) of a live process.
    - C(status) is V(confirmed), V(unconfirmed) (a live process without the launch tag, whatever start time the
      pidfile records), V(stale) (the
      recorded start time differs, or the process started after the pidfile was written), V(not_running),
      V(missing) or V(unreadable).
  returned: when action is check and pidfile is set
  type: dict
  sample: {path: /run/gpufleet/sglang.pid, pid: 4242, status: unconfirmed, confirmed_by: null, user: alice,
           cmdline: "python3 train.py", reason: "pidfile /run/gpufleet/sglang.pid is unconfirmed: ..."}
fingerprint_recorded:
  description: Fingerprint stored at the last launch.
  returned: when action is check
  type: str
workers:
  description:
    - Live processes carrying the launch tag that are the server's - the running launcher and its descendants, and
      tagged processes of the launcher's user or of O(launchable.user).
    - Another user's process carrying the tag is not a worker (anyone can put the tag into a process's environment);
      holding the server's GPUs it is a stray, named in the reason.
  returned: when action is check
  type: list
  elements: dict
  contains:
    pid:
      description: Its pid.
      type: int
    ppid:
      description: Its parent's pid (V(1) for an orphan).
      type: int
    cmdline:
      description: Its command line (first 300 characters).
      type: str
    holds_gpu:
      description: Whether it holds one of the GPUs (the gpu_server role counts these as the verified workers).
      type: bool
strays:
  description: GPU holders without the launch tag (gpu, pid, cmdline).
  returned: when action is check
  type: list
  elements: dict
env_problems:
  description: Per worker pid, the expected keys that are missing or different (only expected keys are read).
  returned: when action is check
  type: dict
up_to_date:
  version_added: 0.2.0
  description: With V(check), true when no restart is needed, the O(nccl_layers) (if given) are as asked and the
    unit (O(systemd)) has no drift.
  returned: when action is check
  type: bool
nccl_layers:
  version_added: 0.2.0
  description:
    - With O(nccl_layers), per layer whether it is up to date (C(up_to_date), C(files), or C(error)).
    - C(access) lists why a layer's file is not up to date although its content is, when other users cannot read it
      (the file, or its directory, lacks read or search for group and others).
  returned: when nccl_layers is set
  type: dict
  contains:
    up_to_date:
      description: Whether every asked layer is up to date.
      type: bool
    sitecustomize:
      description: The sitecustomize layer's C(up_to_date), C(files), C(error) and C(access).
      type: dict
    nccl_conf:
      description: The nccl.conf layer's C(up_to_date), C(files), C(error) and C(access).
      type: dict
locked:
  description: With V(check) or V(lock), whether this run holds the host lock after the call.
  returned: when a lock was asked for
  type: bool
launch_problems:
  description: With V(check) and O(launchable), what the launch would miss (the check failed because of it).
  returned: failure
  type: list
  elements: str
drain_records:
  version_added: 0.2.0
  description:
    - With V(check) and O(rotation_file), the drain record's records (balancer name to its drain), empty when there is
      none; also with a refusal of the restart (RV(launch_problems)).
  returned: with rotation_file, when it could be read
  type: dict
left_out_of_rotation:
  version_added: 0.3.0
  description:
    - With O(decide), when the check refused the restart (RV(launch_problems)), the host's entries (O(decide.balancers))
      whose drain record says an earlier run of gpufleet took the host out of them (a record of another server under
      an entry's name excluded). The host stays out of those; the rollout summary lists them.
  returned: failure
  type: list
  elements: str
drain_record_error:
  version_added: 0.2.0
  description: With V(check) and O(rotation_file), why the drain record could not be read (RV(up_to_date) is then false).
  returned: with rotation_file, when it could not be read
  type: str
lock_holder:
  version_added: 0.2.0
  description: With V(check), O(lock_file) and no O(owner), the owner id of the run that holds the lock (not expired).
  returned: when such a lock exists
  type: str
holder:
  description: On failure to lock, the owner id of the run that holds the lock.
  returned: when the lock is held by another run
  type: str
lock_waited:
  version_added: 0.2.0
  description: With V(check), how long this call waited for the lock of a later run (wait-die), and for which run.
  returned: when the call waited for another run's lock
  type: dict
  contains:
    for:
      description: The owner id of the run that held the lock.
      type: str
    s:
      description: Seconds waited.
      type: float
unit:
  version_added: 0.2.0
  description: With V(check) and O(systemd), the unit as systemd has it.
  returned: when systemd is set
  type: dict
  contains:
    loaded:
      description: Whether systemd has the unit loaded (false for a unit not installed yet).
      type: bool
    active_state:
      description: The unit's ActiveState.
      type: str
    main_pid:
      description: The unit's main pid (V(0) when none).
      type: int
    main_confirmed:
      description: Whether that process carries the launch tag (the server runs).
      type: bool
    unit_file_state:
      description: C(systemctl is-enabled)'s answer (UnitFileState).
      type: str
    enabled_ok:
      description: Whether the unit is loaded and enabled (or disabled) as O(systemd.enabled) asks.
      type: bool
    content_matches:
      description: Whether the unit file is byte for byte O(systemd.unit_content) (null when not compared).
      type: bool
    dropins:
      description: The unit's drop-ins, none of which gpufleet writes.
      type: list
      elements: str
    restart_reasons:
      description: What makes the running unit differ from the desired one; also in RV(reasons).
      type: list
      elements: str
    drift:
      description: Drift a restart does not fix (enablement, drop-ins kept by O(systemd.dropins=warn)).
      type: list
      elements: str
notes:
  version_added: 0.2.0
  description: With V(check), what was found and is not a reason to restart (a unit restarted outside gpufleet).
  returned: when there is one
  type: list
  elements: str
state:
  description: With V(record), the state written.
  returned: when action is record
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _layercheck, _state
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", choices=["check", "record", "lock", "unlock"], default="check"),
            name=dict(type="str", required=True),
            tag_name=dict(type="str", default="GPUFLEET_SERVICE"),
            state_file=dict(type="path", required=True),
            pidfile=dict(type="path"),
            fingerprint=dict(type="str"),
            launchable=dict(type="dict", options=dict(
                command=dict(type="str", required=True),
                user=dict(type="str", default="root"),
                workdir=dict(type="path", default="/"),
                # From the server's env, whose values are secret (server_restart's env is no_log, and so its PATH).
                path=dict(type="str", no_log=True),
                log_path=dict(type="path"),
                drain_record=dict(type="path"),
                urls=dict(type="list", elements="str", default=[]),
                clean_timeout=dict(type="float", default=30.0),
                kill=dict(type="dict", default={}, options=dict(
                    cmdline_regex=dict(type="str"),
                    gpu_strays=dict(type="bool", default=False),
                )),
            )),
            gpus=dict(type="list", elements="int", default=[]),
            require_gpu_holders=dict(type="bool", default=True),
            expected_env=dict(type="dict", default={}),
            timings=dict(type="dict", default={}),
            lock_file=dict(type="path"),
            owner=dict(type="str"),
            rotation_file=dict(type="path"),
            worker_urls=dict(type="dict", default={}),
            lock_ttl=dict(type="float", default=1800.0),
            lock_wait=dict(type="float", default=0.0),
            # Read by the action plugin only: the failure to report after the release.
            fail_msg=dict(type="str"),
            break_owner=dict(type="str"),
            keep_lock=dict(type="bool", default=False),
            # Read by the action plugin only (plugins/action/server_state.py).
            decide=dict(type="dict", options=dict(
                force=dict(type="bool", default=False),
                balancers=dict(type="list", elements="str", default=[]),
                idents=dict(type="dict", default={}),
                nccl_profile=dict(type="str"),
                nccl_known=dict(type="bool", default=True),
                tags=dict(type="list", elements="str", default=[]),
            )),
            # Read by the action plugin only: the lock and the NCCL layers' write before the check.
            tune=dict(type="dict", options=dict(
                sitecustomize=dict(type="dict"),
                nccl_conf=dict(type="dict"),
                backup=dict(type="bool", default=False),
                keep_previous=dict(type="path"),
                tags=dict(type="list", elements="str", default=[]),
            )),
            nccl_layers=dict(type="dict", options=_layercheck.argument_spec()),
            rollback=dict(type="dict", options=dict(to=dict(type="str", default=""))),
            # Top-level, not in systemd: the module's journal entry masks a no_log value only where it is the whole
            # argument, and a dict option is logged as its text (a multi-line secret in it was not masked).
            systemd_env_content=dict(type="str", no_log=True),
            systemd=dict(type="dict", options=dict(
                unit=dict(type="str", required=True),
                unit_path=dict(type="path", required=True),
                unit_content=dict(type="str"),
                env_file=dict(type="path"),
                # The server's environment: its values are secret.
                enabled=dict(type="bool"),
                loaded=dict(type="dict"),
                dropins=dict(type="str", choices=["warn", "remove", "fail"], default="warn"),
            )),
            backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
        ),
        required_if=[("action", "record", ("fingerprint", "pidfile")),
                     ("action", "lock", ("lock_file", "owner")),
                     ("action", "unlock", ("lock_file", "owner"))],
        supports_check_mode=True,
    )
    try:
        result = _state.run(module.params, Step.of(module))
    except StepError as e:
        fail(module, e)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
