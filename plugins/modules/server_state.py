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
            O(pidfile), O(lock_file)) and O(rotation_file), as M(gpufleet.serving.server_restart)'s preflight checks
            them, by the same code and words; none may be a directory or lie under a regular file or a directory this
            module may not write in, and their directories need room.
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
      nccl_profile:
        description: The NCCL profile the inventory asks for (C(gpufleet_nccl_profile)), unset when it asks for none.
        type: str
      nccl_known:
        description: Whether this run knows the variables of O(decide.nccl_profile) (the nccl_tuning role ran).
        type: bool
        default: true
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
      rotation on gpufleet's drain record, with C(rotation), the entries it goes back into.
  returned: when action is check and decide is set
  type: dict
  sample: {do_restart: false, return_only: false,
           result: {restarted: false, reasons: [], workers: 3, workers_verified: 2, record_missing: ""}}
took_over_from:
  version_added: 0.2.0
  description: With O(decide), the owner id of the dead run whose host lock this call took over.
  returned: when it took one over
  type: str
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
  description: With V(check) and O(rotation_file), the drain record's records (balancer name to its drain), empty when there is none.
  returned: with rotation_file, when it could be read
  type: dict
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

import math
import os
import pwd
import time
import typing as t

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import (
    _gpumod, _lastgood, _layercheck, _layers, _layershare, _nvml, _proc, _rotation, _runid, _select, _server, _systemd)
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail


def record_input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """A pidfile whose live process is not the server (no launch tag, or the pid reused since) is not recorded: the
    record is what later checks and kills trust."""
    ident = _server.pidfile_identity(p["pidfile"])
    if ident is None:
        return None  # recorded without a pid (main warns): the next check finds nothing running and restarts
    proc = _proc.read_proc(ident[0])
    if proc is None:
        return None  # gone: the record then says so, and the next check restarts it
    if proc.start_time != ident[1]:
        return "pidfile %s names pid %d, which is another process now (started at %s, not %s); not recorded" % (
            p["pidfile"], ident[0], proc.start_time, ident[1])
    if not _proc.environ_has(ident[0], p["tag_name"], p["name"]):
        return "pidfile %s names pid %d, which does not carry the launch tag %s=%s; not recorded" % (
            p["pidfile"], ident[0], p["tag_name"], p["name"])
    return None


def lock_input_error(p: t.Mapping[str, t.Any]) -> t.Optional[str]:
    """A lock that cannot exclude anybody (expired when written, an empty owner) is refused before anything is done."""
    if p["owner"] is not None and not p["owner"].strip():
        return "owner must not be empty (it names the run that holds the lock)"
    # not (x > 0) and not (x >= 0) also refuse NaN; inf would be a lock that never goes stale, or a wait forever.
    if not p["lock_ttl"] > 0 or math.isinf(p["lock_ttl"]):
        return "lock_ttl must be a number of seconds > 0, got %s (a lock past its TTL is broken by the next run)" % p["lock_ttl"]
    if not p["lock_wait"] >= 0 or math.isinf(p["lock_wait"]):
        return "lock_wait must be a number of seconds >= 0, got %s" % p["lock_wait"]
    if p["lock_file"] and os.path.isdir(p["lock_file"]):
        return "lock_file %s is a directory; name the lock file itself" % p["lock_file"]
    return None


def take_lock(module: AnsibleModule) -> dict:
    p = module.params
    if p["break_owner"] and p["break_owner"] != p["owner"]:
        # The dead run's restart may still be running here (a module goes on when its controller dies): let it finish;
        # it releases the lock itself.
        try:
            waited = _server.wait_lock_worker(p["lock_file"], p["break_owner"], p["lock_ttl"])
        except _server.ServerError as e:
            module.fail_json(msg=str(e), **e.details)
        if waited:
            module.warn("waited %.1f s for the restart of dead run %s, still running on this host as pid %d, to finish"
                        % (waited["waited_s"], p["break_owner"], waited["pid"]))
        cur = _server.read_state(p["lock_file"])
        if cur.get("owner") == p["break_owner"]:
            try:
                os.unlink(p["lock_file"])
            except FileNotFoundError:
                pass
            module.warn("broke the lock of dead run %s" % p["break_owner"])
    try:
        res = _server.acquire_lock(p["lock_file"], p["owner"], p["lock_ttl"], p["lock_wait"])
    except _server.ServerError as e:
        module.fail_json(msg=str(e), **e.details)
    except OSError as e:  # a full or read-only run directory: the error names the lock file; nothing was left there
        module.fail_json(msg="cannot take the host lock: %s; nothing was stopped" % (e.strerror or e), path=p["lock_file"])
    if res.get("broke_stale"):
        module.warn("broke a stale lock: %s" % res["broke_stale"])
    if res.get("waited"):
        # Wait-die: only an earlier run waits, for a later one; say so, and for how long, in the run's output.
        waited = res["waited"]
        module.warn("waited %.1f s for the host lock of a later gpufleet run %s (%s), which held this host; this "
                    "earlier run goes on now (wait-die: only an earlier run waits; lock_wait %.0f s)"
                    % (waited["s"], waited["for"], _runid.started_text(waited["for"]), p["lock_wait"]))
    return res


