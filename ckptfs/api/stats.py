"""Per-tensor statistics and histograms, streamed in chunks (``ckptfs stats``, ``Checkpoint.stats``).

Memory stays bounded whatever a tensor's size: values are decoded chunk by chunk
(:mod:`ckptfs.model.numeric`) and folded into running sums (counts, min/max, and mean and variance merged
with Chan et al.'s pairwise update in float64). What each number means:

* ``nan``, ``posinf``, ``neginf``, ``zeros`` (-0.0 is a zero), ``finite``: counts of elements. A complex
  element counts as NaN when a part is NaN and as infinite when a part is infinite (torch.isnan /
  torch.isinf); its ``posinf``/``neginf`` are None and ``inf`` holds the count.
* ``min``, ``max``: over every value but NaN (so -inf / inf when there are any); ``abs_max`` likewise.
  None for complex tensors (no order) and for tensors without a non-NaN value.
* ``mean``, ``std``: over the finite values, in float64; ``std`` with Bessel's correction (torch.std's
  default; None below two values). A complex mean is complex; its std is real.
* Integers' min and max are exact; bool's are False/True, its mean the fraction of True.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import CkptfsError, UnsupportedError
from ..model.catalog import Catalog
from ..model.index import TENSOR
from ..model.numeric import BOOL, CHUNK_BYTES, COMPLEX, FLOAT, INT, as_python, chunk_elements, decoding, values
from ..model.reader import TensorData
from ..model.tensors import NO_DATA_KINDS, numel
from ..pickle.nodes import TensorNode

Progress = Callable[[int], object]  # called with a count of bytes done


@dataclass
class TensorStats:
    """Statistics of one tensor (see the module doc for what each field means). ``error`` says why there
    are none (a tensor whose bytes cannot be read), ``note`` why some are missing (a dtype without
    arithmetic, a tensor without data)."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    numel: int
    kind: str | None = None  # float / complex / int / bool; None when the values are not decoded
    min: Any = None
    max: Any = None
    mean: Any = None
    std: float | None = None
    abs_max: Any = None
    nan: int = 0
    posinf: int | None = 0
    neginf: int | None = 0
    inf: int = 0
    zeros: int = 0
    finite: int = 0
    note: str | None = None
    error: str | None = None

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: non-finite floats as the strings "nan", "inf", "-inf"; a complex mean as [re, im]."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if name in ("note", "error") and v is None:
                continue
            out[name] = list(v) if name == "shape" else _json_number(v)
        return out


def _json_number(v: Any) -> Any:
    if isinstance(v, complex):
        return [_json_number(v.real), _json_number(v.imag)]
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


@dataclass
class _Moments:
    """Count, mean and sum of squared deviations, merged chunk by chunk (Chan, Golub & LeVeque)."""

    n: int = 0
    mean: Any = 0.0
    m2: float = 0.0

    def add(self, x: np.ndarray) -> None:
        nb = int(x.size)
        if not nb:
            return
        mb = x.mean()
        d = x - mb
        m2b = float(np.vdot(d, d).real)  # sum |x - mean|^2 (complex too)
        if self.n == 0:
            self.n, self.mean, self.m2 = nb, mb, m2b
            return
        n = self.n + nb
        delta = mb - self.mean
        self.mean = self.mean + delta * (nb / n)
        self.m2 += m2b + float(abs(delta)) ** 2 * (self.n * nb / n)
        self.n = n

    def std(self) -> float | None:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else None


