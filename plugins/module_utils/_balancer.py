# -*- coding: utf-8 -*-
# Copyright (c) gpufleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE and should only be used by this collection.
# Breaking changes can happen without notice.

"""The load balancers of zero-drop rollouts (the balancer module): HAProxy (its admin socket), the SGLang Model Gateway
(`smg`, its worker API) and `http` (a remove/add request pair, no read API). Reading a balancer's state, taking a
server out, putting it back to the state found, waiting until UP and the capacity count are each written once here.

HAProxy is spoken to on its admin socket with three text commands (`show stat`, `set server B/S state maint|ready|drain`)
rather than through community.general.haproxy: that module has no state that clears an admin DRAIN (its `enabled`
sends `enable server`, which leaves DRAIN set), reads one backend per call, and would make community.general a
dependency for a few lines of text protocol. One implementation reads and writes, so the drain, the return to service,
the capacity guard and the audit agree on what a state means.

Logic raises BalancerError; only the module's main() turns it into fail_json.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import time
import typing as t
from urllib.parse import urlsplit


TYPES = ("haproxy", "sglang_router", "http", "none")
HAPROXY_SOCKET = "/var/run/haproxy.sock"
HTTP_OK = [200, 201, 202, 204]
# HAProxy states that mean "out of rotation" (an admin's): MAINT (no request at all), DRAIN (only persistent ones).
OUT = ("MAINT", "DRAIN")

Entry = t.Dict[str, t.Any]
Records = t.Mapping[str, t.Mapping[str, t.Any]]


class BalancerError(Exception):
    """A balancer could not be read or changed as asked; `result` is what was done before (the module returns it)."""

    def __init__(self, msg: str, **result: t.Any) -> None:
        super().__init__(msg)
        self.result = result


# -- input ------------------------------------------------------------------------------------------------------------
def input_errors(entries: t.Sequence[t.Mapping[str, t.Any]]) -> t.List[str]:
    """The rules an argument spec cannot express (URL forms, unique names), each broken one named."""
    errs = []
    for i, b in enumerate(entries, 1):
        n = "entry %d " % i
        typ = b.get("type")
        if typ == "haproxy" and not str(b.get("delegate_to") or ""):
            errs.append(n + "(haproxy) needs delegate_to: the host whose admin socket it is")
        elif typ == "sglang_router" and not re.match(r"^https?://[^/]+", str(b.get("url") or "")):
            errs.append(n + "(sglang_router) needs url, the router as http(s)://host:port")
        elif typ == "http" and not all(re.match(r"^https?://", str((b.get(k) or {}).get("url") or ""))
                                       for k in ("remove", "add")):
            errs.append(n + "(http) needs remove.url and add.url, both http(s) URLs")
    names = [b["name"] for b in entries if b.get("name")]
    if len(names) != len(set(names)):
        errs.append("two balancers have the same name")
    return errs


def public_url(url: str) -> str:
    """A URL without its credentials (user:password@) and query (?token=): what a record or a message may show."""
    return re.sub(r"[?#].*$", "", re.sub(r"^([^:/?#]+://)[^/?#]*@", r"\1", url))


def url_secrets(url: str) -> t.List[str]:
    """The parts of a URL that are secret: its user:password and its query."""
    out = []
    m = re.match(r"^[^:/?#]+://([^/?#]*)@", url)
    if m:
        out.append(m.group(1))
    if "?" in url:
        out.append(url.split("?", 1)[1].split("#", 1)[0])
    return [s for s in out if s]


def identity(b: Entry, server: str, worker_url: str) -> str:
    """The server as the balancer names it: HAProxy's server name, the router's worker URL, the remove URL."""
    if b["type"] == "haproxy":
        return b.get("server") or server
    if b["type"] == "sglang_router":
        return b.get("worker_url") or worker_url
    return public_url(b["remove"]["url"])


def identity_map(entries: t.Optional[t.Sequence[t.Any]], server: str, worker_url: str) -> t.Dict[str, str]:
    """Entry name to the server that entry names for the host (the balancer_idents filter, the fast path's refusal)."""
    return {str(b["name"]): identity(b, server, worker_url)
            for b in entries or [] if isinstance(b, t.Mapping) and b.get("name")}


def other_server(rec: t.Any, ident: str) -> t.Optional[str]:
    """The server a drain record names when it is not `ident` (the entry's server as this host has it), else None."""
    server = rec.get("server") if isinstance(rec, t.Mapping) else None
    return str(server) if server not in (None, "") and str(server) != ident else None


def foreign_text(name: str, rec: t.Any, ident: str) -> t.Optional[str]:
    """Why a drain record under entry `name` is not a drain of the host the entry names as `ident`, or None."""
    other = other_server(rec, ident)
    if other is None:
        return None
    return ("the drain record of entry %s names server %s, not this host's %s: not a drain of this host (an entry "
            "copied from another host's variables when it was made?); if gpufleet took %s out, put it back by hand, "
            "then remove %s from the record" % (name, other, ident, other, name))


def record_for(b: Entry, records: Records, names: t.Collection[str], ident: str) -> t.Tuple[t.Optional[str], t.Any]:
    """(key, record) of gpufleet's own drain of this entry: by its name or, for an entry renamed since the drain, the
    record of another name no entry has any more that names the same server. (None, None) when there is none."""
    if b["name"] in records:
        # A record under this name of another server (an entry copied from another host's variables when the drain
        # was made) is not this host's drain: trusted, it would undo an operator's MAINT (helper-38). other_server()
        # says so.
        if other_server(records[b["name"]], ident):
            return None, None
        return b["name"], records[b["name"]]
    for key in sorted(records):
        if key not in names and records[key].get("server") == ident:
            return key, records[key]
    return None, None


# -- HAProxy ----------------------------------------------------------------------------------------------------------
def haproxy_cmd(sock: str, line: str, timeout: float = 10) -> str:
    """One command on HAProxy's admin socket; an unreachable socket is one line naming it, not a traceback."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(timeout)
            s.connect(sock)
            s.sendall(line.encode() + b"\n")
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        finally:
            s.close()
    except OSError as e:
        raise BalancerError("cannot reach the HAProxy admin socket %s: %s" % (sock, e))
    return out.decode("utf-8", "replace")


def parse_stat(text: str) -> t.List[t.Dict[str, str]]:
    """`show stat` CSV to rows (dicts by column), servers only (no FRONTEND/BACKEND lines)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#"):
        raise BalancerError("not an answer to show stat: %r" % text[:120])
    head = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(head, x.split(","))) for x in lines[1:] if x.strip()]
    return [r for r in rows if r.get("svname") not in (None, "FRONTEND", "BACKEND")]


