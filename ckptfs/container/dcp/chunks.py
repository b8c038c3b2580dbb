"""A tensor saved in chunks (FSDP / DTensor shards, in one file or several) as ONE tensor's bytes.

:func:`check_tiling` checks, from the metadata alone, that the chunks tile the tensor exactly: every chunk
inside the tensor, no two overlapping, no element left out. :class:`ChunkedTensor` is a byte source whose
bytes are the whole tensor's logical (C-order) bytes, assembled from the chunks' own bytes on each read:

* when every chunk is one run of the logical order (a slab along one dimension: ``Shard(0)``) and is stored
  contiguously, the tensor is a list of ranges of the chunks' records, read with ``preadinto`` straight into
  the caller's buffer;
* otherwise (``Shard(1)``, 2-D meshes, a chunk saved as a strided view) a read is cut into at most two
  boxes per dimension, and each chunk's part of each box is copied with numpy from the chunk's bytes: from
  the page cache (a local, stored record) or from a read of just the rows it needs. Memory is bounded by the
  read, not the tensor.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...errors import FormatError
from ...source import ByteSource, FileRegion, Identity

#: Most cells the overlap check may lay out (distinct chunk boundaries multiplied over the dimensions).
MAX_GRID_CELLS = 1 << 24
_ELEMENT: dict[int, np.dtype[Any]] = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
                                     8: np.dtype(np.uint64), 16: np.dtype((np.void, 16))}


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def check_tiling(shape: tuple[int, ...], chunks: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]) -> str | None:
    """Why the chunks ``(offsets, sizes)`` do not tile ``shape`` exactly, or None when they do.

    Cost: O(n log n) for n slabs along one dimension (what FSDP and ``Shard(d)`` write); otherwise at most
    the cells between all chunk boundaries (``MAX_GRID_CELLS``) plus n: a metadata file listing thousands of
    nested or overlapping chunks costs no more than a valid tiling with as many boundaries."""
    nd = len(shape)
    if len(chunks) == 1 and chunks[0][1] == shape and not any(chunks[0][0]):
        return None  # the common case: saved whole
    for offsets, sizes in chunks:
        if len(offsets) != nd or len(sizes) != nd:
            return f"a chunk at offsets {list(offsets)} has {len(sizes)} dimensions, the tensor {nd}"
        for o, z, s in zip(offsets, sizes, shape, strict=True):
            if o < 0 or z < 0 or o + z > s:
                return f"the chunk at offsets {list(offsets)} with sizes {list(sizes)} runs past the shape {list(shape)}"
    full = [c for c in chunks if _numel(c[1])]
    if nd == 0:
        return None if len(full) == 1 else ("no chunk holds the scalar" if not full else
                                            f"{len(full)} chunks all hold the scalar (overlapping)")
    if _numel(shape) == 0:
        return None
    for d in range(nd):
        if all(off[e] == 0 and size[e] == shape[e] for off, size in full for e in range(nd) if e != d):
            return _check_slabs(shape, full, d)
    volume = sum(_numel(size) for _, size in full)
    # cells between all chunk boundaries: each one is inside or outside each chunk, so counting how many
    # chunks hold each cell finds overlaps and holes exactly
    bounds = [sorted({0, s, *(c[0][d] for c in full), *(c[0][d] + c[1][d] for c in full)}) for d, s in enumerate(shape)]
    cells = 1
    for b in bounds:
        cells *= len(b) - 1
    if cells > MAX_GRID_CELLS:
        if volume != _numel(shape):
            return _volume_problem(shape, volume)
        return f"too many chunk boundaries to check ({cells} cells)"
    count = np.zeros([len(b) - 1 for b in bounds], dtype=np.uint8)
    touched = 0
    for offsets, sizes in full:
        box = tuple(slice(bisect.bisect_left(b, o), bisect.bisect_left(b, o + z))
                    for b, o, z in zip(bounds, offsets, sizes, strict=True))
        n = 1
        for sl in box:
            n *= sl.stop - sl.start
        touched += n
        count[box] += 1
        if touched > cells:  # more cells counted than there are: one of them twice (and no more work)
            break
    over = count > 1
    if over.any():
        at = [bounds[d][int(i)] for d, i in enumerate(np.argwhere(over)[0])]
        return f"chunks overlap (at element {at})"
    empty = count < 1
    if empty.any():
        at = [bounds[d][int(i)] for d, i in enumerate(np.argwhere(empty)[0])]
        return f"the chunks leave a hole (element {at} is in none of them)"
    return None


def _check_slabs(shape: tuple[int, ...], full: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], d: int) -> str | None:
    """Slabs along dimension ``d`` (each spans every other dimension): in order, each begins where the one
    before ended."""
    def element(i: int) -> list[int]:
        return [i if e == d else 0 for e in range(len(shape))]

    pos = 0
    for off, size in sorted(full, key=lambda c: (c[0][d], c[1][d])):
        if off[d] != pos:
            return (f"chunks overlap (at element {element(off[d])})" if off[d] < pos else
                    f"the chunks leave a hole (element {element(pos)} is in none of them)")
        pos += size[d]
    return None if pos == shape[d] else f"the chunks leave a hole (element {element(pos)} is in none of them)"


def _volume_problem(shape: tuple[int, ...], volume: int) -> str:
    total = _numel(shape)
    return (f"chunks overlap (they hold {volume} elements of a tensor of {total})" if volume > total else
            f"the chunks leave a hole (they hold {volume} elements of a tensor of {total})")


@dataclass
class ChunkData:
    """One chunk's elements: where it sits in the tensor, and where its bytes are (a strided view of
    ``source``: element ``(i, j, ...)`` at byte ``base + (i * strides[0] + ...) * itemsize``)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    source: ByteSource
    base: int
    strides: tuple[int, ...]
    label: str

    @property
    def contiguous(self) -> bool:
        acc = 1
        for s, st in zip(reversed(self.sizes), reversed(self.strides), strict=True):
            if s != 1 and st != acc:
                return False
            acc *= s
        return True


