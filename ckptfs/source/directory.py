"""Directories: what files a checkpoint directory holds, and its files as sources.

Everything above reads a directory through :class:`Directory` and nothing else (never ``os.listdir``): a
listing of one level, and ``open(path)`` of a file by its relative path. A remote directory (an object
store prefix, an HTTP listing) is one more implementation of this Protocol.

Paths are relative and '/'-separated. A path that could leave the directory is refused whatever the
implementation: absolute paths, ``..`` components, empty or NUL-containing names (:func:`check_relative`).
:class:`LocalDirectory` also refuses a file that a symlink takes out of the directory, with one exception:
a Hugging Face cache snapshot (``.../models--org--name/snapshots/<revision>/``), whose files are symlinks to
``../../blobs/<hash>`` of the same repository by design.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..errors import CkptfsError, FormatError
from .base import ByteSource
from .local import LocalFile

#: repository folders of the Hugging Face hub cache (huggingface_hub's REPO_TYPES, as named on disk)
HF_CACHE_PREFIXES = ("models--", "datasets--", "spaces--")


@dataclass(frozen=True)
class DirEntry:
    """One entry of a listing. ``path`` is relative to the directory listed from, '/'-separated."""

    path: str
    size: int
    is_dir: bool
    #: why the entry is not to be opened (a symlink out of the directory), or None
    refused: str | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@runtime_checkable
class Directory(Protocol):
    """A directory whose files can be listed and opened."""

    #: Shown in messages (a path, or a URL without credentials).
    name: str
    #: How many of its files are worth opening at once: 1 where a read costs little (local files: threads
    #: only add overhead), more where each open is a round trip (remote listings).
    concurrency: int

    def list(self, path: str = "") -> list[DirEntry]:
        """The entries of the subdirectory ``path`` ("" for this directory), sorted by name."""
        ...

    def open(self, path: str) -> ByteSource:
        """The file at ``path`` (relative) as a source; raises CkptfsError naming it if it cannot be
        opened or would leave the directory."""
        ...

    def display(self, path: str) -> str:
        """How messages name ``path`` (the directory's name joined with it)."""
        ...


def check_relative(path: str, what: str = "path") -> str:
    """``path`` as a normalised relative path ('./' components dropped), or ValueError saying why it could
    leave the directory (absolute, ``..``, empty, NUL, a Windows drive or backslash)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} is empty")
    if "\x00" in path:
        raise ValueError(f"{what} contains a NUL character")
    if "\\" in path:
        raise ValueError(f"{what} contains a backslash (a Windows path?)")
    if path.startswith("/"):
        raise ValueError(f"{what} is absolute")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise ValueError(f"{what} names the directory itself")
    if ".." in parts:
        raise ValueError(f"{what} climbs out of the directory ('..')")
    if len(parts[0]) >= 2 and parts[0][1] == ":" and parts[0][0].isalpha():
        raise ValueError(f"{what} starts with a drive letter")
    return "/".join(parts)


class LocalDirectory:
    """A local directory. Files are opened by their real path once it is known to lie inside the directory
    (or, for a Hugging Face cache snapshot, inside the repository's ``blobs/``); their ``name`` in messages
    is the path as listed."""

    concurrency = 1

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            st = os.stat(self.name)
        except OSError as e:
            raise CkptfsError(e.strerror or str(e), file=self.name) from None
        if not stat.S_ISDIR(st.st_mode):
            raise CkptfsError("not a directory", file=self.name)
        self.root = os.path.realpath(self.name)
        self.allowed = [self.root]
        # files a listing found as plain files (no symlink) in a directory known to be inside: opened without
        # resolving their path again (one realpath per file is most of what opening a shard costs)
        self._plain: dict[str, str] = {}
        snapshots = os.path.dirname(self.root)
        repo = os.path.dirname(snapshots)
        if os.path.basename(snapshots) == "snapshots" and os.path.basename(repo).startswith(HF_CACHE_PREFIXES):
            self.allowed.append(os.path.join(repo, "blobs"))

    def display(self, path: str) -> str:
        return os.path.join(self.name, path) if path else self.name

    def _inside(self, real: str) -> bool:
        return any(real == root or real.startswith(root.rstrip("/") + "/") for root in self.allowed)

    def _resolve(self, path: str) -> str:
        try:
            rel = check_relative(path)
        except ValueError as e:
            raise FormatError(f"refused: {e}", file=self.name, record=path) from None
        real = os.path.realpath(os.path.join(self.root, rel))
        if not self._inside(real):
            raise FormatError("refused: a symlink leads outside the directory", file=self.name, record=rel)
        return real

    def _chain(self, path: str) -> set[str]:
        """The real paths of directory ``path`` and of every directory above it up to the root: a symlink to
        one of them is a loop (walking it would list the same directories again, for ever or exponentially)."""
        parts = check_relative(path).split("/") if path else []
        return {self.root} | {os.path.realpath(os.path.join(self.root, *parts[:i])) for i in range(1, len(parts) + 1)}

    def list(self, path: str = "") -> list[DirEntry]:
        real = self._resolve(path) if path else self.root
        chain = self._chain(path)
        plain = self._plain
        prefix = path.rstrip("/") + "/" if path else ""
        out = []
        try:
            with os.scandir(real) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=True)
                    except OSError:  # a dangling symlink
                        out.append(DirEntry(prefix + e.name, 0, False, "a symlink to nothing"))
                        continue
                    refused = None
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if e.is_symlink():
                        target = os.path.realpath(e.path)
                        if not self._inside(target):
                            refused = "a symlink leads outside the directory"
                        elif is_dir and target in chain:
                            refused = "a symlink loop (it leads back to a directory that holds it)"
                    if not is_dir and not stat.S_ISREG(st.st_mode):
                        refused = refused or "not a regular file"
                    if not refused and not is_dir and not e.is_symlink():
                        plain[prefix + e.name] = os.path.join(real, e.name)
                    out.append(DirEntry(prefix + e.name, 0 if refused else st.st_size, is_dir, refused))
        except OSError as e:
            raise CkptfsError(e.strerror or str(e), file=self.display(path)) from None
        out.sort(key=lambda d: d.path)
        return out

    def open(self, path: str) -> ByteSource:
        known = self._plain.get(path)
        if known is not None:  # listed as a plain file: refuse it if it became a symlink since
            return LocalFile(known, name=self.display(path), follow=False)
        real = self._resolve(path)
        try:
            st = os.stat(real)
        except OSError as e:
            raise CkptfsError(e.strerror or str(e), file=self.display(path)) from None
        if not stat.S_ISREG(st.st_mode):
            raise FormatError("not a regular file", file=self.display(path))
        return LocalFile(real, name=self.display(check_relative(path)))

    def __repr__(self) -> str:
        return f"LocalDirectory({self.name!r})"
