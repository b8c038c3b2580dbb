"""Storages: ``persistent_load`` ids become :class:`StorageRef` (one per key, owned by the file's container)."""

from __future__ import annotations

from typing import Any, cast

from ...dtypes import DTYPES
from ...pickle.nodes import (
    StorageRef,
    StorageType,
    StorageViewRef,
    TensorNode,
)
from .base import ConverterBase
from .common import ascii_text, show


class StorageConverter(ConverterBase):
    """Persistent ids: torch's storage references (zip and legacy forms, legacy storage views)."""

    # --- storages ------------------------------------------------------------------------------------
    def _storage(self, args: tuple[Any, ...], _name: str = "") -> StorageRef:
        """``('storage', StorageType, key, location, numel)`` (zip) or the legacy 6-tuple with a view slot."""
        pid = args[0] if len(args) == 1 else args
        if type(pid) is tuple and (len(pid) == 5 or len(pid) == 6 and pid[5] is None):  # the common case
            tag, stype, key, location, numel = pid[:5]
            if tag == "storage" and type(stype) is StorageType and type(key) is str and type(location) is str \
                    and type(numel) is int and numel >= 0:
                ref = self.refs.get(key)
                if ref is None:
                    ref = self.refs[key] = StorageRef(key, stype.dtype, numel, location, stype.name, self.owner)
                    return ref
                if ref.dtype is stype.dtype and ref.numel == numel:
                    return ref
        return self._storage_slow(pid)

    def _storage_slow(self, pid: object) -> StorageRef:
        ref: StorageRef | None
        bad = _bad_pid(pid)
        if bad is not None:
            ref = StorageRef("?", None, 0, "?", "?")
            ref.error = bad
            return ref
        pid = cast("tuple[Any, ...]", pid)  # _bad_pid: a 5- or 6-tuple
        stype, key, location, numel = pid[1:5]
        key = ascii_text(key)
        if type(key) is int:
            key = str(key)
        location = cast(str, ascii_text(location))  # _bad_pid: text
        ref = self.refs.get(key)
        if ref is None:
            ref = self.refs[key] = StorageRef(key, stype.dtype, numel, location, stype.name, self.owner)
        elif not (ref.dtype is stype.dtype and ref.numel == numel):
            ref = None
        if ref is not None:
            if len(pid) == 6 and pid[5] is not None:
                return self._storage_view(ref, pid[5], stype)
            return ref
        ref = self.refs[key]
        # torch.save refuses to write two dtypes viewing one storage; torch.load silently reinterprets
        # the first. Here the later references fail, each with the reason.
        other = StorageRef(key, stype.dtype, numel, location, stype.name)
        other.error = (f"storage {key!r} is referenced as {ref.typename}(numel={ref.numel}) and as "
                       f"{stype.name}(numel={numel})")
        return other

    def _storage_view(self, root: StorageRef, view: object, stype: StorageType) -> StorageRef:
        """Legacy view metadata ``(view_key, offset, size)`` (elements of the root's dtype): a storage that
        is a slice of ``root`` (old torch's storage views). The container resolves its record."""
        vkey = ascii_text(view[0]) if type(view) is tuple and len(view) == 3 else None
        if type(vkey) is int:
            vkey = str(vkey)
        offset, size = (view[1], view[2]) if vkey is not None else (None, None)  # type: ignore[index]
        if type(vkey) is not str or type(offset) is not int or type(size) is not int or offset < 0 or size < 0:
            bad = StorageRef("?", root.dtype, 0, root.location, root.typename)
            bad.error = f"malformed legacy storage view {show(view)}"
            return bad
        ref = self.refs.get(vkey)
        if ref is not None:
            if type(ref) is StorageViewRef and ref.root is root and ref.view_offset == offset and ref.numel == size:
                return ref
            bad = StorageRef(vkey, root.dtype, size, root.location, root.typename)
            bad.error = f"storage view {vkey!r} is declared twice, differently"
            return bad
        ref = self.refs[vkey] = StorageViewRef(vkey, root.dtype, size, root.location, stype.name, self.owner)
        ref.root = root
        ref.view_offset = offset
        if root.error is not None:
            ref.error = root.error
        return ref


def _bad_pid(pid: object) -> str | None:
    if type(pid) is not tuple or len(pid) not in (5, 6):
        return f"persistent id {show(pid)} is not a storage reference"
    if ascii_text(pid[0]) != "storage":
        return f"persistent id of type {show(pid[0])} is not a storage"
    stype, key, location, numel = pid[1:5]
    if type(stype) is not StorageType:
        return f"persistent id names {show(stype)} as its storage type"
    key = ascii_text(key)
    if not (type(key) is str or type(key) is int) or not isinstance(ascii_text(location), str):
        return f"malformed storage reference {show(pid)}"
    if type(numel) is not int or numel < 0:
        return f"storage {key!r} declares {show(numel)} elements"
    return None


def storage_as_tensor(ref: StorageRef) -> TensorNode:
    """A storage saved on its own (``torch.save(t.untyped_storage())``): served as a 1-D tensor of it."""
    dtype = ref.dtype or DTYPES["uint8"]
    t = TensorNode("dense", ref, dtype, (ref.numel,), (1,), 0)
    t.extra = {"storage": ref.typename}
    t.error = ref.error
    return t