def _run_start(shape: tuple[int, ...], c: ChunkData) -> int | None:
    """The chunk's first element in the tensor's logical order if the chunk is one run of it (a slab:
    leading dimensions of size 1, then a range of one dimension, then whole dimensions), else None."""
    nd = len(shape)
    k = 0
    while k < nd and c.sizes[k] == 1 and shape[k] != 1:
        k += 1
    for d in range(k + 1, nd):
        if c.offsets[d] != 0 or c.sizes[d] != shape[d]:
            return None
    start = 0
    for d in range(nd):
        start = start * shape[d] + c.offsets[d]
    return start


class ChunkedTensor:
    """The logical bytes of a tensor of ``shape`` made of ``chunks`` (which tile it: see check_tiling)."""

    def __init__(self, name: str, label: str, shape: tuple[int, ...], itemsize: int, chunks: list[ChunkData]) -> None:
        self.name = name
        self.label = label
        self.shape = shape
        self.itemsize = itemsize
        self.chunks = [c for c in chunks if _numel(c.sizes)]
        self.size = _numel(shape) * itemsize
        self.read_size = 1 << 20
        self._sources = list({id(c.source): c.source for c in self.chunks}.values())
        self._lock = threading.Lock()
        # ranges when every chunk is a contiguous run: (logical byte start, bytes, chunk)
        self.runs: list[tuple[int, int, ChunkData]] | None = None
        runs = []
        for c in self.chunks:
            start = _run_start(shape, c)
            if start is None or not c.contiguous:
                break
            runs.append((start * itemsize, _numel(c.sizes) * itemsize, c))
        else:
            runs.sort(key=lambda r: r[0])
            self.runs = runs
            self._starts = [r[0] for r in runs]

    @property
    def assembly(self) -> str:
        """How reads are served: "ranges" (each chunk a range of a record) or "gather"."""
        return "ranges" if self.runs is not None else "gather"

    # --- reading ------------------------------------------------------------------------------------
    def pread(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        out = bytearray(n)
        if n:
            self.preadinto(memoryview(out), offset)
        return bytes(out)

    def preadinto(self, buf: memoryview, offset: int) -> int:
        if offset < 0:
            raise ValueError("negative offset")
        n = max(0, min(len(buf), self.size - offset))
        if n == 0:
            return 0
        if self.runs is not None:
            self._ranges_into(buf[:n], offset)
        else:
            self._gather_into(buf[:n], offset)
        return n

    def _ranges_into(self, buf: memoryview, offset: int) -> None:
        runs, starts = self.runs, self._starts
        assert runs is not None
        i = bisect.bisect_right(starts, offset) - 1
        done, n = 0, len(buf)
        while done < n:
            start, length, c = runs[i]
            inner = offset + done - start
            k = min(length - inner, n - done)
            if c.source.preadinto(buf[done : done + k], c.base + inner) != k:
                raise FormatError(f"chunk data is truncated ({c.label})", file=self.name, record=self.label)
            done += k
            i += 1

    def _gather_into(self, buf: memoryview, offset: int) -> None:
        itemsize = self.itemsize
        elem = _ELEMENT[itemsize]
        e0 = offset // itemsize
        e1 = -(-(offset + len(buf)) // itemsize)
        skip = offset - e0 * itemsize
        direct = skip == 0 and (e1 - e0) * itemsize == len(buf)
        dst = np.frombuffer(buf, dtype=elem) if direct else np.empty(e1 - e0, dtype=elem)
        for prefix, k, a, b, pos in _boxes(self.shape, e0, e1):
            box_shape = (b - a,) + self.shape[k + 1 :]
            box = dst[pos - e0 : pos - e0 + _numel(box_shape)].reshape(box_shape)
            for c in self.chunks:
                self._copy(c, prefix, k, a, b, box)
        if not direct:
            buf[:] = dst.view(np.uint8)[skip : skip + len(buf)]  # type: ignore[call-overload]

    def _copy(self, c: ChunkData, prefix: tuple[int, ...], k: int, a: int, b: int, box: np.ndarray) -> None:
        """Copy the part of chunk ``c`` inside the box (``prefix`` fixed, [a, b) along ``k``, later dims whole)."""
        for d, p in enumerate(prefix):
            if not c.offsets[d] <= p < c.offsets[d] + c.sizes[d]:
                return
        nd = len(self.shape)
        if k < nd:
            lo, hi = max(a, c.offsets[k]), min(b, c.offsets[k] + c.sizes[k])
            if lo >= hi:
                return
        # the chunk's part: local index ranges per dimension
        local = [(p - c.offsets[d], p - c.offsets[d] + 1) for d, p in enumerate(prefix)]
        if k < nd:
            local.append((lo - c.offsets[k], hi - c.offsets[k]))
            local += [(0, c.sizes[d]) for d in range(k + 1, nd)]
        src = self._chunk_view(c, local)
        if k >= nd:  # a scalar / one element
            box.reshape(-1)[:1] = src.reshape(-1)[:1]
            return
        src = src.reshape((hi - lo,) + tuple(c.sizes[k + 1 :]))
        target = (slice(lo - a, hi - a),) + tuple(slice(c.offsets[d], c.offsets[d] + c.sizes[d])
                                                  for d in range(k + 1, nd))
        box[target] = src

    def _chunk_view(self, c: ChunkData, local: list[tuple[int, int]]) -> np.ndarray:
        """The chunk's elements in the index ranges ``local`` (one per dimension) as an array (a view of the
        page cache for a local stored record; else the span they lie in, read)."""
        itemsize = self.itemsize
        first = sum(lo * st for (lo, _hi), st in zip(local, c.strides, strict=True))
        last = first + sum((hi - lo - 1) * st for (lo, hi), st in zip(local, c.strides, strict=True))
        shape = tuple(hi - lo for lo, hi in local)
        strides = tuple(st * itemsize for st in c.strides)
        region = c.source.region()
        if region is not None:
            mapped, at = region.mapping()
            buf: Any = mapped
            start = at + c.base + first * itemsize
        else:
            span = (last - first + 1) * itemsize
            buf = c.source.pread(c.base + first * itemsize, span)
            if len(buf) != span:
                raise FormatError(f"chunk data is truncated ({c.label})", file=self.name, record=self.label)
            start = 0
        view: np.ndarray = np.ndarray(shape, dtype=_ELEMENT[itemsize], buffer=buf, offset=start, strides=strides)
        return view

    # --- abilities ----------------------------------------------------------------------------------
    def identity(self) -> Identity:
        return self._sources[0].identity() if self._sources else Identity("memory", (id(self),), self.size)

    def check_unchanged(self, thorough: bool = True) -> None:
        for s in self._sources:
            s.check_unchanged(thorough)

    def region(self) -> FileRegion | None:
        return None

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        return None

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"ChunkedTensor({self.label!r}, {len(self.chunks)} chunks, {self.assembly})"


def _boxes(shape: tuple[int, ...], e0: int, e1: int) -> list[tuple[tuple[int, ...], int, int, int, int]]:
    """Logical elements [e0, e1) as boxes ``(prefix, k, a, b, first element)``: indices ``prefix`` in the
    first dimensions, [a, b) along dimension ``k``, every index of the later ones; each box is a run of the
    logical order, and together they are [e0, e1) in order. A scalar is one box with k = 0 = ndim."""
    out: list[tuple[tuple[int, ...], int, int, int, int]] = []
    if not shape:
        if e0 == 0 < e1:
            out.append(((), 0, 0, 1, 0))
        return out

    def rec(prefix: tuple[int, ...], dim: int, lo: int, hi: int, pos: int) -> None:
        inner = _numel(shape[dim + 1 :])
        if inner == 0 or lo >= hi:
            return
        i0, r0 = divmod(lo, inner)
        i1, r1 = divmod(hi, inner)
        if r0:
            end = inner if i1 > i0 else r1
            rec(prefix + (i0,), dim + 1, r0, end, pos)
            pos += end - r0
            i0 += 1
            if i1 < i0:
                return
        if i1 > i0:
            out.append((prefix, dim, i0, i1, pos))
            pos += (i1 - i0) * inner
        if r1 and i1 < shape[dim]:
            rec(prefix + (i1,), dim + 1, 0, r1, pos)

    rec((), 0, e0, e1, e0)
    return out