def restart_problems(p: t.Mapping[str, t.Any]) -> t.List[str]:
    """What server_restart's preflight would refuse about its launch and its files (_server.restart_problems, the same
    code and words), checked in the check so that a restart sure to be refused for it neither drains the host nor
    reaches its kill: the command on the server's PATH (process launcher), the files the restart writes
    (O(launchable.log_path) and this check's own paths) and the drain record (writable, room in their directories)."""
    la = p["launchable"]
    # server_restart's own list, of the paths this check knows by its own options (the same role variables).
    files = _server.restart_files(p["state_file"], p["pidfile"], p["lock_file"], la["log_path"])
    if p["rotation_file"]:
        files.setdefault("rotation_file", p["rotation_file"])
    return _server.restart_problems(files, command=None if p["systemd"] else la["command"], user=la["user"],
                                    workdir=la["workdir"], path=la["path"])


def restart_preflight(module: AnsibleModule) -> None:
    """What server_restart refuses before its kill but after the drain, refused here before the drain, with its code,
    words and phase: a foreign listener on the server's port (preflight), GPU holders no kill step would end (clean,
    after the clean gate's timeout for them to go, as the restart waits; nothing is signalled, in check mode alike).
    Only for the check of a run that may restart (O(owner)): the rollout's read-only fast path leaves a host that needs
    a restart to that check anyway (it would wait the gate's timeout twice), and the audit reports the holders."""
    # Imported here: the restart engine is most of the collection's code, and only a check that may restart needs it.
    from ansible_collections.gpufleet.serving.plugins.module_utils import _restart  # pylint: disable=import-outside-toplevel
    p = module.params
    la = p["launchable"]
    sel = _restart.selection_params(p["name"], p["tag_name"], p["pidfile"], p["gpus"], p["backend"],
                                    la["kill"]["cmdline_regex"], la["kill"]["gpu_strays"], la["clean_timeout"],
                                    la["user"])
    try:
        # The restart's own refusal (its preflight), before the drain: the run dir holds the services' locks.
        if p["pidfile"]:
            _layershare.refuse_launch_onto_changing((p["tag_name"], p["name"]), os.path.dirname(p["pidfile"]))
        _restart.refuse_foreign_listeners(sel, la["urls"])
        if p["require_gpu_holders"]:
            _restart.refuse_unended(module, sel)
    except StepError as e:
        if e.details.get("phase") == "clean":  # as the restart returns it: phase clean, the gate's details under `clean`
            raise StepError(str(e), phase="clean", clean=dict(e.details))
        raise


def server_processes(p: t.Mapping[str, t.Any], procs: t.Mapping[int, _proc.Proc],
                     launcher: t.Optional[t.Tuple[t.Any, t.Any]]) -> t.Tuple[t.List[int], t.List[int]]:
    """(the server's processes, processes carrying its launch tag that are not): a tagged process is the server's when
    it is the running launcher or its descendant, or runs as the launcher's user or the definition's
    (O(launchable.user)). Anyone can put the tag into a process's environment (the restart's kill leaves such a
    process alone), so another user's must not pass for a worker lacking the environment (issue 24)."""
    tagged = sorted(pid for pid in procs if _proc.environ_has(pid, p["tag_name"], p["name"]))
    uids: t.Set[int] = set()
    tree: t.Set[int] = set()
    if launcher and launcher[0] in procs:
        uids.add(procs[launcher[0]].uid)
        tree = {launcher[0]} | _proc.descendants([launcher[0]], procs)
    if p["launchable"]:
        try:
            uids.add(pwd.getpwnam(p["launchable"]["user"]).pw_uid)
        except KeyError:  # the launch check reports a missing user
            pass
    if not uids:  # nothing to tell the server's user by: every tagged process counts, as before
        return tagged, []
    mine = [pid for pid in tagged if pid in tree or procs[pid].uid in uids]
    return mine, [pid for pid in tagged if pid not in mine]


