"""HTTP(S) objects for :class:`~ckptfs.source.remote.RemoteSource`: Python's ``http.client`` over persistent
connections (a pool per origin, one request per connection at a time), ``Range`` requests answered 206,
``If-Match`` with the ETag first seen, redirects followed (and remembered), credentials sent only to the
URL's own origin.

Storage options (``--storage-option KEY=VALUE``): ``headers`` (a mapping; ``headers.Authorization=...`` on
the command line), ``username`` / ``password`` (HTTP basic auth; also taken from the URL's
``user:password@`` or from ``~/.netrc``), ``verify`` (``false`` to accept any TLS certificate, or the path
of a CA bundle; without it ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` names one as for requests and curl,
and ``SSL_CERT_FILE`` works too). Proxies: ``http_proxy`` / ``https_proxy`` / ``no_proxy`` as
curl reads them (an ``http://`` proxy; HTTPS goes through a CONNECT tunnel); loopback hosts never use one.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import netrc
import os
import re
import select
import socket
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote, urljoin, urlsplit

from .._version import __version__
from ..errors import CkptfsError, RemoteError
from .options import RemoteOptions
from .remote import Deadline, NotFound, ObjectInfo, Transient, no_such_host, stale
from .urls import Redactor, host_port, redact_url

OPTIONS = ("headers", "username", "password", "verify")
MAX_REDIRECTS = 8
REDIRECTS = (301, 302, 303, 307, 308)
REDIRECT_BODY = 64 << 10  # a redirect's page longer than this is not read (its connection is closed)
REDIRECT_WAIT = 1.0  # seconds a redirect's page may take to arrive before its connection is closed instead
RETRY_STATUS = (408, 425, 429)
CHUNK = 1 << 20
#: TLS failures that trying again cannot cure: the port speaks plain HTTP, or no common protocol version
TLS_MISMATCH = ("WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE",
                "TLSV1_ALERT_PROTOCOL_VERSION")
_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
_UNSATISFIED = re.compile(r"bytes\s+\*/(\d+)\s*$", re.IGNORECASE)

Origin = tuple[str, str, int]


@dataclass(frozen=True)
class _Target:
    """Where a request goes: scheme, host, port and the request path (with its query)."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> _Target:
        try:
            p = urlsplit(url)
            port = p.port
        except ValueError as e:
            raise CkptfsError(f"not a valid URL ({e})", file=redact_url(url)) from None
        if p.scheme not in ("http", "https") or not p.hostname:
            raise CkptfsError("not an http(s) URL with a host", file=redact_url(url))
        path = _requote(p.path or "/") + (f"?{_requote(p.query)}" if p.query else "")
        return cls(p.scheme, p.hostname, port or (443 if p.scheme == "https" else 80), path)

    @property
    def origin(self) -> Origin:
        return (self.scheme, self.host, self.port)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.where}{self.path}"

    @property
    def where(self) -> str:
        return host_port(self.host, self.port)


