# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The readiness gate: the health URL and a real request, failing fast when the launched server dies or another
process holds its port; and the request options it shares with server_bench."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _http, _listener, _proc, _server


def request_argspec() -> t.Dict[str, t.Any]:
    """The readiness request (server_ready's request, wait_ready.request). Its headers are secret (Authorization).

    No defaults here: an option left out stays None, so `compact_request` tells an empty request from a set one;
    wait_ready applies the documented defaults (POST, status 200, 10 s).
    """
    return dict(
        url=dict(type="str"),
        method=dict(type="str"),
        # raw: a YAML dict is sent as JSON (request_body); as a str option it became its Python repr.
        body=dict(type="raw"),
        headers=dict(type="dict", no_log=True),
        status=dict(type="int"),
        expect_regex=dict(type="str"),
        timeout=dict(type="float"),
    )


def body_type_error(body: t.Any) -> t.Optional[str]:
    """A body request_body cannot send (a number, a bool), or None."""
    if body is None or isinstance(body, (str, dict, list)):
        return None
    return "request.body must be a dict or a list (sent as JSON) or a string, got %s" % type(body).__name__


def request_body(body: t.Any, headers: t.Mapping[str, str]) -> t.Tuple[t.Optional[str], t.Dict[str, str]]:
    """The body as sent, and the headers to send it with: a dict or a list as JSON, with Content-Type application/json
    unless the headers set one (in any case); a string as it is. The readiness request and the gate's share it."""
    out = dict(headers)
    if isinstance(body, (dict, list)):
        if not any(k.lower() == "content-type" for k in out):
            out["Content-Type"] = "application/json"
        return json.dumps(body), out
    return body, out


def compact_request(request: t.Optional[t.Mapping[str, t.Any]]) -> t.Dict[str, t.Any]:
    """The request's options that were set ({} when none was)."""
    return {k: v for k, v in (request or {}).items() if v is not None}


def ready_argspec() -> t.Dict[str, t.Any]:
    """server_restart's wait_ready: server_ready's options for the server the restart launched."""
    return dict(
        health_url=dict(type="str", default=""),
        request=dict(type="dict", default={}, options=request_argspec()),
        timeout=dict(type="float", default=600.0),
        interval=dict(type="float", default=0.25),
        log_tail_lines=dict(type="int", default=40),
        log_tail_path=dict(type="path"),
        check_listener=dict(type="bool", default=True),
    )


def ready_input_error(health_url: str, request: t.Mapping[str, t.Any], timeout: float, interval: float) -> t.Optional[str]:
    """What is wrong with readiness options, or None."""
    request = compact_request(request)
    if not 0 < timeout < math.inf:  # NaN too: every comparison with it is false, a poll that never ends
        return "timeout must be greater than 0 seconds, got %s" % timeout
    if not 0 < interval < math.inf:
        return "interval must be greater than 0 seconds, got %s" % interval
    if not health_url and not request:
        return "set health_url or request (or both)"
    if request and not request.get("url"):
        return "request.url is required when request is set"
    for what, url in (("health_url", health_url), ("request.url", (request or {}).get("url"))):
        if url and not _http.is_http_url(url):
            return "%s must be an http:// or https:// URL with a host (and a valid port), got %r" % (what, url)
    if request and request.get("method") and not re.fullmatch(r"[A-Z]+", str(request["method"])):
        return "request.method must be an HTTP method such as GET or POST, got %r" % request["method"]
    if request and body_type_error(request.get("body")):
        return body_type_error(request.get("body"))
    if request and request.get("expect_regex"):
        try:
            re.compile(request["expect_regex"])
        except re.error as e:
            return "request.expect_regex: invalid regular expression %r: %s" % (request["expect_regex"], e)
    return None


