"""Remote directories: an object store prefix or an HTTP index page as a :class:`~ckptfs.source.Directory`.

Listings go through fsspec's ``ls``: s3fs (ListObjectsV2 with a ``/`` delimiter) for ``s3://``, fsspec's
HTTPFileSystem for ``http(s)://`` (the ``<a href>`` links of an HTML index page, such as nginx's
``autoindex on`` writes; only links below the listed URL count, ``../`` and links with a query do not; names
are URL-decoded; sizes, which a page does not give, are asked for with one HEAD per file, concurrently), and
any other fsspec protocol that lists. Listings are configured as single objects are (the same storage options,
S3 settings and HTTP credentials, :mod:`.fsspec_remote`, :mod:`.http`) and retried within ``timeout``.

Files are opened with :func:`~ckptfs.source.remote.open_url` (block cache, read-ahead, retries, identity
checks, redaction), several at once (``concurrency``: each open is a round trip). Names and messages show the
URL without credentials.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ..errors import CkptfsError, FormatError, RemoteError
from .base import ByteSource
from .directory import DirEntry, check_relative
from .fsspec_remote import FsspecTransport
from .options import RemoteOptions
from .remote import Deadline, NotFound, Transient, no_such_host, open_url, retrying
from .urls import chain, host_port, is_chain, redact_url, scheme

NO_LISTING = ("the server gives no directory listing; name the files themselves, or turn listings on (nginx: "
              "autoindex on)")
Listing = tuple[str, list[dict[str, Any]]]  # the listed path's own name in the filesystem, and its entries


class RemoteDirectory:
    """The directory at ``url`` (``s3://bucket/prefix/``, ``https://host/models/m/`` ...); a missing trailing
    slash is implied."""

    concurrency = 8

    def __init__(self, url: str, storage_options: Mapping[str, object] | None = None,
                 remote: RemoteOptions | None = None) -> None:
        self._url = url if url.endswith("/") else url + "/"
        self.name = redact_url(self._url)
        last = urlsplit(chain(self._url)[-1])
        if last.query or last.fragment:
            raise CkptfsError("a directory URL has no query or fragment (?... #...)", file=self.name)
        self._storage_options = dict(storage_options or {})
        self._remote = remote or RemoteOptions()
        self._http = scheme(self._url) in ("http", "https") and not is_chain(self._url)
        if self._http:  # listed by fsspec with the credentials and TLS settings of ckptfs's own client
            from .http import HttpTransport

            settings = HttpTransport(self._url, self._storage_options, self._remote).fsspec_options()
            options = {**settings, "simple_links": False, "skip_instance_cache": True}
            self._lister = FsspecTransport(_without_userinfo(last, self._url), options, self._remote)
        else:
            self._lister = FsspecTransport(self._url, self._storage_options, self._remote)

    def display(self, path: str) -> str:
        return self.name + path

    def _relative(self, path: str) -> str:
        try:
            return check_relative(path)
        except ValueError as e:
            raise FormatError(f"refused: {e}", file=self.name, record=path) from None

    def list(self, path: str = "") -> list[DirEntry]:
        sub = self._relative(path) + "/" if path else ""
        where = self.display(sub)
        try:
            root, infos = retrying(where, "cannot list", Deadline(self._remote.timeout),
                                   lambda d: self._lister.call(lambda fs, p: _ls(fs, _join(p, sub), self._http),
                                                               lambda fs, p: _als(fs, _join(p, sub), self._http), d))
        except CkptfsError as e:
            reason = e.reason if e.reason.startswith("cannot list") else f"cannot list: {e.reason}"
            raise RemoteError(reason, file=where) from None
        prefix = root.rstrip("/") + "/"
        out: dict[str, DirEntry] = {}
        for info in infos:
            name = str(info.get("name", ""))
            rel = name[len(prefix):].strip("/") if name.startswith(prefix) else ""
            if self._http:
                rel = "" if "?" in rel or "#" in rel else unquote(rel)
            if not rel or "/" in rel or rel in (".", "..") or "\x00" in rel:
                continue  # the directory itself (a marker object), a parent link, a link elsewhere
            size = info.get("size")
            out[sub + rel] = DirEntry(sub + rel, int(size) if size is not None else -1,
                                      info.get("type") == "directory")
        if not out and not sub:
            if self._http:
                raise RemoteError(f"cannot list: {NO_LISTING} (a page without links below it)", file=where)
            if any(str(i.get("name", "")).rstrip("/") == prefix.rstrip("/") for i in infos):
                raise RemoteError("cannot list: an object, not a directory (name it without the trailing /)",
                                  file=where)
        unsized = [e.path for e in out.values() if e.size < 0 and not e.is_dir]
        if unsized:
            sizes = self._sizes(unsized)
            for p in unsized:
                out[p] = DirEntry(p, sizes.get(p, 0), False)
        return sorted((e if e.size >= 0 else DirEntry(e.path, 0, e.is_dir) for e in out.values()),
                      key=lambda e: e.path)

    def _sizes(self, paths: Sequence[str]) -> dict[str, int]:
        """Sizes the listing did not give (HTTP), asked for concurrently; a file whose size cannot be learned
        is listed with size 0 (opening it tells why)."""
        def ask(fs: Any, root: str) -> Sequence[Any]:
            return [_size_or_error(fs.info, _join(root, self._quoted(p))) for p in paths]

        async def ask_async(fs: Any, root: str) -> Sequence[Any]:
            return await asyncio.gather(*(fs._info(_join(root, self._quoted(p))) for p in paths),
                                        return_exceptions=True)

        infos = self._lister.call(ask, ask_async, Deadline(self._remote.timeout))
        return {p: int(i["size"]) for p, i in zip(paths, infos, strict=True)
                if isinstance(i, dict) and i.get("size") is not None}

    def _quoted(self, path: str) -> str:
        return quote(path) if self._http else path

    def open(self, path: str) -> ByteSource:
        return open_url(self._url + self._quoted(self._relative(path)), self._storage_options, self._remote)

    def __repr__(self) -> str:
        return f"RemoteDirectory({self.name!r})"


def _join(root: str, sub: str) -> str:
    return root.rstrip("/") + "/" + sub


def _without_userinfo(parts: Any, url: str) -> str:
    """``url`` without ``user:password@`` (the listing sends credentials as a header, never in a URL)."""
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url


def _size_or_error(info: Any, path: str) -> Any:
    try:
        return info(path)
    except Exception as e:  # noqa: BLE001 - the size stays unknown
        return e


def _ls(fs: Any, path: str, http: bool) -> Listing:
    fs.invalidate_cache(path)
    try:
        return path, fs.ls(path, detail=True)
    except Exception as e:  # noqa: BLE001 - HTTP statuses classified, the rest by FsspecTransport.call
        raise _http_status(e) if http else e from None


async def _als(fs: Any, path: str, http: bool) -> Listing:
    fs.invalidate_cache(path)
    try:
        return path, await fs._ls(path, detail=True)
    except Exception as e:  # noqa: BLE001 - as in _ls
        raise _http_status(e) if http else e from None


def _http_status(e: Exception) -> Exception:
    """A listing request's failure (an HTTP error status, a connection that could not be made) as ckptfs's own
    client classifies it, in its words."""
    import aiohttp

    if isinstance(e, (aiohttp.ClientConnectorError, aiohttp.ClientConnectorCertificateError)):
        return _connect_failure(e)
    if not isinstance(e, aiohttp.ClientResponseError):
        return e
    st = e.status
    if st in (401, 407):
        return RemoteError(f"access denied (HTTP {st}): check the credentials")
    if st == 403:
        return RemoteError(f"HTTP 403 Forbidden: access denied, or {NO_LISTING}")
    if st in (404, 410):
        return NotFound(f"not found (HTTP {st})")
    if st >= 500 or st in (408, 425, 429):
        return Transient(f"HTTP {st}")
    return RemoteError(f"unexpected answer HTTP {st}")


def _connect_failure(e: Exception) -> Exception:
    """aiohttp's failure to connect (``e.host``, ``e.port``): refused at once where ckptfs's own client refuses
    (an unknown host name, an untrusted certificate, a port without TLS), else retried."""
    import ssl

    import aiohttp

    from .http import tls_refusal

    host, port = getattr(e, "host", "?"), getattr(e, "port", None)
    where = host_port(host, port)
    cause = e.certificate_error if isinstance(e, aiohttp.ClientConnectorCertificateError) else e.os_error  # type: ignore[attr-defined]
    if isinstance(cause, ssl.SSLError):
        refused = tls_refusal(cause, where)
        return RemoteError(refused) if refused is not None else Transient(f"TLS error with {where}: "
                                                                          f"{cause.reason or cause}")
    if isinstance(e, aiohttp.ClientConnectorDNSError):
        if no_such_host(cause):
            return RemoteError(f"cannot resolve the host name {host}")
        return Transient(f"cannot resolve the host name {host} ({getattr(cause, 'strerror', None) or cause})")
    if isinstance(cause, ConnectionRefusedError):
        return Transient(f"connection refused by {where}")
    return Transient(f"{where}: {getattr(cause, 'strerror', None) or cause}")