class HttpTransport:
    """One object served over HTTP(S) (see the module doc)."""

    def __init__(self, url: str, storage_options: Mapping[str, object], options: RemoteOptions) -> None:
        self.name = redact_url(url)
        self._redact = Redactor.for_target(url, storage_options)
        unknown = sorted(set(storage_options) - set(OPTIONS))
        if unknown:
            raise CkptfsError(f"unknown storage option{'s' * (len(unknown) > 1)} for http(s) URLs: "
                              f"{', '.join(unknown)} (known: {', '.join(OPTIONS)})", file=self.name)
        self._origin_target = self._target = _Target.parse(url)
        self._headers = {"Accept-Encoding": "identity", "User-Agent": f"ckptfs/{__version__}"}
        headers = storage_options.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise CkptfsError("storage option 'headers' must be a mapping of header names to values", file=self.name)
        self._auth_headers = {str(k): str(v) for k, v in headers.items()}
        user, password = self._credentials(url, storage_options)
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self._auth_headers.setdefault("Authorization", f"Basic {token}")
        self._ssl = self._ssl_context(storage_options.get("verify", True))
        self._idle: dict[Origin, list[http.client.HTTPConnection]] = {}
        self._max_idle = options.max_concurrency + 8
        self._lock = threading.Lock()
        self.requests = 0

    # --- configuration -------------------------------------------------------------------------------------
    def _credentials(self, url: str, opts: Mapping[str, object]) -> tuple[str | None, str | None]:
        if opts.get("username") is not None:
            return str(opts["username"]), None if opts.get("password") is None else str(opts["password"])
        netloc = urlsplit(url).netloc
        if "@" in netloc:
            user, _, password = netloc.rpartition("@")[0].partition(":")
            return unquote(user), unquote(password)
        if "Authorization" in self._auth_headers:
            return None, None
        try:
            found = netrc.netrc().authenticators(self._target.host)
        except (OSError, netrc.NetrcParseError):
            return None, None
        return (found[0], found[2]) if found else (None, None)

    def _ssl_context(self, verify: object) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        bundle, origin = None, ""
        if isinstance(verify, str) and verify.lower() not in ("true", "false", "1", "0", "yes", "no"):
            bundle, origin = verify, f"storage option verify={verify!r}"
        elif verify is False or (isinstance(verify, str) and verify.lower() in ("false", "0", "no")):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # as requests and curl read them
                if os.environ.get(var):
                    bundle, origin = os.environ[var], f"{var}={os.environ[var]!r}"
                    break
        if bundle is not None:  # trusted besides the system's CAs
            try:
                ctx.load_verify_locations(cafile=bundle)
            except (OSError, ssl.SSLError) as e:
                raise CkptfsError(f"{origin}: cannot load the CA bundle ({e})", file=self.name) from None
        return ctx

    def fsspec_options(self) -> dict[str, object]:
        """Options for fsspec's HTTPFileSystem (which lists directories) that make its requests as this
        transport's: the same headers and credentials (aiohttp drops ``Authorization`` on a redirect to another
        host), the same TLS verification and the same proxy (aiohttp reads no proxy variable by itself)."""
        opts: dict[str, object] = {"headers": self._headers_for(self._origin_target, {}), "ssl": self._ssl}
        proxy = proxy_for(self._origin_target.scheme, self._origin_target.host)
        if proxy is not None:
            opts["proxy"] = f"http://{host_port(proxy.host, proxy.port)}"
            if proxy.headers:
                opts["proxy_headers"] = proxy.headers
        return opts

    def _headers_for(self, target: _Target, extra: Mapping[str, str]) -> dict[str, str]:
        headers = dict(self._headers)
        if target.origin == self._origin_target.origin:  # never hand credentials to another host
            headers.update(self._auth_headers)
        headers.update(extra)
        return headers

    # --- connections ---------------------------------------------------------------------------------------
    def _connection(self, target: _Target, deadline: Deadline) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            idle = self._idle.get(target.origin)
            while idle:
                kept = idle.pop()
                if not _dropped(kept):
                    return kept, True
                kept.close()
        timeout = _remaining(deadline, target)
        proxy = proxy_for(target.scheme, target.host)
        conn: http.client.HTTPConnection
        if proxy is None:
            host, port = target.host, target.port
        else:
            host, port = proxy.host, proxy.port
        if target.scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl)
            if proxy is not None:  # a CONNECT tunnel through the proxy, TLS with the target inside it
                conn.set_tunnel(target.host, target.port, headers=proxy.headers)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        return conn, False

    def _release(self, target: _Target, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """Back to the pool if the response was read to its end and the server keeps the connection. A chunked
        answer's bytes are all read when its last chunk (size 0) and trailer are: they are read here."""
        if not resp.will_close and not resp.isclosed() and resp.chunked:
            try:
                if resp.read(1):  # more than the range asked for: the connection is closed below
                    conn.close()
                    return
            except Exception:  # noqa: BLE001 - a connection that cannot be reused, not a failed read
                conn.close()
                return
        if resp.will_close or not resp.isclosed() and resp.length != 0:
            conn.close()
            return
        resp.close()
        with self._lock:
            idle = self._idle.setdefault(target.origin, [])
            if len(idle) < self._max_idle:
                idle.append(conn)
                return
        conn.close()

    def _discard_body(self, target: _Target, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """A response whose body is not wanted (a redirect's page): a short one is read so that the connection
        goes back to the pool (the request after a redirect often goes to the same host); a long one closes it."""
        if resp.length is not None and resp.length > REDIRECT_BODY or resp.will_close:
            conn.close()
            return
        try:
            if conn.sock is not None:  # a page that trickles in is not worth the wait
                conn.sock.settimeout(REDIRECT_WAIT)
            resp.read(REDIRECT_BODY)
        except Exception:  # noqa: BLE001 - a connection that cannot be reused, not a failed read
            conn.close()
            return
        self._release(target, conn, resp)

    def _send(self, target: _Target, headers: Mapping[str, str],
              deadline: Deadline) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        while True:
            conn, reused = self._connection(target, deadline)
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(_remaining(deadline, target))
                self.requests += 1
                if conn.host != target.host and target.scheme == "http":  # through a proxy: absolute URL
                    conn.request("GET", target.url, headers={**self._headers_for(target, headers),
                                                             **_proxy_headers(target)})
                else:
                    conn.request("GET", target.path, headers=self._headers_for(target, headers))
                return conn.getresponse(), conn
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as e:
                conn.close()
                if reused:  # a kept-alive connection the server closed meanwhile: the next idle one, or a new one
                    continue
                raise self._failure(e, target) from None
            except Exception as e:  # noqa: BLE001 - classified: retried or reported
                conn.close()
                raise self._failure(e, target) from None

    def _request(self, headers: Mapping[str, str],
                 deadline: Deadline) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection, _Target]:
        """GET at the current target, redirects followed; the response, its status not yet judged."""
        target = self._target
        remembered = target is not self._origin_target
        hops = 0
        while True:
            resp, conn = self._send(target, headers, deadline)
            if resp.status in REDIRECTS:
                location = resp.getheader("Location")
                self._discard_body(target, conn, resp)
                hops += 1
                if not location or hops > MAX_REDIRECTS:
                    raise RemoteError(f"too many redirects (or one without a Location), last from {target.where}")
                target = _Target.parse(urljoin(target.url, location))
                continue
            if remembered and resp.status in (401, 403, 404, 410):  # a remembered redirect expired: start over
                conn.close()
                self._target = target = self._origin_target
                remembered = False
                continue
            if resp.status < 300 and target is not self._target:
                self._target = target  # later requests skip the redirects (signed CDN URLs expire: see above)
            return resp, conn, target

    # --- errors --------------------------------------------------------------------------------------------
    def _failure(self, e: BaseException, target: _Target) -> Exception:
        where = target.where
        if isinstance(e, (Transient, CkptfsError)):
            return e
        if isinstance(e, ssl.SSLError) and (refused := tls_refusal(e, where)) is not None:
            return RemoteError(self._redact(refused))
        if isinstance(e, socket.gaierror):
            if no_such_host(e):
                return RemoteError(f"cannot resolve the host name {target.host}")
            return Transient(f"cannot resolve the host name {target.host} ({e.strerror})")
        if isinstance(e, TimeoutError):
            return Transient(f"no answer from {where} in time")
        if isinstance(e, ConnectionRefusedError):
            return Transient(f"connection refused by {where}")
        if isinstance(e, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
                          http.client.IncompleteRead)):
            return Transient(f"connection to {where} reset or closed")
        if isinstance(e, ssl.SSLError):
            return Transient(self._redact(f"TLS error with {where}: {e.reason or e}"))
        if isinstance(e, http.client.InvalidURL):
            return RemoteError(self._redact(f"not a valid URL ({e})"))
        if isinstance(e, http.client.HTTPException):
            return Transient(self._redact(f"bad response from {where} ({type(e).__name__})"))
        if isinstance(e, OSError):  # unreachable network or host, aborted connection ...
            return Transient(self._redact(f"{where}: {e.strerror or e}"))
        return RemoteError(self._redact(f"{type(e).__name__}: {e}"))

    def _status_error(self, resp: http.client.HTTPResponse, target: _Target) -> Exception:
        st, reason = resp.status, self._redact(resp.reason or "")
        if st in (401, 403):
            return RemoteError(f"access denied (HTTP {st} {reason}): check the credentials")
        if st in (404, 410):
            return NotFound(f"not found (HTTP {st} {reason})")
        if st in RETRY_STATUS or st >= 500:
            return Transient(f"HTTP {st} {reason} from {target.where}")
        return RemoteError(f"unexpected answer HTTP {st} {reason} from {target.where}")

    # --- reading -------------------------------------------------------------------------------------------
    def _read_into(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, view: memoryview,
                   deadline: Deadline, target: _Target) -> None:
        got = 0
        n = len(view)
        try:
            while got < n:
                if conn.sock is not None:
                    conn.sock.settimeout(_remaining(deadline, target))
                k = resp.readinto(view[got : min(n, got + CHUNK)])
                if not k:
                    raise Transient(f"{target.where} closed the connection after {got} of {n} bytes")
                got += k
        except Transient:
            raise
        except Exception as e:  # noqa: BLE001 - classified
            raise self._failure(e, target) from None

    def open(self, head: int, deadline: Deadline) -> tuple[ObjectInfo, bytes]:
        resp, conn, target = self._request({"Range": f"bytes=0-{head - 1}"}, deadline)
        ok = False
        try:
            _identity_encoding(resp)
            st = resp.status
            if st == 206:
                a, b, total = _content_range(resp)
                if total is None:
                    raise RemoteError("the server does not say how big the object is (Content-Range */*)")
                if a != 0 or b >= total:
                    raise RemoteError(f"the server sent bytes {a}-{b} of {total} for a request of 0-{head - 1}")
                n = b + 1
            elif st == 200:
                total = resp.length
                if total is None or total > head:
                    raise RemoteError("the server does not serve byte ranges (it answered a Range request with "
                                      "the whole object): ckptfs needs Range support (nginx, S3, most CDNs have it)")
                n = total
            elif st == 416:
                m = _UNSATISFIED.match(resp.getheader("Content-Range") or "")
                if m is None or int(m.group(1)) != 0:
                    raise RemoteError("the server refused the range 0- of the object (HTTP 416)")
                total = n = 0
            else:
                raise self._status_error(resp, target)
            data = bytearray(n)
            self._read_into(resp, conn, memoryview(data), deadline, target)
            ok = True
        finally:
            if ok:
                self._release(target, conn, resp)
            else:
                conn.close()
        etag, modified = resp.getheader("ETag") or "", resp.getheader("Last-Modified") or ""
        return ObjectInfo(total, etag, modified, _http_time_ns(modified)), bytes(data)

    def fetch(self, start: int, bufs: Sequence[memoryview], expect: ObjectInfo, deadline: Deadline,
              filled: Callable[[int], None]) -> None:
        total = sum(len(b) for b in bufs)
        end = start + total - 1
        headers = {"Range": f"bytes={start}-{end}"}
        if expect.etag and not expect.etag.startswith("W/"):  # If-Match compares strong ETags only
            headers["If-Match"] = expect.etag
        resp, conn, target = self._request(headers, deadline)
        ok = False
        try:
            _identity_encoding(resp)
            st = resp.status
            if st == 206:
                a, b, size = _content_range(resp)
            elif st == 200 and start == 0 and total == expect.size:
                a, b, size = 0, total - 1, resp.length
            elif st == 200:
                raise RemoteError("the server ignored the Range header (it answered with the whole object)")
            elif st == 412:
                raise stale(self.name, "the server says its ETag no longer matches: HTTP 412")
            elif st == 416:
                raise stale(self.name, "it is now shorter: HTTP 416")
            elif st in (404, 410):
                raise stale(self.name, f"it is gone: HTTP {st}")
            else:
                raise self._status_error(resp, target)
            why = expect.change(size, resp.getheader("ETag"), resp.getheader("Last-Modified"))
            if why is not None:
                raise stale(self.name, why)
            if (a, b) != (start, end):
                raise RemoteError(f"the server sent bytes {a}-{b} for a request of {start}-{end}")
            for i, view in enumerate(bufs):
                self._read_into(resp, conn, view, deadline, target)
                filled(i)
            ok = True
        finally:
            if ok:
                self._release(target, conn, resp)
            else:
                conn.close()

    def after_fork(self, keep_connections: bool) -> None:
        self._lock = threading.Lock()
        if keep_connections:
            return
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()  # this process's copy of the socket only: the parent's stays open

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    headers: dict[str, str]


