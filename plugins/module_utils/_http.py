# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The collection's HTTP client, for the servers' own URLs on their host: the ready poll (server_ready, server_restart),
the metrics reads of the drain (inflight_wait) and the performance gate's requests (server_bench)."""

from __future__ import annotations

import ssl
import typing as t
import urllib.error
from urllib.parse import urlparse


def url_errors() -> t.Tuple[t.Type[BaseException], ...]:
    """What an HTTP call through http_client() raises for an unreachable or failing server (an `except` clause
    evaluates it only when an exception arrives, by when http_client() imported ansible.module_utils.urls)."""
    from ansible.module_utils.urls import ConnectionError as UrlsConnectionError  # pylint: disable=import-outside-toplevel
    return (urllib.error.URLError, UrlsConnectionError, OSError, ValueError)


def http_client(validate_certs: bool = True) -> t.Any:
    """The collection's one HTTP client (ansible.module_utils.urls), for the ready poll (server_ready, server_restart)
    and the metrics reads (inflight_wait): no proxy (the server is on this host), no ~/.netrc credentials,
    certificates verified unless `validate_certs` is false."""
    # One Request with one SSL context for a whole wait, not open_url per poll: open_url builds a new SSL context (it
    # reads the CA bundle) on every call, measured at 34 to 147 ms per request against a local HTTP server on the 2-core
    # CI machine, against 1.2 to 1.7 ms for a reused Request; the poll runs every 0.25 s by default.
    # Imported here, not at the top: ansible.module_utils.urls pulls in cryptography's x509 and email.mime, about 130 ms
    # of CPU on the host every time a module that imports this file runs (AnsiballZ compiles its zip's sources on each
    # run), and most of them (the check, the lock, the drain record, the kill) never send a request.
    from ansible.module_utils.urls import Request  # pylint: disable=import-outside-toplevel
    context = ssl.create_default_context()
    if not validate_certs:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return Request(use_proxy=False, use_netrc=False, context=context)


def http(url: str, method: str = "GET", body: t.Optional[str] = None, headers: t.Optional[t.Mapping[str, str]] = None,
         timeout: float = 5.0, client: t.Any = None, max_bytes: int = 65536) -> t.Tuple[int, str]:
    """(status, the first `max_bytes` of the body decoded); an HTTP error status is returned, not raised."""
    data = body.encode() if body is not None else None
    try:
        with (client or http_client()).open(method, url, data=data, headers=dict(headers or {}), timeout=timeout) as r:
            return r.status, r.read(max_bytes).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(4096).decode("utf-8", "replace") if e.fp else ""


def is_http_url(url: str) -> bool:
    """Whether `url` is http:// or https:// with a host and a valid port (server_ready's and server_bench's URLs)."""
    u = urlparse(url)
    try:
        u.port  # pylint: disable=pointless-statement  # raises on a port out of 0-65535
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname)