@dataclass
class _Accumulator:
    kind: str
    lo: Any = None
    hi: Any = None
    abs_hi: Any = None
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    inf: int = 0
    zeros: int = 0
    finite: int = 0
    moments: _Moments = field(default_factory=_Moments)

    def add(self, v: np.ndarray) -> None:
        kind = self.kind
        if kind == FLOAT:
            fin = np.isfinite(v)
            nfin = int(np.count_nonzero(fin))
            f = v
            if nfin != v.size:
                self.nan += int(np.count_nonzero(np.isnan(v)))
                self.posinf += int(np.count_nonzero(v == np.inf))
                self.neginf += int(np.count_nonzero(v == -np.inf))
                f = v[fin]
            self._extremes(f)
            self.finite += nfin
            self.zeros += int(f.size - np.count_nonzero(f))
            self.moments.add(f.astype(np.float64))
        elif kind == COMPLEX:
            isnan, isinf = np.isnan(v), np.isinf(v)
            self.nan += int(np.count_nonzero(isnan))
            self.inf += int(np.count_nonzero(isinf))
            fin = ~(isnan | isinf)
            f = v if fin.all() else v[fin]
            self.finite += int(f.size)
            self.zeros += int(f.size - np.count_nonzero(f))
            notnan = v[~isnan] if isnan.any() else v
            if notnan.size:
                a = float(np.abs(notnan.astype(np.complex128)).max())
                self.abs_hi = a if self.abs_hi is None else max(self.abs_hi, a)
            self.moments.add(f.astype(np.complex128))
        else:  # ints, bools: every value finite
            self._extremes(v)
            self.finite += int(v.size)
            self.zeros += int(v.size - np.count_nonzero(v))
            self.moments.add(v.astype(np.float64))

    def repeat(self, rep: int) -> None:
        """As if every value added so far had been added ``rep`` times (mean, min, max unchanged)."""
        if rep == 1:
            return
        self.nan, self.posinf, self.neginf, self.inf = (self.nan * rep, self.posinf * rep, self.neginf * rep,
                                                        self.inf * rep)
        self.zeros, self.finite = self.zeros * rep, self.finite * rep
        self.moments.n *= rep
        self.moments.m2 *= rep

    def _extremes(self, f: np.ndarray) -> None:
        if not f.size:
            return
        lo, hi = as_python(f.min()), as_python(f.max())
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)

    def finish(self, s: TensorStats) -> None:
        s.kind = self.kind
        s.nan, s.zeros, s.finite = self.nan, self.zeros, self.finite
        m = self.moments
        if self.kind == COMPLEX:
            s.posinf = s.neginf = None
            s.inf = self.inf
            s.abs_max = self.abs_hi
            s.mean = complex(m.mean) if m.n else None
        else:
            lo, hi = self.lo, self.hi
            if self.kind == FLOAT:
                s.posinf, s.neginf, s.inf = self.posinf, self.neginf, self.posinf + self.neginf
                if self.neginf:
                    lo, hi = -math.inf, hi if hi is not None else -math.inf
                if self.posinf:
                    lo, hi = lo if lo is not None else math.inf, math.inf
                lo = None if lo is None else float(lo)
                hi = None if hi is None else float(hi)
            if self.kind == BOOL:
                lo = None if lo is None else bool(lo)
                hi = None if hi is None else bool(hi)
            s.min, s.max = lo, hi
            if lo is not None and hi is not None:
                s.abs_max = bool(hi) if self.kind == BOOL else max(abs(lo), abs(hi))
            s.mean = float(m.mean) if m.n else None
        s.std = m.std()


def _distinct(catalog: Catalog, row: int, data: TensorData) -> tuple[TensorData, int]:
    """The tensor with every broadcast dimension (stride 0, ``expand()``) cut to size 1, and how many times
    each of its elements is repeated in the whole: statistics of an expanded view cost its stored elements,
    not its shape (a 4 KiB file can declare a 4 TiB expanded view)."""
    t = data.t
    if t.stride is None or 0 in t.shape or not any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride, strict=True)):
        return data, 1
    u = t.copy()
    u.shape = tuple(1 if st == 0 else n for n, st in zip(t.shape, t.stride, strict=True))
    rep = math.prod(t.shape) // math.prod(u.shape)
    return catalog.node_data(u, catalog.index.keys[row]), rep


