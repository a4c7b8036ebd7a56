# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""Throughput of a running inference server (server_bench): the request, an answer's output token count, the timed
rounds at a fixed concurrency, and the median's comparison with a baseline."""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import re
import statistics
import time
import typing as t
from concurrent.futures import ThreadPoolExecutor, as_completed
from urllib.parse import urlsplit, urlunsplit


from ansible_collections.gpufleet.serving.plugins.module_utils import _http, _ready
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError

APIS = ("auto", "sglang", "openai")
# The gate's metrics and the unit each is measured in (the audit shows the unit with the median).
UNITS = {"output_tokens_per_s": "output tokens/s", "requests_per_s": "requests/s"}
METRICS = tuple(UNITS)
# Where each API puts the number of tokens it generated for a request: SGLang's native /generate, and the
# OpenAI-compatible /v1/completions and /v1/chat/completions (vLLM, SGLang). `auto` tries them in this order.
TOKEN_FIELDS = {"sglang": ("meta_info", "completion_tokens"), "openai": ("usage", "completion_tokens")}
# An answer is read whole to parse its JSON; a long generation with logprobs runs to a few MiB.
ANSWER_MAX_BYTES = 16 * 1024 * 1024
# One thread per request in flight: a bound against a typo starting a hundred thousand threads on the host.
MAX_CONCURRENCY = 4096
EXCERPT = 200  # characters of a failed answer shown

Send = t.Callable[[], t.Tuple[int, str]]


class Request(t.NamedTuple):
    """The request to time, ready to send (body encoded, headers as strings)."""
    url: str
    method: str
    body: t.Optional[str]
    headers: t.Dict[str, str]
    validate_certs: bool


class Outcome(t.NamedTuple):
    """One request: whether it counts, its latency, its output tokens (None: not read), why it failed."""
    ok: bool
    latency: float
    tokens: t.Optional[int]
    status: t.Optional[int] = None
    error: t.Optional[str] = None


