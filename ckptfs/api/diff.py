"""Comparing two checkpoints key by key (``ckptfs diff``, ``ckptfs.diff``): results, never printing.

Any two things ckptfs opens are compared as key spaces (dotted keys): keys only in A or only in B, entries
whose kind, dtype or shape changed, non-tensor values that changed, and for tensors in both:

* **identical** — same bytes. Found without reading when both are the same range of the same file (the
  same identity: a file against itself, hard links, a checkpoint and a view of it), else by comparing the
  stored bytes chunk by chunk; equal chunks are never decoded.
* **equal** — bytes differ but every value is equal: signed zeros (-0.0 vs 0.0), NaN payloads, another
  byte order, a conjugate bit resolved. Counted as the same unless ``exact``.
* **close** — values differ, all within ``|a - b| <= atol + rtol * |b|`` (float and complex values;
  numpy.isclose's rule with B as the reference; NaN equals NaN, an infinity equals only itself).
* **different** — with the count of differing elements, the largest absolute difference and where it is,
  and the largest relative difference ``|a - b| / |b|``.

Values are decoded by :mod:`ckptfs.model.numeric` (bf16, float8, complex32, quantized: exact), differences
computed in float64 / complex128 chunk by chunk: memory stays bounded whatever the tensors' sizes. A
tensor whose dtype changed (float32 -> bfloat16) is reported as such, with the value differences too when
the shapes match. Keys only in A and only in B whose dtype, shape and bytes match are reported as renamed.
One tensor that cannot be read is an ``error`` entry; the rest are still compared. So is a file of a directory
that could not be opened (``Catalog.problems``: a damaged member of a directory of checkpoints, a refused
symlink): its keys are unknown, so the comparison is incomplete whatever the rest says.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import CkptfsError, UnsupportedError, brief
from ..model.catalog import Catalog
from ..model.index import COMPOSITE, LEAF, LEAF_TYPES, LINK, TENSOR
from ..model.numeric import (
    BOOL,
    CHUNK_BYTES,
    INT,
    Decoding,
    as_python,
    chunk_elements,
    chunks,
    decoding,
    placement,
    unravel,
)
from ..model.reader import TensorData
from ..model.tensors import NO_DATA_KINDS
from ..pickle.nodes import TensorNode

Progress = Callable[[int], object]  # called with a count of bytes done

#: statuses that mean "the same" (``equal`` only without ``exact``)
SAME = ("identical", "equal", "close")
#: statuses that mean "different"
DIFFERENT = ("different", "dtype", "shape", "kind", "value", "only_a", "only_b", "renamed")
#: a tensor whose bytes are not served (a kind ckptfs does not serve): not compared, not an error
SKIPPED = "skipped"
ERROR = "error"


@dataclass(frozen=True)
class DiffOptions:
    atol: float = 0.0
    rtol: float = 0.0
    exact: bool = False  # any byte difference counts (``equal`` is a difference)
    renames: bool = True  # pair keys only in A with keys only in B holding the same bytes
    patterns: tuple[str, ...] = ()  # compare only keys matching these globs (after prefixes are removed)
    a_prefix: str = ""  # compare only A's keys under this prefix, without it
    b_prefix: str = ""
    chunk_bytes: int = CHUNK_BYTES
    tensors_only: bool = False  # compare tensors only: values (epoch, lr ...) and links are left out


@dataclass
class DiffEntry:
    """One key compared. ``status``: identical, equal, close, different, dtype, shape, kind, value,
    only_a, only_b, renamed (``key`` is B's key, ``renamed_from`` A's), skipped or error. An error with
    ``left_out`` ("a" or "b") is a file of that side's directory that could not be opened: ``key`` is its path
    in the directory, ``error`` why."""

    key: str
    status: str
    kind_a: str | None = None  # tensor / value / composite / link
    kind_b: str | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    numel: int | None = None
    n_different: int | None = None  # elements whose values differ (beyond the tolerance for close/different)
    max_abs: Any = None  # largest |a - b|
    at: list[int] | None = None  # where it is
    max_rel: float | None = None  # largest |a - b| / |b|
    nan_mismatch: int | None = None  # elements NaN on one side only
    nan_at: list[int] | None = None  # the first of them
    values: str | None = None  # dtype changed: are the values "equal", "close" (within atol/rtol) or "different"
    how: str | None = None  # identical: "same storage" / "compared"; equal: why the bytes differ
    value_a: str | None = None  # non-tensor values (a short repr)
    value_b: str | None = None
    renamed_from: str | None = None
    error: str | None = None
    left_out: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (fields that are set; non-finite floats as "inf"/"nan")."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, float) and not math.isfinite(v):
                v = repr(v)
            out[name] = v
        return out


@dataclass
class DiffSummary:
    a: str
    b: str
    counts: Counter[str] = field(default_factory=Counter)
    bytes_compared: int = 0  # tensor bytes read from both sides
    exact: bool = False

    def add(self, e: DiffEntry) -> None:
        self.counts[e.status] += 1

    @property
    def errors(self) -> int:
        return self.counts[ERROR]

    @property
    def differences(self) -> int:
        return sum(self.counts[s] for s in DIFFERENT) + (self.counts["equal"] if self.exact else 0)

    @property
    def identical(self) -> bool:
        """No difference (and no error)."""
        return not self.differences and not self.errors


def is_difference(e: DiffEntry, exact: bool = False) -> bool:
    return e.status in DIFFERENT or exact and e.status == "equal"


# --- the comparison ---------------------------------------------------------------------------------------------


class Comparison:
    """``for entry in Comparison(a, b, options): ...`` compares lazily (entries for keys in both sides come
    as they are compared, then renames, keys only in A, keys only in B); ``summary`` is complete once the
    iteration ends. ``total_bytes()`` is what the progress callback will be told, in all."""

    def __init__(self, a: Catalog, b: Catalog, options: DiffOptions = DiffOptions(),
                 progress: Progress | None = None) -> None:
        self.a, self.b = a, b
        self.options = options
        self.progress = progress
        self.summary = DiffSummary(a.name, b.name, exact=options.exact)
        self._keys_a = _selected(a, options.a_prefix, options.patterns, options.tensors_only)
        self._keys_b = _selected(b, options.b_prefix, options.patterns, options.tensors_only)
        self._identities: dict[int, tuple[object, ...]] = {}
        self._elements = chunk_elements(options.chunk_bytes)

    def selected(self) -> tuple[int, int]:
        """How many of A's and of B's keys the options select for comparison."""
        return len(self._keys_a), len(self._keys_b)

    def key_width(self) -> int:
        """The longest key compared (for aligned output)."""
        return max((len(k) for k in (*self._keys_a, *self._keys_b)), default=0)

    def total_bytes(self) -> int:
        """Tensor bytes the comparison may read: A's side of keys in both (B's is counted as it goes), and the
        rename candidates."""
        total = 0
        ia, ib = self.a.index, self.b.index
        for key, row in self._keys_a.items():
            if ia.kinds[row] == TENSOR:
                other = self._keys_b.get(key)
                if other is not None and ib.kinds[other] == TENSOR:
                    total += _nbytes(ia.nodes[row])
        return total

    def __iter__(self) -> Iterator[DiffEntry]:
        for side, cat in (("a", self.a), ("b", self.b)):
            for name, err in cat.problems:  # files of a directory that could not be opened: keys unknown
                left_out = DiffEntry(name, ERROR, error=err.reason, left_out=side)
                self.summary.add(left_out)
                yield left_out
        ka, kb = self._keys_a, self._keys_b
        for key, ra in ka.items():
            rb = kb.get(key)
            if rb is None:
                continue
            e = self._compare_rows(key, ra, rb)
            if e is not None:
                self.summary.add(e)
                yield e
        only_a = [k for k in ka if k not in kb]
        only_b = [k for k in kb if k not in ka]
        renamed: dict[str, str] = self._renames(only_a, only_b) if self.options.renames else {}
        taken = set(renamed.values())
        for kb_key, ka_key in renamed.items():
            ra, rb = ka[ka_key], kb[kb_key]
            t = self.b.index.nodes[rb]
            assert isinstance(t, TensorNode)  # rename candidates are tensors
            e = DiffEntry(kb_key, "renamed", "tensor", "tensor", t.dtype.name, t.dtype.name, tuple(t.shape),
                          tuple(t.shape), renamed_from=ka_key)
            self.summary.add(e)
            yield e
        for key in only_a:
            if key in taken:
                continue
            e = self._one_side(key, ka[key], self.a, "only_a")
            if e is not None:
                self.summary.add(e)
                yield e
        for key in only_b:
            if key in renamed:
                continue
            e = self._one_side(key, kb[key], self.b, "only_b")
            if e is not None:
                self.summary.add(e)
                yield e

    # --- one key --------------------------------------------------------------------------------------------
    def _one_side(self, key: str, row: int, cat: Catalog, status: str) -> DiffEntry | None:
        kind = _kind(cat, row)
        e = DiffEntry(key, status)
        node = cat.index.nodes[row]
        if status == "only_a":
            e.kind_a = kind
        else:
            e.kind_b = kind
        if isinstance(node, TensorNode):
            if status == "only_a":
                e.dtype_a, e.shape_a = node.dtype.name, tuple(node.shape)
            else:
                e.dtype_b, e.shape_b = node.dtype.name, tuple(node.shape)
        elif kind == "value":
            if status == "only_a":
                e.value_a = _show(node)
            else:
                e.value_b = _show(node)
        return e

    def _compare_rows(self, key: str, ra: int, rb: int) -> DiffEntry | None:
        a, b = self.a, self.b
        ka, kb = _kind(a, ra), _kind(b, rb)
        na, nb = a.index.nodes[ra], b.index.nodes[rb]
        e = DiffEntry(key, "identical", ka, kb)
        if isinstance(na, TensorNode):
            e.dtype_a, e.shape_a = na.dtype.name, tuple(na.shape)
        if isinstance(nb, TensorNode):
            e.dtype_b, e.shape_b = nb.dtype.name, tuple(nb.shape)
        if ka != kb:
            e.status = "kind"
            if ka == "value":
                e.value_a = _show(na)
            if kb == "value":
                e.value_b = _show(nb)
            return e
        if ka == "value":
            if not _same_value(na, nb):
                e.status, e.value_a, e.value_b = "value", _show(na), _show(nb)
            return e
        if ka == "link":
            ta, tb = self._link_target(a, na, self.options.a_prefix), self._link_target(b, nb, self.options.b_prefix)
            if ta != tb:
                e.status, e.value_a, e.value_b = "value", f"-> {ta}", f"-> {tb}"
            return e
        assert isinstance(na, TensorNode) and isinstance(nb, TensorNode)
        if ka == "composite":  # its parts are compared as tensors of their own; here its description
            if na.kind != nb.kind or (na.extra or {}).get("layout") != (nb.extra or {}).get("layout"):
                e.status = "kind"
                e.how = f"{na.kind} -> {nb.kind}"
            elif na.dtype.name != nb.dtype.name:
                e.status = "dtype"
            elif na.shape != nb.shape:
                e.status = "shape"
            else:
                return None
            return e
        return self._compare_tensors(e, ra, rb, na, nb)

    def _link_target(self, cat: Catalog, target: object, prefix: str) -> str:
        key = cat.index.keys[target] if isinstance(target, int) else str(target)
        return _strip(key, prefix) or key

    def _compare_tensors(self, e: DiffEntry, ra: int, rb: int, ta: TensorNode, tb: TensorNode) -> DiffEntry:
        a, b = self.a, self.b
        if ta.shape != tb.shape:
            e.status = "shape"
            self._skip_progress(ta)
            return e
        e.numel = _numel(ta.shape)
        if ta.kind in NO_DATA_KINDS or tb.kind in NO_DATA_KINDS:
            if ta.kind != tb.kind:
                e.status, e.how = "kind", f"{ta.kind} -> {tb.kind}"
            elif ta.dtype.name != tb.dtype.name:
                e.status = "dtype"
            else:
                e.how = f"{ta.kind} tensors (no data)"
            return e
        try:
            da = a.data(ra)
            db = b.data(rb)
        except UnsupportedError as err:
            e.status, e.error = SKIPPED, err.reason
            self._skip_progress(ta)
            return e
        except CkptfsError as err:
            e.status, e.error = ERROR, str(err)
            self._skip_progress(ta)
            return e
        try:
            return self._compare_data(e, ra, rb, da, db)
        except CkptfsError as err:
            e.status, e.error = ERROR, str(err)
            for k in ("n_different", "max_abs", "at", "max_rel", "nan_mismatch", "nan_at", "how"):
                setattr(e, k, None)
            return e

    def _compare_data(self, e: DiffEntry, ra: int, rb: int, da: TensorData, db: TensorData) -> DiffEntry:
        a, b = self.a, self.b
        ta, tb = da.t, db.t
        same_dtype = ta.dtype.name == tb.dtype.name
        if not same_dtype:
            e.status = "dtype"
        try:
            deca: Decoding | None = decoding(ta, a.byteorder_of(ta, ra))
            decb: Decoding | None = decoding(tb, b.byteorder_of(tb, rb))
        except UnsupportedError as err:
            deca = decb = None
            if not same_dtype:  # no values to compare across dtypes
                e.how = err.reason
                self._skip_progress(ta)
                return e
        if same_dtype:
            pa = placement(da, self._identities)
            if pa is not None and pa == placement(db, self._identities) and \
                    (deca is None or decb is None or deca.signature == decb.signature):
                e.how = "same storage"
                self._skip_progress(ta)
                return e
        if deca is None or decb is None:
            return self._compare_bytes(e, da, db)
        return self._compare_values(e, da, db, deca, decb, bytes_first=same_dtype and deca.signature == decb.signature)

    def _compare_bytes(self, e: DiffEntry, da: TensorData, db: TensorData) -> DiffEntry:
        """Dtypes without a numeric decoding (packed float4, bits ...): differing elements, by their bytes."""
        itemsize = da.t.dtype.itemsize
        differing = 0
        for (_, ra), (_, rb) in zip(chunks(da, self._elements), chunks(db, self._elements), strict=True):
            self._advance(len(ra), len(rb))
            if ra.tobytes() != rb.tobytes():
                differing += int(np.count_nonzero((ra != rb).reshape(-1, itemsize).any(axis=1)))
        if differing:
            e.status, e.n_different = "different", differing
            e.how = "bytes (the dtype has no arithmetic)"
        else:
            e.how = "compared"
        return e

    def _compare_values(self, e: DiffEntry, da: TensorData, db: TensorData, deca: Decoding, decb: Decoding, *,
                        bytes_first: bool) -> DiffEntry:
        acc = _ValueDiff(self.options.atol, self.options.rtol,
                         exact_ints=deca.kind in (INT, BOOL) and decb.kind in (INT, BOOL))
        bytes_equal = True
        itemsize = deca.itemsize
        for (first, raw_a), (_, raw_b) in zip(chunks(da, self._elements), chunks(db, self._elements), strict=True):
            self._advance(len(raw_a), len(raw_b))
            if not bytes_first:
                bytes_equal = False
                acc.add(first, deca(raw_a), decb(raw_b))
                continue
            idx = _differing(raw_a, raw_b, itemsize)
            if idx is None:
                continue  # equal bytes of one meaning: equal values, never decoded
            bytes_equal = False
            if 2 * len(idx) > len(raw_a) // itemsize:  # most differ: decode the chunk whole
                acc.add(first, deca(raw_a), decb(raw_b))
            else:  # decode only the elements whose bytes differ
                acc.add(first, deca(_elements_at(raw_a, idx, itemsize)), decb(_elements_at(raw_b, idx, itemsize)),
                        idx)
        if bytes_first and bytes_equal:
            e.how = "compared"
            return e
        acc.finish(e, da.t.shape)
        verdict = "equal" if acc.n_not_equal == 0 else "close" if acc.n_not_close == 0 else "different"
        if e.status == "dtype":  # a difference whatever the values; they are told apart as the rest are
            e.values = verdict
            return e
        e.status = verdict
        if verdict == "equal":
            e.how = _why_bytes_differ(deca, decb)
        return e

    # --- renames ---------------------------------------------------------------------------------------------
    def _renames(self, only_a: Sequence[str], only_b: Sequence[str]) -> dict[str, str]:
        """{B key: A key} for tensors only in A and only in B with the same dtype, shape and bytes."""
        def shape_key(cat: Catalog, row: int) -> tuple[object, ...] | None:
            node = cat.index.nodes[row]
            if cat.index.kinds[row] != TENSOR or not isinstance(node, TensorNode) or node.kind in NO_DATA_KINDS:
                return None
            return (node.dtype.name, tuple(node.shape))

        groups_a: dict[tuple[object, ...], list[str]] = {}
        for k in only_a:
            sk = shape_key(self.a, self._keys_a[k])
            if sk is not None:
                groups_a.setdefault(sk, []).append(k)
        out: dict[str, str] = {}
        if not groups_a:
            return out
        groups_b: dict[tuple[object, ...], list[str]] = {}
        for k in only_b:
            sk = shape_key(self.b, self._keys_b[k])
            if sk is not None and sk in groups_a:
                groups_b.setdefault(sk, []).append(k)
        for sk, keys_b in groups_b.items():
            by_digest: dict[bytes, list[str]] = {}
            for k in groups_a[sk]:
                d = self._digest(self.a, self._keys_a[k])
                if d is not None:
                    by_digest.setdefault(d, []).append(k)
            for k in keys_b:
                d = self._digest(self.b, self._keys_b[k])
                candidates = by_digest.get(d) if d is not None else None
                if candidates:
                    out[k] = candidates.pop(0)
        return out

    def _digest(self, cat: Catalog, row: int) -> bytes | None:
        """A digest of a tensor's bytes and their meaning (None if they cannot be read)."""
        try:
            data = cat.data(row)
            t = data.t
            try:
                sig: tuple[object, ...] = decoding(t, cat.byteorder_of(t, row)).signature
            except UnsupportedError:
                sig = (t.dtype.name, cat.byteorder_of(t, row))
            h = hashlib.blake2b(repr(sig).encode(), digest_size=20)
            for _, raw in chunks(data, self._elements):
                h.update(raw.data)
                self.summary.bytes_compared += len(raw)
            return h.digest()
        except CkptfsError:
            return None

    # --- progress --------------------------------------------------------------------------------------------
    def _advance(self, na: int, nb: int) -> None:
        self.summary.bytes_compared += na + nb
        if self.progress is not None and na:
            self.progress(na)

    def _skip_progress(self, t: TensorNode) -> None:
        if self.progress is not None:
            self.progress(_nbytes(t))


