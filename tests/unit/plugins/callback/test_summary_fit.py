# SPDX-License-Identifier: GPL-3.0-or-later
"""The summary's failure cell: a long failure keeps each clause's head and end (rollout_summary.fit)."""
from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.callback.rollout_summary import FAILURE_CHARS, failure_text, fit

# A systemd rollback as server_restart words it: the rollback, the new server's exit, systemd's status, its journal,
# the server's log tail, and what was left.
WHY = ("gpufleet-demo.service exited during start-up after 0.4 s; systemd: Result=exit-code, code=exited, status=3; "
       "journal (journalctl -u gpufleet-demo.service): Dec 05 09:50:01 host1 systemd[1]: gpufleet-demo.service: Main "
       "process exited, code=exited, status=3/NOTIMPLEMENTED | Dec 05 09:50:01 host1 systemd[1]: gpufleet-demo.service: "
       "Failed with result 'exit-code'.; log tail (/var/log/gpufleet/demo.log): ==== gpufleet launch | Traceback (most "
       "recent call last): | File \"/opt/gpufleet-fake/demo_server.py\", line 412, in <module> | " + "x" * 300 + " | "
       "RuntimeError: --fail-at-startup asked for. The failed new server was stopped; the last known good (pid 4242) "
       "serves in its place")
MSG = "demo: rolled back to the last known good 0123456789ab (recorded 2026-12-05T09:40:00+00:00): " + WHY


def test_a_long_systemd_rollback_keeps_every_clauses_head_and_the_end():
    """Found by the new-user pass (issue 24): the summary cut the middle of a long rollback failure, systemd's exit
    status with it."""
    text = failure_text({"msg": MSG})
    assert len(MSG) > FAILURE_CHARS and len(text) <= FAILURE_CHARS, (len(MSG), len(text))
    for part in ("demo: rolled back to the last known good 0123456789ab", "exited during start-up after 0.4 s",
                 "systemd: Result=exit-code, code=exited, status=3", "journal (journalctl -u gpufleet-demo.service)",
                 "log tail (/var/log/gpufleet/demo.log)", "RuntimeError: --fail-at-startup asked for",
                 "the last known good (pid 4242) serves in its place"):
        assert part in text, (part, text)


def test_a_short_text_is_left_whole_and_one_long_clause_keeps_its_head_and_end():
    assert fit("a; b", 10) == "a; b"
    one = "head " + "m" * 1000 + " end"
    out = fit(one, 100)
    assert len(out) == 100 and out.startswith("head ") and out.endswith(" end") and " ... " in out, out


def test_many_short_clauses_fall_back_to_head_and_end_within_the_limit():
    text = "; ".join("clause %03d %s" % (i, "y" * 50) for i in range(40))
    out = fit(text, 600)
    assert len(out) <= 600 and out.startswith("clause 000") and out.endswith("y" * 30), out
    assert "clause 039 " in out, out


def test_a_rollback_that_failed_too_keeps_both_causes_and_an_ssh_text_its_advice():
    """Many mid-sized clauses share the cut (the longest down to the next longest), so the new server's own cause at
    the end of its log tail stays; a text without gpufleet's "; " clauses (OpenSSH's) keeps its head and its end."""
    rb = ("the rollback to the last known good 91f571e01242 failed too (server process 609 exited during start-up after "
          "0.1 s (exit status 1); log tail (/var/log/gpufleet/demo.log): ==== gpufleet launch 2026-12-05T10:20:01 pid 609 "
          "| Traceback (most recent call last): | File \"/opt/gpufleet-fake/demo_server.py\", line 400, in main | "
          "RuntimeError: rollback fail...); the new server failed: server process 600 exited during start-up after 0.1 s "
          "(exit status 1); log tail (/var/log/gpufleet/demo.log): ==== gpufleet launch 2026-12-05T10:20:00 pid 600 | "
          "Traceback (most recent call last): | File \"/opt/gpufleet-fake/demo_server.py\", line 412, in <module> | "
          "RuntimeError: demo failure at startup. The failed new server was not running any more and its GPUs are "
          "clean: nothing of this service runs on the host, which is not serving")
    out = fit(rb, FAILURE_CHARS)
    assert len(out) <= FAILURE_CHARS and out.startswith("the rollback to the last known good 91f571e01242 failed too (")
    assert "RuntimeError: demo failure at startup" in out and "; the new server failed: " in out, out
    ssh = ("Failed to connect to the host via ssh: WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! " + "x " * 300
           + "Offending ED25519 key in /root/.ssh/known_hosts:7 remove with: ssh-keygen -f '/root/.ssh/known_hosts' -R "
           "'gpu17' Host key verification failed.")
    out = fit(ssh, FAILURE_CHARS)
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in out and "ssh-keygen -f '/root/.ssh/known_hosts' -R 'gpu17'" in out


def test_the_middle_clauses_are_cut_first_so_the_holders_and_the_advice_stay():
    """A clean-gate refusal a little over the limit: its holders' command lines hold "; " too. The first clause (the
    first holder, pid and user) and the last (what to do) stay whole; the middle ones share the cut."""
    msg = ("fails at the clean gate, before the kill: GPUs not clean after 4.0 s, held by processes the kill would not "
           "end: GPU 0 pid 142 (root, 20000 MiB): /usr/bin/python3 -c from multiprocessing.spawn import spawn_main; "
           "spawn_main(tracker_fd=6, pipe_handle=13) --multiprocessing-fork; GPU 1 pid 143 (root, 20000 MiB): "
           "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=6, pipe_handle=17) "
           "--multiprocessing-fork; nothing was stopped. None is gpufleet's and kill.cmdline_regex "
           "(gpufleet_server_adopt_cmdline_regex) does not match them: kill.gpu_strays (gpufleet_server_kill_gpu_strays) "
           "ends them")
    out = fit(msg, FAILURE_CHARS)
    assert len(msg) > FAILURE_CHARS >= len(out), len(msg)
    assert "pid 142 (root, 20000 MiB): " in out and "pid 143 (root, 20000 MiB): " in out, out
    assert out.endswith("kill.gpu_strays (gpufleet_server_kill_gpu_strays) ends them"), out
