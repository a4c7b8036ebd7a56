# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE and should only be used by this collection.

from __future__ import annotations


class ModuleDocFragment(object):

    # The check of a running server against its desired state: the options gpufleet.serving.server_info (read-only) and
    # gpufleet.serving.server_state (the same check under the host lock) share, documented once
    # (module_utils/_state.py's check_argument_spec). O(lock_file) is each module's own.
    DOCUMENTATION = r"""
options:
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
      - Its process counts as the server only when it carries the launch tag
        (RV(gpufleet.serving.server_info#module:running)); the recorded start time
        only tells a stale pidfile (a reused pid), it never confirms on its own.
    type: path
  fingerprint:
    description: Hash of the desired state (command, env, user, workdir, launcher, NCCL layers).
    type: str
  launchable:
    version_added: 0.2.0
    description: What the launch needs on the host; the check fails naming each one that is missing.
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
          - When a restart is wanted it is checked with the other files the restart writes after its kill
            (O(state_file),
            O(pidfile), O(gpufleet.serving.server_state#module:lock_file)) and O(launchable.drain_record), as
            M(gpufleet.serving.server_restart)'s preflight
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
          - When a restart is wanted and O(gpufleet.serving.server_state#module:owner) is set, a process listening on
            such a port that the restart's kill
            would not end fails the check with that preflight's message (it says nothing was stopped), before the drain
            and the kill. The server's own processes (those the kill selects, O(launchable.kill)) holding it are fine.
        type: list
        elements: str
        default: []
      clean_timeout:
        version_added: 0.2.0
        description:
          - The restart's O(gpufleet.serving.server_restart#module:wait_clean.timeout). When a restart is wanted and
            O(gpufleet.serving.server_state#module:owner) is set, a process holding the server's GPUs that no kill step
            of the restart would end (not this service's, not
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
      - Require that tagged processes hold every GPU in O(gpus).
      - The check then fails on a host without any GPU.
    type: bool
    default: true
  expected_env:
    description: Variables every GPU-holding worker must carry in /proc/PID/environ.
    type: dict
    default: {}
  systemd_env_content:
    description:
      - With O(systemd), the desired environment file of the unit (O(systemd.env_file)); a file that differs, is
        missing,
        or is not a root-owned 0600 regular file is a reason to restart (the restart rewrites it). Unset skips it.
      - Its values are secret (C(no_log)). A top-level option, not one of O(systemd), because ansible-core's journal
        entry of a module's arguments prints a dict option as text, where a secret of several lines is not masked.
    type: str
    version_added: 0.3.0
  rotation_file:
    version_added: 0.2.0
    description:
      - The host's drain record (the file M(gpufleet.serving.rotation_record) keeps) to read as well,
        in the same call (the rollout's fast path then costs one round trip per host, balancers or not).
      - Its records are returned in RV(gpufleet.serving.server_info#module:drain_records) (empty when there is no
        record); a record that cannot be read
        makes RV(gpufleet.serving.server_info#module:up_to_date) false and is said in
        RV(gpufleet.serving.server_info#module:drain_record_error). Never written.
    type: path
  worker_urls:
    version_added: 0.3.0
    description:
      - With a lock owner (O(gpufleet.serving.server_state#module:owner)), when a restart is needed (or
        O(gpufleet.serving.server_state#module:keep_lock)) or the drain record names
        entries to put back, and with O(gpufleet.serving.server_state#module:action=lock) (the clean playbook's, before
        its drain), the balancer entries whose worker URL
        was set by hand, as entry name to URL. Each URL's host must resolve on this host to one of its own addresses
        (a bind to it succeeds and, where C(ip_nonlocal_bind) lets any bind succeed, the kernel's table of local
        addresses lists it), else the check fails before the drain with nothing touched (its C(phase) is
        V(preflight)); the message shows the URL's host, never the whole URL. An entry copied from another host's
        variables, its C(server) and C(worker_url) both, would pass the balancer's address check and take that host
        out of rotation while this one is killed.
    type: dict
    default: {}
  decide:
    version_added: 0.2.0
    description:
      - The action plugin also decides what the gpu_server role does with the host
        (RV(gpufleet.serving.server_info#module:decision)), on the controller, in the same task, by the same code for
        both modules (with M(gpufleet.serving.server_info), what a run would do; the audit shows it). The module itself
        ignores this option.
      - With M(gpufleet.serving.server_state) and its owner, when the check fails because a run of this controller
        that is gone (Ctrl-C, SIGTERM; the P(gpufleet.serving.run#lookup) lookup's V(alive) is V(false)) holds the host
        lock, the action takes the lock over (the check again with O(gpufleet.serving.server_state#module:break_owner))
        and says so in the run's output and in RV(gpufleet.serving.server_state#module:took_over_from).
      - It refuses (fails the host, nothing changed) when O(decide.nccl_profile) is set but O(decide.nccl_known) is
        false, and, for a run with O(gpufleet.serving.server_state#module:owner), a restart onto NCCL layers
        O(nccl_layers) found not as asked.
    type: dict
    suboptions:
      force:
        description: The restart is forced (C(gpufleet_server_force_restart)); the reasons then say V(forced).
        type: bool
        default: false
      balancers:
        description:
          - Names of the host's balancer entries. With O(gpufleet.serving.server_state#module:owner) and no restart
            needed, the entries the host's drain
            record (O(rotation_file)) names are the ones an earlier run left it out of;
            RV(gpufleet.serving.server_info#module:decision) then says how it
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
          - With O(gpufleet.serving.server_state#module:tune), the tags the check carries as a step of its own. The
            check (and its decision) runs only
            where C(--tags) and C(--skip-tags) select a task with these tags and those the task inherits, by
            ansible-core's rules; RV(gpufleet.serving.server_state#module:checked) is false when they do not. Empty,
            the check runs whenever the task does.
        type: list
        elements: str
        default: []
  nccl_layers:
    version_added: 0.2.0
    description:
      - Also check that the NCCL tuning layers are already as asked, by running the code of
        M(gpufleet.serving.sitecustomize_env) and M(gpufleet.serving.nccl_conf) in check mode (nothing is written).
        RV(gpufleet.serving.server_info#module:up_to_date) is then true only when neither would change, every
        interpreter already sees the values, and
        no restart is needed, so a rollout can skip an up-to-date host after this one call.
      - A layer whose check fails counts as not up to date; the check itself does not fail for it.
    type: dict
    suboptions:
      sitecustomize:
        description: The options of M(gpufleet.serving.sitecustomize_env)
          (O(gpufleet.serving.sitecustomize_env#module:backup) excepted).
        type: dict
      nccl_conf:
        description: The options of M(gpufleet.serving.nccl_conf) (O(gpufleet.serving.nccl_conf#module:backup)
          excepted).
        type: dict
  rollback:
    version_added: 0.2.0
    description:
      - "A rollback by hand (the C(gpufleet.serving.rollback) playbook) - the host is compared
        with one of its last known good generations (C(STATE.last_good.json) beside O(state_file)) instead of
        O(fingerprint) and O(expected_env), and O(launchable) checks the generation's command, user and working
        directory. RV(gpufleet.serving.server_info#module:needs_restart) is then false when the host already runs that
        generation, verified; RV(gpufleet.serving.server_info#module:rollback)
        says which one it is."
      - The generation is O(rollback.to), or the newest one whose fingerprint differs from what the host runs now
        (RV(gpufleet.serving.server_info#module:running_fingerprint); a host that runs no verified server goes back to
        the newest). A host that an
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
      - The server runs as this systemd unit. Its main pid (C(systemctl show)), not the pidfile, is
        the launcher, so a unit systemd started itself (a reboot, C(systemctl restart)) still reads as running; when
        the record is of a verified launch (no gpufleet launch failed or was cut short since), that restart is
        reported in RV(gpufleet.serving.server_info#module:notes), not as a reason.
      - The unit systemd would run is compared with the desired one; see RV(gpufleet.serving.server_info#module:unit).
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
        description: Whether the unit should be enabled; the other state is drift
          (RV(gpufleet.serving.server_info#module:unit.drift)). Unset skips it.
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
            deletes them, M(gpufleet.serving.server_restart)
            O(gpufleet.serving.server_restart#module:systemd.remove_dropins)),
            and fails the check when one is not the unit's own under C(/etc) or C(/run/systemd/system); V(fail) fails
            the check.
        type: str
        choices: [warn, remove, fail]
        default: warn
"""