@dataclass
class _ValueDiff:
    """Differences of decoded values, folded chunk by chunk."""

    atol: float
    rtol: float
    exact_ints: bool
    n_not_equal: int = 0
    n_not_close: int = 0
    nan_mismatch: int = 0
    nan_at: int = -1
    max_abs: Any = None
    at: int = -1
    max_rel: float | None = None

    def add(self, first: int, va: np.ndarray, vb: np.ndarray, index: np.ndarray | None = None) -> None:
        """Values ``va``/``vb`` of the chunk starting at element ``first``: all of it, or (``index``) only the
        elements at those positions in it."""
        if index is not None:
            first_of = first
            pos: Any = lambda i: first_of + int(index[i])  # noqa: E731
        else:
            pos = lambda i: first + i  # noqa: E731
        if self.exact_ints:
            self._add_ints(pos, va, vb)
            return
        wide = np.complex128 if np.iscomplexobj(va) or np.iscomplexobj(vb) else np.float64
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # (a signalling NaN warns in the cast)
            a, b = va.astype(wide, copy=False), vb.astype(wide, copy=False)
            nan_a, nan_b = np.isnan(a), np.isnan(b)
            equal = (a == b) | (nan_a & nan_b)
            n_ne = int(a.size - np.count_nonzero(equal))
            if not n_ne:
                return
            self.n_not_equal += n_ne
            one_nan = nan_a ^ nan_b
            n_nan = int(np.count_nonzero(one_nan))
            if n_nan and self.nan_at < 0:
                self.nan_at = pos(int(np.argmax(one_nan)))
            self.nan_mismatch += n_nan
            diff = np.abs(a - b)
            diff[equal | one_nan] = 0.0
            mag_b = np.abs(b)
            tol = self.atol + self.rtol * mag_b
            not_close = (diff > tol) | one_nan
            infinite = (np.isinf(a) | np.isinf(b)) & ~equal
            not_close |= infinite  # an infinity is close only to itself (numpy.isclose's rule)
            self.n_not_close += int(np.count_nonzero(not_close))
            i = int(np.argmax(diff))
            m = float(diff[i])
            if diff[i] > 0 and (self.max_abs is None or m > self.max_abs):
                self.max_abs, self.at = m, pos(i)
            rel = np.where(diff > 0, diff / mag_b, 0.0)  # x / 0 = inf where b is 0 and a is not
            rel[np.isnan(rel)] = np.inf  # inf / inf: an infinity against another one (-inf vs inf) is infinitely
            # different, and a NaN here would hide every other element's relative difference from max()
            r = float(rel.max()) if rel.size else 0.0
            if r > 0 and (self.max_rel is None or r > self.max_rel):
                self.max_rel = r

    def _add_ints(self, pos: Any, va: np.ndarray, vb: np.ndarray) -> None:
        ne = va != vb
        n = int(np.count_nonzero(ne))
        if not n:
            return
        self.n_not_equal += n
        self.n_not_close += n
        idx = np.flatnonzero(ne)
        xa, xb = va[idx], vb[idx]
        approx = np.abs(xa.astype(np.float64) - xb.astype(np.float64))  # finds the largest; exact below
        j = int(np.argmax(approx))
        m = abs(int(as_python(xa[j])) - int(as_python(xb[j])))
        if self.max_abs is None or m > self.max_abs:
            self.max_abs, self.at = m, pos(int(idx[j]))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = approx / np.abs(xb.astype(np.float64))
        r = float(rel.max())
        if self.max_rel is None or r > self.max_rel:
            self.max_rel = r

    def finish(self, e: DiffEntry, shape: tuple[int, ...]) -> None:
        if self.n_not_equal == 0:
            e.n_different = 0 if e.status == "dtype" else None
            return
        e.n_different = self.n_not_close if self.n_not_close else self.n_not_equal
        e.max_abs = self.max_abs
        e.at = unravel(self.at, shape) if self.at >= 0 else None
        e.max_rel = self.max_rel
        e.nan_mismatch = self.nan_mismatch or None
        e.nan_at = unravel(self.nan_at, shape) if self.nan_at >= 0 else None


