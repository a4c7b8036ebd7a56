# SPDX-License-Identifier: GPL-3.0-or-later
"""A fleet reached as a non-root `ops` user with sudo (ansible_become), and sudo's `Defaults requiretty`: with
pipelining the first module cannot run, and the summary must say why (sudo's own words), not only "Module result
deserialization failed"; with pipelining off (as the quickstart says) the same host rolls out."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

OPS = r'''
id ops >/dev/null 2>&1 || useradd -m -s /bin/bash ops
usermod -p '*' ops   # no password, not locked: sshd without PAM refuses locked accounts
printf 'ops ALL=(ALL) NOPASSWD: ALL\nDefaults requiretty\n' > /etc/sudoers.d/ops
chmod 0440 /etc/sudoers.d/ops
visudo -cf /etc/sudoers.d/ops
'''


def test_requiretty_with_pipelining_names_the_cause_and_pipelining_off_works(rolled_out):
    rf = rolled_out("clean")
    if rf.fleet.ssh("host1", "command -v sudo", check=False).returncode != 0:
        pytest.skip("sudo is not installed on this machine (scripts/setup installs it)")
    rf.fleet.ssh("host1", OPS, check=True)
    try:
        before = rf.snapshot()
        as_ops = {"ansible_user": "ops", "ansible_become": True}

        run = rf.playbook("rollout", host_vars={"host1": as_ops})

        assert run.rc != 0, run.tail()
        failure = run.summary["host1"]["failure"]
        assert "sudo: sorry, you must have a tty to run sudo" in failure, run.summary["host1"]
        assert run.summary["host1"]["status"] == "failed"
        assert rf.snapshot().identities("host1") == before.identities("host1")

        # Pipelining off for that host: sudo gets its terminal, and the (up-to-date) host is left as it was.
        run = rf.playbook("rollout", host_vars={"host1": dict(as_ops, ansible_pipelining=False)})

        assert run.rc == 0, run.tail()
        assert run.summary["host1"]["status"] == "ok" and run.summary["host1"]["restarted"] is False, run.summary
        assert rf.snapshot().identities("host1") == before.identities("host1")
    finally:
        rf.fleet.ssh("host1", "rm -f /etc/sudoers.d/ops")
    rf.state = "clean"
