"""Hand-made pickles and zip archives for the hostile corpus (no torch needed to build them).

``P`` assembles a pickle opcode by opcode (names as in :mod:`pickletools`); ``torch_zip`` lays records out
the way torch.save does (root folder, 64-byte aligned data with a 'FB' padding extra, zip64 end records),
with knobs to lie in any field. Everything here is written for this corpus; nothing is copied from
exploit collections.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

# --- pickles ------------------------------------------------------------------------------------------------


class P:
    """A pickle assembler: each method appends one opcode (or a small idiom) and returns self."""

    def __init__(self, proto: int | None = 2) -> None:
        self.b = bytearray()
        if proto is not None and proto >= 2:
            self.b += bytes([0x80, proto])

    def __bytes__(self) -> bytes:
        return bytes(self.b)

    def raw(self, data: bytes) -> "P":
        self.b += data
        return self

    # values
    def none(self) -> "P":
        return self.raw(b"N")

    def bool(self, v: bool) -> "P":
        return self.raw(b"\x88" if v else b"\x89")

    def int(self, n: int) -> "P":
        if 0 <= n < 256:
            return self.raw(b"K" + bytes([n]))
        if 0 <= n < 65536:
            return self.raw(b"M" + struct.pack("<H", n))
        if -(2**31) <= n < 2**31:
            return self.raw(b"J" + struct.pack("<i", n))
        nbytes = (n.bit_length() + 8) // 8
        enc = n.to_bytes(nbytes, "little", signed=True)
        if nbytes < 256:
            return self.raw(b"\x8a" + bytes([nbytes]) + enc)
        return self.raw(b"\x8b" + struct.pack("<i", nbytes) + enc)

    def float(self, v: float) -> "P":
        return self.raw(b"G" + struct.pack(">d", v))

    def str(self, s: str | bytes) -> "P":
        data = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
        return self.raw(b"X" + struct.pack("<I", len(data)) + data)

    def short_str(self, s: str) -> "P":  # protocol 4 SHORT_BINUNICODE
        data = s.encode()
        return self.raw(b"\x8c" + bytes([len(data)]) + data)

    def bytes(self, data: bytes) -> "P":  # protocol 3 BINBYTES
        return self.raw(b"B" + struct.pack("<I", len(data)) + data)

    # stack / memo
    def mark(self) -> "P":
        return self.raw(b"(")

    def put(self, i: int) -> "P":
        return self.raw(b"q" + bytes([i])) if i < 256 else self.raw(b"r" + struct.pack("<I", i))

    def get(self, i: int) -> "P":
        return self.raw(b"h" + bytes([i])) if i < 256 else self.raw(b"j" + struct.pack("<I", i))

    def memoize(self) -> "P":  # protocol 4
        return self.raw(b"\x94")

    def dup(self) -> "P":
        return self.raw(b"2")

    def pop(self) -> "P":
        return self.raw(b"0")

    def pop_mark(self) -> "P":
        return self.raw(b"1")

    # containers
    def empty_tuple(self) -> "P":
        return self.raw(b")")

    def tuple(self, n: int | None = None) -> "P":
        """TUPLE1/2/3 for n in 1..3, TUPLE (closing a MARK) otherwise."""
        return self.raw({1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(n, b"t") if n else b"t")

    def empty_list(self) -> "P":
        return self.raw(b"]")

    def empty_dict(self) -> "P":
        return self.raw(b"}")

    def append(self) -> "P":
        return self.raw(b"a")

    def appends(self) -> "P":
        return self.raw(b"e")

    def setitem(self) -> "P":
        return self.raw(b"s")

    def setitems(self) -> "P":
        return self.raw(b"u")

    def list_op(self) -> "P":
        return self.raw(b"l")

    def dict_op(self) -> "P":
        return self.raw(b"d")

    def empty_set(self) -> "P":
        return self.raw(b"\x8f")

    def additems(self) -> "P":
        return self.raw(b"\x90")

    def frozenset(self) -> "P":
        return self.raw(b"\x91")

    # objects
    def global_(self, module: str, name: str) -> "P":
        return self.raw(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def stack_global(self, module: str, name: str) -> "P":
        return self.short_str(module).short_str(name).raw(b"\x93")

    def inst(self, module: str, name: str) -> "P":
        return self.raw(b"i" + module.encode() + b"\n" + name.encode() + b"\n")

    def obj(self) -> "P":
        return self.raw(b"o")

    def reduce(self) -> "P":
        return self.raw(b"R")

    def build(self) -> "P":
        return self.raw(b"b")

    def newobj(self) -> "P":
        return self.raw(b"\x81")

    def newobj_ex(self) -> "P":
        return self.raw(b"\x92")

    def persid(self) -> "P":
        return self.raw(b"Q")

    def ext1(self, code: int) -> "P":
        return self.raw(b"\x82" + bytes([code]))

    def ext2(self, code: int) -> "P":
        return self.raw(b"\x83" + struct.pack("<H", code))

    def ext4(self, code: int) -> "P":
        return self.raw(b"\x84" + struct.pack("<i", code))

    def stop(self) -> "P":
        return self.raw(b".")

    # idioms
    def call(self, module: str, name: str, *args: object) -> "P":
        """GLOBAL module.name, a tuple of plain args, REDUCE."""
        self.global_(module, name).mark()
        for a in args:
            self.value(a)
        return self.tuple().reduce()

    def value(self, v: object) -> "P":
        """Plain Python data (str, bytes, int, float, bool, None, tuple, list, dict)."""
        if v is None:
            return self.none()
        if isinstance(v, bool):
            return self.bool(v)
        if isinstance(v, int):
            return self.int(v)
        if isinstance(v, float):
            return self.float(v)
        if isinstance(v, str):
            return self.str(v)
        if isinstance(v, bytes):
            return self.global_("_codecs", "encode").mark().str(v.decode("latin-1")).str("latin1").tuple().reduce()
        if isinstance(v, tuple):
            if not v:
                return self.empty_tuple()
            self.mark()
            for x in v:
                self.value(x)
            return self.tuple()
        if isinstance(v, list):
            self.empty_list()
            if v:
                self.mark()
                for x in v:
                    self.value(x)
                self.appends()
            return self
        if isinstance(v, dict):
            self.empty_dict()
            if v:
                self.mark()
                for k, x in v.items():
                    self.value(k).value(x)
                self.setitems()
            return self
        if isinstance(v, Emit):
            v.fn(self)
            return self
        raise TypeError(f"no pickle idiom for {type(v).__name__}")

    def ordered_dict(self) -> "P":
        return self.global_("collections", "OrderedDict").empty_tuple().reduce()

    def storage_pid(self, key: str, storage: str = "FloatStorage", numel: int = 0, location: str = "cpu",
                    module: str = "torch") -> "P":
        return self.mark().str("storage").global_(module, storage).str(key).str(location).int(numel).tuple().persid()

    def tensor(self, key: str, numel: int, size: Sequence[int], stride: Sequence[int], offset: int = 0,
               storage: str = "FloatStorage", requires_grad: bool = False, location: str = "cpu") -> "P":
        """torch._utils._rebuild_tensor_v2 exactly as torch.save writes it (protocol 2)."""
        self.global_("torch._utils", "_rebuild_tensor_v2").mark()
        self.storage_pid(key, storage, numel, location)
        self.int(offset).value(tuple(size)).value(tuple(stride)).bool(requires_grad)
        return self.ordered_dict().tuple().reduce()


@dataclass
class Emit:
    """A value for :meth:`P.value` that emits custom opcodes."""

    fn: object


def state_dict(items: Iterable[tuple[str, "callable"]], proto: int = 2, ordered: bool = True) -> bytes:
    """A pickle of {key: <emitted value>} (an OrderedDict like a module's state_dict)."""
    p = P(proto)
    if ordered:
        p.ordered_dict()
    else:
        p.empty_dict()
    p.mark()
    for k, emit in items:
        p.value(k)
        emit(p)
    return bytes(p.setitems().stop())


# --- zip archives ------------------------------------------------------------------------------------------


@dataclass
class Entry:
    name: bytes  # full name, root included
    data: bytes
    method: int = 0  # 0 stored, 8 deflate
    crc: int | None = None  # None: the real CRC
    flags: int = 0x0800  # utf-8 names; torch writes 0x0808 (data descriptor), we keep sizes in the local header
    size: int | None = None  # CD uncompressed size (None: real)
    csize: int | None = None  # CD compressed size (None: real)
    local_name: bytes | None = None  # name in the local header (None: same)
    local_method: int | None = None
    local_sizes: tuple[int, int] | None = None  # (csize, size) written in the local header
    local_crc: int | None = None
    header_offset: int | None = None  # CD header offset override (None: real)
    pad_to: int = 64  # data alignment (torch: 64)
    extra_cd: bytes = b""
    zip64: bool = False  # write zip64 extras for this entry (sizes/offset as 0xFFFFFFFF in the CD)


@dataclass
class Layout:
    data: bytes
    local: dict = field(default_factory=dict)  # name -> local header offset
    data_at: dict = field(default_factory=dict)  # name -> data offset
    cd: dict = field(default_factory=dict)  # name -> CD entry offset
    cd_offset: int = 0
    cd_size: int = 0
    eocd64: int | None = None
    locator: int | None = None
    eocd: int = 0


LOCAL = struct.Struct("<4s2B4HL2L2H")
CDIR = struct.Struct("<4s4B4HL2L5H2L")
EOCD = struct.Struct("<4s4H2LH")
EOCD64 = struct.Struct("<4sQ2H2L4Q")
LOCATOR = struct.Struct("<4sLQL")


def write_zip(entries: Sequence[Entry], *, zip64_end: bool = True, comment: bytes = b"", prefix: bytes = b"",
              between_cd_and_end: bytes = b"", eocd_counts: tuple[int, int] | None = None,
              eocd64_counts: tuple[int, int] | None = None, cd_offset_override: int | None = None,
              cd_size_override: int | None = None, eocd64_offset_override: int | None = None,
              classic_sentinels: bool = True) -> Layout:
    """Lay out ``entries`` like torch.save: local header + 'FB' padding extra + data, central directory,
    zip64 end record + locator, end record. ``prefix`` is junk before the archive (offsets are written
    as if it were absent, like a file that was prepended to)."""
    out = bytearray()
    lay = Layout(b"")
    cd = bytearray()
    for e in entries:
        comp = e.data if e.method == 0 else _deflate(e.data)
        crc = zlib.crc32(e.data) if e.crc is None else e.crc
        name_l = e.name if e.local_name is None else e.local_name
        hoff = len(out)
        base = hoff + LOCAL.size + len(name_l)
        pad = (-(base + 4)) % e.pad_to if e.pad_to > 1 else 0
        extra = (struct.pack("<2H", 0x4246, pad) + b"Z" * pad) if e.pad_to > 1 else b""
        lcs, ls = e.local_sizes if e.local_sizes is not None else (len(comp), len(e.data))
        lm = e.method if e.local_method is None else e.local_method
        lcrc = crc if e.local_crc is None else e.local_crc
        out += LOCAL.pack(b"PK\x03\x04", 20, 0, e.flags, lm, 0, 0x21, lcrc, lcs, ls, len(name_l), len(extra))
        out += name_l + extra
        lay.local[e.name] = hoff
        lay.data_at[e.name] = len(out)
        out += comp
        size = len(e.data) if e.size is None else e.size
        csize = len(comp) if e.csize is None else e.csize
        ho = hoff if e.header_offset is None else e.header_offset
        extra_cd = e.extra_cd
        if e.zip64:
            extra_cd = struct.pack("<2H3Q", 1, 24, size, csize, ho) + extra_cd
            size = csize = ho = 0xFFFFFFFF
        lay.cd[e.name] = len(cd)
        cd += CDIR.pack(b"PK\x01\x02", 45, 3, 45, 0, e.flags, e.method, 0, 0x21, crc, csize, size, len(e.name),
                        len(extra_cd), 0, 0, 0, 0, ho)
        cd += e.name + extra_cd
    cd_offset = len(out)
    lay.cd = {k: v + cd_offset for k, v in lay.cd.items()}
    out += cd
    out += between_cd_and_end
    n = len(entries)
    co = cd_offset if cd_offset_override is None else cd_offset_override
    cs = len(cd) if cd_size_override is None else cd_size_override
    if zip64_end:
        lay.eocd64 = len(out)
        c64 = eocd64_counts or (n, n)
        out += EOCD64.pack(b"PK\x06\x06", 44, 30, 45, 0, 0, c64[0], c64[1], cs, co)
        lay.locator = len(out)
        off64 = lay.eocd64 if eocd64_offset_override is None else eocd64_offset_override
        out += LOCATOR.pack(b"PK\x06\x07", 0, off64, 1)
    lay.eocd = len(out)
    c = eocd_counts or (n, n)
    if zip64_end and classic_sentinels:
        out += EOCD.pack(b"PK\x05\x06", 0, 0, c[0], c[1], 0xFFFFFFFF, 0xFFFFFFFF, len(comment))
    else:
        out += EOCD.pack(b"PK\x05\x06", 0, 0, c[0], c[1], cs, co, len(comment))
    out += comment
    lay.cd_offset, lay.cd_size = cd_offset, len(cd)
    lay.data = prefix + bytes(out)
    return lay


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def torch_zip(pickle: bytes, storages: dict[str, bytes], root: str = "archive", *, byteorder: bytes | None = b"little",
              extra_records: Sequence[tuple[str, bytes]] = (), tweak: "callable | None" = None,
              **zip_kw: object) -> Layout:
    """A torch.save-style archive: data.pkl, .format_version, .storage_alignment, byteorder, data/<k>,
    version, .data/serialization_id. ``tweak(entries)`` may edit the Entry list before layout."""
    r = root.encode() + b"/"
    entries = [Entry(r + b"data.pkl", pickle), Entry(r + b".format_version", b"1"),
               Entry(r + b".storage_alignment", b"64")]
    if byteorder is not None:
        entries.append(Entry(r + b"byteorder", byteorder))
    for k, v in storages.items():
        entries.append(Entry(r + b"data/" + k.encode("utf-8", "surrogateescape"), v))
    for name, data in extra_records:
        entries.append(Entry(r + name.encode("utf-8", "surrogateescape"), data))
    entries.append(Entry(r + b"version", b"3\n"))
    entries.append(Entry(r + b".data/serialization_id", b"0" * 40))
    if tweak is not None:
        tweak(entries)
    return write_zip(entries, **zip_kw)  # type: ignore[arg-type]


def find_entry(entries: list[Entry], suffix: bytes) -> Entry:
    for e in entries:
        if e.name.endswith(suffix):
            return e
    raise KeyError(suffix)


# --- legacy (torch < 1.6) streams ------------------------------------------------------------------------


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def legacy_stream(obj_pickle: bytes, storages: Sequence[tuple[str, int, bytes]], *, magic: int = LEGACY_MAGIC,
                  protocol: int = 1001, sys_info: bytes | None = None, keys: Sequence[object] | None = None) -> bytes:
    """magic, protocol version, sys_info, the object pickle, the key list, then per storage an 8-byte
    little-endian element count and the raw bytes. ``storages`` is [(key, count, data)]."""
    head = bytes(P().int(magic).stop()) + bytes(P().int(protocol).stop())
    if sys_info is None:
        sys_info = bytes(P().value({"protocol_version": 1001, "little_endian": True,
                                    "type_sizes": {"short": 2, "int": 4, "long": 4}}).stop())
    klist = bytes(P().value(list(keys) if keys is not None else [k for k, _, _ in storages]).stop())
    body = b"".join(struct.pack("<q", n) + d for _, n, d in storages)
    return head + sys_info + obj_pickle + klist + body


def legacy_tensor(p: P, key: str, numel: int, size: Sequence[int], stride: Sequence[int], offset: int = 0,
                  storage: str = "FloatStorage") -> P:
    """_rebuild_tensor_v2 with the legacy 6-tuple persistent id (view slot None)."""
    p.global_("torch._utils", "_rebuild_tensor_v2").mark()
    p.mark().str("storage").global_("torch", storage).str(key).str("cpu").int(numel).none().tuple().persid()
    p.int(offset).value(tuple(size)).value(tuple(stride)).bool(False)
    return p.ordered_dict().tuple().reduce()
