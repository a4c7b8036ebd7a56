#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: server_bench
short_description: Measure a running inference server's throughput, and fail below a fraction of a baseline
version_added: 0.2.0
description:
  - Sends O(request) to a running server, O(warmup) times first (not measured), then in O(rounds) rounds of
    O(requests) requests, O(concurrency) of them in flight at a time. Each round's value is the output tokens of its
    answers (or its requests, O(metric)) divided by the round's wall time; RV(median) is the median of the rounds.
  - With O(baseline) (an earlier RV(median) of the same O(metric), request and concurrency), the module fails when
    the median is below O(min_ratio) of it, naming both numbers and the ratio. Without it the module passes and says
    that nothing was compared.
  - A request that fails (an HTTP status other than 2xx, a connection error, no answer within O(timeout), or with
    O(metric=output_tokens_per_s) an answer without a token count) fails the module, naming the status and the URL
    (without its user, password and query string) and how many requests had succeeded. Header values are never shown
    (C(no_log)), and no message or result key holds the body. The task's invocation (C(-vvv)) shows the URL and the
    body as given, as it shows any option, so put a token in O(request.headers), not in the URL or the body.
  - The answer must be one JSON document (not streamed); the output token count is read from it as O(api) says.
    Each request opens its own connection, without a proxy.
  - The module changes nothing on the host, but the requests it sends load the server (send it to a server out of
    rotation, or one that may take the load).
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.INFO_MODULE
attributes:
  check_mode:
    support: full
    details:
      - Check mode sends no request. It returns RV(skipped) true, with a RV(msg) saying what a run would measure and
        against what baseline, and RV(rounds) empty.
  idempotent:
    support: full
    details:
      - It never changes anything, but each run measures anew, so the numbers differ from run to run.
options:
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
          - Request body. A dict or a list is sent as JSON (with C(Content-Type application/json) unless O(request.headers)
            sets one); a string is sent as it is.
          - For O(metric=output_tokens_per_s), ask for a fixed number of tokens that the server cannot stop early
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
    description: Requests sent first, at O(concurrency), and not measured (a first request can be slower). V(0) sends none.
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
    description: Measured rounds; RV(median) is their median. At least V(1).
    type: int
    default: 3
  timeout:
    description: Seconds each request may wait for the server (for the connection, and between the bytes of the answer).
    type: float
    default: 120
  baseline:
    description:
      - An earlier measurement of the same O(metric) (its RV(median)), with the same request and concurrency. Greater
        than 0. Unset, nothing is compared.
    type: float
  min_ratio:
    description: With O(baseline), the module fails when RV(median) divided by O(baseline) is below this. Greater than 0 and
      at most 1.
    type: float
    default: 0.9
seealso:
  - module: gpufleet.serving.server_ready
"""

EXAMPLES = r"""
- name: Measure the output tokens per second of sglang, 16 requests at a time
  gpufleet.serving.server_bench:
    request:
      url: http://127.0.0.1:30000/generate
      body: {text: "Write a haiku about GPUs.", sampling_params: {max_new_tokens: 256, ignore_eos: true}}
    concurrency: 16
    requests: 64
  register: bench_before

- name: Fail when the server is now more than 10 % slower than before
  gpufleet.serving.server_bench:
    request:
      url: http://127.0.0.1:30000/generate
      body: {text: "Write a haiku about GPUs.", sampling_params: {max_new_tokens: 256, ignore_eos: true}}
    concurrency: 16
    requests: 64
    baseline: "{{ bench_before.median }}"
    min_ratio: 0.9

- name: Measure vLLM's OpenAI-compatible API, behind a token
  gpufleet.serving.server_bench:
    request:
      url: http://127.0.0.1:8000/v1/completions
      body: {model: my-model, prompt: "Hello", max_tokens: 128, ignore_eos: true}
      headers: {Authorization: "Bearer {{ vllm_api_key }}"}
    api: openai
"""

RETURN = r"""
url:
  description: The URL measured, without its user, password and query string.
  returned: always
  type: str
  sample: http://127.0.0.1:30000/generate
metric:
  description: O(metric).
  returned: always
  type: str
  sample: output_tokens_per_s
