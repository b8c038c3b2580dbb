"""torch's legacy stream format: every torch.save before torch 1.6, and ``_use_new_zipfile_serialization=False``.

Layout (torch/serialization.py ``_legacy_save``)::

    pickle   MAGIC_NUMBER (0x1950a86a20f9469cfc6c)
    pickle   PROTOCOL_VERSION (1001)
    pickle   sys_info {protocol_version, little_endian, type_sizes}
    pickle   the object; storages are persistent ids ('storage', StorageType, key, location, numel, view)
    pickle   the sorted list of storage keys
    for each key, in that order:  8-byte little-endian element count, then count * itemsize raw bytes

Nothing tells where the object pickle ends except its STOP opcode, and nothing tells where a storage's
bytes start except the sizes of the storages before it. So: the three header pickles are read with the
strict unpickler; the object pickle is handed to the caller as a stream (``pickle_bytes``) that the
unpickler leaves positioned just after STOP; once the pickle's storage references are known
(``bind``), the key list is read and the 8-byte headers are walked (small reads, no storage data read),
each count checked against the element count the pickle declares. Storage data is always
little-endian (torch converts on big-endian hosts when writing and reading). Records are then plain
byte ranges of the file, served by pread like stored zip records.
"""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import CkptfsError, FormatError, LimitError, TensorError, UnsafePickleError, brief
from ..limits import DEFAULT_LIMITS, Limits
from ..pickle.nodes import StorageRef, StorageViewRef
from ..pickle.unpickler import SafeUnpickler, unpickle
from ..source import ByteSource, SubRange
from .base import Attachment, GraphDigest, ObjectGraph

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
HEADER_WINDOW = 4096  # bytes read at a time while walking storage headers (many small storages: one read)


def _plain(v: object, depth: int = 0) -> object:
    """A sys_info value as JSON can hold it: torch writes a bool, an int and a dict of ints; anything else the
    file put there (a storage class, a float NaN, a nested tuple) is shown as its brief repr."""
    if v is None or isinstance(v, (bool, str)) or isinstance(v, int) and v.bit_length() <= 64:
        return v
    if isinstance(v, float) and math.isfinite(v):
        return v
    if isinstance(v, dict) and depth < 2 and len(v) <= 64:
        return {k if isinstance(k, str) else brief(k): _plain(x, depth + 1) for k, x in v.items()}
    return brief(v)


class _Window(io.RawIOBase):
    """Bytes [start, end) of a source as a raw stream; reading past ``limit`` is a LimitError."""

    def __init__(self, source: ByteSource, start: int, limit: int, what: str) -> None:
        super().__init__()
        self.source = source
        self.pos = start
        self.end = min(source.size, start + limit)
        self.truncated_by_limit = source.size > start + limit
        self.limit = limit
        self.what = what

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self.pos
        elif whence == io.SEEK_END:
            offset += self.end
        self.pos = offset
        return self.pos

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b)
        n = min(len(view), self.end - self.pos)
        if n <= 0:
            if self.truncated_by_limit:
                raise LimitError(f"{self.what} is over the limit of {self.limit} bytes "
                                 "(raise Limits.max_pickle_bytes to index it)")
            return 0
        got = self.source.preadinto(view[:n], self.pos)
        self.pos += got
        return got


def _stream(source: ByteSource, start: int, limit: int, what: str) -> io.BufferedReader:
    # 64 KiB reads: big enough for speed, small enough that reading past a pickle's STOP into the
    # storage data that follows costs little
    return io.BufferedReader(_Window(source, start, limit, what), buffer_size=1 << 16)