def rollback_choice(module: AnsibleModule) -> t.Dict[str, t.Any]:
    """O(rollback): the last known good generation this host goes back to (_lastgood.choose), chosen before anything
    is locked; the check then compares the host with it instead of O(fingerprint) and O(expected_env), and the launch
    check looks at its command. Fails, nothing changed, when the host has no such generation."""
    p = module.params
    state = _server.read_state(p["state_file"])
    running = _lastgood.running_from_pidfile(state, p["pidfile"], p["tag_name"], p["name"]) if p["pidfile"] else None
    lkg = _lastgood.path_for(p["state_file"])
    f = _lastgood.read_file(lkg)
    try:
        g = _lastgood.choose(f["generations"], running, p["rollback"]["to"] or "", f["rolled_back"], lkg)
    except _lastgood.TargetError as e:
        module.fail_json(msg="rollback: %s; nothing was changed" % e, running_fingerprint=running,
                         last_good=_lastgood.summary(f["generations"]))
    launcher = "systemd" if p["systemd"] else "process"
    if g.get("launcher") != launcher:
        module.fail_json(msg="rollback: the last known good %s was launched by the %s launcher, and this service's is "
                             "%s (gpufleet_server_launcher): roll out that definition instead; nothing was changed"
                             % (str(g["fingerprint"])[:12], g.get("launcher"), launcher),
                         running_fingerprint=running, last_good=_lastgood.summary(f["generations"]))
    gone = _lastgood.missing_paths(g)
    if gone:  # refused before the drain and the kill: the healthy server would be stopped for one that cannot run
        module.fail_json(msg="rollback: the last known good %s names %s, which no longer exist%s on this host; nothing "
                             "was changed" % (str(g["fingerprint"])[:12], ", ".join(gone), "s" if len(gone) == 1 else ""),
                         running_fingerprint=running, last_good=_lastgood.summary(f["generations"]))
    refused = _layers.put_back_refusal(g.get("layers"), warn=module.warn, files=module)
    if refused:  # before the drain and the kill (a second service on the host runs with the current values)
        module.fail_json(msg="rollback: the NCCL layers of the last known good %s cannot be put back: %s"
                             % (str(g["fingerprint"])[:12], refused),
                         running_fingerprint=running, last_good=_lastgood.summary(f["generations"]))
    choice = {"fingerprint": g["fingerprint"], "recorded_at": g.get("recorded_at"), "from": running,
              "inventory_fingerprint": p["fingerprint"]}
    p["fingerprint"] = g["fingerprint"]
    p["expected_env"] = dict(g.get("expected_env") or {})
    if p["systemd"]:
        # The unit is compared with the generation's files, not the inventory's: a host that runs it already is right.
        # Its own drop-ins are part of it (kept, not removed); the loaded settings are the generation's file's.
        files = {str(x.get("path")): x.get("content") for x in g.get("systemd_files") or []}
        p["systemd"] = dict(p["systemd"], unit_content=files.get(p["systemd"]["unit_path"]), loaded=None, dropins="warn")
        p["systemd_env_content"] = files.get(p["systemd"]["env_file"] or "")
        return choice
    if p["launchable"]:
        path = (g.get("env") or {}).get("PATH")
        ready = _lastgood.ready_for(g, {})  # the URLs the generation answered at, for the foreign-listener check
        urls = [ready.get("health_url"), (ready.get("request") or {}).get("url")] if ready else p["launchable"]["urls"]
        p["launchable"] = dict(p["launchable"], command=g["command"][0], user=g.get("user") or "root",
                               workdir=g.get("workdir") or "/", path=str(path) if path else None, urls=urls)
    return choice


