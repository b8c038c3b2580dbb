"""libfuse's reply buffers (``struct fuse_bufvec``) for the ``read_buf`` callback, built with ctypes.

A read answered with a buffer that names a file descriptor and a position (``FUSE_BUF_IS_FD |
FUSE_BUF_FD_SEEK``) lets libfuse ``splice`` the file's pages into a pipe and from the pipe into
/dev/fuse: the checkpoint's page cache goes to the kernel without passing through this process (no
``preadv`` into a user buffer, no ``writev`` that pins and copies that buffer page by page). A read that
must be computed is answered from memory, as before.

libfuse frees what ``read_buf`` hands over with ``free()``: the vector itself and every memory buffer in
it, so both are allocated with the C library's ``malloc``. The vector's entries are laid out inline
(``struct fuse_buf buf[1]`` is a flexible array); libfuse 3.17 added ``mem_size`` to ``struct fuse_buf``.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Sequence, Union

FUSE_BUF_IS_FD = 1 << 1
FUSE_BUF_FD_SEEK = 1 << 2
FUSE_BUF_FD_RETRY = 1 << 3  # libfuse loops on a short splice instead of finishing the reply by copying

_FD_FLAGS = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY

#: a span of a reply: ``(fd, position, length)`` of a local file, or bytes
Span = Union[tuple[int, int, int], bytes]

_libc = ctypes.CDLL(None, use_errno=True)
_malloc = _libc.malloc
_malloc.restype = ctypes.c_void_p
_malloc.argtypes = [ctypes.c_size_t]
_free = _libc.free
_free.restype = None
_free.argtypes = [ctypes.c_void_p]


def _buf_type(mem_size: bool) -> type[ctypes.Structure]:
    fields: list[tuple[str, type]] = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                                      ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]
    if mem_size:
        fields.append(("mem_size", ctypes.c_size_t))
    return type("fuse_buf", (ctypes.Structure,), {"_fields_": fields})


class _Header(ctypes.Structure):
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t)]


def _packer(cls: type[ctypes.Structure]) -> struct.Struct:
    """A struct.Struct laying out ``cls``'s fields at the offsets ctypes gives them (padding included), so a
    vector is packed in one call per entry instead of one ctypes attribute write per field."""
    fmt, pos = "=", 0
    for name, ctype in cls._fields_:  # type: ignore[misc]
        field = getattr(cls, name)
        fmt += "x" * (field.offset - pos)
        size = ctypes.sizeof(ctype)
        signed = ctype in (ctypes.c_int, ctypes.c_int64)
        fmt += {4: "i" if signed else "I", 8: "q" if signed else "Q"}[size]
        pos = field.offset + size
    return struct.Struct(fmt + "x" * (ctypes.sizeof(cls) - pos))


class Replies:
    """Makes the ``struct fuse_bufvec`` a ``read_buf`` callback returns, for one libfuse version."""

    def __init__(self, version: tuple[int, int]) -> None:
        self.buf_type = _buf_type(version >= (3, 17))
        self.entry = ctypes.sizeof(self.buf_type)
        self.header = ctypes.sizeof(_Header)
        self._pack_entry = _packer(self.buf_type)
        self._extra = (0,) * (len(self.buf_type._fields_) - 5)  # mem_size (libfuse >= 3.17): 0, ours
        self._pack_header = _packer(_Header)

    def _vector(self, count: int) -> int:
        size = self.header + max(count, 1) * self.entry
        addr = _malloc(size)
        if not addr:
            raise MemoryError("malloc failed")
        ctypes.memset(addr, 0, size)
        _Header.from_address(addr).count = count
        return addr

    def _entry(self, vec: int, i: int) -> ctypes.Structure:
        return self.buf_type.from_address(vec + self.header + i * self.entry)

    def spans(self, spans: Sequence[Span]) -> int:
        """A vector of file spans (spliced by libfuse) and literal bytes (copied into malloc'd memory)."""
        count = len(spans)
        packed = bytearray(self.header + max(count, 1) * self.entry)
        self._pack_header.pack_into(packed, 0, count, 0, 0)
        pack, extra = self._pack_entry.pack_into, self._extra
        mems: list[int] = []
        try:
            at = self.header
            for span in spans:
                if isinstance(span, bytes):
                    mem = 0
                    if span:
                        mem = _malloc(len(span))
                        if not mem:
                            raise MemoryError("malloc failed")
                        mems.append(mem)
                        ctypes.memmove(mem, span, len(span))
                    pack(packed, at, len(span), 0, mem, 0, 0, *extra)
                else:
                    fd, pos, n = span
                    pack(packed, at, n, _FD_FLAGS, 0, fd, pos, *extra)
                at += self.entry
            vec = _malloc(len(packed))
            if not vec:
                raise MemoryError("malloc failed")
        except BaseException:
            for mem in mems:
                _free(mem)
            raise
        ctypes.memmove(vec, bytes(packed), len(packed))
        return vec

    def memory(self, size: int) -> tuple[int, int]:
        """A vector of one memory buffer of ``size`` bytes to fill: (vector, buffer address). Set the count
        filled with :meth:`set_size`."""
        vec = self._vector(1)
        mem = _malloc(max(size, 1))
        if not mem:
            _free(vec)
            raise MemoryError("malloc failed")
        buf = self._entry(vec, 0)
        buf.mem, buf.size = mem, size
        return vec, mem

    def set_size(self, vec: int, size: int) -> None:
        self._entry(vec, 0).size = size

    def release(self, vec: int) -> None:
        """Free a vector that was not handed to libfuse (what libfuse's fuse_free_buf does)."""
        header = _Header.from_address(vec)
        for i in range(max(header.count, 1)):
            buf = self._entry(vec, i)
            if not buf.flags & FUSE_BUF_IS_FD and buf.mem:
                _free(buf.mem)
        _free(vec)


F_SETPIPE_SZ = 1031


def pipe_capacity(want: int) -> int:
    """The size of the largest pipe this process may make, up to ``want`` bytes: libfuse splices a reply
    through one pipe, header included, and copies a reply that does not fit. Above
    /proc/sys/fs/pipe-max-size (1 MiB by default) only CAP_SYS_RESOURCE may go: tried, not guessed."""
    import fcntl

    r, w = os.pipe()
    try:
        return int(fcntl.fcntl(r, F_SETPIPE_SZ, want))
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return min(want, int(f.read().strip()))
    except (OSError, ValueError):
        return min(want, 1 << 20)