requests:
  description: Requests per round (O(requests)).
  returned: always
  type: int
  sample: 16
concurrency:
  description: Requests in flight at a time (O(concurrency)).
  returned: always
  type: int
  sample: 4
warmup:
  description: Warm-up requests (O(warmup)).
  returned: always
  type: int
  sample: 2
round_count:
  description: Measured rounds asked for (O(rounds)).
  returned: always
  type: int
  sample: 3
rounds:
  description: Each round's value of O(metric), in the order measured (6 significant digits). Empty in check mode;
    on a failed request, the rounds measured before it.
  returned: always
  type: list
  elements: float
  sample: [1510.2, 1498.7, 1523.9]
median:
  description: The median of RV(rounds); null in check mode.
  returned: success, and failure below O(min_ratio)
  type: float
  sample: 1510.2
tokens:
  description: Output tokens of the measured answers (warm-up left out); null when an answer had no count (possible
    with O(metric=requests_per_s)) and in check mode.
  returned: success, and failure below O(min_ratio)
  type: int
  sample: 6144
latency_s:
  description: Seconds per measured request, from sending it to its whole answer; null in check mode.
  returned: success, and failure below O(min_ratio)
  type: dict
  contains:
    p50:
      description: Median (nearest rank).
      type: float
    p90:
      description: 90th percentile (nearest rank).
      type: float
    max:
      description: Slowest request.
      type: float
baseline:
  description: O(baseline) (null when unset).
  returned: always
  type: float
min_ratio:
  description: O(min_ratio).
  returned: always
  type: float
ratio:
  description: RV(median) divided by O(baseline), 4 decimals; null without a baseline and in check mode.
  returned: always
  type: float
  sample: 0.9731
passed:
  description: False when RV(ratio) is below O(min_ratio); true without a baseline; null in check mode (nothing was
    measured).
  returned: always
  type: bool
skipped:
  description: True in check mode, which measures nothing.
  returned: check mode
  type: bool
msg:
  description: What was measured and how it compares with the baseline; in check mode, what a run would measure.
  returned: always
  type: str
phase:
  description: On a failed request, where it failed (V(warm-up), V(round 2 of 3)).
  returned: failure of a request
  type: str
status:
  description: On a failed request, its HTTP status (null when there was no answer).
  returned: failure of a request
  type: int
succeeded:
  description: On a failed request, the requests that had succeeded (warm-up included).
  returned: failure of a request
  type: int
failed_requests:
  description: On a failed request, how many requests of its round (or warm-up) failed.
  returned: failure of a request
  type: int
"""

import typing as t

from ansible_collections.gpufleet.serving.plugins.module_utils import _bench, _nolog
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import StepError, fail


def main() -> None:
    module = _nolog.NoLogModule(
        argument_spec=dict(_bench.argument_spec(), baseline=dict(type="float")),
        supports_check_mode=True,
    )
    p = module.params
    try:
        req = _bench.check_input(p)
    except StepError as e:
        fail(module, e)
    result: t.Dict[str, t.Any] = dict(
        changed=False, url=_bench.shown_url(req.url), metric=p["metric"], requests=p["requests"],
        concurrency=p["concurrency"], warmup=p["warmup"], round_count=p["rounds"], rounds=[], baseline=p["baseline"],
        min_ratio=p["min_ratio"], ratio=None, passed=None)
    if module.check_mode:
        # A measurement is its requests: check mode sends none (it would load the server), and says what it skipped.
        module.exit_json(skipped=True, median=None, tokens=None, latency_s=None,
                         msg="check mode, no request sent: a run would measure %s" % _bench.plan_text(p, req), **result)
    try:
        result.update(_bench.measure(_bench.sender(req, p["timeout"]), p, result["url"]))
    except StepError as e:
        result["passed"] = False
        fail(module, e, **result)
    ratio, passed, msg = _bench.compare(result["median"], p["baseline"], p["min_ratio"], p["metric"], result["rounds"])
    result.update(ratio=ratio, passed=passed)
    if not passed:
        module.fail_json(msg=msg, **result)
    module.exit_json(msg=msg, **result)


if __name__ == "__main__":
    main()