def rollback_reasons(res: t.Dict[str, t.Any], choice: t.Mapping[str, t.Any]) -> t.List[str]:
    """The check's reasons in a rollback's words: the fingerprint's change is the rollback itself."""
    said = "roll back to the last known good %s (recorded %s) from %s" % (
        str(choice["fingerprint"])[:12], choice["recorded_at"], str(choice["from"] or "no verified server")[:12])
    return [said if r.startswith("desired state changed (fingerprint") else r for r in res["reasons"]]


def check(module: AnsibleModule) -> dict:
    p = module.params
    choice = rollback_choice(module) if p["rollback"] is not None else None
    if p["launchable"]:
        la = p["launchable"]
        problems = _server.launch_problems(la["command"], la["user"], la["workdir"])
        if problems:
            module.fail_json(msg="cannot run this server: %s." % "; ".join(problems), launch_problems=problems)
        # The restart's own words for a GPU index this host lacks (the GPU reading below would fail on it too).
        _gpumod.gpus_preflight(p)
    locking = bool(p["lock_file"] and p["owner"]) and not module.check_mode
    # This run's lock from an earlier call (action=lock, or a check that kept it) is neither taken nor dropped here.
    held = _server.read_state(p["lock_file"]) if p["lock_file"] and p["owner"] else {}
    held_before = held.get("owner") == p["owner"] and float(held.get("expires", 0)) >= time.time()
    lock_res = {}
    if locking:
        lock_res = take_lock(module)
    elif p["lock_file"] and p["owner"] and not p["break_owner"]:
        # Check mode takes no lock, but predicts the real call: another run's live lock makes it fail (an earlier
        # run's at once, wait-die) or wait.
        busy = _server.foreign_live_lock(p["lock_file"], p["owner"])
        if busy is not None and _runid.is_earlier(str(busy.get("owner")), p["owner"]):
            e = _server.lock_refused_error(busy)
            module.fail_json(msg=str(e), **e.details)
        if busy is not None and p["lock_wait"] == 0:
            e = _server.lock_busy_error(busy)
            module.fail_json(msg=str(e), **e.details)
    try:
        res = check_state(module)
        # A server its record does not name is kept, but not "already right": the rollout's read-only fast path then
        # leaves it to the role, whose locked check writes the record again (rerecord).
        res["up_to_date"] = (not res["needs_restart"] and not res.get("unit", {}).get("drift")
                             and not res.get("unrecorded") and not res.get("last_good_pending"))
        if p["nccl_layers"]:
            res["nccl_layers"] = _layercheck.up_to_date(p["nccl_layers"], module.warn)
            res["up_to_date"] = res["up_to_date"] and res["nccl_layers"]["up_to_date"]
        if p["launchable"] and (res["needs_restart"] or p["keep_lock"]):
            problems = restart_problems(p)
            if problems:
                raise StepError("cannot run this server, nothing was stopped: %s" % "; ".join(problems),
                                phase="preflight", launch_problems=problems)
            if p["owner"]:
                restart_preflight(module)
    except BaseException:
        if locking and not held_before:
            _server.release_lock(p["lock_file"], p["owner"])
        raise
    if choice is not None:
        res["reasons"] = rollback_reasons(res, choice)
        res["rollback"] = choice
        inv = choice["inventory_fingerprint"]
        if res["needs_restart"] and inv and inv != choice["fingerprint"]:
            # The rollback changes the host, not the inventory: the next rollout restarts it to the inventory's again.
            module.warn("rollback: %s goes back to %s, but the inventory still describes %s: the next rollout restarts "
                        "it to that definition again; change the inventory before the next rollout"
                        % (p["name"], str(choice["fingerprint"])[:12], inv[:12]))
    if lock_res.get("waited"):
        res["lock_waited"] = lock_res["waited"]
    if p["rotation_file"]:
        try:
            res["drain_records"] = _rotation.read(p["rotation_file"])
        except (_rotation.RecordError, OSError) as e:
            res["drain_record_error"] = "drain record %s: %s" % (p["rotation_file"], e)
            res["up_to_date"] = False
    if p["lock_file"] and not p["owner"]:
        holder = _server.lock_holder(p["lock_file"])
        if holder is not None:
            res["lock_holder"] = holder
            res["up_to_date"] = False
    if locking:
        res["locked"] = True
        rerecord(module, res)  # under the lock, when there is one
        if not res["needs_restart"] and not p["keep_lock"] and not held_before:
            res["locked"] = not _server.release_lock(p["lock_file"], p["owner"])
        # The lock file this call leaves behind, when it was not there before, is its only change to the host (with
        # the record of a server whose record had failed).
        res["changed"] = res["locked"] and not held_before or bool(res.get("recorded") or res.get("last_good_kept"))
    elif p["lock_file"] and p["owner"]:
        # Check mode takes no lock but predicts the real call: it keeps the lock when a restart is needed.
        res["locked"] = held_before
        res["changed"] = bool(res["needs_restart"] or p["keep_lock"]) and not held_before
    return res


