"""An on-disk cache of remote objects' blocks (``--cache-dir``, ``--cache-size``), shared by processes.

Layout: ``DIR/ckptfs-cache-v1/<key>/`` per object, where ``key`` hashes the URL (credentials removed), the
ETag, the size and the Last-Modified time: another version of the object is another directory, so bytes of
two versions never mix. Each block is one file named by its index (hex), written to a temporary name and
renamed into place, so a reader (any process) sees a whole block or none; ``object.json`` says what the
directory holds. Many processes (mounts, ``ls``, training jobs) may use one directory at once with no
other coordination.

Size: once a process has written a tenth of ``max_bytes`` (at least 64 MiB) it takes the directory's lock
(if free) and deletes the least recently used blocks until the total is under 90 % of ``max_bytes``;
reading a block marks it used (its mtime, refreshed at most once a minute). A block that cannot be read
whole is a miss; a full disk stops writes for the object, never reads.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import logging
import os
import threading
import time

from ..errors import CkptfsError

log = logging.getLogger("ckptfs.cache")

VERSION_DIR = "ckptfs-cache-v1"
TOUCH_EVERY = 60.0
_counter = itertools.count()


def object_key(url: str, etag: str, size: int, last_modified: str) -> str:
    text = "\0".join((url, etag, str(size), last_modified))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:40]


class DiskCache:
    def __init__(self, root: str, max_bytes: int, key: str, block: int, describe: dict[str, object]) -> None:
        self.root = os.path.join(os.path.abspath(root), VERSION_DIR)
        self.dir = os.path.join(self.root, key)
        self.block = block
        self.max_bytes = max_bytes
        self.writable = True
        self._written = 0
        self._lock = threading.Lock()
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
        except OSError as e:
            raise CkptfsError(f"cannot use the cache directory: {e.strerror or e}", file=root) from None
        meta = os.path.join(self.dir, "object.json")
        if not os.path.exists(meta):
            self._write_file(meta, (json.dumps({**describe, "block_size": block}, indent=1) + "\n").encode())

    def _path(self, idx: int) -> str:
        return os.path.join(self.dir, f"{idx:08x}")

    def get(self, idx: int, length: int) -> bytes | None:
        """Block ``idx`` if it is cached whole (``length`` bytes), else None."""
        path = self._path(idx)
        try:
            with open(path, "rb", buffering=0) as f:
                data = f.read(length + 1)
                st = os.fstat(f.fileno())
        except OSError:
            return None
        if len(data) != length:
            return None
        if time.time() - st.st_mtime > TOUCH_EVERY:
            try:
                os.utime(path)
            except OSError:
                pass
        return data

    def put(self, idx: int, data: bytes | bytearray | memoryview) -> None:
        if not self.writable:
            return
        try:
            try:
                self._write_file(self._path(idx), data)
            except FileNotFoundError:  # another process trimmed the cache and removed our directory
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
                self._write_file(self._path(idx), data)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                self.writable = False
                log.warning("cache %s: no more writes (%s)", self.dir, e.strerror)
                return
            raise
        with self._lock:
            self._written += len(data)
            due = self._written >= max(64 << 20, self.max_bytes // 10)
            if due:
                self._written = 0
        if due:
            self.trim()

    def _write_file(self, path: str, data: bytes | bytearray | memoryview) -> None:
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.{next(_counter)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, path)

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def trim(self) -> None:
        """Delete the least recently used blocks (of any object) beyond 90 % of the size limit. One process at
        a time: if another holds the lock, it is doing it."""
        lock_path = os.path.join(self.root, ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return
            trim_dir(self.root, int(self.max_bytes * 0.9))
        finally:
            os.close(fd)


def cache_usage(root: str) -> list[tuple[float, int, str]]:
    """(mtime, size, path) of every block file under ``root`` (a ckptfs-cache-v1 directory)."""
    out: list[tuple[float, int, str]] = []
    try:
        objects = list(os.scandir(root))
    except OSError:
        return out
    for obj in objects:
        if not obj.is_dir(follow_symlinks=False):
            continue
        try:
            entries = list(os.scandir(obj.path))
        except OSError:
            continue
        for e in entries:
            if e.name == "object.json":
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if e.name.endswith(".tmp"):  # being written, or left by a writer that died
                if time.time() - st.st_mtime < 3600:
                    continue
            out.append((st.st_mtime, st.st_size, e.path))
    return out


def trim_dir(root: str, target: int) -> int:
    """Delete least recently used block files until at most ``target`` bytes remain; the bytes deleted."""
    files = cache_usage(root)
    total = sum(size for _, size, _ in files)
    freed = 0
    if total <= target:
        return 0
    files.sort()
    for _, size, path in files:
        if total - freed <= target:
            break
        try:
            os.unlink(path)
            freed += size
        except OSError:
            pass
    for obj in os.scandir(root):  # object directories left with no block: gone too
        if obj.is_dir(follow_symlinks=False):
            try:
                names = os.listdir(obj.path)
            except OSError:
                continue
            if all(n == "object.json" for n in names):
                for n in names:
                    try:
                        os.unlink(os.path.join(obj.path, n))
                    except OSError:
                        pass
                try:
                    os.rmdir(obj.path)
                except OSError:
                    pass
    return freed
