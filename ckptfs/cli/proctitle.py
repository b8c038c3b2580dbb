"""Credentials out of the process list: rewrite this process's command line as other users see it.

``/proc/<pid>/cmdline`` (what ``ps`` shows to every user) is the memory that held ``argv`` when the process
started. A URL with ``user:password@`` or a signed query, ``--storage-option secret=...`` or ``-o storage.secret=...``, would stay
there for the life of a mount daemon (a fork of ``ckptfs mount ...``). :func:`scrub_cmdline` writes the
redacted arguments over it, as setproctitle does. Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import os
import re

from ..source.urls import is_url, redact_url, secret_name

SECRET_FLAGS = ("--storage-option",)


def _mask_option(item: str) -> str:
    key, eq, _ = item.partition("=")
    return f"{key}=***" if eq and (secret_name(key) or "header" in key.lower()) else item


def _mask_group(group: str) -> str:
    """A ``-o`` group with the values of credential-like ``storage.KEY=VALUE`` options masked."""
    parts = re.split(r"(?<!\\),", group)
    return ",".join("storage." + _mask_option(p[len("storage."):]) if p.startswith("storage.") else p for p in parts)


def redacted_args(args: list[str]) -> list[str]:
    """The arguments with URLs redacted and credential-like ``--storage-option`` values masked."""
    out = []
    flag_before = group_before = False
    for a in args:
        if flag_before:
            out.append(_mask_option(a))
            flag_before = False
        elif group_before:
            out.append(_mask_group(a))
            group_before = False
        elif a == "-o":
            out.append(a)
            group_before = True
        elif a.startswith("-o") and "storage." in a:
            out.append("-o" + _mask_group(a[2:]))
        elif a in SECRET_FLAGS:
            out.append(a)
            flag_before = True
        elif a.startswith(tuple(f + "=" for f in SECRET_FLAGS)):
            flag, _, rest = a.partition("=")
            out.append(f"{flag}={_mask_option(rest)}")
        elif is_url(a):
            out.append(redact_url(a))
        else:
            out.append(a)
    return out


def scrub_cmdline() -> bool:
    """Rewrite /proc/self/cmdline without credentials; True if something had to be hidden (and was)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return False
    args = [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]]
    new = redacted_args(args)
    if new == args or not arg_start or arg_end <= arg_start:
        return False
    length = arg_end - arg_start
    blob = b"\0".join(a.encode("utf-8", "surrogateescape") for a in new) + b"\0"
    blob = blob[: length - 1] + b"\0" if len(blob) > length else blob.ljust(length, b"\0")
    import ctypes  # only now: importing it costs a few ms that most commands need not pay

    try:
        ctypes.memmove(arg_start, blob, length)
    except (OSError, ValueError):
        return False
    return True


def scrub_if_needed() -> None:
    """Called by the CLI once its arguments are parsed (they are Python strings by then)."""
    if os.path.exists("/proc/self/cmdline"):
        scrub_cmdline()