def check_unit(module: AnsibleModule, procs: t.Mapping[int, _proc.Proc]) -> t.Dict[str, t.Any]:
    """The systemd launcher: the unit's main pid is the launcher, and the unit systemd runs is compared with the
    desired one (file content, pending reload, drop-ins, enablement)."""
    p = module.params
    sd = p["systemd"]
    try:
        props = _systemd.show(module.run_command, sd["unit"])
    except _systemd.SystemdError as e:
        raise StepError("cannot read the state of %s: %s" % (sd["unit"], e), **e.details)
    try:
        d = _systemd.drift(props, sd["unit"], sd["unit_path"], sd["unit_content"], sd["enabled"], sd["env_file"],
                           p["systemd_env_content"], sd["loaded"])
    except _systemd.SystemdError as e:
        raise StepError(str(e), **e.details)
    pid = _systemd.main_pid(props)
    live = procs.get(pid) if pid else None
    confirmed = live is not None and _proc.environ_has(pid, p["tag_name"], p["name"])
    if d["dropins"] and sd["dropins"] == "fail":
        raise StepError("%s has drop-ins gpufleet did not write (%s); gpufleet_server_systemd_dropins is fail: "
                        "remove them, or set it to remove or warn" % (sd["unit"], ", ".join(d["dropins"])),
                        dropins=d["dropins"])
    restart = list(d["restart"])
    drift = list(d["other"])
    if d["dropins"]:
        if sd["dropins"] == "remove":
            # Only this unit's own drop-ins under /etc or /run are gpufleet's to delete; refuse before anything
            # is stopped rather than restart onto a unit that still has the others.
            kept = [x for x in d["dropins"] if not _systemd.removable_dropin(x, sd["unit"])]
            if kept:
                raise StepError("%s has drop-ins gpufleet may not delete (%s: a name prefix's, shared with other "
                                "units, or a package's); remove them by hand" % (sd["unit"], ", ".join(kept)),
                                dropins=d["dropins"])
            restart.append("drop-ins gpufleet did not write change the unit (removed at the restart): %s"
                           % ", ".join(d["dropins"]))
            drift = [x for x in drift if not x.startswith("drop-ins")]
        else:
            module.warn("%s: drop-ins gpufleet did not write change the unit: %s; they stay in force "
                        "(gpufleet_server_systemd_dropins: warn)" % (sd["unit"], ", ".join(d["dropins"])))
    enabled_ok = not any(x.startswith("unit is") for x in d["other"]) and d["loaded"]
    return dict(loaded=d["loaded"], active_state=props["ActiveState"], main_pid=pid, main_confirmed=confirmed,
                main_start_time=live.start_time if live else None, unit_file_state=d["enabled_state"],
                enabled_ok=enabled_ok, content_matches=d["content_matches"], dropins=d["dropins"],
                restart_reasons=restart, drift=drift)