def shown_url(url: str) -> str:
    """`url` as results and messages show it: no user or password, no query string or fragment (either may hold a
    token)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def scrub(text: str, url: str) -> str:
    """`text` (an error, a server's answer) with `url` shown as shown_url does, and its query string and password
    replaced wherever they appear alone (a server may echo the path it was asked for)."""
    parts = urlsplit(url)
    text = text.replace(url, shown_url(url))
    for secret in (parts.query, parts.password):
        if secret:
            text = text.replace(secret, "***")
    return text


def field_names(api: str) -> t.List[str]:
    """The fields an answer's output token count is read from, in the order tried."""
    return [".".join(TOKEN_FIELDS[a]) for a in (("sglang", "openai") if api == "auto" else (api,))]


def output_tokens(answer: t.Any, api: str) -> t.Optional[int]:
    """The output token count of a parsed JSON answer under `api` (auto: SGLang's field, then OpenAI's), or None.

    A list (SGLang's answer to a batch of prompts, one object each) counts the sum, and None if any item has none."""
    if isinstance(answer, list):
        counts = [output_tokens(a, api) for a in answer]
        return None if not counts or any(c is None for c in counts) else sum(t.cast(t.List[int], counts))
    if not isinstance(answer, dict):
        return None
    for name in ("sglang", "openai") if api == "auto" else (api,):
        outer, inner = TOKEN_FIELDS[name]
        section = answer.get(outer)
        value = section.get(inner) if isinstance(section, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def build_request(req: t.Mapping[str, t.Any]) -> Request:
    """The request option checked and encoded: a dict or list body as JSON (with a JSON Content-Type unless one is
    set). Messages never show a header's or the body's value: they may hold tokens."""
    url = req.get("url") or ""
    if not _http.is_http_url(url):
        raise StepError("request.url must be an http:// or https:// URL with a host (and a valid port), got %r"
                        % shown_url(url))
    method = req.get("method") or "POST"
    if not re.fullmatch(r"[A-Z]+", method):
        raise StepError("request.method must be an HTTP method such as GET or POST, got %r" % method)
    headers: t.Dict[str, str] = {}
    for name, value in (req.get("headers") or {}).items():
        if not isinstance(name, str) or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            raise StepError("request.headers: %r is not a valid header name" % (name,))
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise StepError("request.headers: the value of %s must be a string or a number, got %s"
                            % (name, type(value).__name__))
        if re.search(r"[\r\n\0]", str(value)):
            raise StepError("request.headers: the value of %s contains a line break or a NUL byte" % name)
        headers[name] = str(value)
    err = _ready.body_type_error(req.get("body"))
    if err:
        raise StepError(err)
    body, headers = _ready.request_body(req.get("body"), headers)
    return Request(url, method, body, headers, bool(req.get("validate_certs", True)))


def input_problems(p: t.Mapping[str, t.Any]) -> t.List[str]:
    """Every rule the options break (type-checked options, defaults applied), one sentence each; [] when none."""
    out = []
    for name, low in (("requests", 1), ("concurrency", 1), ("rounds", 1), ("warmup", 0)):
        if p[name] < low:
            out.append("%s must be >= %d, got %d" % (name, low, p[name]))
    if p["concurrency"] > MAX_CONCURRENCY:
        out.append("concurrency must be at most %d (one thread per request in flight), got %d"
                   % (MAX_CONCURRENCY, p["concurrency"]))
    # `not 0 < x` also refuses NaN (every comparison with it is false).
    if not 0 < p["timeout"] < math.inf:
        out.append("timeout must be greater than 0 seconds, got %s" % p["timeout"])
    if not 0 < p["min_ratio"] <= 1:
        out.append("min_ratio must be greater than 0 and at most 1, got %s" % p["min_ratio"])
    if p.get("baseline") is not None and not 0 < p["baseline"] < math.inf:
        out.append("baseline must be greater than 0 (an earlier median of %s), got %s" % (p["metric"], p["baseline"]))
    try:
        build_request(p["request"])
    except StepError as e:
        out.append(str(e))
    return out


def check_input(p: t.Mapping[str, t.Any]) -> Request:
    """Refuse options that cannot give a measurement (before any request is sent); the request to send."""
    problems = input_problems(p)
    if problems:
        raise StepError("; ".join(problems))
    return build_request(p["request"])


def sender(req: Request, timeout: float) -> Send:
    """A function sending `req` once: (status, answer). Through _server's client, as every HTTP call of the collection
    (ansible.module_utils.urls: certificates checked unless validate_certs is false, no proxy, no ~/.netrc), one
    client (one SSL context) shared by every request and thread. Each request opens its own connection."""
    client = _http.http_client(validate_certs=req.validate_certs)

    def send() -> t.Tuple[int, str]:
        return _http.http(req.url, req.method, req.body, req.headers, timeout=timeout, client=client,
                          max_bytes=ANSWER_MAX_BYTES)

    return send


def attempt(send: Send, api: str, need_tokens: bool, url: str, timeout: float,
            clock: t.Callable[[], float] = time.monotonic) -> Outcome:
    """Send once and judge the answer: a 2xx status, and with `need_tokens` a JSON answer with a token count."""
    t0 = clock()
    try:
        status, text = send()
    except (TimeoutError, http.client.HTTPException) + _http.url_errors() as e:
        latency = clock() - t0
        reason = getattr(e, "reason", None) or e
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            why = "no answer within the timeout of %s s" % timeout
        else:
            why = "connection error: %s" % scrub(str(reason), url)
        return Outcome(False, latency, None, error=why)
    latency = clock() - t0
    if not 200 <= status < 300:
        excerpt = scrub(text, url)
        excerpt = excerpt[:EXCERPT] + ("..." if len(excerpt) > EXCERPT else "")
        return Outcome(False, latency, None, status, "HTTP %d (answer: %s)" % (status, excerpt.strip() or "empty"))
    try:
        answer = json.loads(text)
    except ValueError:
        if need_tokens:
            return Outcome(False, latency, None, status, "HTTP %d, but the answer is not JSON (a streamed answer is "
                                                         "not read: send stream false)" % status)
        return Outcome(True, latency, None, status)
    tokens = output_tokens(answer, api)
    if tokens is None and need_tokens:
        keys = ", ".join(sorted(str(k) for k in answer)) if isinstance(answer, dict) else type(answer).__name__
        return Outcome(False, latency, None, status, "HTTP %d, but the answer has no output token count (%s; it has: %s)"
                       % (status, " or ".join(field_names(api)), keys or "nothing"))
    return Outcome(True, latency, tokens, status)


def run_batch(pool: ThreadPoolExecutor, one: t.Callable[[], Outcome], n: int,
              clock: t.Callable[[], float] = time.monotonic) -> t.Tuple[t.List[Outcome], float]:
    """`n` requests through `pool` (its threads are the concurrency): their outcomes and the wall time of all. After a
    failure the requests not yet sent are cancelled; those in flight are waited for."""
    t0 = clock()
    futures = [pool.submit(one) for _n in range(n)]
    outcomes = []
    for f in as_completed(futures):
        if f.cancelled():
            continue
        o = f.result()
        outcomes.append(o)
        if not o.ok:
            for g in futures:
                g.cancel()
    return outcomes, clock() - t0


def nearest_rank(values: t.Sequence[float], q: float) -> float:
    """The q-quantile (0 < q <= 1) by nearest rank: a value that was measured."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def sig(value: float) -> float:
    """`value` to 6 significant digits, as results show measured values."""
    return float("%.6g" % value)


def plan_text(p: t.Mapping[str, t.Any], req: Request) -> str:
    """What a run measures, in words (check mode's message)."""
    base = ("%s of %s %s: %d warm-up request(s), then %d round(s) of %d request(s) at concurrency %d"
            % (p["metric"], req.method, shown_url(req.url), p["warmup"], p["rounds"], p["requests"], p["concurrency"]))
    if p.get("baseline") is None:
        return base + ", with no baseline to compare the median with"
    return base + ", the median compared with the baseline %s (failing below %s of it)" % (p["baseline"], p["min_ratio"])


def measure(send: Send, p: t.Mapping[str, t.Any], url: str,
            clock: t.Callable[[], float] = time.monotonic) -> t.Dict[str, t.Any]:
    """The warm-up, then the timed rounds: per-round values, their median, tokens and latencies. A failed request
    raises StepError naming what failed and how many requests had succeeded (its details: the rounds so far)."""
    need_tokens = p["metric"] == "output_tokens_per_s"
    values: t.List[float] = []
    latencies: t.List[float] = []
    counts: t.List[t.Optional[int]] = []
    succeeded = 0

    def one() -> Outcome:
        return attempt(send, p["api"], need_tokens, p["request"]["url"], p["timeout"], clock)

    batches = [("warm-up", p["warmup"])] if p["warmup"] else []
    batches += [("round %d of %d" % (i + 1, p["rounds"]), p["requests"]) for i in range(p["rounds"])]
    workers = min(p["concurrency"], max(p["requests"], p["warmup"]))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="server_bench") as pool:
        for phase, n in batches:
            outcomes, wall = run_batch(pool, one, n, clock)
            succeeded += sum(1 for o in outcomes if o.ok)
            failed = [o for o in outcomes if not o.ok]
            if failed:
                raise StepError("a request to %s failed in %s: %s; %d request(s) succeeded, %d failed"
                                % (url, "the warm-up" if phase == "warm-up" else phase, failed[0].error, succeeded,
                                   len(failed)),
                                phase=phase, status=failed[0].status, succeeded=succeeded, failed_requests=len(failed),
                                rounds=[sig(v) for v in values])
            if phase == "warm-up":
                continue
            tokens = [o.tokens for o in outcomes]
            counts += tokens
            latencies += [o.latency for o in outcomes]
            done = sum(x or 0 for x in tokens) if need_tokens else len(outcomes)
            values.append(done / max(wall, 1e-9))
    return {
        "rounds": [sig(v) for v in values],
        "median": sig(statistics.median(values)),
        "tokens": None if any(c is None for c in counts) else sum(t.cast(t.List[int], counts)),
        "latency_s": {"p50": round(nearest_rank(latencies, 0.5), 4), "p90": round(nearest_rank(latencies, 0.9), 4),
                      "max": round(max(latencies), 4)},
    }


def compare(median: float, baseline: t.Optional[float], min_ratio: float, metric: str,
            rounds: t.Sequence[float]) -> t.Tuple[t.Optional[float], bool, str]:
    """(ratio, passed, message): the median against the baseline (no baseline: passed, ratio None)."""
    shown = ", ".join("%g" % v for v in rounds)
    if baseline is None:
        return None, True, "%s median %g (rounds: %s); no baseline was given, so nothing was compared" % (
            metric, median, shown)
    ratio = median / baseline
    if ratio < min_ratio:
        return round(ratio, 4), False, (
            "%s fell to %.4g of the baseline: median %g against baseline %g, below min_ratio %g (rounds: %s)"
            % (metric, ratio, median, baseline, min_ratio, shown))
    return round(ratio, 4), True, "%s median %g is %.4g of the baseline %g, at least min_ratio %g (rounds: %s)" % (
        metric, median, ratio, baseline, min_ratio, shown)


def argument_spec() -> t.Dict[str, t.Any]:
    """The measurement's options (server_bench's, and server_restart's O(gate) without the baseline it reads itself)."""
    return dict(
        request=dict(type="dict", required=True, options=dict(
            url=dict(type="str", required=True),
            method=dict(type="str", default="POST"),
            body=dict(type="raw"),
            # Secret (an Authorization token): masked in every result (_nolog.NoLogModule), never shown.
            headers=dict(type="dict", default={}, no_log=True),
            validate_certs=dict(type="bool", default=True),
        )),
        api=dict(type="str", choices=list(APIS), default="auto"),
        metric=dict(type="str", choices=list(METRICS), default="output_tokens_per_s"),
        warmup=dict(type="int", default=2),
        requests=dict(type="int", default=16),
        concurrency=dict(type="int", default=4),
        rounds=dict(type="int", default=3),
        timeout=dict(type="float", default=120.0),
        min_ratio=dict(type="float", default=0.9),
    )


def gate_key(g: t.Mapping[str, t.Any]) -> str:
    """What makes two measurements comparable: the metric, the request (URL, method, body; not its secret headers)
    and the load. A gate whose benchmark changed has no baseline until it passed once with the new one."""
    shape = [g["metric"], g["api"], g["request"]["method"], g["request"]["url"],
             json.dumps(g["request"].get("body"), sort_keys=True, default=str), g["requests"], g["concurrency"],
             g["warmup"]]
    return hashlib.sha256(json.dumps(shape).encode("utf-8")).hexdigest()[:16]


def gate_baseline(recorded: t.Optional[t.Mapping[str, t.Any]], g: t.Mapping[str, t.Any]) -> t.Optional[float]:
    """The host's last known good measurement of this benchmark (a record's `gate`), or None."""
    if not isinstance(recorded, t.Mapping) or recorded.get("key") != gate_key(g):
        return None
    value = recorded.get("median")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def gate_plan(g: t.Mapping[str, t.Any], baseline: t.Optional[float]) -> t.Dict[str, t.Any]:
    """What the restart's performance gate would measure and against what (check mode: no request is sent). The
    result has the keys of a measurement's, with `median`, `ratio` and `passed` null and `would_measure` true."""
    p = dict(g, baseline=baseline)
    req = check_input(p)
    msg = "would measure %s" % plan_text(p, req)
    if baseline is None:  # plan_text said there is none
        msg += " (this host's first measurement of this benchmark: it would be recorded and pass)"
    else:
        msg += " (this host's last known good measurement)"
    return dict(metric=p["metric"], median=None, baseline=baseline, min_ratio=p["min_ratio"], ratio=None, passed=None,
                msg=msg, key=gate_key(g), url=shown_url(req.url), would_measure=True)


def gate(g: t.Mapping[str, t.Any], baseline: t.Optional[float]) -> t.Dict[str, t.Any]:
    """Measure and compare (the restart's performance gate). Returns the measurement with `passed`, `ratio`, `msg`
    and `key`; raises StepError (phase gate) when a request fails or the median falls below min_ratio."""
    p = dict(g, baseline=baseline)
    req = check_input(p)
    url = shown_url(req.url)
    try:
        out = measure(sender(req, p["timeout"]), p, url)
    except StepError as e:
        raise StepError("performance gate: %s" % e, phase="gate", gate=dict(e.details, passed=False)) from None
    ratio, passed, msg = compare(out["median"], baseline, p["min_ratio"], p["metric"], out["rounds"])
    if baseline is None:
        msg = "%s median %g (rounds: %s); no baseline for this benchmark on this host yet: recorded as the host's " \
              "baseline" % (p["metric"], out["median"], ", ".join("%g" % v for v in out["rounds"]))
    out.update(metric=p["metric"], baseline=baseline, min_ratio=p["min_ratio"], ratio=ratio, passed=passed, msg=msg,
               key=gate_key(g), url=url)
    if not passed:
        raise StepError("performance gate: %s" % msg, phase="gate", gate=out)
    return out
