"""The FUSE adapter (mfusepy, or fusepy when only that is installed): paths -> nodes, attributes, reads.

It knows only :class:`MountSource` (implemented by :class:`ckptfs.views.tree.TreeView`) and nothing of
checkpoint formats. Reads are zero-copy: :class:`ZeroCopyFUSE` overrides the binding's
low-level ``read`` callback so the handle ``preadv``s straight into libfuse's reply buffer (no ``bytes``
object, no memmove). On libfuse3 reads go through ``read_buf`` instead: where a handle says its bytes lie
in a local file (``Handle.file_spans``), the reply names the file and libfuse splices its pages into
/dev/fuse (:mod:`ckptfs.mount.bufvec`); other reads are filled into memory by ``readinto``.

Everything is read-only: every call that would change something fails with EROFS (the mount is also
``ro``, so the kernel refuses most of them before they get here). A failing read is logged and returns
EIO for that request only; the daemon keeps serving.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import stat
import threading
import warnings
from ctypes.util import find_library
from typing import Any, Callable, Iterable, Iterator, Protocol

from ..views.namespace import DIR, FILE, LINK
from .bufvec import Replies, Span, pipe_capacity

log = logging.getLogger("ckptfs.mount")

BLKSIZE = 1 << 20  # st_blksize / f_bsize: readers (cat, cp, numpy) use buffers this big
TIMEOUT = 86400.0  # entry/attr/negative cache timeouts: the tree never changes while mounted
READ_AHEAD_KB = 16384  # the mount's readahead window, raised when root (1 MiB requests on libfuse3)
MAX_READ = 1 << 20  # libfuse3's largest read request (256 pages)
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: FUSE_CAP_* flags of libfuse3's fuse_conn_info.want
CAP_SPLICE_WRITE = 1 << 7
CAP_SPLICE_MOVE = 1 << 8
ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)

_MODES = {DIR: stat.S_IFDIR | 0o555, FILE: stat.S_IFREG | 0o444, LINK: stat.S_IFLNK | 0o777}


class Handle(Protocol):
    """An open file."""

    def readinto(self, buf: memoryview, offset: int) -> int:
        """Fill ``buf`` from ``offset``; the count (short only at the end). Raising fails this read (EIO)."""
        ...

    def file_spans(self, offset: int, size: int) -> list[Span] | None:
        """Where bytes [offset, offset + size) lie, end to end: ``(fd, position, length)`` in local files that
        stay open while the handle is, or literal bytes; fewer bytes only at the end of the file. None when
        they must be read with ``readinto`` (computed, remote). Raising fails this read (EIO)."""
        ...

    def close(self) -> None: ...


class MountSource(Protocol):
    """What the adapter serves: nodes (ints, 0 the root) with a type (DIR, FILE or LINK from
    :mod:`ckptfs.views.namespace`), names, sizes, contents and xattrs."""

    mtime_ns: int

    def lookup(self, path: str) -> int | None:
        """The node at a '/'-separated path relative to the root (no leading slash), or None."""
        ...

    def node_type(self, node: int) -> int: ...

    def inode(self, node: int) -> int: ...

    def parent(self, node: int) -> int: ...

    def nlink(self, node: int) -> int: ...

    def size(self, node: int) -> int: ...

    def listdir(self, node: int) -> Iterable[tuple[str, int]]:
        """(name, node) of a directory's entries, in the order to list them (an iterator is read only as far
        as readdir asks: the first entries of a million-entry directory come at once)."""
        ...

    def readlink(self, node: int) -> str: ...

    def open(self, node: int) -> Handle:
        """Raises to refuse the open (EIO)."""
        ...

    def xattrs(self, node: int) -> dict[str, bytes]: ...

    def total_bytes(self) -> int:
        """Bytes of data (statfs)."""
        ...

    def __len__(self) -> int:
        """Nodes (statfs)."""
        ...


class Listing:
    """A directory's entries, taken from an iterator only as far as they are asked for."""

    __slots__ = ("_it", "_got")

    def __init__(self, entries: Iterator[tuple[str, int]]) -> None:
        self._it: Iterator[tuple[str, int]] | None = entries
        self._got: list[tuple[str, int]] = []

    def at(self, i: int) -> tuple[str, int] | None:
        """Entry ``i``, or None past the end."""
        got = self._got
        while i >= len(got) and self._it is not None:
            chunk = list(itertools.islice(self._it, max(256, len(got))))  # (doubling: few calls in all)
            if not chunk:
                self._it = None
            got += chunk
        return got[i] if i < len(got) else None

    def all(self) -> list[tuple[str, int]]:
        while self._it is not None:
            self.at(len(self._got))
        return self._got


