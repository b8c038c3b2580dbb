"""S3 and every other fsspec protocol for :class:`~ckptfs.source.remote.RemoteSource`.

* ``s3://bucket/key`` (and ``s3a://``): s3fs's client (aiobotocore) makes each ranged ``GetObject`` with
  ``IfMatch`` set to the ETag first seen, and ckptfs compares the ETag, size and Last-Modified of every
  answer; ``?versionId=...`` pins a version. Endpoints and credentials come from the standard places
  (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE`` and ``~/.aws``, instance roles ...) or storage options (s3fs's: ``endpoint_url``, ``key``,
  ``secret``, ``token``, ``anon``, ``client_kwargs`` ...). Retries are ckptfs's (botocore's are turned off so
  that ``timeout`` bounds a read).
* anything else fsspec knows (``gs://``, ``az://``, ``hf://``, ``simplecache::...``): ``info()`` gives the
  size and an identity (ETag, generation or hash, and the modification time, where the backend reports
  them), ``cat_file`` the ranges. The identity is checked again when files are opened (every
  ``revalidate_after`` seconds), not on every answer: these backends do not report it per range.

The filesystem object is made again in a forked child (its event loop and sessions belong to the parent).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import os
import ssl
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import CkptfsError, RemoteError
from .http import tls_refusal
from .options import RemoteOptions
from .remote import Deadline, NotAFile, NotFound, ObjectInfo, Transient, Transport, no_such_host, stale
from .urls import Redactor, is_chain, redact_url, scheme

T = TypeVar("T")
ETAG_FIELDS = ("ETag", "etag", "generation", "version_id", "VersionId", "md5Hash", "md5", "blob_id", "sha256",
               "checksum")
TIME_FIELDS = ("LastModified", "last_modified", "mtime", "updated", "modified", "time_modified", "created")
PERMANENT = (ValueError, TypeError, KeyError, NotImplementedError, AttributeError)


def fsspec_transport(url: str, storage_options: Mapping[str, object], options: RemoteOptions) -> Transport:
    if is_s3(url):
        return S3Transport(url, storage_options, options)
    return FsspecTransport(url, storage_options, options)


def is_s3(url: str) -> bool:
    return scheme(url) in ("s3", "s3a") and not is_chain(url)


def backend_options(url: str, storage_options: Mapping[str, object], options: RemoteOptions) -> dict[str, Any]:
    """The storage options ckptfs hands the URL's fsspec filesystem: the user's, and for S3 botocore's own
    retries turned off (ckptfs retries, within ``timeout``) and its timeouts within ``timeout``."""
    opts = dict(storage_options)
    if is_s3(url):
        config = dict(opts.get("config_kwargs") or {})  # type: ignore[call-overload]
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", min(options.timeout, 10.0))
        config.setdefault("read_timeout", options.timeout)
        opts["config_kwargs"] = config
    return opts


def url_filesystem(url: str, opts: Mapping[str, object], redact: Redactor) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the URL's path in it; a missing package or a bad option is a
    one-line CkptfsError."""
    try:
        import fsspec.core

        if "::" in url and not is_chain(url):  # an IPv6 host, which fsspec would split as a chain
            cls = fsspec.get_filesystem_class(scheme(url))
            fs = fsspec.filesystem(scheme(url), **{**cls._get_kwargs_from_urls(url), **opts})
            return fs, str(cls._strip_protocol(url))
        fs, path = fsspec.core.url_to_fs(url, **opts)
        return fs, str(path)
    except ImportError as e:
        raise _import_error(url, e) from None
    except (ValueError, TypeError) as e:
        raise CkptfsError(redact(f"cannot open with fsspec: {e}"), file=redact_url(url)) from None


def _import_error(url: str, e: BaseException) -> CkptfsError:
    proto = scheme(url)
    hint = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
            "hf": "huggingface_hub"}.get(proto)
    if hint in ("s3fs",):
        need = "pip install 'ckptfs[remote]' (s3fs)"
    else:
        need = f"pip install {hint}" if hint else str(e)
    return CkptfsError(f"{proto}:// URLs need a package that is not installed: {need}", file=redact_url(url))