def check_state(module: AnsibleModule) -> dict:
    p = module.params
    state = _server.read_state(p["state_file"])
    reasons = []
    procs = _proc.snapshot()
    pidfile = pidfile_state(p["pidfile"], procs, (p["tag_name"], p["name"])) if p["pidfile"] else None
    unit = check_unit(module, procs) if p["systemd"] else None
    notes = []
    if unit is not None:
        # systemd knows the launcher: after a `systemctl restart` by hand the pidfile names the old one.
        running = unit["main_confirmed"]
        launcher = (unit["main_pid"], unit["main_start_time"])
    else:
        # The same test as the kill's: a pidfile naming a live process the pidfile cannot confirm (a pid-only file
        # naming an unrelated process) is not our server running.
        running = bool(pidfile and pidfile["status"] == "confirmed")
        live = procs.get(pidfile["pid"]) if running else None
        launcher = (pidfile["pid"], live.start_time if live else None) if running else (None, None)
    if not running:
        reasons.append("server is not running")
    recorded = state.get("fingerprint")
    on_record = (state.get("pid"), state.get("start_time"))
    unrecorded = unit is None and running and unrecorded_launch(p, state, launcher, on_record)
    if unrecorded:
        notes.append("the running server (pid %s) was launched by gpufleet with this definition, but its record %s does "
                     "not name it (the record of its restart failed): kept, and recorded again"
                     % (launcher[0], p["state_file"]))
    elif p["fingerprint"] and recorded != p["fingerprint"]:
        reasons.append("desired state changed (fingerprint %s -> %s)" % ((recorded or "none")[:12], p["fingerprint"][:12]))
    # The record names the launch that passed every check. A server launched after it whose launch failed (not ready,
    # workers without the environment) runs under the same pidfile; it is not the recorded one, whatever the
    # fingerprint says, and must be restarted.
    if unrecorded:
        pass
    elif state.get("verified") is False:
        # server_restart marks the record before each launch and rewrites it once every check passed.
        reasons.append("the last launch by gpufleet did not pass its checks (or its run was interrupted)")
    elif running and state.get("pid") is not None and launcher != on_record:
        if unit is not None:
            # The record is of a verified launch, and no gpufleet launch since: systemd started the unit itself
            # (a reboot, `systemctl restart`, Restart=), from the unit the check compares with the desired one.
            notes.append("the unit was restarted outside gpufleet (main pid %s, verified launch on record pid %s); "
                         "its unit and its workers' environment are checked as usual" % (launcher[0], on_record[0]))
        else:
            reasons.append("the running server (pid %s) is not the verified launch on record (pid %s)"
                           % (launcher[0], state.get("pid")))
    if unit is not None:
        reasons.extend(unit["restart_reasons"])
    tagged, forged = server_processes(p, procs, launcher if running else None)
    holders = {}
    if p["require_gpu_holders"]:
        with _gpumod.backend_or_fail(p["backend"]) as backend:
            indices = _nvml.resolve_indices(backend, p["gpus"])
            if not indices:
                raise StepError("gpus: this host has no GPUs, so no GPU server can run here", backend=backend.name)
            for i in indices:
                holders[i] = [h["pid"] for h in backend.processes(i)]
    tagged_set = set(tagged)
    strays = [dict(gpu=g, pid=pid, cmdline=procs[pid].command[:300] if pid in procs else "?")
              for g, pids in sorted(holders.items()) for pid in pids if pid not in tagged_set]
    if strays:
        reasons.append("GPUs held by %d process(es) without this server's launch tag%s" % (
            len(strays), "" if not forged else " (pid %s: with it, as a user the server does not run as)"
            % ", ".join(str(x) for x in forged)))
    for g, pids in sorted(holders.items()):
        if not tagged_set.intersection(pids):
            reasons.append("GPU %d is not held by a %s worker" % (g, p["name"]))
    if tagged and not running:
        reasons.append("%d tagged process(es) alive without their launcher (orphans)" % len(tagged))
    holder_pids = {pid for pids in holders.values() for pid in pids}
    env_problems = {}
    expected = {k: str(v) for k, v in p["expected_env"].items()}
    for pid in tagged:
        if holders and pid not in holder_pids:
            continue
        try:
            actual = _proc.read_environ(pid, expected)
        except _proc.ProcError:
            continue
        bad = sorted(k for k, v in expected.items() if actual.get(k) != v)
        if bad:
            env_problems[str(pid)] = bad
    if env_problems:
        reasons.append("workers lack the expected environment: %s" % ", ".join(
            "pid %s: %s" % (k, " ".join(v)) for k, v in sorted(env_problems.items())))
    workers = [dict(pid=pid, ppid=procs[pid].ppid, cmdline=procs[pid].command[:300], holds_gpu=pid in holder_pids)
               for pid in tagged if pid in procs]
    res = dict(changed=False, needs_restart=bool(reasons), reasons=reasons, running=running,
               fingerprint_recorded=recorded, workers=workers, strays=strays, env_problems=env_problems,
               gpu_holders={str(k): v for k, v in holders.items()},
               running_fingerprint=_lastgood.running_fingerprint(state, launcher, p["tag_name"], running),
               last_good=last_good_report(p["state_file"], state))
    if unrecorded:
        res["unrecorded"] = True
    elif running and not reasons and p["pidfile"] and p["fingerprint"] and pending_last_good(p, launcher):
        # Its record was written again, but not its last known good generation (the state filesystem was still full):
        # kept aside since, promoted by the locked check once there is room (rerecord), not only at the next kill.
        res["last_good_pending"] = True
    if pidfile is not None:
        res["pidfile"] = pidfile
    if unit is not None:
        res["unit"] = unit
    if notes:
        res["notes"] = notes
    return res