class FuseUnavailable(Exception):
    """No usable FUSE binding or library; the message says what to install."""


def library_choice() -> str:
    """Which libfuse to load: CKPTFS_FUSE=2/3 forces one; otherwise libfuse3 when present (1 MiB reads)."""
    want = os.environ.get("CKPTFS_FUSE", "auto").strip()
    if os.environ.get("FUSE_LIBRARY_PATH") or os.environ.get("FUSE_LIBRARY_NAME"):
        return "env"  # the user chose explicitly (mfusepy's own variables)
    have3, have2 = find_library("fuse3"), find_library("fuse")
    if want == "3" or want == "auto" and have3:
        if not have3:
            raise FuseUnavailable("libfuse3 is not installed: install the fuse3 package "
                                  "(Debian/Ubuntu: apt install fuse3; Fedora: dnf install fuse3)")
        return "3"
    if want in ("2", "auto"):
        if not have2:
            raise FuseUnavailable("libfuse is not installed: install the fuse3 package "
                                  "(Debian/Ubuntu: apt install fuse3; Fedora: dnf install fuse3), or libfuse2")
        return "2"
    raise FuseUnavailable(f"CKPTFS_FUSE={want!r}: expected 2, 3 or auto")


def load_fuse() -> Any:
    """Import the binding with the chosen libfuse. Must run before anything else imports mfusepy."""
    choice = library_choice()
    if choice in ("2", "3"):
        os.environ["FUSE_LIBRARY_NAME"] = "fuse3" if choice == "3" else "fuse"
    try:
        import mfusepy as fuse
    except ImportError:
        try:
            import fuse  # fusepy: libfuse2 only
        except ImportError:
            raise FuseUnavailable("the Python package mfusepy is missing: pip install mfusepy") from None
        except OSError as e:
            raise FuseUnavailable(f"fusepy cannot load libfuse2 ({e}): install libfuse2, or pip install "
                                  "mfusepy (which uses libfuse3)") from None
    except OSError as e:
        raise FuseUnavailable(f"cannot load libfuse ({e}): install the fuse3 package") from None
    except AttributeError as e:  # mfusepy refuses a library version it cannot drive
        raise FuseUnavailable(f"unusable libfuse: {e}") from None
    return fuse  # (fusepy, or mfusepy imported earlier in this process, may have loaded another libfuse)


def fuse_major(fuse: Any) -> int:
    return int(getattr(fuse, "fuse_version_major", 2))


def library_version(fuse: Any) -> str:
    if not hasattr(fuse, "fuse_version_major"):
        return "2.x (fusepy)"
    return f"{fuse.fuse_version_major}.{fuse.fuse_version_minor}"


