"""Container readers: tell the format of a checkpoint by its first bytes and open it."""

from __future__ import annotations

from ..errors import FormatError, UnsupportedError
from ..limits import DEFAULT_LIMITS, Limits
from ..source import ByteSource
from .base import Attachment, Container, ObjectGraph
from .safetensors import SafetensorsFile, is_safetensors
from .torchscript import TorchScriptZip, is_torchscript
from .torchzip import TorchZip
from .zip import is_zip

__all__ = ["Attachment", "Container", "ObjectGraph", "SafetensorsFile", "open_container", "sniff"]

# torch's legacy MAGIC_NUMBER 0x1950a86a20f9469cfc6c, pickled as a 10-byte LONG1 (any protocol)
LEGACY_MAGIC = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


def sniff(head: bytes, size: int) -> str:
    """'zip', 'legacy', 'safetensors', 'tar' or 'unknown' from the first 512 bytes."""
    if is_zip(head):
        return "zip"
    if head[:1] == b"\x80" and LEGACY_MAGIC in head[:32]:
        return "legacy"
    if is_safetensors(head, size):
        return "safetensors"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return "unknown"


def open_container(source: ByteSource, limits: Limits = DEFAULT_LIMITS) -> Container:
    head = source.pread(0, 512)
    kind = sniff(head, source.size)
    if kind == "zip":
        archive = TorchZip(source, limits)
        return TorchScriptZip(archive) if is_torchscript(archive) else archive
    if kind == "legacy":
        from .legacy import LegacyStream

        return LegacyStream(source, limits)
    if kind == "safetensors":
        return SafetensorsFile(source, limits)
    if kind == "tar":
        raise UnsupportedError("unsupported (tar-based torch < 0.4 format)", file=source.name)
    if not head:
        raise FormatError("empty file, not a checkpoint", file=source.name)
    if head[:1] == b"\x80":
        raise FormatError("a bare pickle without torch's magic number (not a torch.save checkpoint)",
                          file=source.name)
    other = other_format(head, source.size)
    if other is not None:
        what, hint = other
        raise FormatError(f"{what}, not a torch checkpoint ({hint})", file=source.name)
    raise FormatError(f"not a torch checkpoint (starts with {head[:8]!r})", file=source.name)


def other_format(head: bytes, size: int) -> tuple[str, str] | None:
    """Name the (non-torch) format of a file people often mistake for a checkpoint, with how to read it."""
    for magic, found in _OTHER_MAGICS:
        if head.startswith(magic):
            return found
    return None


_OTHER_MAGICS = (
    (b"\x93NUMPY", ("a NumPy .npy file", "np.load(path, mmap_mode='r') reads it lazily")),
    (b"GGUF", ("a GGUF file", "llama.cpp's format")),
    (b"\x89HDF\r\n\x1a\n", ("an HDF5 file", "Keras / h5py")),
)