class FsspecTransport:
    """An object on any fsspec filesystem (see the module doc)."""

    def __init__(self, url: str, storage_options: Mapping[str, object], options: RemoteOptions) -> None:
        self.name = redact_url(url)
        self._url = url
        self._opts = backend_options(url, storage_options, options)
        self._redact = Redactor.for_target(url, storage_options)
        self._lock = threading.Lock()
        self._fs: Any = None
        self._path = ""
        self._pid = -1
        self._filesystem()  # configuration errors now, not at the first read

    def _filesystem(self) -> tuple[Any, str]:
        with self._lock:
            if self._fs is None or self._pid != os.getpid():
                self._fs, self._path = url_filesystem(self._url, self._opts, self._redact)
                self._pid = os.getpid()
            return self._fs, self._path

    def call(self, fn: Callable[[Any, str], T], async_fn: Callable[[Any, str], Coroutine[Any, Any, T]] | None,
             deadline: Deadline) -> T:
        """``fn(fs, path)`` (``async_fn`` on fsspec's event loop, within the deadline, where the filesystem is
        asynchronous) with its errors classified: NotFound, RemoteError (refused), Transient (retried)."""
        fs, path = self._filesystem()
        try:
            if async_fn is not None and getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
                return _run(fs.loop, async_fn(fs, path), deadline)
            return fn(fs, path)
        except (Transient, CkptfsError):
            raise
        except FileNotFoundError:
            raise NotFound("not found") from None
        except PermissionError as e:
            raise RemoteError(self._redact(f"access denied ({e})")) from None
        except PERMANENT as e:
            raise RemoteError(self._redact(f"{type(e).__name__}: {e}")) from None
        except Exception as e:  # noqa: BLE001 - backends raise many kinds for network trouble: retried
            refused = botocore_refusal(e, self._redact) if is_s3(self._url) else None
            if refused is not None:
                raise refused from None
            raise Transient(self._redact(f"{type(e).__name__}: {e}")) from None

    def open(self, head: int, deadline: Deadline) -> tuple[ObjectInfo, bytes]:
        info: dict[str, Any] = self.call(lambda fs, p: fs.info(p), lambda fs, p: fs._info(p), deadline)
        if info.get("type", "file") != "file":
            raise NotAFile(f"is a {info.get('type')}, not a checkpoint file")
        size = int(info["size"])
        etag = next((str(info[k]) for k in ETAG_FIELDS if info.get(k)), "")
        modified = next((info[k] for k in TIME_FIELDS if info.get(k)), "")
        obj = ObjectInfo(size, etag, str(modified), _time_ns(modified))
        n = min(head, size)
        data = self._cat(0, n, deadline) if n else b""
        return obj, data

    def _cat(self, start: int, end: int, deadline: Deadline) -> bytes:
        data = self.call(lambda fs, p: fs.cat_file(p, start=start, end=end),
                         lambda fs, p: fs._cat_file(p, start=start, end=end), deadline)
        return bytes(data)

    def fetch(self, start: int, bufs: Sequence[memoryview], expect: ObjectInfo, deadline: Deadline,
              filled: Callable[[int], None]) -> None:
        total = sum(len(b) for b in bufs)
        try:
            data = self._cat(start, start + total, deadline)
        except NotFound:
            raise stale(self.name, "it is gone") from None
        if len(data) < total:
            raise stale(self.name, f"it is now shorter (got {len(data)} of {total} bytes at {start})")
        if len(data) > total:
            raise RemoteError(f"the backend returned {len(data)} bytes for a range of {total}")
        pos = 0
        for i, view in enumerate(bufs):
            view[:] = data[pos : pos + len(view)]
            pos += len(view)
            filled(i)

    def after_fork(self, keep_connections: bool) -> None:
        self._lock = threading.Lock()
        self._fs = None  # made again on first use (fsspec resets its event loop in the child: no connection survives)

    def close(self) -> None:
        return None


