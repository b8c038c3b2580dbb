"""Type stub of the C extension ``_tablescan.c`` (see :func:`ckptfs.model.table.scan`)."""

#: keys, ordered, root_state, leaves [(row, value)], tensor_of, storage, offset, shape, stride, requires_grad,
#: shapes, st_keys (int64s when all decimal, else text), st_numel, st_type, st_location, storage-class codes,
#: locations. Columns of ints are bytes of native int64 (uint16 for st_type and st_location).
Columns = tuple[list[str], bool, object, list[tuple[int, object]], bytes | None, bytes, bytes, bytes, bytes, bytes,
                list[tuple[int, ...]], bytes | list[str], bytes, bytes, bytes, list[int], list[str]]

def scan(pickle: bytes, globals: dict[bytes, int], dtype_codes: list[int], budget: int, max_ndim: int,
         prefix: bytes | None, odict_class: type, arena: int = ..., /) -> Columns | None: ...