class Operations:
    """The filesystem: every callback resolves a path to a node of the mount source."""

    use_ns = True  # times in nanoseconds (mfusepy)

    def __init__(self, source: MountSource, fuse: Any, *, uid: int | None = None, gid: int | None = None,
                 umask: int = 0, mountpoint: str | None = None, read_ahead_kb: int = READ_AHEAD_KB) -> None:
        self.source = source
        self._fuse = fuse
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        # the permissions every file and directory shows (-o umask takes bits away; symlinks keep theirs)
        self.modes = {t: m if t == LINK else m & ~umask for t, m in _MODES.items()}
        self.mtime = source.mtime_ns
        self.mountpoint = mountpoint
        self.read_ahead_kb = read_ahead_kb
        self.handles: dict[int, tuple[Handle, str]] = {}  # fh -> (handle, path)
        # open directories: fh -> (node, listing or None)
        self.dirs: dict[int, tuple[int, Listing | None]] = {}
        self._fh = itertools.count(1)
        self._paths: dict[str, int] = {}  # path -> node, filled on lookup
        self.ready = threading.Event()  # set once the mount has answered a request
        self.on_ready: list[Callable[[], object]] = []  # callables run then (the daemon detaches its stderr)
        self.max_read = 0
        self.errors = 0
        self.splice = False  # answer reads with read_buf (set by serve on libfuse3)
        self.replies: Replies | None = None

    # --- helpers --------------------------------------------------------------------------------------
    def _err(self, code: int) -> Exception:
        err: Exception = self._fuse.FuseOSError(code)
        return err

    def _node(self, path: str) -> int:
        node = self._paths.get(path)
        if node is None:
            node = self.source.lookup(path[1:] if path.startswith("/") else path)
            if node is None:
                raise self._err(errno.ENOENT)
            if len(self._paths) > 200_000:
                self._paths.clear()
            self._paths[path] = node
        return node

    def attrs(self, node: int) -> dict[str, int]:
        src = self.source
        size = src.size(node)
        t = self.mtime
        return {
            "st_mode": self.modes[src.node_type(node)], "st_ino": src.inode(node), "st_nlink": src.nlink(node),
            "st_size": size, "st_uid": self.uid, "st_gid": self.gid, "st_atime": t, "st_mtime": t, "st_ctime": t,
            "st_blocks": (size + 511) // 512, "st_blksize": BLKSIZE,
        }

    # --- lifecycle ------------------------------------------------------------------------------------
    def init(self, path: str) -> None:
        """INIT from the kernel: the mount exists. A helper thread waits until it answers a request (our
        loop runs once init returns), then runs the ``on_ready`` hooks and raises the readahead."""
        log.debug("init: mounted at %s", self.mountpoint)
        if self.mountpoint:
            threading.Thread(target=self._after_mount, name="ckptfs-ready", daemon=True).start()
        else:
            self.ready.set()

    def init_with_config(self, conn: Any, config: Any) -> None:
        if conn is not None and self.max_read and hasattr(conn, "max_read"):
            conn.max_read = self.max_read  # libfuse3 refuses a max_read option that init does not repeat
        if conn is not None and self.splice and conn.capable & CAP_SPLICE_WRITE:
            conn.want |= CAP_SPLICE_WRITE  # replies naming a file descriptor are spliced, not copied
        self.init("/")

    def _after_mount(self) -> None:
        try:
            dev = os.stat(self.mountpoint).st_dev  # type: ignore[arg-type]
        except OSError as e:
            log.debug("the mount did not come up: %s", e)
            return
        self.ready.set()
        for fn in self.on_ready:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("ready hook failed")
        if self.read_ahead_kb and os.geteuid() == 0:
            self._raise_read_ahead(dev)

    def _raise_read_ahead(self, dev: int) -> None:
        """Raise this mount's bdi readahead (the kernel caps it at INIT, so only once the mount answers):
        libfuse3 then gets 1 MiB read requests instead of 128 KiB."""
        path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        try:
            with open(path, "w") as f:
                f.write(str(self.read_ahead_kb))
            log.debug("read_ahead_kb=%d for %s", self.read_ahead_kb, path)
        except OSError as e:
            log.debug("could not raise read_ahead_kb: %s", e)

    def destroy(self, path: str) -> None:
        log.debug("destroy: unmounting %s", self.mountpoint)

    # --- metadata -------------------------------------------------------------------------------------
    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        return self.attrs(self._node(path))

    def access(self, path: str, amode: int) -> int:
        self._node(path)
        if amode & os.W_OK:
            raise self._err(errno.EROFS)
        return 0

    def opendir(self, path: str) -> int:
        node = self._node(path)
        if self.source.node_type(node) != DIR:
            raise self._err(errno.ENOTDIR)
        fh = next(self._fh)
        self.dirs[fh] = (node, None)
        return fh

    def releasedir(self, path: str, fh: int) -> int:
        self.dirs.pop(fh, None)
        return 0

    def listing(self, fh: int) -> Listing:
        """An open directory's entries, "." and ".." first, made once per opendir (readdir comes back
        for every 4 KiB of entries), as far as readdir has asked."""
        node, entries = self.dirs.get(fh, (None, None))
        if node is None:
            raise self._err(errno.EBADF)
        if entries is None:
            src = self.source
            dots = [(".", node), ("..", src.parent(node) if node else node)]
            entries = Listing(itertools.chain(dots, src.listdir(node)))
            self.dirs[fh] = (node, entries)
        return entries

    def entry_attrs(self, node: int, plus: bool) -> dict[str, int]:
        """What a directory entry carries: mode and inode (d_ino 0 would hide the entry), or with ``plus``
        (READDIRPLUS) every attribute, so that ``ls -l`` needs no LOOKUP per entry."""
        if plus:
            return self.attrs(node)
        return {"st_mode": self.modes[self.source.node_type(node)], "st_ino": self.source.inode(node)}

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        """All entries at once (libfuse2 / fusepy: they buffer the listing themselves)."""
        return [(name, self.entry_attrs(child, False), 0) for name, child in self.listing(fh).all()]

    def readlink(self, path: str) -> str:
        node = self._node(path)
        if self.source.node_type(node) != LINK:
            raise self._err(errno.EINVAL)
        return self.source.readlink(node)

    def statfs(self, path: str) -> dict[str, int]:
        total = self.source.total_bytes()
        return {"f_bsize": BLKSIZE, "f_frsize": 4096, "f_blocks": (total + 4095) // 4096, "f_bfree": 0,
                "f_bavail": 0, "f_files": len(self.source), "f_ffree": 0, "f_favail": 0, "f_namemax": 255}

    def listxattr(self, path: str) -> list[str]:
        return list(self.source.xattrs(self._node(path)))

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        node = self._node(path)
        if not name.startswith("user."):  # security.*, system.* (ACLs), trusted.*: not supported here, and
            raise self._err(errno.EOPNOTSUPP)  # saying so lets ls -l stop asking for every file
        if not name.startswith("user.ckptfs."):
            raise self._err(ENOATTR)
        value = self.source.xattrs(node).get(name)
        if value is None:
            raise self._err(ENOATTR)
        return value

    # --- reading --------------------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        node = self._node(path)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise self._err(errno.EROFS)
        typ = self.source.node_type(node)
        if typ == DIR:
            raise self._err(errno.EISDIR)
        try:
            handle = self.source.open(node)
        except Exception as e:  # noqa: BLE001 - a stale or broken checkpoint: this file only
            self.errors += 1
            log.error("open %s: %s", path, e)
            raise self._err(errno.EIO) from None
        fh = next(self._fh)
        self.handles[fh] = (handle, path)
        return fh

    def read_into(self, fh: int, buf: Any, size: int, offset: int) -> int:
        """Fill libfuse's buffer ``buf`` (a ctypes pointer) with up to ``size`` bytes from ``offset``."""
        return self.read_at(fh, ctypes.addressof(buf.contents), size, offset)

    def read_at(self, fh: int, address: int, size: int, offset: int) -> int:
        """Fill ``size`` bytes of memory at ``address`` from ``offset``: the count, or -errno."""
        entry = self.handles.get(fh)
        if entry is None:
            return -errno.EBADF
        if size <= 0:
            return 0
        view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        try:
            return entry[0].readinto(view, offset)
        except Exception as e:  # noqa: BLE001 - EIO for this request; the daemon keeps serving
            self.errors += 1
            log.error("read %s [%d, +%d): %s", entry[1], offset, size, e)
            return -errno.EIO
        finally:
            view.release()

    def read_buf(self, path: Any, bufpp: Any, size: int, offset: int, fh: int) -> int:
        """libfuse3's ``read_buf``: hand libfuse a reply vector in ``bufpp[0]`` (it frees it). Bytes that lie
        in a local file are named by descriptor and position, and libfuse splices them; anything else is
        read into memory. 0, or -errno (then nothing is handed over)."""
        replies = self.replies
        entry = self.handles.get(fh)
        if entry is None or replies is None:
            return -errno.EBADF
        try:
            spans = entry[0].file_spans(offset, size)
        except Exception as e:  # noqa: BLE001 - EIO for this request; the daemon keeps serving
            self.errors += 1
            log.error("read %s [%d, +%d): %s", entry[1], offset, size, e)
            return -errno.EIO
        if spans is not None:
            bufpp[0] = replies.spans(spans)
            if log.isEnabledFor(logging.DEBUG):
                by_fd = sum(sp[2] for sp in spans if not isinstance(sp, bytes))
                literal = sum(len(sp) for sp in spans if isinstance(sp, bytes))
                log.debug("read %s [%d, +%d): %d bytes by file descriptor, %d literal", entry[1], offset, size, by_fd,
                          literal)
            return 0
        vec, mem = replies.memory(size)
        n = self.read_at(fh, mem, size, offset)
        if n < 0:
            replies.release(vec)
            return n
        replies.set_size(vec, n)
        bufpp[0] = vec
        if log.isEnabledFor(logging.DEBUG):
            log.debug("read %s [%d, +%d): %d bytes in memory", entry[1], offset, size, n)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """Makes the binding register its read callback; ZeroCopyFUSE.read serves it with read_into (this
        copying form only runs if a binding calls the operations' read itself)."""
        buf = (ctypes.c_char * max(size, 1))()
        n = self.read_into(fh, ctypes.cast(buf, ctypes.POINTER(ctypes.c_byte)), size, offset)
        if n < 0:
            raise self._err(-n)
        return buf.raw[:n]

    def release(self, path: str, fh: int) -> int:
        entry = self.handles.pop(fh, None)
        if entry is not None:
            entry[0].close()
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    # --- everything that writes: EROFS ---------------------------------------------------------------
    def _rofs(self, *args: Any, **kwargs: Any) -> int:
        raise self._err(errno.EROFS)

    chmod = chown = link = mkdir = mknod = rename = rmdir = symlink = truncate = unlink = _rofs
    utimens = write = setxattr = removexattr = fallocate = _rofs

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        raise self._err(errno.EROFS)