def tensor_stats(catalog: Catalog, row: int, *, chunk_bytes: int = CHUNK_BYTES,
                 progress: Progress | None = None) -> TensorStats:
    """Statistics of the tensor at ``row``. Raises CkptfsError when its bytes cannot be read."""
    index = catalog.index
    key = index.keys[row]
    node = index.nodes[row]
    if isinstance(node, TensorNode) and node.kind == "quantized" and node.unsupported and node.error is None:
        # quint4x2 / quint2x4: packed values, no arithmetic on their bytes (docs/cli.md: a note, not an error)
        s = TensorStats(key, node.dtype.name, tuple(node.shape), numel(node.shape))
        s.note = node.unsupported
        return s
    data = catalog.data(row)
    t = data.t
    s = TensorStats(key, t.dtype.name, tuple(t.shape), data.size // t.dtype.itemsize if t.dtype.itemsize else 0)
    if t.kind in NO_DATA_KINDS:
        s.note = f"a {t.kind} tensor has no data"
        return s
    try:
        dec = decoding(t, catalog.byteorder_of(t, row))
    except UnsupportedError as e:
        s.note = e.reason
        if progress is not None:
            progress(data.size)
        return s
    acc = _Accumulator(dec.kind)
    data, rep = _distinct(catalog, row, data)
    for _, v in values(data, dec, chunk_elements(chunk_bytes)):
        acc.add(v)
        if progress is not None:
            progress(v.size * dec.itemsize * rep)
    acc.repeat(rep)
    acc.finish(s)
    return s


def stats(catalog: Catalog, rows: Sequence[int] | None = None, *, chunk_bytes: int = CHUNK_BYTES,
          progress: Progress | None = None) -> Iterator[TensorStats]:
    """Statistics of each tensor row (all tensors in checkpoint order by default). A tensor whose bytes
    cannot be read gives a TensorStats with ``error`` set; the others are not affected."""
    index = catalog.index
    if rows is None:
        rows = index.tensors()
    for row in rows:
        if index.kinds[row] != TENSOR:
            continue
        try:
            yield tensor_stats(catalog, row, chunk_bytes=chunk_bytes, progress=progress)
        except CkptfsError as e:
            node = index.nodes[row]
            dtype = getattr(node, "dtype", None)
            shape = tuple(getattr(node, "shape", ()))
            n = 1
            for d in shape:
                n *= d
            yield TensorStats(index.keys[row], dtype.name if dtype is not None else "?", shape, n, error=str(e))


# --- histograms ------------------------------------------------------------------------------------------------


@dataclass
class Histogram:
    """Counts of a tensor's finite values in ``bins`` equal bins from ``edges[0]`` to ``edges[-1]`` (the last
    bin includes its right edge, as numpy.histogram's); NaN and infinite values are counted apart."""

    key: str
    edges: list[float]
    counts: list[int]
    nan: int
    inf: int

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "edges": self.edges, "counts": self.counts, "nan": self.nan, "inf": self.inf}


def histogram(catalog: Catalog, row: int, *, bins: int = 50, value_range: tuple[float, float] | None = None,
              chunk_bytes: int = CHUNK_BYTES, progress: Progress | None = None) -> Histogram:
    """The histogram of a real-valued tensor's finite values. Without ``value_range`` the range is the
    finite values' min and max (one more pass over the tensor)."""
    key = catalog.index.keys[row]
    data = catalog.data(row)
    t = data.t
    dec = decoding(t, catalog.byteorder_of(t, row))
    data, rep = _distinct(catalog, row, data)
    if dec.kind == COMPLEX:
        raise UnsupportedError("a histogram of complex values is not drawn (compare their real or imaginary "
                               "parts)", file=catalog.name, record=key)
    if bins < 1:
        raise CkptfsError(f"bins must be at least 1, not {bins}")
    n = chunk_elements(chunk_bytes)
    if value_range is None:
        lo = hi = None
        for _, v in values(data, dec, n):
            if progress is not None:
                progress(v.size * dec.itemsize * rep)
            f = v[np.isfinite(v)] if dec.kind == FLOAT else v
            if f.size:
                a, b = float(f.min()), float(f.max())
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
        value_range = (lo, hi) if lo is not None and hi is not None else (0.0, 1.0)
    lo, hi = value_range
    if lo == hi:  # numpy's rule for a range of one value
        lo, hi = lo - 0.5, hi + 0.5
    counts = np.zeros(bins, dtype=np.int64)
    nan = inf = 0
    edges = None
    for _, v in values(data, dec, n):
        if progress is not None:
            progress(v.size * dec.itemsize * rep)
        if dec.kind == FLOAT:
            nan += int(np.count_nonzero(np.isnan(v)))
            inf += int(np.count_nonzero(np.isinf(v)))
            v = v[np.isfinite(v)]
        c, edges = np.histogram(v.astype(np.float64), bins=bins, range=(lo, hi))
        counts += c
    if edges is None:
        edges = np.linspace(lo, hi, bins + 1)
    return Histogram(key, [float(e) for e in edges], [int(c) * rep for c in counts], nan * rep, inf * rep)


__all__ = ["BOOL", "COMPLEX", "FLOAT", "INT", "Histogram", "TensorStats", "histogram", "stats", "tensor_stats"]