class S3Transport(FsspecTransport):
    """An S3 object through s3fs's client: ranged GetObject with IfMatch, every answer checked."""

    def __init__(self, url: str, storage_options: Mapping[str, object], options: RemoteOptions) -> None:
        super().__init__(url, storage_options, options)
        fs, path = self._filesystem()
        self._bucket, self._key, self._version = fs.split_path(url)
        if not self._bucket:
            raise CkptfsError("an S3 URL names a bucket and a key: s3://BUCKET/KEY", file=self.name)
        if not self._key:  # (the opener then lists the bucket, as for a prefix without its trailing /)
            raise NotAFile("a bucket, not an object: s3://BUCKET/KEY names one", file=self.name)

    async def _get(self, fs: Any, rng: str, if_match: str | None) -> tuple[dict[str, Any], bytes]:
        await fs.set_session()
        s3 = await fs.get_s3(self._bucket)
        kw: dict[str, Any] = {"Bucket": self._bucket, "Key": self._key, "Range": rng, **fs.req_kw}
        if self._version:
            kw["VersionId"] = self._version
        if if_match:
            kw["IfMatch"] = if_match
        resp = await s3.get_object(**kw)
        body = resp["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return resp, data

    def _s3(self, rng: str, if_match: str | None, deadline: Deadline) -> tuple[dict[str, Any], bytes]:
        fs, _ = self._filesystem()
        try:
            return _run(fs.loop, self._get(fs, rng, if_match), deadline)
        except (Transient, CkptfsError):
            raise
        except Exception as e:  # noqa: BLE001 - classified below
            raise self._failure(e) from None

    def _failure(self, e: BaseException) -> Exception:
        import botocore.exceptions as bx

        if isinstance(e, bx.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            msg = self._redact(str(err.get("Message") or code))
            if code in ("PreconditionFailed",) or status == 412:
                return _Precondition(msg)
            if code in ("NoSuchKey", "NotFound", "NoSuchBucket", "NoSuchVersion") or status == 404:
                return NotFound(f"not found ({code or status}: {msg})")
            if code == "InvalidRange" or status == 416:
                return _Unsatisfiable(msg)
            if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                                "ExpiredToken", "InvalidToken"):
                return RemoteError(f"access denied ({code}: {msg}): check the credentials")
            if status >= 500 or status in (408, 429) or code in ("SlowDown", "RequestTimeout", "InternalError",
                                                                 "ServiceUnavailable", "Throttling"):
                return Transient(f"{code or status}: {msg}")
            return RemoteError(f"{code or status}: {msg}")
        refused = botocore_refusal(e, self._redact)
        if refused is not None:
            return refused
        if isinstance(e, (bx.ParamValidationError, *PERMANENT)):
            return RemoteError(self._redact(f"{type(e).__name__}: {e}"))
        return Transient(self._redact(f"{type(e).__name__}: {e}".rstrip(": ")))

    def open(self, head: int, deadline: Deadline) -> tuple[ObjectInfo, bytes]:
        try:
            resp, data = self._s3(f"bytes=0-{head - 1}", None, deadline)
        except _Unsatisfiable:  # an empty object has no byte 0
            return ObjectInfo(0), b""
        total = _total(resp, len(data))
        modified = resp.get("LastModified")
        return ObjectInfo(total, str(resp.get("ETag") or ""), str(modified or ""), _time_ns(modified)), data

    def fetch(self, start: int, bufs: Sequence[memoryview], expect: ObjectInfo, deadline: Deadline,
              filled: Callable[[int], None]) -> None:
        total = sum(len(b) for b in bufs)
        try:
            resp, data = self._s3(f"bytes={start}-{start + total - 1}", expect.etag or None, deadline)
        except _Precondition:
            raise stale(self.name, "the server says its ETag no longer matches: PreconditionFailed") from None
        except _Unsatisfiable:
            raise stale(self.name, "it is now shorter: InvalidRange") from None
        except NotFound:
            raise stale(self.name, "it is gone") from None
        modified = resp.get("LastModified")
        why = expect.change(_total(resp, len(data)), str(resp.get("ETag") or ""), str(modified or "") or None)
        if why is not None:
            raise stale(self.name, why)
        if len(data) != total:
            raise Transient(f"got {len(data)} of {total} bytes")
        pos = 0
        for i, view in enumerate(bufs):
            view[:] = data[pos : pos + len(view)]
            pos += len(view)
            filled(i)


def botocore_refusal(e: BaseException, redact: Redactor) -> RemoteError | None:
    """A botocore configuration failure that trying again cannot cure (no credentials, a profile that does not
    exist, an unreadable config file ...) as a one-line error; None for anything else."""
    try:
        import botocore.exceptions as bx
    except ImportError:
        return None
    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return RemoteError("no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, "
                           "or --storage-option anon=true for a public bucket)")
    if isinstance(e, (bx.ProfileNotFound, bx.ConfigNotFound, bx.ConfigParseError, bx.NoRegionError,
                      bx.UnknownCredentialError, bx.InvalidConfigError)):
        return RemoteError(redact(f"AWS configuration: {e}"))
    if isinstance(e, bx.BotoCoreError):  # (botocore's SSLError) an untrusted endpoint, a port without TLS
        cause = _ssl_cause(e)
        endpoint = urlsplit(str(e.kwargs.get("endpoint_url") or ""))
        refused = tls_refusal(cause, endpoint.netloc or "the endpoint") if cause is not None else None
        if refused is not None:
            return RemoteError(redact(refused.replace("storage option verify=PATH names a CA bundle",
                                                      "AWS_CA_BUNDLE or --storage-option client_kwargs.verify=PATH "
                                                      "names a CA bundle")))
        if _cause(e, no_such_host) is not None:  # not a transient fault
            return RemoteError(redact(f"cannot resolve the host name {endpoint.hostname or '?'} of the endpoint "
                                      f"{endpoint.scheme}://{endpoint.netloc}"))
    return None


def _ssl_cause(e: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a client's exception (botocore wraps aiohttp's, which wraps the ssl module's)."""
    # (aiohttp's wrappers subclass ssl.SSLError too)
    return _cause(e, lambda x: isinstance(x, ssl.SSLError) and type(x).__module__ == "ssl")  # type: ignore[return-value]


def _cause(e: BaseException, wanted: Callable[[object], bool]) -> object | None:
    """The first exception in the chain behind ``e`` (causes, contexts, aiohttp's and botocore's wrapped
    errors) that is ``wanted``."""
    seen: set[int] = set()
    todo: list[object] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if wanted(x):
            return x
        kwargs = getattr(x, "kwargs", None)
        todo += [getattr(x, "__cause__", None), getattr(x, "__context__", None), getattr(x, "certificate_error", None),
                 getattr(x, "os_error", None), kwargs.get("error") if isinstance(kwargs, dict) else None]
    return None


class _Precondition(RemoteError):
    pass


class _Unsatisfiable(RemoteError):
    pass


def _run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], deadline: Deadline) -> T:
    """Run ``coro`` on fsspec's event loop (another thread), giving up after the deadline."""
    left = deadline.remaining()
    if left <= 0:
        coro.close()
        raise Transient("no answer in time")
    future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, left), loop)
    try:
        return future.result(left + 5.0)
    except (asyncio.TimeoutError, concurrent.futures.TimeoutError):
        future.cancel()
        raise Transient("no answer in time") from None


def _total(resp: Mapping[str, Any], got: int) -> int:
    text = str(resp.get("ContentRange") or "")
    if "/" in text and text.rsplit("/", 1)[1].isdigit():
        return int(text.rsplit("/", 1)[1])
    return got  # no Content-Range: the whole object came back


def _time_ns(value: object) -> int:
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1e9)
    if isinstance(value, (int, float)):
        return int(value * 1e9) if value < 1e12 else int(value)
    if isinstance(value, str) and value:
        try:
            return int(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
        except ValueError:
            return 0
    return 0
