"""Errors ckptfs raises: one line each, naming the file and, where known, the record or key."""

from __future__ import annotations


_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {0x7F: "\\x7f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}


def oneline(s: str) -> str:
    """Names from a hostile file, printable on one line: control characters and lone surrogates escaped."""
    if s.isprintable():
        return s
    s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s.translate(_CONTROL)


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

    def at(self, *, file: str | None = None, record: str | None = None) -> "CkptfsError":
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
