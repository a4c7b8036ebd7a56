# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Signal a set of exact process identities with escalation (TERM, grace, KILL) and report each."""

from __future__ import annotations

import os
import select
import signal
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _proc

_HAVE_PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


class KillError(Exception):
    pass


def parse_signal(name: t.Union[str, int]) -> signal.Signals:
    if isinstance(name, int) or str(name).isdigit():
        try:
            return signal.Signals(int(name))
        except ValueError:
            raise KillError("unknown signal number %s" % name)
    n = str(name).upper()
    if not n.startswith("SIG"):
        n = "SIG" + n
    try:
        return signal.Signals[n]
    except KeyError:
        raise KillError("unknown signal %r" % name)


class _Target:
    """One process pinned by (pid, start time); a pidfd makes later signals race-free."""

    def __init__(self, p: _proc.Proc) -> None:
        self.proc = p
        self.fd: int | None = None
        self.signals: t.List[str] = []
        self.exited_after: float | None = None
        self.already_gone = False
        self.error: str | None = None
        if _HAVE_PIDFD:
            try:
                self.fd = os.pidfd_open(p.pid)
            except OSError:
                self.fd = None
        # Verify AFTER opening the pidfd: if the pid was reused in between, the fd points elsewhere.
        if not _proc.is_alive(p.identity):
            self.already_gone = True
            self.close()

    def alive(self, t0: float) -> bool:
        """Re-check, and record the exit time the first time the process is seen gone."""
        if self.already_gone or self.exited_after is not None:
            return False
        if _proc.is_alive(self.proc.identity):
            return True
        self.exited_after = time.monotonic() - t0
        return False

    def send(self, sig: signal.Signals) -> bool:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            elif _proc.is_alive(self.proc.identity):
                os.kill(self.proc.pid, sig)
            else:
                return False
        except ProcessLookupError:
            return False
        except PermissionError:
            # Another user's process without become: report it as a survivor, do not crash.
            self.error = "permission denied sending %s; use become: true" % sig.name
            return True
        self.signals.append(sig.name)
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def kill(
    procs: t.Sequence[_proc.Proc],
    signals: t.Sequence[t.Union[str, int]] = ("TERM", "KILL"),
    grace: float = 10.0,
    final_wait: float = 5.0,
    poll_interval: float = 0.01,
    first: t.Collection[int] = (),
) -> t.List[t.Dict[str, t.Any]]:
    """Send each signal in turn to the still-living targets, waiting `grace` s between steps.

    After the last signal wait `final_wait` s. A process already gone counts as success.
    With `first` (pids of some targets, a server's launcher), the first signal goes to those alone and they get up to
    `grace` s to exit before the others get it: SGLang and vLLM finish their requests in flight on SIGTERM only while
    their workers are left alone, and a launcher usually stops its own workers on its way out. The grace still bounds
    the whole first step: the others get the first signal when the leaders are gone (or their grace is out) and only
    what is left of the same `grace` s, counted from the leaders' signal, so the next signal comes at most `grace` s
    after the first one whatever the order (a SIGTERM-ignoring launcher once cost twice the grace).
    """
    sigs = [parse_signal(s) for s in signals]
    if not sigs:
        raise KillError("at least one signal is required")
    if grace < 0 or final_wait < 0 or poll_interval <= 0:
        raise KillError("grace and final_wait must be >= 0 and poll_interval > 0")
    targets = [_Target(p) for p in procs]
    t0 = time.monotonic()
    lead = [x for x in targets if x.proc.pid in set(first)]
    first_deadline = None
    try:
        if lead:
            for x in lead:
                if x.alive(t0) and x.error is None and not x.send(sigs[0]):
                    x.exited_after = time.monotonic() - t0
            first_deadline = time.monotonic() + grace
            _wait(lead, t0, first_deadline, poll_interval)
        for i, sig in enumerate(sigs):
            living = [x for x in targets if x.alive(t0) and x.error is None]
            if not living:
                break
            if i == 0 and lead:
                # The leaders had this signal and their grace; a second TERM makes some servers skip their drain
                # (uvicorn forces its exit on a second signal).
                living = [x for x in living if x not in lead]
                if not living:
                    continue
            for x in living:
                if not x.send(sig):
                    x.exited_after = time.monotonic() - t0
            if i == len(sigs) - 1:
                deadline = time.monotonic() + final_wait
            elif i == 0 and first_deadline is not None:
                deadline = first_deadline  # the rest of the leaders' grace, not a second one
            else:
                deadline = time.monotonic() + grace
            _wait(targets, t0, deadline, poll_interval)
    finally:
        for x in targets:
            x.close()
    out = []
    for x in targets:
        p = x.proc
        survived = not x.already_gone and x.exited_after is None
        res = {
            "pid": p.pid,
            "start_time": p.start_time,
            "cmdline": p.command[:500],
            "user": p.user(),
            "signals_sent": x.signals,
            "already_gone": x.already_gone,
            "exited_after_s": None if x.exited_after is None else round(x.exited_after, 4),
            "survived": survived,
        }
        if survived:
            now = _proc.read_proc(p.pid)
            res["state"] = now.state if now else "?"
        if x.error:
            res["error"] = x.error
        out.append(res)
    return out


def _wait(targets: t.List[_Target], t0: float, deadline: float, poll_interval: float) -> None:
    """Wait until every target has exited or the deadline passes.

    A pidfd becomes readable when its process exits, so poll() wakes at once; /proc is
    re-checked every poll_interval too (no pidfd support, or a zombie state change).
    """
    while True:
        pending = [x for x in targets if x.alive(t0) and x.error is None]
        now = time.monotonic()
        if not pending or now >= deadline:
            return
        timeout = min(poll_interval, deadline - now)
        fds = [x.fd for x in pending if x.fd is not None]
        if fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            poller.poll(timeout * 1000.0)
        else:
            time.sleep(timeout)