def make_fuse_class(fuse: Any) -> type:
    """The binding's FUSE class with a zero-copy ``read``: the handle preadv()s into libfuse's buffer."""

    class ZeroCopyFUSE(fuse.FUSE):
        operations: Operations
        def read(self, path: Any, buf: Any, size: int, offset: int, fip: Any) -> int:  # noqa: D102
            return self.operations.read_into(fip.contents.fh, buf, size, offset)

        def read_buf(self, path: Any, bufpp: Any, size: int, offset: int, fip: Any) -> int:  # noqa: D102
            return self.operations.read_buf(path, ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p)), size, offset,
                                            fip.contents.fh)

        def readdir_fuse_3(self, path: Any, buf: Any, filler: Any, offset: int, fip: Any, flags: int) -> int:
            """Entries from ``offset`` on, each with its offset (so libfuse passes READDIRPLUS attributes to
            the kernel: with FUSE_FILL_DIR_PLUS and full attributes, ``ls -l`` of a 40k-entry directory
            needs no LOOKUP per entry), until libfuse's buffer is full."""
            ops = self.operations
            plus = bool(flags & 1)  # FUSE_READDIR_PLUS
            entries = ops.listing(fip.contents.fh)
            st = fuse.c_stat()
            size = ctypes.sizeof(st)
            enc, errors = self.encoding, self.errors
            for i in itertools.count(offset):
                entry = entries.at(i)
                if entry is None:
                    break
                name, node = entry
                ctypes.memset(ctypes.byref(st), 0, size)
                dots = i < 2
                fuse.set_st_attrs(st, ops.entry_attrs(node, plus and not dots), use_ns=True)
                fill = 2 if plus and not dots else 0  # FUSE_FILL_DIR_PLUS
                if filler(buf, name.encode(enc, errors), st, i + 1, fill) != 0:
                    break
            return 0

    if fuse_major(fuse) != 3 or not hasattr(fuse, "set_st_attrs"):
        del ZeroCopyFUSE.readdir_fuse_3
    return ZeroCopyFUSE