def proxy_for(scheme: str, host: str) -> Proxy | None:
    """The HTTP proxy the environment names for ``scheme`` (``https_proxy``, ``http_proxy``, ``all_proxy``),
    unless ``no_proxy`` exempts ``host`` or it is a loopback address (no proxy can reach those)."""
    import ipaddress
    import urllib.request

    if host == "localhost" or host.endswith(".localhost"):
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    proxies = urllib.request.getproxies()
    url = proxies.get(scheme) or proxies.get("all")
    if not url or urllib.request.proxy_bypass(host):
        return None
    p = urlsplit(url if "://" in url else f"http://{url}")
    if p.scheme != "http" or not p.hostname:
        raise RemoteError(f"the {scheme}_proxy variable names a proxy ckptfs cannot use ({redact_url(url)}): "
                          "an http:// proxy is needed")
    headers = {}
    if p.username:
        token = base64.b64encode(f"{unquote(p.username)}:{unquote(p.password or '')}".encode()).decode()
        headers["Proxy-Authorization"] = f"Basic {token}"
    return Proxy(p.hostname, p.port or 80, headers)


def _proxy_headers(target: _Target) -> dict[str, str]:
    proxy = proxy_for(target.scheme, target.host)
    return proxy.headers if proxy is not None else {}


def _requote(text: str) -> str:
    """A URL's path or query as it goes on the request line: characters a URL cannot hold (spaces, non-ASCII,
    controls) percent-encoded, as browsers, curl and requests send them; existing ``%XX`` escapes kept."""
    return quote(text, safe="!#$%&'()*+,/:;=?@[]~")


