"""Errors ckptfs raises: one line each, naming the file and, where known, the record or key."""

from __future__ import annotations

_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {0x7F: "\\x7f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def oneline(s: str) -> str:
    """Names from a hostile file, printable on one line: control characters and lone surrogates escaped,
    and any other character a terminal would not print as itself (bidi overrides, zero-width and other
    format characters) as ``\\uXXXX``."""
    if s.isprintable():
        return s
    s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    s = s.translate(_CONTROL)
    if not s.isprintable():
        s = "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"
                    for ch in s)
    return s


def brief(v: object, n: int = 80) -> str:
    """``repr(v)`` cut to ``n`` characters, in bounded time whatever ``v`` is: small values (up to a few
    thousand items and characters) get their exact repr; a huge one, a 10^6-deep nesting or a memo DAG
    whose full repr would have 3^59 parts is rendered a few levels and items deep."""
    if _small(v):
        try:
            s = repr(v)
        except Exception:  # noqa: BLE001 - a repr may refuse (int digit limits, recursion)
            s = f"<{type(v).__name__}>"
    else:
        s = _partial(v, 3)
    return s if len(s) <= n else s[: max(n - 3, 0)] + "..."


_CONTAINERS = (list, tuple, set, frozenset, dict)


def _small(v: object, budget: int = 4000) -> bool:
    stack = [(v, 0)]
    while stack:
        x, depth = stack.pop()
        budget -= 1
        if budget < 0 or depth > 30:
            return False
        if isinstance(x, (str, bytes, bytearray)):
            budget -= len(x) >> 4
        elif isinstance(x, int):
            if x.bit_length() > 4096:
                return False
        elif isinstance(x, dict):
            if len(x) > budget:
                return False
            stack.extend((k, depth + 1) for k in x.keys())
            stack.extend((y, depth + 1) for y in x.values())
        elif isinstance(x, _CONTAINERS):
            if len(x) > budget:
                return False
            stack.extend((y, depth + 1) for y in x)
    return True


def _partial(v: object, levels: int, items: int = 6) -> str:
    """A bounded rendering: ``levels`` deep, ``items`` per container, strings and ints cut short."""
    if isinstance(v, (str, bytes, bytearray)):
        return repr(v[:60]) + ("..." if len(v) > 60 else "")
    if isinstance(v, int) and not isinstance(v, bool):
        return repr(v) if v.bit_length() <= 200 else f"<int of {v.bit_length()} bits>"
    if isinstance(v, _CONTAINERS):
        if levels <= 0:
            return f"<{type(v).__name__} of {len(v)}>"
        if isinstance(v, dict):
            parts = [f"{_partial(k, levels - 1)}: {_partial(x, levels - 1)}" for k, x in list(v.items())[:items]]
            open_, close = "{", "}"
        else:
            parts = [_partial(x, levels - 1) for x in list(v)[:items]]
            open_, close = {list: ("[", "]"), tuple: ("(", ")")}.get(type(v), ("{", "}"))
        if len(v) > items:
            parts.append(f"... {len(v) - items} more")
        return open_ + ", ".join(parts) + close
    try:
        return repr(v)[:200]
    except Exception:  # noqa: BLE001
        return f"<{type(v).__name__}>"


class CkptfsError(Exception):
    """A checkpoint (or a part of it) that ckptfs cannot or will not serve.

    ``str(err)`` is a single line: ``<file>: <record or key>: <reason>``.
    """

    def __init__(self, message: str, *, file: str | None = None, record: str | None = None) -> None:
        self.reason = oneline(" ".join(str(message).split()))
        self.file = file
        self.record = record
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [oneline(str(p)) for p in (self.file, self.record) if p]
        parts.append(self.reason)
        return ": ".join(parts)

    def at(self, *, file: str | None = None, record: str | None = None) -> CkptfsError:
        """Fill in the file / record if they are not known yet; returns self."""
        if self.file is None and file is not None:
            self.file = file
        if self.record is None and record is not None:
            self.record = record
        self.args = (self._render(),)
        return self

    def __str__(self) -> str:
        return self._render()


class FormatError(CkptfsError):
    """The container (zip / legacy stream) is malformed or ambiguous."""


class UnsafePickleError(CkptfsError):
    """The pickle asks for something ckptfs refuses (strict mode, bad opcodes, limits)."""


class LimitError(CkptfsError):
    """A configured resource limit (nesting, nodes, sizes) was hit."""


class TensorError(CkptfsError):
    """One tensor cannot be served (bad shape/stride/record); the rest of the checkpoint can."""


class UnsupportedError(CkptfsError):
    """A known construct whose bytes ckptfs does not serve (yet); metadata is still indexed."""


class StaleSourceError(CkptfsError):
    """The checkpoint file changed under an open index (truncated, rewritten, replaced)."""


class RemoteError(CkptfsError):
    """A remote checkpoint could not be read: the server is down or too slow (``timeout``), refused the
    request (not found, access denied), or does not serve byte ranges."""