def pending_last_good(p: t.Mapping[str, t.Any], launcher: t.Tuple[t.Any, t.Any]) -> bool:
    """Whether a last known good generation of this definition was put aside for the running launcher."""
    try:
        return _lastgood.pending_for(p["pidfile"], p["fingerprint"], launcher if launcher[1] is not None else None) \
            is not None
    except OSError:
        return False  # unreadable: rerecord says so when it is the record's to recover


def last_good_report(state_file: str, state: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """What the check shows of the last known good generations and of the record's gate measurement (RV(last_good)):
    fingerprints, times and numbers, never a definition (its environment values are secret)."""
    f = _lastgood.read_file(_lastgood.path_for(state_file))
    gens = _lastgood.summary(f["generations"])
    g = state.get("gate") if isinstance(state.get("gate"), dict) else None
    gate = None
    if g:
        # Imported only for a recorded measurement: _bench brings http.client and statistics, which every check (a
        # no-op rollout runs one per host) would otherwise compile and import for nothing.
        from ansible_collections.gpufleet.serving.plugins.module_utils import _bench  # pylint: disable=import-outside-toplevel
        gate = {"median": g.get("median"), "metric": g.get("metric"), "unit": _bench.UNITS.get(str(g.get("metric"))),
                "measured_at": g.get("measured_at"), "fingerprint": g.get("fingerprint")}
    return {"newest": gens[0] if gens else None, "generations": gens, "rolled_back": f["rolled_back"], "gate": gate}


def unrecorded_launch(p: t.Mapping[str, t.Any], state: t.Mapping[str, t.Any], launcher: t.Tuple[t.Any, t.Any],
                      on_record: t.Tuple[t.Any, t.Any]) -> bool:
    """Whether the running server is a launch of this very definition that the record does not name because writing
    the record failed after the launch (a full state filesystem): its launcher carries the fingerprint (server_restart
    sets it at launch) and the record says nothing against it. Restarting it would only fail the same way, forever.
    A launch that failed its checks is not one: server_restart marked the record unverified before it, so `verified`
    is false then."""
    if not p["fingerprint"] or state.get("verified") is False:
        return False
    if state.get("fingerprint") == p["fingerprint"] and launcher == on_record:
        return False  # the record names it: nothing to recover
    key = p["tag_name"] + _server.FINGERPRINT_SUFFIX
    try:
        return _proc.read_environ(launcher[0], [key]).get(key) == p["fingerprint"]
    except _proc.ProcError:
        return False


def rerecord(module: AnsibleModule, res: t.Dict[str, t.Any]) -> None:
    """Write the record of an up-to-date server the record does not name (unrecorded_launch); a record that still
    cannot be written is a warning, not a restart."""
    p = module.params
    if module.check_mode or res["needs_restart"] or not p["pidfile"]:
        return
    if res.get("last_good_pending"):  # the record names the server; only its generation is still aside
        keep_pending(module, res)
        return
    if not res.get("unrecorded"):
        return
    old = _server.read_state(p["state_file"])
    timings = old.get("timings") if isinstance(old.get("timings"), dict) else {}
    # A verified restart whose record failed put its last known good generation (and gate measurement) aside.
    try:
        pending = _lastgood.pending_for(p["pidfile"], p["fingerprint"], _server.pidfile_identity(p["pidfile"]))
    except OSError as e:  # unreadable: the record is still written, without it
        module.warn("the last known good generation put aside in %s cannot be read: %s"
                    % (_lastgood.pending_path(p["pidfile"]), e.strerror or e))
        pending = None
    gate = (pending or {}).get("generation", {}).get("gate")
    try:
        _server.record_state(p["state_file"], p["name"], p["fingerprint"], p["pidfile"], timings or {},
                             gate=gate if isinstance(gate, dict) else None)
    except OSError as e:
        # Said in the result too (the role passes it to the rollout summary): a warning alone scrolls by.
        why = str(e.strerror or e)
        if p["state_file"] not in why:  # the atomic writers name the file already ("cannot write PATH: ...")
            why = "%s: %s" % (p["state_file"], why)
        res["record_missing"] = ("the running server (pid %s) is up to date and kept, but its record still cannot be "
                                 "written (%s): the record is still missing; the next run writes it once there is "
                                 "room" % ((res.get("pidfile") or {}).get("pid"), why))
        module.warn(res["record_missing"])
        return
    res["recorded"] = True
    if pending is not None:
        keep_pending(module, res, pending)


def keep_pending(module: AnsibleModule, res: t.Dict[str, t.Any], pending: t.Optional[t.Mapping[str, t.Any]] = None
                 ) -> None:
    """Make the generation put aside for the running server the newest last known good (RV(last_good) shows it); a
    file still too full is a warning, and the generation stays aside for the next check."""
    p = module.params
    if pending is None:
        try:
            pending = _lastgood.pending_for(p["pidfile"], p["fingerprint"], _server.pidfile_identity(p["pidfile"]))
        except OSError:
            pending = None
        if pending is None:
            return
    try:
        _lastgood.promote(p["pidfile"], p["state_file"], pending)
    except OSError as e:  # the record is written and the server kept: a warning, as after a restart
        module.warn("the last known good definitions could not be written to %s: %s"
                    % (_lastgood.path_for(p["state_file"]), e.strerror or e))
        return
    res["last_good_kept"] = True
    try:
        res["last_good"] = last_good_report(p["state_file"], _server.read_state(p["state_file"]))
    except OSError:
        pass  # what the check reported before stays


def pidfile_state(path: str, procs: t.Mapping[int, _proc.Proc], tag: t.Tuple[str, str]) -> t.Dict[str, t.Any]:
    """_select.check_pidfile's report; an unreadable pidfile is reported, not fatal (the check is read-only)."""
    try:
        return _select.check_pidfile(path, procs, tag=tag)
    except (_select.SelectError, OSError) as e:
        return dict(path=path, pid=None, status="unreadable", reason="pidfile %s is unreadable: %s" % (path, e),
                    confirmed_by=None)


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
            lock_ttl=dict(type="float", default=1800.0),
            lock_wait=dict(type="float", default=0.0),
            break_owner=dict(type="str"),
            keep_lock=dict(type="bool", default=False),
            # Read by the action plugin only (plugins/action/server_state.py).
            decide=dict(type="dict", options=dict(
                force=dict(type="bool", default=False),
                balancers=dict(type="list", elements="str", default=[]),
                nccl_profile=dict(type="str"),
                nccl_known=dict(type="bool", default=True),
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
    p = module.params
    err = lock_input_error(p)
    if err:
        module.fail_json(msg=err)
    if p["action"] == "check":
        try:
            result = check(module)
        except StepError as e:
            fail(module, e)
        module.exit_json(**result)
    if p["action"] == "record":
        err = record_input_error(p)
        if err:
            module.fail_json(msg=err)
        if _server.pidfile_identity(p["pidfile"]) is None:
            module.warn("pidfile %s is missing or does not hold the 'PID START_TIME' a launch writes: recorded without a "
                        "pid, so the next check finds no server running" % p["pidfile"])
        changed, new = _server.record_state(p["state_file"], p["name"], p["fingerprint"], p["pidfile"], p["timings"],
                                            module.check_mode)
        module.exit_json(changed=changed, state=new)
    cur = _server.read_state(p["lock_file"])
    if p["action"] == "lock":
        if module.check_mode:
            module.exit_json(changed=cur.get("owner") != p["owner"], lock=cur)
        res = take_lock(module)
        # Taking the lock writes the lock file; re-taking this run's own lock changes nothing.
        module.exit_json(changed=cur.get("owner") != p["owner"], locked=True, **res)
    released = False
    if not module.check_mode:
        released = _server.release_lock(p["lock_file"], p["owner"])
    module.exit_json(changed=released if not module.check_mode else cur.get("owner") == p["owner"], released=released)


if __name__ == "__main__":
    main()