def tls_refusal(e: ssl.SSLError, where: str) -> str | None:
    """Why a TLS failure with ``where`` (host:port) is final, or None (worth retrying): an untrusted
    certificate, or a port that does not speak TLS (an ``https://`` URL of a plain HTTP server)."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return (f"the TLS certificate of {where} is not trusted ({getattr(e, 'verify_message', None) or e}); "
                "storage option verify=PATH names a CA bundle")
    if getattr(e, "reason", None) in TLS_MISMATCH:
        return f"{where} does not speak TLS ({e.reason}): an http:// URL, or another port?"
    return None


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection can no longer be used: the server closed it (a server's keep-alive timeout is
    often shorter than the pauses between a mount's reads), or sent something unasked."""
    if conn.sock is None:
        return True
    poller = select.poll()
    poller.register(conn.sock, select.POLLIN)
    try:
        return bool(poller.poll(0))
    except OSError:
        return True


def _remaining(deadline: Deadline, target: _Target) -> float:
    left = deadline.remaining()
    if left <= 0:
        raise Transient(f"no answer from {target.where} in time")
    return left


def _identity_encoding(resp: http.client.HTTPResponse) -> None:
    encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity" and resp.status < 300:
        raise RemoteError(f"the server sent {encoding}-encoded bytes although ckptfs asked for identity: byte "
                          "ranges of an encoded answer are not the object's")


def _content_range(resp: http.client.HTTPResponse) -> tuple[int, int, int | None]:
    text = resp.getheader("Content-Range") or ""
    m = _RANGE.match(text)
    if m is None:
        raise RemoteError(f"a 206 answer without a valid Content-Range ({text[:60]!r})")
    total = None if m.group(3) == "*" else int(m.group(3))
    return int(m.group(1)), int(m.group(2)), total


def _http_time_ns(value: str) -> int:
    if not value:
        return 0
    try:
        return int(email.utils.parsedate_to_datetime(value).timestamp() * 1e9)
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0