# --- helpers ----------------------------------------------------------------------------------------------------

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _differing(raw_a: np.ndarray, raw_b: np.ndarray, itemsize: int) -> np.ndarray | None:
    """Positions of the elements whose stored bytes differ (one pass over whole elements), or None."""
    uint = _UINT.get(itemsize)
    if uint is not None:
        ne = raw_a.view(uint) != raw_b.view(uint)
    else:  # 16-byte elements (complex128): two words each
        ne = (raw_a.view(np.uint64).reshape(-1, itemsize // 8) != raw_b.view(np.uint64).reshape(-1, itemsize // 8)
              ).any(axis=1)
    if not ne.any():
        return None
    return np.flatnonzero(ne)


def _elements_at(raw: np.ndarray, idx: np.ndarray, itemsize: int) -> np.ndarray:
    """The stored bytes of the elements at ``idx``, laid end to end (what a Decoding takes)."""
    return raw.reshape(-1, itemsize)[idx].reshape(-1)



def _why_bytes_differ(a: Decoding, b: Decoding) -> str:
    if a.signature == b.signature:
        return "equal values, other bytes (signed zeros or NaN payloads)"
    reasons = []
    (_, order_a, conj_a, neg_a, q_a), (_, order_b, conj_b, neg_b, q_b) = a.signature, b.signature
    if order_a != order_b:
        reasons.append(f"byte order {order_a} vs {order_b}")
    if conj_a != conj_b or neg_a != neg_b:
        reasons.append("a conjugate / negative bit stored on one side")
    if q_a != q_b:
        reasons.append("other quantization parameters")
    return "equal values, stored differently: " + ", ".join(reasons or ["other encoding"])


def _kind(cat: Catalog, row: int) -> str:
    kind = cat.index.kinds[row]
    return {TENSOR: "tensor", LEAF: "value", COMPOSITE: "composite", LINK: "link"}.get(kind, kind)


def _strip(key: str, prefix: str) -> str | None:
    if not prefix:
        return key
    if key == prefix:
        return ""
    return key[len(prefix) + 1:] if key.startswith(prefix + ".") else None


def _selected(cat: Catalog, prefix: str, patterns: Sequence[str], tensors_only: bool = False) -> dict[str, int]:
    """{key (prefix removed): row} of the entries compared, in checkpoint order."""
    index = cat.index
    kinds, keys = index.kinds, index.keys
    wanted = (TENSOR, COMPOSITE) if tensors_only else (TENSOR, LEAF, COMPOSITE, LINK)
    out: dict[str, int] = {}
    for row in index.order():
        if kinds[row] not in wanted:
            continue
        key = _strip(keys[row], prefix.rstrip("."))
        if key is None or not key and prefix:
            continue
        if patterns and not any(fnmatch.fnmatchcase(key, p) for p in patterns):
            continue
        out[key] = row
    return out


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _nbytes(t: object) -> int:
    if not isinstance(t, TensorNode) or t.kind in NO_DATA_KINDS or t.parts is not None:
        return 0
    return _numel(t.shape) * t.dtype.itemsize


def _same_value(a: object, b: object) -> bool:
    if type(a) in LEAF_TYPES and type(b) in LEAF_TYPES:
        if type(a) is not type(b):
            return False
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return bool(a == b)
    return brief(a, 4000) == brief(b, 4000)


def _show(v: object) -> str:
    return brief(v, 80)


def diff_catalogs(a: Catalog, b: Catalog, options: DiffOptions = DiffOptions(),
                  progress: Progress | None = None) -> tuple[list[DiffEntry], DiffSummary]:
    """Every entry of the comparison and the summary (:class:`Comparison` yields them one by one)."""
    c = Comparison(a, b, options, progress)
    entries = list(c)
    return entries, c.summary