def exit_status(pid: int) -> t.Optional[str]:
    """How a launcher that this process started (and has not reaped) ended: 'exit status 1', 'killed by SIGKILL';
    None when it is not this process's child (server_ready watching a pidfile) or still runs."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if got != pid:
        return None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return "killed by %s" % signal.Signals(sig).name
        except ValueError:
            return "killed by signal %d" % sig
    return "exit status %d" % os.WEXITSTATUS(status)


def wait_ready(identity: t.Optional[t.Tuple[int, int]], health_url: str, request: t.Mapping[str, t.Any],
               timeout: float, interval: float, log_path: str, tail_lines: int = 40, tail_path: t.Optional[str] = None,
               tail_since: t.Optional[_server.LogStamp] = None, tag: t.Optional[t.Tuple[str, str]] = None,
               check_listener: bool = True) -> t.Dict[str, t.Any]:
    """Poll health (then a real request) until both pass; fail at once if the server dies (tail: _server.failure_tail).

    With `identity` (the launcher's pid and start time), an answer counts only when the socket listening on the URL's
    port belongs to the launcher's tree (or, with `tag`, to a process carrying the launch tag): a foreign listener on
    the port answers 200 while the launched server dies on EADDRINUSE. Where the socket cannot be attributed (the
    URL's host is not this host, no visible listener), the answer counts and `listener.assumed` says so.
    """
    request = compact_request(request)
    body, headers = request_body(request.get("body"), request.get("headers") or {})
    client = _http.http_client()
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = "not polled yet"
    health_ok_at = None
    attempts = 0
    ours = _listener.tree_of(identity, tag) if identity is not None else None
    listener: t.Dict[str, t.Any] = {}

    def foreign_answer(url: str, what: str) -> t.Optional[str]:
        """Why an answer from `url` is not the launched server's (None: it is, or it cannot be told)."""
        if ours is None or not check_listener:
            return None
        res = _listener.port_holders(url, ours, reached_only=True)
        listener.clear()
        listener.update(res)
        if not res["foreign"] or res["ours"]:
            return None
        if res["elsewhere"]:
            # The server listens, on another address of the port: the URL will keep reaching the other process.
            raise _server.ServerError(
                "%s answered from %s on port %d, not from the server gpufleet launched, which listens there on another "
                "address (pid %s): %s reaches that process first. Give the URL the server's own address (for example "
                "http://127.0.0.1:%d/...) or stop that process"
                % (what, _listener.foreign_text(res), res["port"], ", ".join(str(x) for x in res["elsewhere"]), url,
                   res["port"]), phase="ready", foreign_listener=res["foreign"])
        return ("%s answered, but port %d is held by %s, not by the server gpufleet launched (pid %d); not counted"
                % (what, res["port"], _listener.foreign_text(res), identity[0]))

    def done(extra: t.Dict[str, t.Any]) -> t.Dict[str, t.Any]:
        out = {"ready_s": round(time.monotonic() - t0, 3), "health_s": health_ok_at, "attempts": attempts}
        out.update(extra)
        if listener:
            out["listener"] = {k: listener[k] for k in ("port", "checked", "ours", "assumed")}
        return out

    while True:
        if identity is not None and not _proc.is_alive(identity):
            tail, where = _server.failure_tail(log_path, tail_lines, tail_path, tail_since)
            # The last lines hold the cause (a traceback ends with it); keep them short enough for one-line summaries.
            # The launch line says nothing of the cause.
            last = " | ".join(ln.strip() for ln in tail.splitlines()[-3:] if ln.strip() and not ln.startswith(_server.LAUNCH_LINE))
            if len(last) > 300:
                last = "..." + last[-297:]
            status = exit_status(identity[0])
            # EADDRINUSE: say who holds the port (never killed: it is not this service's).
            held = ""
            url = health_url or request.get("url")
            if url and check_listener:
                res = _listener.port_holders(url, _listener.tree_of(identity, tag))
                if res["foreign"]:
                    held = "; port %d is held by %s" % (res["port"], _listener.foreign_text(res))
            raise _server.ServerError("server process %d exited during start-up after %.1f s%s%s; log tail (%s): %s"
                                      % (identity[0], time.monotonic() - t0, " (%s)" % status if status else "", held, where,
                                         last or "(empty)"),
                                      log_tail=tail, phase="startup", exit_status=status)
        attempts += 1
        try:
            if health_url and health_ok_at is None:
                code, _body = _http.http(health_url, timeout=min(5.0, max(0.1, deadline - time.monotonic())),
                                         client=client)
                if code == 200:
                    why = foreign_answer(health_url, "health")
                    if why:
                        last = why
                    else:
                        health_ok_at = time.monotonic() - t0
                else:
                    last = "health returned HTTP %d" % code
            if health_ok_at is not None or not health_url:
                if not request:
                    return done({})
                code, text = _http.http(request["url"], request.get("method") or "POST", body, headers,
                                        timeout=float(request.get("timeout") or 10), client=client)
                want = int(request.get("status") or 200)
                rx = request.get("expect_regex")
                if code == want and (not rx or re.search(rx, text)):
                    why = foreign_answer(request["url"], "the real request")
                    if why:
                        last = why
                        health_ok_at = None  # the health answer may have come from the same listener
                    else:
                        return done({"request_status": code, "response": text[:300]})
                else:
                    last = "real request returned HTTP %d: %s" % (code, text[:200])
        except _http.url_errors() as e:
            reason = getattr(e, "reason", e)
            last = ("real request" if health_ok_at is not None else "health") + " failed: %s" % reason
        if time.monotonic() >= deadline:
            hint = ""
            if health_ok_at is not None and request:
                hint = " (/health answered 200 but the real request did not succeed: the server may be hung)"
            raise _server.ServerError("server not ready after %.1f s: %s%s" % (timeout, last, hint),
                                      log_tail=_server.failure_tail(log_path, tail_lines, tail_path, tail_since)[0], phase="ready",
                                      health_ok=health_ok_at is not None)
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
