#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_restart
short_description: Restart a server in one step - kill, verify clean, launch, ready, verify the workers, record
version_added: 0.2.0
description:
  - Runs the whole restart cycle of a server in one module call, in this order, stopping at the first step that
    fails (RV(phase) names it). The cycle is the same for both launchers (O(launcher)); only the stop and the start
    differ, and the timings mean the same.
  - "With O(launcher=systemd), the unit O(systemd.unit) (installed by the caller: the command, its environment,
    C(KillMode=mixed) and C(TimeoutStopSec) set to the kill grace are in it) is stopped with C(systemctl stop): TERM
    to its main process, up to C(TimeoutStopSec) for it to finish, then KILL of everything left in its cgroup, as
    the process launcher's kill does. A unit file changed on disk is loaded first (C(systemctl daemon-reload)), so
    the stop already uses its grace. The start is C(systemctl start); the unit's main pid is the launcher (written
    to O(pidfile)). A start-up failure names systemd's exit status and its journal lines."
  - "C(preflight): before anything is stopped, the launch's executable (O(command[0]), absolute or found on the
    server's C(PATH)), O(user) and O(workdir) must exist and O(gpus) must name GPUs of this host; O(pidfile),
    O(record.state_file) and O(log_path) must not lie under a regular file nor in a directory that cannot be written
    (read-only included); and the directories of O(record.state_file), O(pidfile), O(release_lock.lock_file) and
    O(log_path) must each have 16 KiB and 4 inodes free (the failure names the directory and its free bytes);
    otherwise the module fails and stops nothing.
    With O(wait_ready.check_listener), a process that the kill does not select listening on the port of the health
    URL (or of the request's URL), on any address of the host, fails it too, named by pid, user and command line (it
    is never killed): a request to the URL would reach that process instead of the new server, or, bound to another
    address, it would keep the new server from listening (EADDRINUSE) on the addresses the old server's own sockets
    have (every address when the old server is not listening); beside them it is fine. A listener holding one of O(gpus) (itself or
    through a descendant) is a server started by hand: O(kill.gpu_strays) lets it through (the stray kill ends what
    holds the GPUs), otherwise the failure says how to adopt it."
  - "C(kill): every process carrying the launch tag O(tag_name)=O(name) (workers orphaned to PID 1 included), the
    process O(pidfile) names when confirmed and, with O(kill.cmdline_regex), an adopted server started before
    gpufleet; TERM, grace, KILL, as M(gpufleet.serving.process_kill) does. The pidfile's process is confirmed only by
    the launch tag or O(kill.cmdline_regex); the start time the pidfile records only tells a stale pidfile, so a
    pidfile naming an unrelated process (a server stopped by hand; its pid, or its pid and real start time) selects
    nothing and is reported in the C(pidfile) of RV(kill)."
  - "C(strays): with O(kill.gpu_strays), every other process holding one of O(gpus), minus O(kill.exclude_regex)."
  - "Two services on one host: a process carrying another service's launch tag (O(tag_name) with another value in its
    environment) is never killed by this module, whatever selects it (O(kill.cmdline_regex), O(kill.gpu_strays), a
    session or process tree, a pidfile); it is listed in the C(excluded) of RV(kill) with the service it belongs to."
  - "C(clean), before the kill: a process holding O(gpus) that neither the kill nor the stray kill would end (a
    process started by hand, another service's, one of O(kill.exclude_regex)) would fail the clean gate after the
    kill and leave the host without its server. Such a holder gets O(wait_clean.timeout) seconds to exit by itself
    (NVML polled every O(wait_clean.poll_interval)); if it is still there the module fails in phase C(clean) with
    RV(killed)=V(0), listing the holders and what would end them, and nothing is stopped. Check mode runs the same
    check (the kill steps' selections, nothing signalled). A holder NVML lists that this pid namespace does not show
    is left to the clean gate after the kill."
  - "C(clean): after the kill, wait until O(gpus) are clean, as M(gpufleet.serving.gpu_wait) does; nothing is
    launched onto a dirty GPU. The failure lists every holder."
  - "C(launch): start O(command) tagged, in its own session, as M(gpufleet.serving.server_launch) does."
  - "C(ready): wait for the health URL and a real request, failing at once with the launcher's exit status and the
    log tail if the server dies (C(startup)), as M(gpufleet.serving.server_ready) does. An answer counts only when the
    socket it came from (of those listening on the URL's port, the one on the first of the URL host's addresses that
    has one) belongs to the launched server (the launcher's process tree or a process
    carrying the launch tag; O(wait_ready.check_listener)). O(wait_ready) must name a health URL or a request; without
    one the module fails before anything is killed."
  - "A new server that dies during start-up or fails the readiness gate serves nobody: unless O(keep_failed), what is
    left of it (the processes carrying the launch tag; with O(launcher=systemd), the unit, stopped) is killed as the
    old server was and its GPUs are verified clean again, then the module fails; the message ends with what was left
    and RV(new_server) says it."
  - "C(busy): with O(wait_busy), wait until each GPU of O(gpus) (every GPU of the host when empty) lists
    O(wait_busy.min_processes) processes, failing at once if the launcher dies. A GPU that stays idle for
    O(wait_busy.idle_grace) seconds while the server's own processes hold the others fails the step early (a ready
    server has loaded its model: a GPU it has not taken is one it does not use), and the failure names the idle GPUs
    and the O(gpus) to set. The server is left running then: it answered its readiness request."
  - "C(verify_gpus): the server's GPUs (O(gpus)) are held only by processes that carry its launch tag. One that took
    a GPU between the clean gate and the launch fails the step, named, and is never killed (RV(gpu_intruders)); the
    server is not recorded as verified. A holder that is gone or not visible here (another pid namespace) is passed
    over."
  - "C(verify_env): with O(verify_env), check that every GPU-holding worker carries the expected environment
    (and, with a log, what NCCL logged), as M(gpufleet.serving.process_env) does. Only the expected keys are read."
  - "C(record): with O(record), write the state file (fingerprint, pid, timings) as
    M(gpufleet.serving.server_state) C(action=record) does. Before the launch the state file is marked unverified;
    with the process launcher the server then also carries the fingerprint in its environment
    (O(tag_name)C(_FINGERPRINT)). When the record cannot be written after every check passed (a full state
    filesystem), the module fails naming the file, removes the unverified mark, and leaves the verified server
    running; the next C(action=check) keeps that server (it carries this fingerprint) and writes the record again.
    Every file is written through a temporary file renamed into place; none is left behind by a failure."
  - With O(release_lock), the host lock is released at the end, whether the cycle passed or failed. While the cycle
    runs, the lock names this module's process; if the controller dies meanwhile (Ctrl-C, SIGTERM), the cycle still
    runs to its end on the host (a SIGTERM, SIGINT or SIGHUP that reaches this module during the cycle is not obeyed
    and is named in a warning; SIGKILL still stops it), and a later run that takes over the dead run's lock waits for this process first
    (O(gpufleet.serving.server_state#module:break_owner)), so two restarts never interleave on one host.
  - Each step is the code of the single-step module; one call instead of seven saves an ansible task start per
    step and host (about 0.3 s of CPU on each side per host), which is most of a fleet restart's wall time.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.NVML
  - gpufleet.serving._launch
attributes:
  check_mode:
    support: full
    details: Lists the processes the kill steps would signal and reports that it would launch; changes nothing. It
      fails as the real run does, before anything is stopped and with the same message (C(would fail) for C(fails)),
      when a process that neither kill step would end still holds the GPUs after O(wait_clean.timeout).
  diff_mode:
    support: none
  idempotent:
    support: none
    details: A restart always restarts; the gpu_server role calls it only when a restart is needed.
options:
  launcher:
    version_added: 0.2.0
    description:
      - How the server is started and stopped. V(process) starts O(command) in its own session; V(systemd) starts
        and stops the unit O(systemd.unit).
    type: str
    choices: [process, systemd]
    default: process
  systemd:
    version_added: 0.2.0
    description: The unit, with O(launcher=systemd) (required then).
    type: dict
    suboptions:
      unit:
        description: Name of the service unit, for example C(gpufleet-sglang.service).
        type: str
        required: true
      remove_dropins:
        description:
          - Drop-ins of the unit to delete before the stop (paths under C(/etc/systemd/system/UNIT.d/) or
            C(/run/systemd/system/UNIT.d/) only; any other path fails before anything is done).
        type: list
        elements: path
        default: []
  retire_unit:
    version_added: 0.2.0
    description:
      - "With O(launcher=process), a unit an earlier systemd launch left (the server moved to the process launcher):
        when one of O(retire_unit.files) exists, the unit is stopped and disabled (C(systemctl disable --now)) and
        the files are deleted before the kill, so it cannot start a second server at the next boot."
    type: dict
    suboptions:
      unit:
        description: The unit's name.
        type: str
        required: true
      files:
        description: Its unit file and environment file.
        type: list
        elements: path
        required: true
  keep_failed:
    version_added: 0.2.0
    description:
      - Keep a new server that died during start-up or failed the readiness gate running, for debugging. By default
        (V(false)) what is left of it is stopped and its GPUs verified clean before the module fails.
    type: bool
    default: false
  stop_only:
    version_added: 0.2.0
    description:
      - Stop the server and verify its GPUs clean (the C(kill), C(strays) and C(clean) steps), remove O(pidfile)
        once the process it names is gone (RV(pidfile_removed)), then return without a launch. O(command) and
        O(wait_ready) are not needed then. The clean playbook's stop.
    type: bool
    default: false
  command:
    description:
      - Argument vector to execute (no shell). Required with O(launcher=process); with O(launcher=systemd) the unit
        holds the command, and setting it (or O(env)) is an error. O(user), O(workdir), O(umask) and
        O(env_passthrough) are then the unit's too, and not used.
    type: list
    elements: str
  pidfile:
    description: Pidfile of the server (C(PID START_TIME)); the old one selects what to kill (when confirmed), the new
      one is written.
    type: path
    required: true
  gpus:
    description: GPU indices the server uses, for the stray kill, the clean gate and the busy wait. Empty means all.
    type: list
    elements: int
    default: []
  backend:
    description: GPU backend.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  kill:
    description: How the old server is stopped.
    type: dict
    default: {}
    suboptions:
      cmdline_regex:
        description:
          - Also kill processes whose command line matches (a server started before gpufleet managed it).
          - A process carrying another service's launch tag is never killed, even when it matches.
          - With O(gpus) set, a process matched by this regex alone whose processes (itself and its descendants) hold
            GPUs, none of them one of O(gpus), is another server started by hand and is never killed either; one that
            holds no GPU is.
        type: str
      gpu_strays:
        description: Also kill processes without the tag that hold one of O(gpus) (never another service's, by its launch tag).
        type: bool
        default: false
      exclude_regex:
        description: Command lines never killed; unset keeps the default list of host agents (nvidia-persistenced, DCGM, exporters).
        type: list
        elements: str
      signals:
        description: Signals to send in turn.
        type: list
        elements: str
        default: [TERM, KILL]
      grace:
        description: Seconds to wait after each signal but the last.
        type: float
        default: 10
      final_wait:
        description: Seconds to wait after the last signal before failing on survivors.
        type: float
        default: 5
      poll_interval:
        description: Seconds between liveness checks.
        type: float
        default: 0.01
      order:
        description:
          - V(launcher_first) signals the launcher (the confirmed pidfile process, else the tops of the selected trees)
            alone first and gives it O(kill.grace) seconds to drain and exit, then the rest (within the same grace),
            then escalates;
            V(all_at_once) signals every process together. See O(gpufleet.serving.process_kill#module:order).
        type: str
        choices: [launcher_first, all_at_once]
        default: launcher_first
        version_added: 0.2.0
  wait_clean:
    description: The clean gate before the launch.
    type: dict
    default: {}
    suboptions:
      timeout:
        description: Seconds to wait before failing without launching. Must be greater than 0.
        type: float
        default: 30
      poll_interval:
        description: Seconds between polls. Must be greater than 0.
        type: float
        default: 0.02
      max_used_mib:
        description: Highest used memory (MiB) that still counts as clean; unset picks the default of C(gpu_wait).
        type: int
  wait_ready:
    version_added: 0.2.0
    description:
      - Wait until the server is ready, as M(gpufleet.serving.server_ready) does, failing at once with the log tail
        if the server dies during start-up.
      - Required unless O(stop_only=true). Not evaluated in check mode.
    type: dict
    suboptions:
      health_url:
        description: URL that must answer HTTP 200. Empty skips the health poll.
        type: str
        default: ""
      request:
        description: A real request that must succeed, as O(gpufleet.serving.server_ready#module:request). Empty skips it.
        type: dict
        default: {}
        suboptions:
          url:
            description: URL of the request. Required when any other key is set.
            type: str
          method:
            description: HTTP method; C(POST) when unset.
            type: str
          body:
            description:
              - Request body. A dict or a list is sent as JSON (with C(Content-Type application/json) unless
                O(wait_ready.request.headers) sets one); a string is sent as it is.
            type: raw
          headers:
            description:
              - Request headers.
              - The values are secret (C(no_log)), as the values of O(env) are, so an C(Authorization) header may
                hold a token.
            type: dict
          status:
            description: Status the response must have; C(200) when unset.
            type: int
          expect_regex:
            description: Regular expression the response body must match.
            type: str
          timeout:
            description: Seconds per attempt; C(10) when unset.
            type: float
      timeout:
        description: Seconds to wait for readiness. Must be greater than 0.
        type: float
        default: 600
      interval:
        description: Seconds between polls. Must be greater than 0.
        type: float
        default: 0.25
      log_tail_lines:
        description: Lines of O(log_path) returned on failure.
        type: int
        default: 40
      log_tail_path:
        version_added: 0.2.0
        description:
          - The server's own log file, for a server that writes its log there (its C(--log) option, say) rather
            than to its standard output and error, which O(log_path) captures. A start-up failure's log tail is
            read from it when the server wrote to it since the launch, else from O(log_path).
          - Unset, the tail comes from O(log_path); when that holds only gpufleet's launch line, the failure says
            so and points here.
        type: path
      check_listener:
        version_added: 0.2.0
        description:
          - Count an answer only when the socket listening on the URL's port belongs to the launched server, as
            O(gpufleet.serving.server_ready#module:check_listener) does (the launch tag counts too), and check the
            port in the C(preflight).
          - V(false) counts every answer (a server reached through a proxy process of its own, C(docker-proxy)).
        type: bool
        default: true
  wait_busy:
    description: Wait until the workers hold the GPUs. Unset skips the step.
    type: dict
    suboptions:
      min_processes:
        description: Processes each GPU must list.
        type: int
        default: 1
      timeout:
        description: Seconds to wait.
        type: float
        default: 600
      poll_interval:
        description: Seconds between polls.
        type: float
        default: 0.05
      idle_grace:
        version_added: 0.2.0
        description:
          - Seconds a GPU may stay idle while the server's own processes hold the other GPUs (the set they hold not
            changing) before the step fails, instead of waiting out O(wait_busy.timeout).
        type: float
        default: 30
  verify_env:
    description: Check the environment of the GPU-holding workers. Unset skips the step.
    type: dict
    suboptions:
      expected:
        description: Variables and values every checked worker must carry.
        type: dict
        required: true
      nccl_log:
        description: NCCL log files to read as a second proof, as O(gpufleet.serving.process_env#module:nccl_log).
        type: list
        elements: path
        default: []
      target:
        description: Which processes to check, as O(gpufleet.serving.process_env#module:target).
        type: str
        choices: [workers, all_selected]
        default: workers
  record:
    description: Write the state file after the checks passed. Unset skips the step.
    type: dict
    suboptions:
      state_file:
        description: JSON state file of this service.
        type: path
        required: true
      fingerprint:
        description: Hash of the desired state.
        type: str
        required: true
      generations:
        version_added: 0.2.0
        description:
          - After the record, keep this server's definition (launcher, command, environment, user, workdir, umask,
            the systemd unit's name), O(record.layers) and the gate's measurement as the newest last known good
            generation in C(STATE.last_good.json) beside O(record.state_file), root-only (0600, the environment's
            values are secret), and keep this many generations (a generation of the same fingerprint gives way to
            the new one). V(0) keeps none and leaves the file alone.
        type: int
        default: 3
      layers:
        version_added: 0.2.0
        description: The NCCL layers this run applied (as the caller computed them), kept with the generation.
        type: dict
  release_lock:
    description: Release this run's host lock at the end, also when a step failed (unless O(release_lock.keep_on_failure)).
    type: dict
    suboptions:
      lock_file:
        description: The lock file.
        type: path
        required: true
      owner:
        description: This run's owner id.
        type: str
        required: true
      keep_on_failure:
        description:
          - A failed cycle keeps the lock (RV(lock_released) V(false)) for the caller, who puts things back under it
            and then releases it - the C(gpu_server) role does, for the NCCL layers after a restart refused before its
            kill and for the return to service after a refusal or a rollback, so that no other run writes between.
        type: bool
        default: false
        version_added: 0.2.0
  gate:
    version_added: 0.2.0
    description:
      - The performance gate, after the workers' environment is verified and before the record - the options of
        M(gpufleet.serving.server_bench) without O(gpufleet.serving.server_bench#module:baseline). The median is
        compared with this host's last known good measurement of the same benchmark (the record's, O(record.state_file));
        below O(gate.min_ratio) of it the host fails in phase C(gate) (RV(phase)). A passing measurement is recorded
        as the host's new baseline; with no baseline yet (a first run, or a benchmark that changed) it is recorded and
        passes, and RV(gate) says so. A server that failed the gate keeps running (it was verified); its record
        stays unverified, so the next run restarts it.
      - Check mode sends no request.
    type: dict
    suboptions:
      request:
        description: The request to time, sent as is (one request of the load to measure).
        type: dict
        required: true
        suboptions:
          url:
            description: URL of the request, C(http://) or C(https://).
            type: str
            required: true
          method:
            description: HTTP method.
            type: str
            default: POST
          body:
            description:
              - Request body. A dict or a list is sent as JSON (with C(Content-Type application/json) unless O(gate.request.headers)
                sets one); a string is sent as it is.
              - For O(gate.metric=output_tokens_per_s), ask for a fixed number of tokens that the server cannot stop early
                (SGLang C(sampling_params) C(max_new_tokens) with C(ignore_eos), OpenAI C(max_tokens)), so that every
                round generates the same work.
            type: raw
          headers:
            description:
              - Request headers.
              - The values are secret (C(no_log)), so an C(Authorization) header may hold a token.
            type: dict
            default: {}
          validate_certs:
            description: Check the server's certificate for an C(https://) URL.
            type: bool
            default: true
      api:
        description:
          - Where the output token count is read from each JSON answer. V(sglang) reads C(meta_info.completion_tokens)
            (SGLang's C(/generate)); V(openai) reads C(usage.completion_tokens) (the OpenAI-compatible C(/v1/completions)
            and C(/v1/chat/completions) of vLLM and SGLang); V(auto) tries C(meta_info) first, then C(usage).
          - A JSON list (SGLang's answer to a batch of prompts) counts the sum of its items.
        type: str
        choices: [auto, sglang, openai]
        default: auto
      metric:
        description:
          - What is measured. V(output_tokens_per_s) counts the output tokens of each round's answers; V(requests_per_s)
            counts its requests (the answers need no token count then).
        type: str
        choices: [output_tokens_per_s, requests_per_s]
        default: output_tokens_per_s
      warmup:
        description: Requests sent first, at O(gate.concurrency), and not measured (a first request can be slower). V(0) sends none.
        type: int
        default: 2
      requests:
        description: Requests per round. At least V(1).
        type: int
        default: 16
      concurrency:
        description: Requests in flight at a time (one client thread each), from V(1) to V(4096).
        type: int
        default: 4
      rounds:
        description: Measured rounds; C(median) is their median. At least V(1).
        type: int
        default: 3
      timeout:
        description: Seconds each request may wait for the server (for the connection, and between the bytes of the answer).
        type: float
        default: 120
      min_ratio:
        description: With the host's last known good, the module fails when C(median) divided by the host's last known good is below this. Greater than 0 and
          at most 1.
        type: float
        default: 0.9
  rollback:
    version_added: 0.2.0
    description:
      - When the restart fails after its kill (the launch, the start-up, the readiness, the busy wait, the workers'
        environment or the performance gate), go back to this host's newest last known good generation (read before
        the kill from C(STATE.last_good.json), see O(record.generations)) - stop what is left of the failed server,
        put back the generation's NCCL layers, launch its definition, wait until it is ready, verify its workers
        against what they were verified against then, and record it. The module still fails (the restart did), with
        a message that starts with C(rolled back to the last known good FINGERPRINT) and RV(rolled_back); a rollback
        that fails too says both reasons (RV(rollback_failed)), and what it launched is stopped.
      - With O(launcher=systemd), the generation's definition is the unit's files as systemd ran them when it passed
        (the unit file, the unit's own drop-ins under C(/etc) or C(/run), its environment files; kept root-only),
        which are written back before systemd is reloaded and the unit started.
      - Not when the newest generation is the definition that just failed, was launched by the other launcher, or
        holds nothing to launch again (a systemd generation recorded before gpufleet kept unit files), with
        when O(keep_failed) keeps a failed server that still runs (one that died at start-up leaves nothing to keep,
        and the host goes back), with O(record.generations) V(0), or in check mode.
        Before the kill, a generation put aside for the running server (its record could not be written) becomes the
        newest. Needs O(record). A failure past the kill that
        it could not answer ends with C(no rollback) and the reason, in parentheses.
    type: bool
    default: false
  layers_previous:
    version_added: 0.3.0
    description:
      - The snapshot this run's M(gpufleet.serving.nccl_layers) call kept of the NCCL layers before it changed them
        (its C(keep_previous) path, returned as C(previous_kept)); leave it unset when that call
        changed no layer.
      - After a rollback, RV(rolled_back) says with C(nccl_changed) whether the layers now differ from what they were
        before this run (a rollback that put back exactly what the run replaced leaves them as they were). When the
        restart passes or rolls back, the snapshot is removed (it only serves a restart refused before its kill).
    type: path
  restore:
    version_added: 0.2.0
    description:
      - "A rollback by hand (the C(gpufleet.serving.rollback) playbook) - the fingerprint of one of this host's last
        known good generations (C(STATE.last_good.json) beside O(record.state_file)), in full or its first 12 or more
        characters, to launch instead of a definition of the caller's. The whole cycle runs as usual (preflight, the
        kill, the clean gate, launch, ready, busy, the workers' environment, record) with the generation's command,
        environment, O(env_passthrough), O(user), O(workdir) and O(umask); after the clean gate its NCCL layers are
        put back (RV(layers_restored)); its workers are verified against the environment they were verified against
        when it was recorded (O(verify_env.expected) is replaced, when O(verify_env) is set); the record keeps its
        gate measurement as the baseline; and it becomes the newest generation again (its C(recorded_at) kept, a
        C(restored_at) added), the file noting the rollback (C(rolled_back) - from what ran, to it), which makes the
        next rollback by hand a no-op."
      - A fingerprint this host has no generation of, or a prefix naming several, fails in phase C(preflight) before
        anything is stopped, naming the generations the host has.
      - With O(launcher=systemd), the generation's unit files (its unit file, the unit's own drop-ins, its environment
        file) are written back before the stop (RV(unit_restored)), and the unit is started onto them; a generation
        of the other launcher is refused like an unknown one.
      - Needs O(record); O(command), O(env), O(stop_only), O(rollback) and O(gate) must not be set.
    type: str
notes:
  - Reading other users' C(/proc/PID/environ) needs root; use C(become).
seealso:
  - module: gpufleet.serving.process_kill
  - module: gpufleet.serving.gpu_wait
  - module: gpufleet.serving.server_launch
  - module: gpufleet.serving.process_env
  - module: gpufleet.serving.server_state
"""

EXAMPLES = r"""
- name: Restart sglang on GPUs 0-7 and prove the NCCL tuning reached every worker
  gpufleet.serving.server_restart:
    name: sglang
    command: [python3, -m, sglang.launch_server, --model-path, /models/kimi, --tp, "8"]
    log_path: /var/log/gpufleet/sglang.log
    pidfile: /run/gpufleet/sglang.pid
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    kill:
      grace: 15
      gpu_strays: true
    wait_clean:
      timeout: 20
    wait_ready:
      health_url: http://127.0.0.1:30000/health
      request:
        url: http://127.0.0.1:30000/generate
        body: '{"text": "ping", "sampling_params": {"max_new_tokens": 1}}'
      timeout: 900
    wait_busy:
      min_processes: 1
    verify_env:
      expected: {NCCL_P2P_LEVEL: SYS, NCCL_BUFFSIZE: "16777216"}
    record:
      state_file: /var/lib/gpufleet/sglang.json
      fingerprint: "{{ fingerprint }}"
    # Fail the host when the new server is below 90% of this host's last known good output tokens per second.
    gate:
      request:
        url: http://127.0.0.1:30000/generate
        body: {text: "Explain NCCL rings in one paragraph.", sampling_params: {max_new_tokens: 256, temperature: 0}}
      requests: 32
      concurrency: 8
      min_ratio: 0.9
  become: true

- name: Go back by hand to a last known good generation of this host (its first 12 characters, as the summary shows)
  gpufleet.serving.server_restart:
    name: sglang
    restore: 3f9a1c0e7b2d
    log_path: /var/log/gpufleet/sglang.log
    pidfile: /run/gpufleet/sglang.pid
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    wait_ready:
      health_url: http://127.0.0.1:30000/health
      timeout: 900
    verify_env:
      expected: {GPUFLEET_SERVICE: sglang}  # replaced by what the generation's workers were verified against
    record:
      state_file: /var/lib/gpufleet/sglang.json
      fingerprint: unused  # the generation's
  become: true

- name: Restart the systemd unit the gpu_server role installed, with the same checks
  gpufleet.serving.server_restart:
    name: sglang
    launcher: systemd
    systemd:
      unit: gpufleet-sglang.service
    log_path: /var/log/gpufleet/sglang.log
    pidfile: /run/gpufleet/sglang.pid
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    wait_ready:
      health_url: http://127.0.0.1:30000/health
      timeout: 900
    verify_env:
      expected: {NCCL_P2P_LEVEL: SYS}
  become: true
"""

RETURN = r"""
restore:
  version_added: 0.2.0
  description: With O(restore), the generation launched - C(fingerprint), C(recorded_at), and C(previous), the
    fingerprint of what the host ran before (V(null) when no verified server of a known definition ran).
  returned: when O(restore) is set and the generation was found
  type: dict
layers_restored:
  version_added: 0.2.0
  description: With O(restore), the generation's NCCL layers put back - C(layers) (their names) and C(changed)
    (whether a file changed; in check mode, whether one would).
  returned: when O(restore) is set and the generation has NCCL layers, after the kill
  type: dict
unit_restored:
  version_added: 0.3.0
  description: With O(restore) and O(launcher=systemd), the paths of the generation's unit files written back before
    the stop (in check mode, those that would be).
  returned: when O(restore) is set with O(launcher=systemd)
  type: list
  elements: str
rolled_back:
  version_added: 0.2.0
  description: After a failure past the kill, the last known good this host went back to - C(fingerprint), C(pid),
    C(workers_verified), C(recorded_at) (when that definition first passed on the host) and C(nccl_changed) (whether the NCCL
    layers differ from what they were before this run, see O(layers_previous)).
  returned: failure, when O(rollback) went back to a last known good
  type: dict
rollback_failed:
  version_added: 0.2.0
  description: The rollback's C(fingerprint) and C(error), when the rollback failed too.
  returned: failure, when O(rollback) was tried and failed
  type: dict
last_good:
  version_added: 0.2.0
  description:
    - The last known good generations after the record (newest first) - C(fingerprint), C(recorded_at) (when that
      definition first passed on the host; a later restart of the same definition keeps it) and C(gate_median) of
      each; never their definitions.
  returned: when the record was written and O(record.generations) is above 0
  type: list
  elements: dict
gate:
  version_added: 0.2.0
  description:
    - The performance gate's measurement (O(gate)) - C(metric), C(rounds), C(median), C(tokens), C(latency_s),
      C(baseline) (this host's last known good, or V(null)), C(ratio), C(min_ratio), C(passed), C(msg) and C(key)
      (what makes two measurements comparable); on a failed request, what failed and the rounds measured so far.
    - In check mode no request is sent; it says what the gate would measure and against what - C(would_measure)
      V(true), C(metric), C(baseline) (this host's last known good measurement, or V(null) when the first one would be
      recorded and pass), C(min_ratio), C(key), C(url) (without userinfo or query) and C(msg) in words; C(median),
      C(ratio) and C(passed) are V(null).
  returned: when the gate ran, or in check mode when O(gate) is set
  type: dict
workers_verified:
  version_added: 0.2.0
  description:
    - On a failure after the kill, the GPU-holding workers whose environment is verified now - those of the verify
      when only the performance gate or the record failed after it, else V(0). Absent when the restart was refused before its kill (the old
      server still serves).
  returned: on failure, after the kill or in the gate or record step
  type: int
kill:
  description:
    - What the kill step selected and signalled, as M(gpufleet.serving.process_kill) returns it.
    - Its C(pidfile) says what O(pidfile) named and whether it was confirmed (C(status) V(confirmed),
      V(unconfirmed), V(stale), V(not_running) or V(missing); C(confirmed_by) V(tag) or V(cmdline_regex)); only a
      confirmed process is killed through it, and a recorded start time alone never confirms.
  returned: always
  type: dict
strays:
  description: The same for the stray GPU holders.
  returned: when kill.gpu_strays is true
  type: dict
clean:
  description:
    - The clean gate's reading, as M(gpufleet.serving.gpu_wait) returns it; with the holders when it failed.
    - When the check before the kill failed, C(before_kill=true), C(waited_s) and the C(holders) no kill step would end.
  returned: when the gate ran, or when the check before the kill failed
  type: dict
pid:
  description: Pid of the launched server.
  returned: when launched
  type: int
start_time:
  description: Start time of that process (clock ticks since boot).
  returned: when launched
  type: int
launch_s:
  description: Seconds the launch took.
  returned: when launched
  type: float
ready:
  description: C(ready_s), C(health_s), C(attempts) and C(listener), as M(gpufleet.serving.server_ready) returns them.
  returned: when the server became ready
  type: dict
new_server:
  version_added: 0.2.0
  description: What was left of a new server that died during start-up or failed the readiness gate.
  returned: failure in phase startup or ready, after the launch
  type: dict
  contains:
    kept:
      description: Kept running for debugging (O(keep_failed)).
      type: bool
    stopped:
      description: Stopped (its tagged processes killed, with O(launcher=systemd) the unit stopped).
      type: bool
    killed:
      description: Its processes the stop ended.
      type: int
    clean:
      description: The clean gate's reading after the stop.
      type: dict
    error:
      description: Why the stop or the clean gate failed.
      type: str
    text:
      description: The sentence the failure message ends with.
      type: str
exit_status:
  version_added: 0.2.0
  description: How the launcher ended (V(exit status 1), V(killed by SIGKILL)).
  returned: failure in phase startup, with O(launcher=process)
  type: str
port_holders:
  version_added: 0.2.0
  description: The processes outside the kill's selection listening on the server's port (pid, user, cmdline).
  returned: failure in phase preflight for that reason
  type: list
  elements: dict
busy:
  description: The busy wait's reading.
  returned: when wait_busy is set and the step ran
  type: dict
env:
  description: The environment check, as M(gpufleet.serving.process_env) returns it (only expected keys).
  returned: when verify_env is set and the step ran
  type: dict
  contains:
    processes:
      description: One entry per checked process (C(pid), C(role), C(status), the missing and different keys);
        the gpu_server role counts them as the verified workers.
      type: list
      elements: dict
state:
  description: The state written.
  returned: when record is set and the step ran
  type: dict
unit:
  version_added: 0.2.0
  description: The unit as systemd reported it before the stop.
  returned: when launcher is systemd
  type: dict
  contains:
    LoadState:
      description: V(loaded), or V(not-found) for a unit not installed yet.
      type: str
    ActiveState:
      description: V(active), V(inactive), V(failed), ...
      type: str
    MainPID:
      description: The unit's main pid (V(0) when none).
      type: str
dropins_removed:
  version_added: 0.2.0
  description: The drop-ins O(systemd.remove_dropins) deleted.
  returned: when some were deleted
  type: list
  elements: str
killed:
  version_added: 0.2.0
  description:
    - Processes of the old server the kill and stray steps ended, signalled or gone with their launcher (with
      O(launcher=systemd), also the tagged processes the unit's stop ended); V(0) in check mode, where C(signalled)
      in RV(kill) counts those it would signal.
    - Also returned when a later step failed; above V(0), the old server is gone although no new one is ready.
  returned: always, but for invalid options
  type: int
timings:
  description:
    - Seconds of C(preflight_s), C(kill_s), C(clean_s), C(launch_s), C(ready_s), C(cycle_s) (first signal to
      ready), C(busy_s) and C(verify_env_s), for the steps that ran; also returned on failure.
    - In check mode nothing is signalled and no C(kill_s) is returned.
  returned: always
  type: dict
  contains:
    kill_s:
      description: The stop (with O(launcher=systemd), C(systemctl stop)) plus the sweep of what was left.
      type: float
    clean_s:
      description: The clean gate's wait.
      type: float
    launch_s:
      description: Starting the server (C(systemctl start) and reading its main pid, with O(launcher=systemd)).
      type: float
    ready_s:
      description: The readiness wait (health URL and real request).
      type: float
    cycle_s:
      description: From the first signal to the server answering its real request.
      type: float
    preflight_s:
      version_added: 0.3.0
      description: From the module's start to the first signal (its preflight and the clean gate's look at the GPUs).
      type: float
    busy_s:
      version_added: 0.3.0
      description: The wait, after ready, until each GPU lists the server's processes (O(wait_busy)).
      type: float
    verify_env_s:
      version_added: 0.3.0
      description: The check of the workers' environment (O(verify_env)).
      type: float
would_launch:
  description: In check mode, true (false with O(stop_only)).
  returned: check mode
  type: bool
would_stop:
  version_added: 0.2.0
  description: With O(stop_only) in check mode, whether there is a server to stop.
  returned: check mode with stop_only
  type: bool
pidfile_removed:
  version_added: 0.2.0
  description:
    - With O(stop_only), true when the stop removed O(pidfile), whose process is gone (left behind, it would name
      whatever process reuses the pid). A pidfile naming a live process is left.
  returned: when it did
  type: bool
unit_retired:
  version_added: 0.2.0
  description: The files of the unit O(retire_unit) took out of service (would, in check mode).
  returned: when there was one
  type: list
  elements: str
lock_released:
  description: Whether this call released the host lock.
  returned: when release_lock is set, outside check mode
  type: bool
log_tail:
  description: Last lines of the server log (O(wait_ready.log_tail_path) when set) when the readiness wait failed.
  returned: failure in the ready step
  type: str
gpu_intruders:
  version_added: 0.3.0
  description: With a failure in the C(verify_gpus) step, each of the server's GPUs another process holds, with those
    processes (pid, user and command line).
  returned: failure in the verify_gpus step
  type: dict
  sample: {"0": ["pid 4242 (alice: python3 train.py)"]}
phase:
  description: The step that failed - V(preflight) (nothing stopped), V(kill), V(strays), V(clean) (nothing launched;
    nothing stopped either when RV(clean) has C(before_kill)), V(launch), V(startup) (the server died; stopped unless
    O(keep_failed)), V(ready) (timeout; stopped unless O(keep_failed)), V(busy) (a GPU stayed idle, or the launcher
    died after it was ready), V(verify_gpus) (another process holds one of its GPUs), V(verify_env), V(gate) (the
    performance gate, slower than this host's last known good, or a benchmark request failed; the server keeps
    running) or V(record).
  returned: failure
  type: str
"""

import traceback
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _nolog, _restart
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError
from ansible_collections.gpufleet.serving.plugins.module_utils._step import Step


def main() -> None:
    module = _nolog.NoLogModule(argument_spec=_restart.argument_spec(), supports_check_mode=True)
    p = module.params
    err = _restart.input_error(p)
    if err:
        # Before anything is read, killed or started: the caller (the gpu_server role) puts a drained host back.
        module.fail_json(msg=err, phase="preflight", killed=0)
    result: t.Dict[str, t.Any] = dict(changed=False, timings={})
    failure: t.Optional[StepError] = None
    with _restart.shielded(not module.check_mode) as signals:
        try:
            _restart.run_or_roll_back(p, Step.of(module), result)
        except StepError as e:
            failure = e
        except Exception as e:  # pylint: disable=broad-except
            # An unexpected error (an OSError writing the state file, say) is reported with its phase like any failure.
            failure = StepError("%s: unexpected error: %s" % (result.get("phase", "restart"), e),
                                exception=traceback.format_exc())
        finally:
            # The documented promise: the host lock is released whether the cycle passed or failed, whatever failed.
            _restart.release(p, result, module.check_mode, failed=failure is not None)
    if signals:
        module.warn("%s came during the restart and was not obeyed: the cycle ran to its end (a controller that "
                    "stopped meanwhile does not stop a restart it started)" % ", ".join(sorted(set(signals))))
    if failure is not None:
        module.fail_json(msg=str(failure), **_restart.fail_result(result, failure))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
