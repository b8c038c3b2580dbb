"""URLs as targets: telling a URL from a path, and showing one without its credentials.

A target is a URL when it starts with ``scheme://`` (``http``, ``https``, ``s3``, ``gs``, ``hf`` ...) or is an
fsspec chain (``simplecache::s3://...``); ``file://`` names a local file. Wherever ckptfs shows a URL (errors,
logs, ``mount.json``, ``index.json``, ``/proc/mounts``, the daemon's command line) it shows
:func:`redact_url`'s form: no ``user:password@``, no fragment, and the values of query parameters that look
like credentials (``X-Amz-Signature``, ``sig``, ``token``, ...) replaced by ``REDACTED``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, unquote, urlsplit, urlunsplit

_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]+)://")
#: query parameters and option names whose values are (or may be) secrets
_SECRET_NAME = re.compile(r"sig|token|secret|passw|pwd|credential|auth|key|session|security|cookie|code|"
                          r"x-amz-|x-goog-|sas", re.IGNORECASE)
REDACTED = "REDACTED"
#: environment variables holding secrets that backends read (their values never appear in messages)
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "HF_TOKEN",
              "HUGGING_FACE_HUB_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING",
              "GOOGLE_APPLICATION_CREDENTIALS_JSON")


def is_url(target: object) -> bool:
    """True for ``scheme://...`` (except ``file://``) and fsspec chains such as ``simplecache::s3://b/k``."""
    if not isinstance(target, str):
        return False
    m = _SCHEME.match(target)
    if m is not None:
        return m.group(1).lower() != "file"
    return is_chain(target) and _SCHEME.search(target) is not None


def chain(url: str) -> list[str]:
    """The links of an fsspec chain (``simplecache::s3://b/k`` -> ``["simplecache", "s3://b/k"]``); a plain URL
    is one link. ``::`` inside a bracketed IPv6 host (``http://[::1]:8000/m.pth``) does not separate links."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(url):
        c = url[i]
        if c == "[":
            depth += 1
        elif c == "]":
            depth = max(0, depth - 1)
        elif c == ":" and depth == 0 and url.startswith("::", i):
            parts.append(url[start:i])
            start = i = i + 2
            continue
        i += 1
    return [*parts, url[start:]]


def is_chain(url: str) -> bool:
    """Whether ``url`` is an fsspec chain of several links (see :func:`chain`)."""
    return "::" in url and len(chain(url)) > 1


def local_path(target: str) -> str:
    """``file:///a/b`` -> ``/a/b``; anything else unchanged."""
    if target[:7].lower() == "file://":
        return unquote(urlsplit(target).path)
    return target


def host_port(host: object, port: object) -> str:
    """``host:port`` as a URL writes it: an IPv6 address in brackets (``[::1]:8080``)."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def scheme(url: str) -> str:
    """The protocol of a URL (of the last link of an fsspec chain), lower case."""
    last = chain(url)[-1]
    m = _SCHEME.match(last)
    return m.group(1).lower() if m else ""


def secret_name(name: str) -> bool:
    """Whether a query parameter or option named ``name`` may hold a credential."""
    return bool(_SECRET_NAME.search(name))


def redact_url(url: str) -> str:
    """``url`` as it may be shown: without user info, fragment and credential-like query values."""
    if is_chain(url):
        return "::".join(redact_url(part) for part in chain(url))
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"<a {scheme(url) or 'malformed'} URL>"
    netloc = parts.netloc.rpartition("@")[2]
    query = "&".join(_redact_param(p) for p in parts.query.split("&")) if parts.query else ""
    if parts.scheme and url[len(parts.scheme) + 1 :].startswith("//"):  # kept when empty: "s3://", "file:///x"
        return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _redact_param(param: str) -> str:
    name, eq, value = param.partition("=")
    if eq and value and secret_name(unquote(name)):
        return f"{name}={REDACTED}"
    return param


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries: the password (and user) of its user info, credential-like query values."""
    out = []
    for part in chain(url):
        try:
            parts = urlsplit(part)
        except ValueError:
            out.append(part)
            continue
        userinfo = parts.netloc.rpartition("@")[0]
        if userinfo:
            user, _, password = userinfo.partition(":")
            out += [user, password, unquote(user), unquote(password)]
        for param in parts.query.split("&"):
            name, eq, value = param.partition("=")
            if eq and value and secret_name(unquote(name)):
                out += [value, unquote(value)]
    return [s for s in out if s]


def option_secrets(options: Mapping[str, object] | None) -> list[str]:
    """Values of storage options whose names look like credentials, and every header value (nested)."""
    out: list[str] = []

    def walk(obj: object, secret: bool) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                name = str(k)
                walk(v, secret or secret_name(name) or name.lower() == "headers")
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, secret)
        elif secret and isinstance(obj, (str, bytes)):
            out.append(obj.decode("utf-8", "replace") if isinstance(obj, bytes) else obj)

    walk(options or {}, False)
    return [s for s in out if s]


class Redactor:
    """Replaces known secrets in text (messages built from a backend's exceptions) by ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        found = set()
        for s in secrets:
            if len(s) >= 3:  # shorter ones would mangle ordinary text; they are not credentials anyway
                found.add(s)
                found.add(quote(s, safe=""))
        self.secrets = sorted(found, key=len, reverse=True)

    @classmethod
    def for_target(cls, url: str, options: Mapping[str, object] | None) -> Redactor:
        env = [os.environ[k] for k in SECRET_ENV if os.environ.get(k)]
        return cls(url_secrets(url) + option_secrets(options) + env)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, "***")
        return text
