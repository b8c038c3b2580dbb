"""The container seam: what every container reader (torch zip, legacy stream, TorchScript, ...) offers.

A container knows which stored blobs exist and where their bytes are; it hands the layer above an
*object graph* (what ``torch.load`` would rebuild, as inert data: unpickled with ckptfs's safe
unpickler, or built from a table such as a safetensors header) whose storages it then serves as byte
sources. A new format is one module implementing :class:`Container`, plus a line in
:func:`ckptfs.container.open_container`'s sniffing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from ..limits import Limits
from ..pickle.nodes import StorageRef
from ..source import ByteSource


class GraphDigest(Protocol):
    """What the index above makes of an object graph, offered to the container that builds it: a compact form
    (the columns of a plain state_dict) that stands in for the graph when the graph is of that form.

    ``of_graph`` runs on the unpickled root where it is unpickled (the probe's child) and returns bytes to
    send back, or None; ``of_pickle`` reads the form straight from a pickle's bytes, without unpickling,
    and returns it, or None when the pickle is not plainly of that form (then the pickle is unpickled)."""

    def of_graph(self, obj: object) -> bytes | None: ...

    def of_pickle(self, data: bytes, key_prefix: str | None, limits: Limits) -> object | None: ...


@dataclass
class ObjectGraph:
    """The root object of a container, handed over once.

    ``take()`` returns it and forgets it, so that afterwards only the caller's index holds the graph (and
    can free it piece by piece while indexing). ``record`` names where the graph came from (for errors);
    ``unknown_globals`` counts the classes the unpickler did not import."""

    root: list[object]
    record: str
    unknown_globals: dict[str, int] = field(default_factory=dict)
    #: instead of ``root``: what ``object_graph(digest=...)``'s digest made of the graph (the bytes ``of_graph``
    #: sent from where it was unpickled, or what ``of_pickle`` read from the pickle)
    digest: object | None = None

    def take(self) -> object:
        return self.root.pop()


@dataclass(frozen=True)
class Attachment:
    """A file a container carries besides its object graph (a TorchScript archive's ``code/`` sources),
    served read-only and byte-exact. ``group`` says what it is; ``path`` is '/'-separated as stored."""

    group: str
    path: str
    size: int
    open: Callable[[], ByteSource]


class Container(Protocol):
    kind: str  # "zip", "legacy", "torchscript", "safetensors", "dcp"
    source: ByteSource
    byteorder: str  # "little" / "big": byte order of storage data

    @property
    def info(self) -> dict[str, Any]:
        """Format facts for `ckptfs info` (root, records, versions ...); may be gathered on first use."""
        ...

    def object_graph(self, strict: bool, digest: GraphDigest | None = None) -> ObjectGraph:
        """The root object, as inert data (raises a CkptfsError naming the record on failure).

        ``digest`` (optional to honour, :class:`GraphDigest`): when it recognises the graph, from the pickle's
        bytes or where the pickle is unpickled (the probe's child), the graph comes back as what it made of
        it (``ObjectGraph.digest``) instead of objects."""
        ...

    def pickles(self) -> Sequence[bytes]:
        """The pickles :meth:`object_graph` will unpickle, read now (so that a catalog of many files checks
        them together: :func:`ckptfs.pickle.unpickler.probed_together`); () when there are none, or when
        they are read as a stream."""
        ...

    def bind(self, refs: Mapping[str, StorageRef]) -> None:
        """Called once the graph's storages are known (the legacy stream locates its storages only then)."""
        ...

    def storage_size(self, key: str) -> int:
        """Size in bytes of storage ``key``, refusing as :meth:`storage_source` does (cheap: no objects made)."""
        ...

    def storage_source(self, key: str) -> ByteSource:
        """The bytes of storage ``key`` (raises FormatError / TensorError)."""
        ...

    def record_name(self, key: str) -> str:
        """How the container names storage ``key``'s record, for messages and sidecars."""
        ...

    def storage_layout(self, key: str) -> dict[str, Any] | None:
        """Where storage ``key``'s bytes are in the format's own terms (shown in the entry's ``extra``), or
        None when :meth:`record_name` says it all."""
        ...

    def attachments(self) -> Sequence[Attachment]:
        """Files carried besides the object graph (none for most formats)."""
        ...

    def user_metadata(self) -> Mapping[str, str] | None:
        """The free-form string metadata the file carries for its users (a safetensors ``__metadata__``), or
        None for formats that have no such thing (torch.save files). Format facts are in :attr:`info`."""
        ...

    def close(self) -> None: ...
