"""A tensor's logical bytes: what ``t.contiguous().numpy().tobytes()`` would give, planned as pieces.

A C-contiguous tensor is one byte range of its storage: its content is one range piece and a read is one
``pread``. Any other strided view (transposed, sliced, expanded with stride 0, channels_last) is a
computed piece, gathered with numpy from the storage bytes it touches, in blocks (never a Python loop per
element). Bytes are in the file's byte order, exactly as stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CkptfsError, LimitError, TensorError, UnsupportedError
from ..pickle.nodes import TensorNode
from ..source import ByteSource, FileRegion
from .extents import Computed, Content, Literal, Piece, source_range
from .tensors import NO_DATA_KINDS, STRIDED_KINDS, is_contiguous, nbytes, numel


class TensorData:
    """The logical bytes of one tensor, planned as pieces (:class:`~ckptfs.model.extents.Content`): a range
    of its storage when it is C-contiguous, its pickled bytes for an inline numpy array, a gather for any
    other strided view."""

    __slots__ = ("t", "storage", "size", "base", "contiguous", "inline", "file_name", "key", "_content")

    def __init__(self, t: TensorNode, storage: ByteSource | None, *, file_name: str = "", key: str = "") -> None:
        self.t = t
        self.file_name = file_name
        self.key = key
        self.size = nbytes(t)
        self.inline: bytes | None = None
        self.storage = storage
        self.base = 0
        self.contiguous = False
        if t.error is not None:
            raise self._fail(t.error)
        if t.kind in NO_DATA_KINDS:  # meta tensors, storage-less wrapper subclasses: nothing to read
            self.inline, self.contiguous = b"", True
        elif t.kind == "numpy" and t.extra and "inline" in t.extra and t.unsupported is None:
            self.inline = t.extra["inline"]
            self.contiguous = not t.extra.get("fortran_order") or len(t.shape) < 2
        elif t.unsupported is not None and (t.kind not in STRIDED_KINDS or t.kind == "quantized"):
            # (a quantized one is packed, quint4x2: its elements are not itemsize-byte strided ones)
            raise self._fail(t.unsupported, cls=UnsupportedError)
        elif t.kind not in STRIDED_KINDS:
            raise self._fail(f"{t.kind} tensors are not served")
        else:
            if storage is None:
                raise self._fail("storage record is not resolved")
            self.base = t.storage_offset * t.dtype.itemsize
            self.contiguous = is_contiguous(t.shape, t.stride)  # type: ignore[arg-type]
        self._content: Content | None = None

    @property
    def content(self) -> Content:
        """The pieces, planned on first use (a zero-copy map of a stored range needs none)."""
        c = self._content
        if c is None:
            c = self._content = Content(self._pieces())  # (a race plans it twice: harmless)
        return c

    def _pieces(self) -> list[Piece]:
        if self.size == 0:
            return []
        if self.contiguous:
            if self.inline is not None:
                return [Literal(self.inline[: self.size])]
            assert self.storage is not None
            return [source_range(self.storage, self.base, self.size)]
        sources = (self.storage,) if self.storage is not None else ()
        return [Computed(self.size, self._gather_into, "strided gather", sources)]

    def _fail(self, msg: str, cls: type[CkptfsError] = TensorError) -> CkptfsError:
        storage = self.t.storage
        record = None
        if storage is not None and storage.owner is not None:
            record = storage.owner.record_name(storage.key)
        where = f"{self.key} ({record})" if record and self.key else (self.key or record)
        return cls(msg, file=self.file_name, record=where)

    # --- public -----------------------------------------------------------------------------------------
    def read(self, offset: int = 0, size: int = -1) -> bytes:
        """Bytes [offset, offset + size) of the logical content (to the end when ``size`` < 0)."""
        if offset < 0:
            raise ValueError("negative offset")
        try:
            return self.content.read(offset, size)
        except MemoryError:  # e.g. a 4 TiB expanded view (stride 0) asked for whole
            raise self._fail(f"reading {size if size >= 0 else self.size - offset} bytes at once does not fit in "
                             "memory; read the tensor in ranges", cls=LimitError) from None

    def readinto(self, buf: memoryview, offset: int) -> int:
        """Fill ``buf`` with logical bytes from ``offset``; returns the count (short only at the end)."""
        return self.content.readinto(buf, offset)

    def region(self) -> FileRegion | None:
        """Where the whole tensor lies in a local file (it is one stored range): zero-copy maps, else None."""
        if not self.contiguous or self.inline is not None or self.storage is None or not self.size:
            return None
        r = self.storage.region()
        return None if r is None else FileRegion(r.file, r.offset + self.base)

    # --- strided gather -----------------------------------------------------------------------------------
    def _gather_into(self, out: memoryview, offset: int) -> None:
        """Logical bytes [offset, offset + len(out)) of a strided view, gathered (a Computed piece's fill)."""
        t = self.t
        itemsize = t.dtype.itemsize
        elem = _ELEMENT[itemsize]
        e0 = offset // itemsize
        e1 = -(-(offset + len(out)) // itemsize)
        skip = offset - e0 * itemsize
        if skip == 0 and (e1 - e0) * itemsize == len(out):
            self._gather_elements(e0, e1, np.frombuffer(out, dtype=elem))
            return
        tmp = np.empty(e1 - e0, dtype=elem)
        self._gather_elements(e0, e1, tmp)
        # an ndarray is a buffer (numpy's stubs declare __buffer__ for Python >= 3.12 only)
        out[:] = tmp.view(np.uint8)[skip : skip + len(out)]  # type: ignore[call-overload]

    def _gather_elements(self, e0: int, e1: int, dst: np.ndarray) -> None:
        """Logical elements [e0, e1) into ``dst`` (1-D, one element of the tensor's size per item).

        The view over the storage has the element's width as its dtype, so numpy's strided copy moves
        whole elements (a transposed float32 matrix copies 4-byte items, not 4 one-byte runs)."""
        t = self.t
        itemsize = t.dtype.itemsize
        shape, stride = t.shape, t.stride
        region = self.storage.region() if self.storage is not None else None
        buf: object
        if self.inline is not None:  # a Fortran-ordered numpy array: its storage is the pickled bytes
            buf, start = self.inline, t.storage_offset * itemsize
        elif region is not None:
            # the whole storage through the page cache (a read-only map: only the pages the view touches are
            # read, and a file larger than memory maps too)
            mapped, at = region.view()
            buf, start = mapped, at + t.storage_offset * itemsize
        else:  # deflated or remote: read the storage span of the rows this range touches
            inner = numel(shape[1:]) if shape else 1
            if shape and inner:
                i_lo, i_hi = e0 // inner, (e1 - 1) // inner
                shape = (i_hi - i_lo + 1,) + tuple(shape[1:])
                e0, e1 = e0 - i_lo * inner, e1 - i_lo * inner
                origin = t.storage_offset + i_lo * stride[0]  # type: ignore[index]
            else:
                origin = t.storage_offset
            assert self.storage is not None
            buf = self.storage.pread(origin * itemsize, (_span(shape, stride) + 1) * itemsize)  # type: ignore[arg-type]
            start = 0
        view = np.ndarray(tuple(shape), dtype=_ELEMENT[itemsize], buffer=buf, offset=start,
                          strides=tuple(s * itemsize for s in stride))  # type: ignore[union-attr]
        _copy_range(view, e0, e1, dst)


#: numpy types as wide as one element: strided copies move whole elements at once.
_ELEMENT: dict[int, np.dtype[Any]] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                                     8: np.dtype(np.uint64), 16: np.dtype((np.void, 16))}


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    return sum((s - 1) * st for s, st in zip(shape, stride, strict=False) if s > 0)


#: A last axis striding by at least this many bytes is copied in tiles of TILE columns: numpy walks the
#: destination in order, and a transposed source then lands on a new page for every element; tiles keep
#: the pages a copy touches few (2.4x faster on a transposed 4096x4096 float32 here).
TILE_STRIDE = 4096
TILE = 512


def _copy_block(src: np.ndarray, dst: np.ndarray) -> None:
    if src.ndim >= 2 and src.strides[-1] >= TILE_STRIDE and src.shape[-1] > TILE:
        for j in range(0, src.shape[-1], TILE):
            dst[..., j : j + TILE] = src[..., j : j + TILE]
    else:
        dst[...] = src


def _copy_range(view: np.ndarray, e0: int, e1: int, dst: np.ndarray) -> None:
    """Logical (C-order) elements [e0, e1) of ``view`` into the 1-D ``dst``: whole sub-arrays in one
    numpy copy, and at most two partial ones per dimension."""
    shape = view.shape
    if len(shape) == 0:
        dst[0] = view
        return
    inner = numel(shape[1:])
    if inner == 0:
        return
    i0, r0 = divmod(e0, inner)
    i1, r1 = divmod(e1, inner)
    pos = 0
    if r0:
        end = inner if i1 > i0 else r1
        _copy_range(view[i0], r0, end, dst[pos : pos + end - r0])
        pos += end - r0
        i0 += 1
        if i1 < i0:
            return
    if i1 > i0:
        n = (i1 - i0) * inner
        _copy_block(view[i0:i1], dst[pos : pos + n].reshape(view[i0:i1].shape))
        pos += n
    if r1 and i1 < shape[0]:
        _copy_range(view[i1], 0, r1, dst[pos : pos + r1])