def _dispatch(self: Operations, op: str, *args: Any) -> Any:
    fn = getattr(self, op, None)
    if fn is None:
        raise self._err(errno.ENOSYS)
    return fn(*args)


def traced(ops: Operations) -> Operations:
    """-d/--debug: log every FUSE call with its arguments and result (or error)."""
    names = ("getattr", "access", "opendir", "releasedir", "listing", "readdir", "readlink", "statfs", "listxattr",
             "getxattr", "open", "read_into", "release", "chmod", "chown", "link", "mkdir", "mknod", "rename", "rmdir",
             "symlink", "truncate", "unlink", "utimens", "write", "setxattr", "removexattr", "create", "init",
             "destroy")
    for name in names:
        fn = getattr(ops, name)

        def wrapper(*args: Any, _fn: Any = fn, _name: str = name) -> Any:
            shown = tuple("<buf>" if type(a).__name__.startswith("LP_") else a for a in args)
            try:
                res = _fn(*args)
            except OSError as e:
                log.debug("%s%r -> %s", _name, shown, errno.errorcode.get(e.errno or 0, e.errno))
                raise
            out = f"[{len(res)} entries]" if isinstance(res, list) and len(res) > 8 else res
            log.debug("%s%r -> %r", _name, shown, out)
            return res

        setattr(ops, name, wrapper)
    return ops