def server_states(rows: t.Sequence[t.Mapping[str, str]], server: str, backend: str = "") -> t.Dict[str, str]:
    """{backend: status} of `server` in `backend` (every backend that has it when empty)."""
    return {r["pxname"]: r.get("status", "") for r in rows
            if r.get("svname") == server and (not backend or r.get("pxname") == backend)}


def address_mismatch(addr: str, worker_url: str) -> t.Optional[str]:
    """Why HAProxy's address of a server ("IP:PORT", "[IPv6]:PORT") is not where the worker URL's server listens, or
    None when it is (or when there is nothing to compare: no address shown, a unix socket, no worker URL). The worker
    URL's host is resolved here, where HAProxy runs (the entry's delegate_to)."""
    if not addr or ":" not in addr or not worker_url:
        return None
    host, _sep, port = addr.rpartition(":")
    host = host.strip("[]")
    u = urlsplit(worker_url)
    try:
        want_port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return "its worker URL %s has no valid port" % public_url(worker_url)
    if port != str(want_port):
        return "port %s, not the worker URL's %s" % (port, want_port)
    try:
        have = ipaddress.ip_address(host)
    except ValueError:
        return None  # not an address (a name HAProxy shows unresolved): nothing to compare
    try:
        ips = {ipaddress.ip_address(a[4][0].split("%")[0])
               for a in socket.getaddrinfo(u.hostname or "", want_port, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError, ValueError) as e:
        return "the worker URL's host %s cannot be resolved here (%s)" % (u.hostname, e)
    if have in ips or (have.version == 6 and have.ipv4_mapped in ips):
        return None
    if {str(i) for i in ips} == {u.hostname}:  # the URL names an address
        return "address %s, not the worker URL's %s" % (host, u.hostname)
    return "address %s, and the worker URL's host %s is %s" % (
        host, u.hostname, ", ".join(sorted(str(i) for i in ips)))


# A backend that sent a server a session this recently (show stat's lastsess, seconds) is one a frontend uses.
SERVING_S = 300


def _recent(lastsess: t.Any) -> bool:
    try:
        return 0 <= int(str(lastsess)) <= SERVING_S
    except ValueError:  # not shown (an old HAProxy), or -1 written otherwise: no evidence
        return False


def word(status: str) -> str:
    return (status.split() or [""])[0]


def found_of(states: t.Mapping[str, str]) -> str:
    """One word for the server over its backends: MAINT only when MAINT in all, DRAIN when DRAIN in any, else its
    status; where an operator set MAINT or DRAIN in some backends only, each ("b1=UP b2=MAINT"), so that each backend
    goes back to its own state. 'absent' when no backend has it."""
    sts = sorted({word(s) for s in states.values()})
    if len(sts) > 1 and any(s in OUT for s in sts):
        return " ".join("%s=%s" % (b, word(states[b])) for b in sorted(states))
    if not sts:
        return "absent"
    if sts == ["MAINT"]:
        return "MAINT"
    if "DRAIN" in sts:
        return "DRAIN"
    return [s for s in sts if s != "MAINT"][0]


def resume_back(found: str, rec_found: str) -> str:
    """What a host goes back to when gpufleet's own drain (its record found `rec_found`) is found again MAINT in some
    backends only (an operator put it back into the others by hand, as the runbook says): each backend still MAINT
    goes back to what the record found there, the others stay as found now. One word when all agree."""
    now, rec = back_by_backend(found, ""), back_by_backend(rec_found, "")
    out = {b: (rec.get(b, rec.get("", "UP")) if s == "MAINT" else s) for b, s in now.items()}
    if len(set(out.values())) == 1:
        return next(iter(out.values()))
    return " ".join("%s=%s" % (b, out[b]) for b in sorted(out))


def back_by_backend(back: str, backend: str) -> t.Dict[str, str]:
    """{backend: state to go back to}: per backend when found per backend, else {backend or '' (every one): back}."""
    if "=" in back:
        return dict(p.split("=", 1) for p in back.split())
    return {backend: back}


class HAProxy:
    """One admin socket; `show stat` read once per call of read() and kept for capacity's many servers."""

    def __init__(self, sock: str, interval: float = 1.0) -> None:
        self.sock = sock
        self.interval = interval

    def rows(self) -> t.List[t.Dict[str, str]]:
        return parse_stat(haproxy_cmd(self.sock, "show stat"))

    def states(self, server: str, backend: str = "") -> t.Dict[str, str]:
        return server_states(self.rows(), server, backend)

    def read(self, server: str, backend: str = "") -> t.Dict[str, t.Dict[str, str]]:
        """{states, addrs, weights} of `server`, each by backend, from one show stat (addrs: show stat's addr,
        "IP:PORT", HAProxy 1.7 and later; empty where not shown)."""
        every = self.rows()
        rows = [r for r in every if r.get("svname") == server and (not backend or r.get("pxname") == backend)]
        # The other servers in rotation in each of those backends (UP or no check, weight not 0).
        others = {be: sum(1 for r in every if r.get("pxname") == be and r.get("svname") != server
                          and word(r.get("status", "")) in ("UP", "no") and r.get("weight") != "0")
                  for be in {r["pxname"] for r in rows}}
        # The server's rows in the backends `backend` leaves out (the drain's check that an entry covers them).
        elsewhere = {r["pxname"]: {"status": r.get("status", ""), "weight": r.get("weight", ""), "addr": r.get("addr", ""),
                                   "lastsess": r.get("lastsess", "")}
                     for r in every if backend and r.get("svname") == server and r.get("pxname") != backend}
        return {"states": {r["pxname"]: r.get("status", "") for r in rows},
                "addrs": {r["pxname"]: r.get("addr", "") for r in rows},
                "weights": {r["pxname"]: r.get("weight", "") for r in rows},
                "others_in_rotation": others, "elsewhere": elsewhere}

    def set_state(self, backends: t.Iterable[str], server: str, state: str) -> None:
        for b in sorted(backends):
            out = haproxy_cmd(self.sock, "set server %s/%s state %s" % (b, server, state)).strip()
            if out:
                raise BalancerError("set server %s/%s state %s: %s" % (b, server, state, out))

    def wait(self, server: str, backends: t.Sequence[str], want: str, timeout: float,
             sleep: t.Callable[[float], None] = time.sleep) -> t.Dict[str, str]:
        """Until `server` is `want` in each of `backends` ('' is every backend that has it): its first word, but UP
        only settled. A server leaves MAINT as "UP 1/2" (UP, going down: no check has passed since), and a server
        HAProxy cannot reach reads so until its next check marks it DOWN (helper-41); "UP" alone is a check passed."""
        def done(s: str) -> bool:
            return s.strip() == "UP" if want == "UP" else word(s) == want
        deadline = time.monotonic() + timeout
        while True:
            st: t.Dict[str, str] = {}
            for b in backends:
                st.update(self.states(server, b))
            if st and all(done(s) for s in st.values()):
                return st
            if time.monotonic() >= deadline:
                raise BalancerError("HAProxy %s: server %s is %s, not %s, after %gs" % (
                    self.sock, server, ", ".join("%s in %s" % (s, b) for b, s in sorted(st.items())) or "absent",
                    want, timeout), states=st)
            sleep(self.interval)


# -- SGLang Model Gateway (smg) ---------------------------------------------------------------------------------------
class Http:
    """HTTP through ansible.module_utils.urls (certs, proxies and timeouts the Ansible way)."""

    def __init__(self, timeout: float = 10, validate_certs: bool = True) -> None:
        self.timeout = timeout
        self.validate_certs = validate_certs

    def call(self, method: str, url: str, headers: t.Optional[t.Mapping[str, str]] = None,
             body: t.Any = None) -> t.Tuple[int, str]:
        """(status, body); an HTTP error answer is a status too; no connection raises BalancerError (no secret)."""
        data = body if body is None or isinstance(body, (str, bytes)) else json.dumps(body)
        hdrs = dict(headers or {})
        if data is not None and not isinstance(body, (str, bytes)):
            hdrs.setdefault("Content-Type", "application/json")
        # Imported here: ansible.module_utils.urls costs every run of a module importing this file about 130 ms of CPU
        # (cryptography's x509), and HAProxy's socket needs none of it.
        from urllib.error import HTTPError  # pylint: disable=import-outside-toplevel
        from ansible.module_utils.urls import open_url  # pylint: disable=import-outside-toplevel
        try:
            r = open_url(url, data=data, headers=hdrs, method=method, timeout=self.timeout,
                         validate_certs=self.validate_certs, use_proxy=False)
            return r.getcode(), r.read().decode("utf-8", "replace")
        except HTTPError as e:
            return e.code, ""
        except Exception as e:  # URLError, socket errors, TLS: one line naming the URL, never its credentials
            raise BalancerError("%s %s: %s" % (method, public_url(url), getattr(e, "reason", e)))


class Router:
    def __init__(self, url: str, headers: t.Optional[t.Mapping[str, str]], http: Http, interval: float = 1.0) -> None:
        self.url = url.rstrip("/")
        self.headers = headers or {}
        self.http = http
        self.interval = interval

    def workers(self) -> t.List[t.Dict[str, t.Any]]:
        code, body = self.http.call("GET", self.url + "/workers", self.headers)
        if code != 200:
            raise BalancerError("the router %s answered HTTP %s to GET /workers" % (self.url, code), status=code)
        try:
            ws = json.loads(body).get("workers", [])
        except (ValueError, AttributeError):
            raise BalancerError("the router %s: GET /workers is not JSON with a workers list" % self.url)
        return [w for w in ws if isinstance(w, dict)]

    def mine(self, worker_url: str) -> t.List[t.Dict[str, t.Any]]:
        return [w for w in self.workers() if w.get("url") == worker_url]

    def remove(self, worker_url: str) -> bool:
        ws = self.mine(worker_url)
        for w in ws:
            code = self.http.call("DELETE", "%s/workers/%s" % (self.url, w.get("id")), self.headers)[0]
            if code not in (200, 202, 204):
                raise BalancerError("the router %s answered HTTP %s to DELETE /workers/%s" % (self.url, code, w.get("id")))
        return bool(ws)

    def add(self, worker_url: str) -> bool:
        if self.mine(worker_url):
            return False
        code = self.http.call("POST", self.url + "/workers", self.headers, {"url": worker_url})[0]
        if code not in (200, 201, 202):
            raise BalancerError("the router %s answered HTTP %s to POST /workers (%s)" % (self.url, code, worker_url))
        return True

    def wait(self, worker_url: str, listed: bool, timeout: float,
             sleep: t.Callable[[float], None] = time.sleep) -> None:
        """Until the router lists the worker healthy (listed) or no longer lists it."""
        deadline = time.monotonic() + timeout
        while True:
            ws = self.mine(worker_url)
            if (any(w.get("is_healthy") for w in ws) if listed else not ws):
                return
            if time.monotonic() >= deadline:
                raise BalancerError("the router %s %s the worker %s after %gs" % (
                    self.url, "does not list healthy" if listed else "still lists", worker_url, timeout))
            sleep(self.interval)


# -- the operations ---------------------------------------------------------------------------------------------------
class Balancers:
    """The entries of one host (or, for capacity, of many) as one delegate reaches them."""

    def __init__(self, entries: t.Sequence[Entry], server: str = "", worker_url: str = "",
                 records: t.Optional[Records] = None, http: t.Optional[Http] = None, interval: float = 1.0,
                 sleep: t.Callable[[float], None] = time.sleep, names: t.Optional[t.Collection[str]] = None,
                 out_timeout: float = 30) -> None:
        self.entries = [b for b in entries if b.get("type", "none") != "none"]
        self.server = server
        self.worker_url = worker_url
        self.records = dict(records or {})
        # Every entry name of the host (not only this delegate's): a record of one of them is not a renamed entry's.
        self.names = set(names or ()) | {b["name"] for b in self.entries}
        self.http = http or Http()
        self.interval = interval
        self.sleep = sleep
        # Seconds a balancer gets to show the server out (MAINT; the router no longer listing it).
        self.out_timeout = out_timeout
        # What the caller should say (module.warn): the plan's "the last server in rotation" (helper-45).
        self.warnings: t.List[str] = []

    # helpers
    def ident(self, b: Entry) -> str:
        return identity(b, self.server, self.worker_url)

    def haproxy(self, b: Entry) -> HAProxy:
        return HAProxy(b.get("socket") or HAPROXY_SOCKET, self.interval)

    def router(self, b: Entry) -> Router:
        return Router(b["url"], b.get("headers"), self.http, self.interval)

    def read_one(self, b: Entry) -> t.Dict[str, t.Any]:
        """What the balancer says of the server: {found, states (HAProxy), workers (the router's URLs)}."""
        if b["type"] == "haproxy":
            hp = self.haproxy(b).read(self.ident(b), b.get("backend") or "")
            return dict(hp, found=found_of(hp["states"]))
        if b["type"] == "sglang_router":
            ws = self.router(b).workers()
            mine = [w for w in ws if w.get("url") == self.ident(b)]
            return {"found": "listed" if mine else "absent", "workers": [str(w.get("url")) for w in ws],
                    "healthy": any(w.get("is_healthy") for w in mine),
                    "others_healthy": sum(1 for w in ws if w.get("url") != self.ident(b) and w.get("is_healthy"))}
        return {"found": "unknown"}

    # out -------------------------------------------------------------------------------------------------------------
    def uncovered_backends(self, reads: t.Mapping[str, t.Mapping[str, t.Any]]) -> t.Tuple[t.List[str], t.List[str]]:
        """(refusals, warnings): HAProxy backends of a socket where this host's server is in rotation (UP or "no check",
        weight not 0, at this host's address) that no entry of the host covers, as its entries there name other
        backends. An entry with backend B took the server out of B only, and the restart stopped it while backend A, a
        frontend's, sent it requests (helper-49). The admin socket does not say which backends a frontend uses: a
        backend that sent the server a session in the last SERVING_S seconds (show stat's lastsess) is refused, before
        anything is touched; one with no session of it (a pool no frontend uses) is warned of. From the plan's reads."""
        refusals, warnings = [], []
        by_sock: t.Dict[t.Tuple[str, str], t.List[Entry]] = {}
        for b in self.entries:
            if b["type"] == "haproxy":
                by_sock.setdefault((b.get("socket") or HAPROXY_SOCKET, self.ident(b)), []).append(b)
        for (sock, srv), entries in by_sock.items():
            if any(not b.get("backend") for b in entries):
                continue  # an entry without backend covers every backend that has the server
            covered = {b["backend"] for b in entries}
            rows: t.Dict[str, t.Mapping[str, str]] = {}
            for b in entries:
                rows.update((reads.get(b["name"]) or {}).get("elsewhere") or {})
            url = entries[0].get("worker_url") or self.worker_url
            serving = {be: r for be, r in rows.items()
                       if be not in covered and word(r.get("status", "")) in ("UP", "no") and r.get("weight") != "0"
                       and not address_mismatch(str(r.get("addr") or ""), url)}
            if not serving:
                continue
            used = sorted(be for be, r in serving.items() if _recent(r.get("lastsess")))
            head = ("haproxy %s (%s on %s): server %s is also in rotation in backend %%s, which no balancer entry of this "
                    "host takes it out of (its entries name backend %s)"
                    % (entries[0]["name"], sock, entries[0].get("delegate_to") or "localhost", srv,
                       ", ".join(sorted(covered))))
            if used:
                refusals.append(head % ", ".join(used) + ", and sent it requests in the last %d s: the restart would stop "
                                "it while %s sends it more. Add an entry for %s, or leave the entry's backend empty "
                                "(every backend that has the server)"
                                % (SERVING_S, "that backend" if len(used) == 1 else "those backends", ", ".join(used)))
            idle = sorted(be for be in serving if be not in used)
            if idle:
                warnings.append(head % ", ".join(idle) + " but sent it no request lately: if a frontend uses it, its "
                                "requests to this server fail while it restarts. Add an entry for it, or leave the entry's "
                                "backend empty (every backend that has the server)")
        return refusals, warnings

    def plan_out(self) -> t.List[t.Dict[str, t.Any]]:
        """Read every entry before any is touched; refuse a wrong server or worker URL, or a server left in rotation in
        a backend no entry covers, with nothing touched."""
        plan = []
        reads = self.read_each(self.entries)
        uncovered, unused = self.uncovered_backends(reads)
        if uncovered:
            raise BalancerError("; ".join(uncovered) + "; nothing was touched")
        self.warnings.extend(unused)
        for b in self.entries:
            now = reads[b["name"]]
            found = now["found"]
            key, rec = record_for(b, self.records, self.names, self.ident(b))
            if b["type"] == "sglang_router" and found == "absent" and rec is None:
                raise BalancerError(
                    "sglang_router %s (%s) does not list the worker %s and gpufleet has no record of taking it out: a "
                    "wrong worker_url, or a worker removed by hand (the router lists %s); nothing was touched"
                    % (b["name"], b["url"], self.ident(b), ", ".join(now["workers"]) or "none"))
            if b["type"] == "haproxy" and found == "absent":
                raise BalancerError(
                    "haproxy %s (%s on %s) has no server %s %s: a wrong server or backend name; nothing was touched"
                    % (b["name"], b.get("socket") or HAPROXY_SOCKET, b.get("delegate_to") or "localhost", self.ident(b),
                       ("in backend " + b["backend"]) if b.get("backend") else "in any backend"))
            if b["type"] == "haproxy":
                self.refuse_another_server(b, now["addrs"])
            step: t.Dict[str, t.Any] = {"name": b["name"], "type": b["type"], "found": found, "record": key}
            if found == "MAINT" and rec is None:
                step["left_as_found"] = "MAINT"  # an operator's: not gpufleet's to take out or put back
            elif found == "absent":
                step["back"] = rec.get("found", "UP")  # gpufleet's own earlier drain (its record): already out
            else:
                # A drain record of another server under this entry's name (helper-38) would be overwritten by this
                # host's drain and then cleared: the only trace that gpufleet took that server out, gone in silence
                # (helper-39). Refused before anything is touched, as the put-back refuses it.
                foreign = self.foreign_record(b)
                if foreign:
                    raise BalancerError(foreign + "; nothing was touched")
                # Found in MAINT (an earlier run's drain) or unknown (http): the record keeps what was found first.
                back = rec.get("found", found) if rec is not None and found in ("MAINT", "unknown") else found
                if rec is not None and "=" in found and "MAINT" in back_by_backend(found, "").values():
                    # gpufleet's own drain, put back by hand in some backends only (helper-39): the backends still
                    # MAINT are gpufleet's and go back to what the record found, not left MAINT as an operator's.
                    back = resume_back(found, str(rec.get("found", "UP")))
                step["back"] = back
                step["drain"] = {"balancer": b["name"], "found": back, "server": self.ident(b),
                                 "keep": found in ("MAINT", "unknown")}
                alone = self.last_in_rotation(b, now)
                if alone:
                    self.warnings.append(alone)
            plan.append(step)
        return plan

    def last_in_rotation(self, b: Entry, now: t.Mapping[str, t.Any]) -> t.Optional[str]:
        """Why taking the server out leaves a balancer with no server in rotation (None when another one serves): with
        gpufleet_rollout_min_in_service unset (0) the drain goes on, so a fleet whose other servers an operator took
        out loses every request while this one restarts (helper-45: 4847 of 5000 failed, with no word)."""
        ident = self.ident(b)
        if b["type"] == "haproxy":
            serving = [be for be, st in (now.get("states") or {}).items()
                       if word(st) in ("UP", "no") and (now.get("weights") or {}).get(be) != "0"]
            alone = sorted(be for be in serving if not (now.get("others_in_rotation") or {}).get(be))
            if alone:
                return ("haproxy %s: %s is the only server in rotation in backend %s: while it is out (drain, restart, "
                        "put-back) no server there takes requests; gpufleet_rollout_min_in_service refuses such a batch"
                        % (b["name"], ident, ", ".join(alone)))
        elif b["type"] == "sglang_router" and now.get("healthy") and not now.get("others_healthy"):
            return ("sglang_router %s: %s is the only healthy worker the router lists: while it is out (drain, restart, "
                    "put-back) the router has no worker to send requests to; gpufleet_rollout_min_in_service refuses "
                    "such a batch" % (b["name"], ident))
        return None

    def read_each(self, entries: t.Sequence[Entry]) -> t.Dict[str, t.Dict[str, t.Any]]:
        """read_one of each entry by name, before any is touched; every entry that cannot be read is named."""
        reads, errors = {}, []
        for b in entries:
            try:
                reads[b["name"]] = self.read_one(b)
            except BalancerError as e:
                errors.append("%s %s: %s" % (b["type"], b["name"], e))
        if errors:
            raise BalancerError("%s; nothing was touched" % "; ".join(errors))
        return reads

    def another_server(self, b: Entry, addrs: t.Mapping[str, str]) -> t.Optional[str]:
        """Why a HAProxy entry's server is not this host's server, or None. Its address is compared with the entry's
        worker_url (default the host's http://ansible_host:port), which is where to put the address HAProxy reaches
        this host's server at when it is another one (a second network, a local HAProxy on 127.0.0.1)."""
        url = b.get("worker_url") or self.worker_url
        bad = {k: why for k, why in ((k, address_mismatch(a, url)) for k, a in sorted(addrs.items())) if why}
        if not bad:
            return None
        return ("haproxy %s (%s on %s): server %s is not this host's server (%s): %s; a server name of another host, or "
                "HAProxy reaches this host's server at another address (set the entry's worker_url to "
                "http://ADDRESS:PORT as HAProxy has it)"
                % (b["name"], b.get("socket") or HAPROXY_SOCKET, b.get("delegate_to") or "localhost", self.ident(b),
                   public_url(url), "; ".join("in backend %s it has %s" % (k, why) for k, why in bad.items())))

    def refuse_another_server(self, b: Entry, addrs: t.Mapping[str, str]) -> None:
        """A server name copied from another host's entry would take that other host out of rotation (or put it back)
        and leave this one serving while it is killed: refused before anything is touched."""
        why = self.another_server(b, addrs)
        if why:
            raise BalancerError(why + "; nothing was touched")

    def take_out(self, plan: t.Sequence[t.Mapping[str, t.Any]], timeout: float = 30) -> t.Dict[str, t.Any]:
        """Each entry out of rotation as planned; returns {changed, rotation (out_of, found, left_as_found, renamed)}."""
        rot: t.Dict[str, t.Any] = {"out_of": [], "found": {}, "left_as_found": {}, "renamed": {}}
        changed = False
        by_name = {b["name"]: b for b in self.entries}
        for step in plan:
            b, name = by_name[step["name"]], step["name"]
            if "left_as_found" in step:
                rot["left_as_found"][name] = step["left_as_found"]
                continue
            try:
                changed = self._out(b, step) or changed
            except BalancerError as e:
                raise BalancerError("%s: %s" % (name, e), changed=changed, rotation=rot)
            rot["out_of"].append(name)
            rot["found"][name] = step["back"]
            if step.get("record") and step["record"] != name:
                rot["renamed"][step["record"]] = name
        return {"changed": changed, "rotation": rot}

    def _out(self, b: Entry, step: t.Mapping[str, t.Any]) -> bool:
        if b["type"] == "haproxy":
            hp, srv = self.haproxy(b), self.ident(b)
            st = hp.states(srv, b.get("backend") or "")
            todo = [k for k, s in st.items() if word(s) != "MAINT"]
            # MAINT, not DRAIN: no new request goes there, those in flight go on.
            hp.set_state(todo, srv, "maint")
            hp.wait(srv, sorted(st), "MAINT", self.out_timeout, self.sleep)
            return bool(todo)
        if b["type"] == "sglang_router":
            r = self.router(b)
            removed = r.remove(self.ident(b))
            r.wait(self.ident(b), False, self.out_timeout, self.sleep)
            return removed
        self.call_http(b, "remove")
        return True

    def call_http(self, b: Entry, which: str) -> None:
        req = b[which]
        code = self.http.call(req.get("method") or "POST", req["url"], req.get("headers"), req.get("body"))[0]
        if code not in (req.get("status_code") or HTTP_OK):
            raise BalancerError("the %s request %s %s answered HTTP %s" % (
                which, req.get("method") or "POST", public_url(req["url"]), code))

    # in --------------------------------------------------------------------------------------------------------------
    def put_back(self, found: t.Mapping[str, str], left_as_found: t.Mapping[str, str], up_timeout: float,
                 check_mode: bool = False) -> t.Dict[str, t.Any]:
        """Each entry back to the state it was found in, waited for until UP (HAProxy) or listed healthy (router).
        An operator's MAINT stays MAINT; an operator's DRAIN goes back to DRAIN (left as found, not waited for)."""
        rot: t.Dict[str, t.Any] = {"back_in": [], "left_as_found": {}, "records_kept": []}
        changed = False
        # A server name of another host (an entry changed since the drain) would put that host back, an operator's
        # MAINT undone, and leave this one out: every entry this call puts back is checked first, nothing touched.
        checked = [b for b in self.entries if b["type"] == "haproxy" and left_as_found.get(b["name"]) != "MAINT"]
        # A drain record of another server under an entry's name: this host was not drained there by gpufleet, and the
        # server put back would be this one over whatever state it is in (an operator's MAINT). Refused, nothing touched.
        foreign = {b["name"]: self.foreign_record(b) for b in self.entries}
        refused = [f for name, f in foreign.items() if f and left_as_found.get(name) != "MAINT"]
        if refused:
            raise BalancerError("; ".join(refused) + "; nothing was touched")
        # The same record under an entry left in an operator's MAINT is not refused (nothing of it is put back), and it
        # is kept: it may be the only trace that gpufleet took that other server out. The role's clear leaves it.
        rot["records_kept"] = [name for name, f in foreign.items() if f]
        reads = self.read_each(checked)
        for b in checked:
            self.refuse_another_server(b, reads[b["name"]]["addrs"])
        for b in self.entries:
            name = b["name"]
            back = "MAINT" if left_as_found.get(name) == "MAINT" else found.get(name, "UP")
            try:
                changed = self._in(b, back, up_timeout, check_mode, rot) or changed
            except BalancerError as e:
                raise BalancerError("%s: %s" % (name, e), changed=changed, rotation=rot)
            rot["back_in"].append(name)
        return {"changed": changed, "rotation": rot}

    def _in(self, b: Entry, back: str, up_timeout: float, check_mode: bool, rot: t.Dict[str, t.Any]) -> bool:
        name = b["name"]
        if b["type"] == "haproxy":
            if back == "MAINT":
                return False
            hp, srv = self.haproxy(b), self.ident(b)
            by = back_by_backend(back, b.get("backend") or "")
            kept = sorted((k, v) for k, v in by.items() if v in OUT)
            if back == "DRAIN":
                rot["left_as_found"][name] = "DRAIN"
            elif "=" in back and kept:
                rot["left_as_found"][name] = ", ".join("%s in backend %s" % (v, k) for k, v in kept)
            changed = False
            ups: t.Set[str] = set()
            for bk, st in sorted(by.items()):
                if st == "MAINT":
                    continue
                want = "DRAIN" if st == "DRAIN" else "UP"
                now = hp.states(srv, bk)
                if not now:
                    raise BalancerError("HAProxy %s has no server %s %s" % (
                        hp.sock, srv, ("in backend " + bk) if bk else "in any backend"))
                if want == "UP":
                    # gpufleet takes a server out with MAINT only: a backend in DRAIN now was set so by someone else
                    # since (an operator, after an interrupted run), and stays so, said (helper-40).
                    theirs = sorted(k for k, s in now.items() if word(s) == "DRAIN")
                    if theirs:
                        rot["left_as_found"][name] = ", ".join(
                            [x for x in [rot["left_as_found"].get(name)] if x] + ["DRAIN in backend %s" % k for k in theirs])
                    todo = [k for k, s in now.items() if word(s) not in ("UP", "DRAIN")]
                    ups.update(k for k in now if k not in theirs)
                else:
                    todo = [k for k, s in now.items() if word(s) != want]
                if todo and not check_mode:
                    # `state ready` clears MAINT and an admin DRAIN alike (`enable server` would leave DRAIN set).
                    hp.set_state(todo, srv, "drain" if want == "DRAIN" else "ready")
                changed = changed or bool(todo)
            if not check_mode:
                for bk in sorted(ups):
                    hp.wait(srv, [bk], "UP", up_timeout, self.sleep)
            return changed
        if b["type"] == "sglang_router":
            r = self.router(b)
            if check_mode:
                return not r.mine(self.ident(b))
            added = r.add(self.ident(b))
            r.wait(self.ident(b), True, up_timeout, self.sleep)
            return added
        if not check_mode:
            self.call_http(b, "add")
        return True

    # read ------------------------------------------------------------------------------------------------------------
    def back_in_rotation(self, skip: t.Collection[str] = ()) -> t.List[t.Tuple[str, str]]:
        """(name, found) of each readable entry that has the server in rotation again (recheck before the kill)."""
        out = []
        for b in self.entries:
            if b["type"] == "http" or b["name"] in skip:
                continue
            found = self.read_one(b)["found"]
            if found not in ("MAINT", "absent"):
                out.append((b["name"], found))
        return out

    def who(self, b: Entry, records_error: str = "") -> str:
        key, rec = record_for(b, self.records, self.names, self.ident(b))
        if rec is not None:
            return (" by gpufleet (run %s at %s did not put it back: a failed or interrupted run, or the clean playbook; "
                    "the next rollout puts it back)" % (rec.get("run") or "?", rec.get("at") or "?"))
        if records_error:
            return " (drain record unreadable: %s)" % records_error[:120]
        return ", not by gpufleet (no drain record of it)"

    def foreign_record(self, b: Entry) -> t.Optional[str]:
        """Why the host's drain record under this entry's name is not this host's drain, or None."""
        return foreign_text(b["name"], self.records.get(b["name"]), self.ident(b))

    def drift(self, records_error: str = "") -> t.List[str]:
        """The audit's lines: a host out of rotation (by whom) or in rotation but not UP; http is not audited."""
        out = [f for f in (self.foreign_record(b) for b in self.entries) if f]
        for b in self.entries:
            if b["type"] == "http":
                continue
            name = b["name"]
            try:
                now = self.read_one(b)
            except BalancerError as e:
                out.append("balancer %s could not be read: %s" % (name, str(e)[:120]))
                continue
            if b["type"] == "haproxy":
                why = self.another_server(b, now["addrs"])
                if why:  # its state is another host's: not this host's drift
                    out.append(why)
                    continue
                if not now["states"]:
                    out.append("out of rotation on %s (no server %s there)%s" % (name, self.ident(b), self.who(b, records_error)))
                for bk, s in sorted(now["states"].items()):
                    if word(s) == "UP" and now["weights"].get(bk) == "0":
                        # No request goes to it, as the capacity guard counts it (an operator's way to take it out).
                        out.append("out of rotation on %s (weight 0 in backend %s)%s" % (name, bk, self.who(b, records_error)))
                    if word(s) == "UP":
                        continue
                    # gpufleet takes a server out with MAINT only: a DRAIN is someone else's, record or not (helper-40).
                    who = (", not by gpufleet (it takes a server out with MAINT, never DRAIN)" if word(s) == "DRAIN"
                           else self.who(b, records_error))
                    out.append(("out of rotation on %s (%s in backend %s)%s" % (name, s, bk, who))
                               if s in OUT else "in rotation on %s but %s (backend %s)" % (name, s, bk))
            elif now["found"] == "absent":
                out.append("out of rotation on %s (the router does not list %s)%s"
                           % (name, self.ident(b), self.who(b, records_error)))
            elif not now["healthy"]:
                out.append("in rotation on %s but unhealthy" % name)
        return out

    def capacity(self) -> t.Dict[str, t.Any]:
        """The capacity guard's count over many hosts' entries (each with `host`, and `server` or `worker_url`): the
        hosts any balancer has out of rotation (not UP or "no check" in HAProxy, weight 0 there, a worker the router
        does not list healthy), the balancers that could not be read (their hosts are not counted out), and each pool
        a request can be routed to (an HAProxy backend of a socket, a router) with the hosts that have a server there
        and those in rotation there: a host out of one backend only still carries another's requests (helper-47)."""
        out_hosts: t.List[str] = []
        unread: t.List[str] = []
        seen: t.Dict[str, t.Any] = {}
        pools: t.Dict[str, t.Dict[str, t.List[str]]] = {}

        def member(pool: str, host: str, in_rotation: bool) -> None:
            p = pools.setdefault(pool, {"members": [], "in": []})
            for k, add in (("members", True), ("in", in_rotation)):
                if add and host not in p[k]:
                    p[k].append(host)

        for b in self.entries:
            if b["type"] == "http":
                continue
            host = b.get("host") or self.server
            if b["type"] == "haproxy":
                sock = b.get("socket") or HAPROXY_SOCKET
                if sock not in seen:
                    try:
                        seen[sock] = self.haproxy(b).rows()
                    except BalancerError as e:
                        seen[sock] = None
                        unread.append("HAProxy %s on %s (%s)" % (sock, b.get("delegate_to") or "localhost", str(e)[:120]))
                rows = seen[sock]
                if rows is None:
                    continue
                srv = b.get("server") or b.get("host") or self.server
                mine = [r for r in rows if r.get("svname") == srv and (not b.get("backend") or r.get("pxname") == b["backend"])]
                for r in mine:
                    member("HAProxy %s backend %s" % (sock, r.get("pxname")), host,
                           word(r.get("status", "")) in ("UP", "no") and r.get("weight") != "0")
                ok = bool(mine) and all(word(r.get("status", "")) in ("UP", "no") and r.get("weight") != "0" for r in mine)
                if not mine:
                    member("HAProxy %s backend %s" % (sock, b.get("backend") or "(any)"), host, False)
            else:
                key = "router " + b["url"].rstrip("/")
                if key not in seen:
                    try:
                        seen[key] = self.router(b).workers()
                    except BalancerError as e:  # its answer, or why none came (the connection's error)
                        seen[key] = None
                        unread.append("the router %s from %s (%s)" % (
                            b["url"].rstrip("/"), b.get("delegate_to") or "localhost",
                            "HTTP %s" % e.result["status"] if "status" in e.result else str(e)[:120]))
                ws = seen[key]
                if ws is None:
                    continue
                ok = any(w.get("url") == (b.get("worker_url") or self.worker_url) and w.get("is_healthy") for w in ws)
                member(key, host, ok)
            if not ok and host not in out_hosts:
                out_hosts.append(host)
        return {"out_hosts": out_hosts, "unread": unread, "pools": pools}


def capacity_refusal(reads: t.Sequence[t.Mapping[str, t.Any]], fleet: t.Sequence[str], batch: t.Sequence[str],
                     drained: t.Sequence[str], left_out: t.Sequence[str], minimum: int) -> t.Optional[str]:
    """The capacity guard's decision for a batch, from the balancers' reads (capacity(), one per delegate): None when the
    batch may go on, else why not.

    `fleet`: the hosts with balancers; `drained`: the batch's hosts that will be drained (not already up to date);
    `left_out`: fleet hosts out whatever the balancers say (this run's failed hosts, the clean playbook's stopped ones).
    A host is in service when every balancer of it has it in rotation. The batch must leave `minimum` hosts in service,
    unless it drains nobody who is in service anywhere (it cannot lower the capacity then); and, with a minimum, no pool
    (an HAProxy backend, a router) that has a server in rotation now may be left without one: a host out of one backend
    only (an operator's MAINT there) still carries the other's requests (helper-47, the last server of a backend was
    drained under load while the fleet count said it was out already)."""
    pools: t.Dict[str, t.Dict[str, t.Set[str]]] = {}
    out_by_balancers: t.Set[str] = set()
    for r in reads:
        out_by_balancers.update(str(h) for h in r.get("out_hosts") or [])
        for name, p in (r.get("pools") or {}).items():
            q = pools.setdefault(name, {"members": set(), "in": set()})
            q["members"].update(str(h) for h in p.get("members") or [])
            q["in"].update(str(h) for h in p.get("in") or [])
    fleet_set, batch_set = set(fleet), set(batch)
    gone = (set(left_out) & fleet_set) | (out_by_balancers - batch_set) & fleet_set
    out_now = gone | (out_by_balancers & batch_set & fleet_set)
    # A host of the batch that some pool still has in rotation is drained out of it: it lowers that pool's capacity.
    in_somewhere = {h for q in pools.values() for h in q["in"]} - gone
    draining = sorted((set(drained) & fleet_set) - gone - (out_now - in_somewhere))
    after = len(fleet_set) - len(out_now | set(draining))
    if draining and after < minimum:
        already = sorted(out_now - set(draining))
        partly = sorted(set(draining) & out_now)
        return ("gpufleet_rollout_min_in_service: draining %s would leave %d of %d server(s) in rotation%s%s, fewer than "
                "%d; nothing was touched: %s"
                % (", ".join(draining), after, len(fleet_set),
                   " (%s already out)" % ", ".join(already) if already else "",
                   " (%s out of some of its balancers and still in others)" % ", ".join(partly) if partly else "",
                   minimum,
                   "use smaller batches (gpufleet_rollout_serial)" if len(fleet_set) - len(out_now) - 1 >= minimum
                   else "no batch can pass, as even a batch of one host would leave fewer: lower "
                        "gpufleet_rollout_min_in_service or put servers back into rotation"))
    if minimum > 0 and draining:
        for name in sorted(pools):
            q = pools[name]
            now = q["in"] - gone
            if now and not (now - set(draining)):
                others = sorted(q["members"] - (now & set(draining)))
                return ("gpufleet_rollout_min_in_service: draining %s would leave no server in rotation in %s (%s); "
                        "nothing was touched: put a server of it back into rotation first, or set "
                        "gpufleet_rollout_min_in_service to 0 to drain it anyway"
                        % (", ".join(sorted(now & set(draining))), name,
                           "its other servers are out: %s" % ", ".join(others) if others else "it has no other server"))
    return None