class LegacyStream:
    """A legacy (non-zip) torch.save stream."""

    kind = "legacy"
    byteorder = "little"

    def __init__(self, source: ByteSource, limits: Limits = DEFAULT_LIMITS) -> None:
        self.source = source
        self.limits = limits
        self.records: dict[str, SubRange] = {}
        self.errors: dict[str, str] = {}  # storage key -> why its bytes cannot be located
        self.bound = False
        self._main: io.BufferedReader | None = None
        self.main_start, self.sys_info = self._read_header()
        self.info: dict[str, Any] = {"kind": "legacy", "magic": hex(MAGIC_NUMBER), "protocol_version": PROTOCOL_VERSION,
                           "sys_info": self.sys_info, "byteorder": "little", "pickle_offset": self.main_start}

    def _fail(self, msg: str, record: str | None = None) -> FormatError:
        return FormatError(msg, file=self.source.name, record=record)

    # --- the three header pickles ---------------------------------------------------------------------
    def _read_header(self) -> tuple[int, dict[str, object]]:

        stream = _stream(self.source, 0, HEADER_WINDOW, "the legacy header")
        up = SafeUnpickler(stream, strict=True, limits=self.limits)
        values = []
        for what in ("magic number", "protocol version", "sys_info"):
            try:
                values.append(up.load())
            except CkptfsError as e:
                raise self._fail(f"legacy {what}: {e.reason}") from None
            except Exception as e:  # noqa: BLE001 - malformed pickles raise many kinds
                raise self._fail(f"legacy {what} is not a readable pickle ({type(e).__name__})") from None
        magic, protocol, sys_info = values
        if magic != MAGIC_NUMBER:
            raise self._fail(f"legacy magic number is {magic!r}, not torch's")
        if protocol != PROTOCOL_VERSION:
            raise self._fail(f"legacy protocol version {protocol!r} (torch writes {PROTOCOL_VERSION})")
        if not isinstance(sys_info, dict):
            raise self._fail(f"legacy sys_info is a {type(sys_info).__name__}, not a dict")
        info = {k: _plain(v) for k, v in sys_info.items() if isinstance(k, str)}
        return stream.tell(), info

    # --- the object pickle -----------------------------------------------------------------------------
    def object_graph(self, strict: bool, digest: GraphDigest | None = None) -> ObjectGraph:
        """The object pickle, read as a stream (its end is found by unpickling it: see the module doc)."""
        self._main = _stream(self.source, self.main_start, self.limits.max_pickle_bytes, "the legacy object pickle")
        # (no digest: the stream's storages are located from the graph's references, bind())
        obj, up, _ = unpickle(self._main, strict=strict, limits=self.limits, file=self.source.name, record="pickle")
        graph = ObjectGraph([obj], "pickle", dict(up.unknown_globals))
        del obj, up
        return graph

    # --- storages --------------------------------------------------------------------------------------
    def pickles(self) -> Sequence[bytes]:
        return ()

    def bind(self, refs: Mapping[str, StorageRef]) -> None:
        """Locate every storage once the pickle's references (dtype, numel) are known."""
        if self.bound:
            return
        self.bound = True
        if self._main is None:
            raise self._fail("bind() before the object pickle was read")
        keys_at = self._main.tell()
        keys, data_start = self._read_keys(keys_at)
        self.info["storage_keys"] = len(keys)
        self.info["data_offset"] = data_start
        self._walk(keys, data_start, refs)
        views = [r for r in refs.values() if type(r) is StorageViewRef and r.root is not None]
        for v in views:
            self._bind_view(v)

    def _read_keys(self, at: int) -> tuple[list[str], int]:

        stream = _stream(self.source, at, self.limits.max_pickle_bytes, "the legacy storage key list")
        up = SafeUnpickler(stream, strict=True, limits=self.limits)
        record = f"storage key list at byte {at}"
        try:
            keys = up.load()
        except CkptfsError as e:
            raise e.at(file=self.source.name, record=record) from None
        except Exception as e:  # noqa: BLE001
            raise self._fail(f"not a readable pickle ({type(e).__name__}: {e})", record=record) from None
        if not isinstance(keys, list):
            raise self._fail(f"is a {type(keys).__name__}, not a list", record=record)
        out = []
        for k in keys:
            if isinstance(k, bytes):
                k = k.decode("ascii", "backslashreplace")
            elif type(k) is int:
                k = str(k)
            if type(k) is not str:
                raise UnsafePickleError(f"storage key {k!r} is not a string", file=self.source.name, record=record)
            out.append(k)
        return out, stream.tell()

    def _walk(self, keys: list[str], off: int, refs: Mapping[str, StorageRef]) -> None:
        size = self.source.size
        self._prefetch_headers(keys, off, refs)
        win_start, win = 0, b""
        lost: str | None = None  # once set, the bytes of every later storage cannot be located
        for key in keys:
            if lost is not None:
                self.errors.setdefault(key, lost)
                continue
            if key in self.records or key in self.errors:
                self.errors[key] = f"storage key {key!r} is listed twice in the stream"
                self.records.pop(key, None)
                lost = f"follows storage {key!r}, which is listed twice"
                continue
            ref = refs.get(key)
            if ref is None or type(ref) is not StorageRef:  # never referenced, or a view's key
                self.errors[key] = "storage listed in the stream but never referenced by the pickle"
                lost = f"follows storage {key!r}, whose element size the pickle does not tell"
                continue
            if not (win_start <= off and off + 8 <= win_start + len(win)):
                win_start, win = off, self.source.pread(off, HEADER_WINDOW)
            head = win[off - win_start : off - win_start + 8]
            if len(head) < 8:
                self.errors[key] = f"the stream ends at byte {size} before storage {key!r}'s header"
                lost = self.errors[key]
                continue
            count = int.from_bytes(head, "little")
            nbytes = count * ref.itemsize
            start = off + 8
            if start + nbytes > size:
                self.errors[key] = (f"storage {key!r} declares {count} elements ({nbytes} bytes from byte {start}) "
                                    f"but the file ends at byte {size}")
                lost = f"follows storage {key!r}, which runs past the end of the file"
                continue
            if count != ref.numel:
                self.errors[key] = (f"the stream holds {count} elements for storage {key!r}; the pickle declares "
                                    f"{ref.numel} (torch.load refuses this: wrong byte size)")
            else:
                self.records[key] = SubRange(self.source, start, nbytes, self.record_name(key))
            off = start + nbytes
        self.info["data_end"] = off
        if lost is None and off < size:
            self.info["trailing_bytes"] = size - off

    def _prefetch_headers(self, keys: list[str], off: int, refs: Mapping[str, StorageRef]) -> None:
        """Where each storage's 8-byte header should be, if the pickle's sizes are right: a remote source
        fetches them in one concurrent batch instead of one round trip per storage (the walk still checks)."""
        ranges = []
        for key in keys:
            ref = refs.get(key)
            if ref is None or type(ref) is not StorageRef or off + 8 > self.source.size:
                break
            ranges.append((off, 8))
            off += 8 + ref.numel * ref.itemsize
        if len(ranges) > 1:
            self.source.prefetch(ranges)

    def _bind_view(self, v: StorageViewRef) -> None:
        """A storage view (old files): a slice of its root storage's record."""
        root = v.root
        assert root is not None
        rec = self.records.get(root.key)
        if rec is None:
            self.errors[v.key] = f"view of storage {root.key!r}: " + self.errors.get(root.key, "root is not in the stream")
            return
        start = v.view_offset * root.itemsize
        if start + v.nbytes > rec.size:
            self.errors[v.key] = (f"storage view {v.key!r} [{start}, {start + v.nbytes}) lies outside its root "
                                  f"storage {root.key!r} of {rec.size} bytes")
            return
        self.records[v.key] = SubRange(rec, start, v.nbytes, self.record_name(v.key))

    def storage_source(self, key: str) -> ByteSource:
        rec = self.records.get(key)
        if rec is None:
            why = self.errors.get(key) or "storage is not in the stream's storage list"
            raise TensorError(why, file=self.source.name, record=f"storages/{key}")
        return rec

    def storage_size(self, key: str) -> int:
        return self.storage_source(key).size

    def record_name(self, key: str) -> str:
        """Storages have no names in the stream: ``storages/<key>`` (the data follows its 8-byte count)."""
        return f"storages/{key}"

    def attachments(self) -> Sequence[Attachment]:
        return ()

    def storage_layout(self, key: str) -> dict[str, Any] | None:
        return None

    def user_metadata(self) -> Mapping[str, str] | None:
        return None

    def close(self) -> None:
        self.source.close()