def fuse_options(fuse: Any, *, fsname: str, threads: bool, user: dict[str, Any]) -> dict[str, Any]:
    """Mount options: read-only, cached by the kernel (the source is immutable), our inode numbers, then
    the user's ``-o`` options (which win)."""
    opts: dict[str, Any] = {
        "ro": True, "default_permissions": True, "fsname": fsname, "subtype": "ckptfs", "kernel_cache": True,
        "use_ino": True, "entry_timeout": TIMEOUT, "attr_timeout": TIMEOUT, "negative_timeout": TIMEOUT,
    }
    opts.update(user)
    if fuse_major(fuse) == 3:
        opts.pop("nonempty", None)  # libfuse3 always allows it (and rejects the option)
        opts.pop("big_writes", None)
    return {"foreground": True, "nothreads": not threads, **opts}


def splice_wanted(fuse: Any, options: dict[str, Any]) -> bool:
    """Reads answered by splicing file pages (libfuse3 through mfusepy): on unless ``-o nosplice`` or
    CKPTFS_SPLICE=0. ``nosplice`` is ours: it is taken out of the options passed to libfuse."""
    off = bool(options.pop("nosplice", False)) or os.environ.get("CKPTFS_SPLICE", "1") == "0"
    return not off and fuse_major(fuse) == 3 and hasattr(fuse, "fuse_version_major")


def splice_max_read(capacity: int) -> int:
    """The largest read request whose reply, header and an unaligned first page included, fits a pipe of
    ``capacity`` bytes (libfuse copies replies that do not), or 0 when a 1 MiB request fits."""
    need = MAX_READ + 4 * PAGE
    if capacity >= need:
        return 0
    return max(PAGE, (capacity - 4 * PAGE) // PAGE * PAGE)


def serve(source: MountSource, mountpoint: str, fuse: Any, *, threads: bool = False, debug: bool = False,
          fsname: str = "ckptfs", options: dict[str, Any] | None = None,
          ops: Operations | None = None, splice: bool | None = None) -> Operations:
    """Mount ``source`` at ``mountpoint`` and serve until unmounted or signalled (SIGINT/SIGTERM/SIGHUP
    unmount cleanly: libfuse's handlers end the loop and fuse_main unmounts). Returns the operations."""
    ops = ops or Operations(source, fuse, mountpoint=mountpoint)
    if not hasattr(fuse, "fuse_version_major"):  # fusepy dispatches every call through operations(op, *args)
        ops.__class__ = type("FusepyOperations", (type(ops),), {"__call__": _dispatch})
    user = dict(options or {})
    wanted = splice_wanted(fuse, user)  # (takes our own option out of the user's)
    ops.splice = wanted if splice is None else splice and wanted
    if ops.splice:
        ops.replies = Replies((fuse_major(fuse), int(getattr(fuse, "fuse_version_minor", 0))))
        limit = splice_max_read(pipe_capacity(MAX_READ + 4 * PAGE))
        if limit and not ops.max_read and "max_read" not in user:
            ops.max_read = limit
            user["max_read"] = str(limit)
    else:
        ops.read_buf = None  # type: ignore[method-assign,assignment]  # libfuse then calls read
    if debug:
        traced(ops)
    kwargs = fuse_options(fuse, fsname=fsname, threads=threads, user=user)
    cls = make_fuse_class(fuse)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cls(ops, mountpoint, **kwargs)
    return ops
