"""torch.save's zip layout on top of the generic zip reader: data.pkl, data/<key>, byteorder, versions."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import FormatError, LimitError, TensorError, UnsupportedError
from ..limits import DEFAULT_LIMITS, Limits
from ..pickle.nodes import StorageRef
from ..pickle.unpickler import unpickle
from ..source import ByteSource
from .base import Attachment, GraphDigest, ObjectGraph
from .zip import DEFLATED, STORED, ZipArchive, ZipRecord

INFO_RECORDS = (".format_version", ".storage_alignment", "version", ".data/version", ".data/serialization_id")


class TorchZip:
    """A torch.save zip archive (torch >= 1.6)."""

    kind = "zip"

    def __init__(self, source: ByteSource, limits: Limits = DEFAULT_LIMITS) -> None:
        self.source = source
        self.limits = limits
        self.archive = ZipArchive(source, limits)
        self._pickle: bytes | None = None
        self.pickle_record = self._pickle_record()
        self.byteorder = self._byteorder()
        self._info_facts: dict[str, Any] | None = None

    @property
    def info(self) -> dict[str, Any]:
        """Format facts for ``ckptfs info`` (gathered on first use: opening the shards of a directory or the
        items of a DCP checkpoint does not read the records they come from)."""
        if self._info_facts is None:
            self._info_facts = self._info()
        return self._info_facts

    def _fail(self, msg: str, record: str | None = None) -> FormatError:
        return FormatError(msg, file=self.source.name, record=record)

    def _pickle_record(self) -> ZipRecord:
        rec = self.archive.get("data.pkl")
        if rec is None:
            if self.archive.has("model.json"):  # TorchScript before torch 1.4: JSON + protobuf-style tensors
                raise UnsupportedError("unsupported (TorchScript archive of torch < 1.4: model.json and "
                                       "tensors/, no data.pkl)", file=self.source.name)
            raise self._fail(f"no {self.archive.root}data.pkl record (not a torch.save archive?)")
        return rec

    def _byteorder(self) -> str:
        raw = self.archive.read_small("byteorder")
        if raw is None:
            return "little"  # files before torch 2.1 have no byteorder record; torch assumes little
        if raw not in (b"little", b"big"):
            raise self._fail(f"byteorder record holds {raw[:20]!r}, not 'little' or 'big'",
                             record=self.archive.root + "byteorder")
        return raw.decode()

    def _info(self) -> dict[str, Any]:
        arch = self.archive
        info: dict[str, Any] = {"root": arch.root.rstrip("/"), "records": len(arch), "zip64": arch.zip64,
                      "byteorder": self.byteorder, "byteorder_record": arch.has("byteorder")}
        for name in INFO_RECORDS:
            try:
                raw = arch.read_small(name)
            except Exception:  # noqa: BLE001 - informational only
                raw = b"<unreadable>"
            if raw is not None:
                info[name] = raw.decode("utf-8", "backslashreplace").strip()[:100]
        methods = arch.methods()
        info["compressed_records"] = sum(c for m, c in methods.items() if m != STORED)
        info["methods"] = sorted(methods)
        return info

    def pickles(self) -> Sequence[bytes]:
        if self._pickle is None:
            self._pickle = self.pickle_bytes()
        return (self._pickle,)

    def pickle_bytes(self) -> bytes:
        rec = self.pickle_record
        try:
            rec.check_servable()
            return rec.read_all(self.limits.max_pickle_bytes)
        except LimitError as e:
            raise LimitError(f"{e.reason} (--limit max_pickle_bytes=N raises it)", file=e.file, record=e.record) from None
        except FormatError:
            raise
        except TensorError as e:
            raise self._fail(e.reason, record=self.archive.root + rec.name) from None

    def object_graph(self, strict: bool, digest: GraphDigest | None = None,
                     key_prefix: str | None = None) -> ObjectGraph:
        """``key_prefix`` goes before every storage key of the graph (several archives indexed as one)."""
        record = self.archive.root + self.pickle_record.name
        data = self._pickle if self._pickle is not None else self.pickle_bytes()
        self._pickle = None  # (read in advance by pickles(): not kept once unpickled)
        if digest is not None:
            found = digest.of_pickle(data, key_prefix, self.limits)
            if found is not None:  # recognised without unpickling (no global outside the allowlist was named)
                return ObjectGraph([], record, {}, found)
        obj, up, summary = unpickle(data, strict=strict, limits=self.limits, file=self.source.name, record=record,
                                    key_prefix=key_prefix, digest=None if digest is None else digest.of_graph)
        graph = ObjectGraph([obj], record, dict(up.unknown_globals), summary)
        del obj, up  # the unpickler's memo would keep every unpickled object alive
        return graph

    def bind(self, refs: Mapping[str, StorageRef]) -> None:
        return None  # records are found by name: nothing to locate

    def _storage_entry(self, key: str) -> ZipRecord:
        name = "data/" + key
        rec = self.archive.get(name)
        root = self.archive.root
        if rec is None:
            raise TensorError("record is missing from the archive", file=self.source.name, record=root + name)
        if rec.is_dir:
            raise TensorError("storage names a directory entry, not data", file=self.source.name,
                              record=root + name)
        if rec.method not in (STORED, DEFLATED):
            raise TensorError(f"compression method {rec.method} is not supported", file=self.source.name,
                              record=root + name)
        return rec

    def storage_source(self, key: str) -> ByteSource:
        return self._storage_entry(key).data()

    def record_name(self, key: str) -> str:
        """The full entry name of storage ``key`` (what `unzip -l` shows)."""
        return f"{self.archive.root}data/{key}"

    def storage_size(self, key: str) -> int:
        """Size of storage ``key``'s record, with the same refusals as :meth:`storage_source`, without
        creating a record object (validation of 20k tensors stays cheap)."""
        size = self.archive.size_of("data/" + key)
        if size is None or size < 0:
            return self._storage_entry(key).size  # raises the precise error
        return size

    def attachments(self) -> Sequence[Attachment]:
        return ()

    def storage_layout(self, key: str) -> dict[str, Any] | None:
        return None

    def user_metadata(self) -> Mapping[str, str] | None:
        return None

    def close(self) -> None:
        self.source.close()
