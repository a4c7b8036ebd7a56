# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Requests in flight on a server, from its own Prometheus metrics, and the wait until there are none (inflight_wait)."""

from __future__ import annotations

import math
import re
import socket
import time
import typing as t

# SGLang's gauges; vLLM's are vllm:num_requests_running and vllm:num_requests_waiting.
SGLANG_METRICS = ["sglang:num_running_reqs", "sglang:num_queue_reqs"]

# Prometheus text exposition format: `name{labels} value [timestamp]` or `name value [timestamp]`.
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?\s*$')


class DrainError(Exception):
    """The metrics could not be used (bad input, no such metric, an error answer); carries what was read."""

    def __init__(self, msg: str, **result: t.Any) -> None:
        super().__init__(msg)
        self.result = result


class DrainTimeout(DrainError):
    pass


def parse(text: str, names: t.Sequence[str]) -> t.Dict[str, float]:
    """Sum of every sample (all label sets) of each of `names` that the text has; absent names are left out."""
    out: t.Dict[str, float] = {}
    want = set(names)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m or m.group(1) not in want:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(v):  # NaN: no value, not a request
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def input_error(url: str, metrics: t.Sequence[str], timeout: float, interval: float) -> t.Optional[str]:
    if not re.match(r"^https?://[^/\s]+", url or ""):
        return "url must be an http:// or https:// URL of the server's metrics, got %r" % url
    if not metrics or any(not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", m or "") for m in metrics):
        return "metrics must be a non-empty list of Prometheus metric names, got %r" % (list(metrics),)
    if timeout < 0:
        return "timeout must be >= 0 seconds, got %s" % timeout
    if interval <= 0:
        return "interval must be greater than 0 seconds, got %s" % interval
    return None


def is_refused(err: BaseException) -> bool:
    """A server that is not listening has nothing in flight (it is down: often why it is being restarted)."""
    seen: t.List[BaseException] = []
    e: t.Optional[BaseException] = err
    while e is not None and e not in seen:
        seen.append(e)
        if isinstance(e, ConnectionRefusedError):
            return True
        e = getattr(e, "reason", None) or e.__cause__ or e.__context__
    return "Connection refused" in str(err)


Fetch = t.Callable[[str], t.Tuple[int, str]]


def wait(fetch: Fetch, url: str, metrics: t.Sequence[str], timeout: float, interval: float,
         once: bool = False, clock: t.Callable[[], float] = time.monotonic,
         sleep: t.Callable[[float], None] = time.sleep,
         alive: t.Optional[t.Callable[[], t.Optional[str]]] = None) -> t.Dict[str, t.Any]:
    """Read the metrics until their sum is 0, at most `timeout` s (`once`: a single read, for check mode).

    Returns {inflight, gauges, waited_s, reads, server_down}; raises DrainTimeout (with the same keys) when requests
    are still in flight at the deadline, DrainError when the URL answers without any of the metrics or with an error.
    """
    t0 = clock()
    reads = 0
    while True:
        reads += 1
        try:
            status, body = fetch(url)
        except (OSError, socket.timeout) as e:  # URLError is an OSError
            if is_refused(e):
                # Refused means "not running" only if the server itself does not answer: a metrics URL with a typo
                # must not pass for a drained server that still has requests in flight.
                answering = alive() if alive is not None else None
                if answering:
                    raise DrainError("%s refused the connection, but the server answers on %s: the metrics URL is "
                                     "wrong (gpufleet_server_drain_metrics_url); nothing was killed"
                                     % (url, answering), reads=reads)
                return dict(inflight=0, gauges={}, waited_s=round(clock() - t0, 3), reads=reads, server_down=True)
            raise DrainError("%s: the metrics could not be read: %s" % (url, e), reads=reads)
        if status != 200:
            raise DrainError("%s answered HTTP %s; the metrics could not be read" % (url, status), reads=reads)
        values = parse(body, metrics)
        if not values:
            raise DrainError("%s has none of the metrics %s: set the metric names (vLLM: vllm:num_requests_running, "
                             "vllm:num_requests_waiting)" % (url, ", ".join(metrics)), reads=reads)
        inflight = sum(values.values())
        res = dict(inflight=inflight, gauges=values, waited_s=round(clock() - t0, 3), reads=reads, server_down=False)
        if inflight <= 0 or once:
            return res
        if clock() - t0 >= timeout:
            raise DrainTimeout("%g request(s) still in flight after %gs (%s)" % (
                inflight, timeout, ", ".join("%s=%g" % kv for kv in sorted(values.items()))), **res)
        sleep(interval)
