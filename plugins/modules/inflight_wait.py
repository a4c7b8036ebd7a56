#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: inflight_wait
short_description: Wait until a server has no requests in flight, from its own Prometheus metrics
version_added: 0.2.0
description:
  - Reads O(url) (the server's Prometheus metrics) every O(interval) seconds until the sum of O(metrics) over all their
    label sets is 0, for at most O(timeout) seconds. The gpu_server role runs it after taking a host out of its load
    balancers and before the kill, so no request in flight is cut.
  - A server that refuses the connection has nothing in flight (it is down, often the reason for its restart) and
    counts as drained (RV(server_down)).
  - An answer without any of O(metrics), or an HTTP error, fails at once with the URL and the names, never as drained.
author: gpufleet contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving._attributes
  - gpufleet.serving._attributes.INFO_MODULE
options:
  url:
    description: URL of the server's metrics in Prometheus text format, for example V(http://127.0.0.1:30000/metrics).
    type: str
    required: true
  metrics:
    description:
      - Gauges whose sum is the number of requests in flight.
      - SGLang (the default) V([sglang:num_running_reqs, sglang:num_queue_reqs]); vLLM
        V([vllm:num_requests_running, vllm:num_requests_waiting]).
    type: list
    elements: str
    default: [sglang:num_running_reqs, sglang:num_queue_reqs]
  timeout:
    description: Seconds to wait for 0. Past it the module fails with the counts (or, with O(on_timeout=proceed), returns
      RV(drained=false)).
    type: float
    default: 300
  interval:
    description: Seconds between two reads.
    type: float
    default: 0.5
  on_timeout:
    description: V(fail) the task, or V(proceed) (return with RV(drained=false) and a warning).
    type: str
    choices: [fail, proceed]
    default: fail
  headers:
    description: Request headers (an C(Authorization) for a protected metrics endpoint). The values are secret (C(no_log)).
    type: dict
    default: {}
  validate_certs:
    description: Verify the server's TLS certificate (https URLs).
    type: bool
    default: true
  alive_url:
    version_added: 0.2.0
    description:
      - The server's health URL. When O(url) refuses the connection, the server counts as down (nothing in flight)
        only if this URL does not answer either; a server that answers here has a wrong O(url), and the module
        fails.
    type: str
notes:
  - In check mode the metrics are read once and nothing is waited for.
seealso:
  - module: gpufleet.serving.server_restart
"""

EXAMPLES = r"""
- name: Wait for SGLang's requests in flight to finish (at most 10 minutes)
  gpufleet.serving.inflight_wait:
    url: http://127.0.0.1:30000/metrics
    timeout: 600

- name: The same for vLLM
  gpufleet.serving.inflight_wait:
    url: http://127.0.0.1:8000/metrics
    metrics: [vllm:num_requests_running, vllm:num_requests_waiting]
"""

RETURN = r"""
drained:
  description: Whether no request was in flight at the last read.
  returned: always
  type: bool
inflight:
  description: Requests in flight at the last read (the sum of O(metrics)).
  returned: always
  type: float
gauges:
  description: Each metric found, summed over its label sets, at the last read.
  returned: always
  type: dict
waited_s:
  description: Seconds from the first read to the last.
  returned: always
  type: float
reads:
  description: Number of reads of O(url).
  returned: always
  type: int
server_down:
  description: The server refused the connection (not running), so nothing was in flight.
  returned: always
  type: bool
"""

import typing as t

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _drain, _http

# A metrics page lists every gauge and histogram of the server (vLLM's runs to hundreds of KiB with many models).
METRICS_MAX_BYTES = 4 * 1024 * 1024


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            metrics=dict(type="list", elements="str", default=list(_drain.SGLANG_METRICS)),
            timeout=dict(type="float", default=300.0),
            interval=dict(type="float", default=0.5),
            on_timeout=dict(type="str", choices=["fail", "proceed"], default="fail"),
            headers=dict(type="dict", default={}, no_log=True),
            validate_certs=dict(type="bool", default=True),
            alive_url=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    err = _drain.input_error(p["url"], p["metrics"], p["timeout"], p["interval"])
    if err:
        module.fail_json(msg=err)
    headers = {str(k): str(v) for k, v in p["headers"].items()}
    client = _http.http_client(validate_certs=p["validate_certs"])  # one client (one SSL context) for every read

    def fetch(url: str) -> t.Tuple[int, str]:
        return _http.http(url, headers=headers, timeout=5.0, client=client, max_bytes=METRICS_MAX_BYTES)

    def alive() -> t.Optional[str]:
        """The alive URL when the server answers there at all (any HTTP status), else None."""
        if not p["alive_url"]:
            return None
        try:
            fetch(p["alive_url"])
        except Exception:  # pylint: disable=broad-except
            return None
        return p["alive_url"]

    try:
        res = _drain.wait(fetch, p["url"], p["metrics"], p["timeout"], p["interval"], once=module.check_mode,
                          alive=alive)
    except _drain.DrainTimeout as e:
        if p["on_timeout"] == "fail":
            module.fail_json(msg=str(e), drained=False, **e.result)
        module.warn("%s; going on (on_timeout=proceed)" % e)
        module.exit_json(changed=False, drained=False, **e.result)
    except _drain.DrainError as e:
        module.fail_json(msg=str(e), drained=False, **e.result)
    module.exit_json(changed=False, drained=res["inflight"] <= 0, **res)


if __name__ == "__main__":
    main()
