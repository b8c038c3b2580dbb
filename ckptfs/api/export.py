"""``ckptfs export SRC DST``: write a checkpoint as real safetensors file(s), streaming, with bounded memory.

What is written is exactly what the safetensors view shows (:mod:`ckptfs.views.safetensors`): a header
from the index, then each tensor's bytes. How the bytes move:

* a tensor stored as one range of a local file is copied by the kernel (``os.copy_file_range``: no copy
  through this process, a reflink on filesystems that share extents); holes in the source (a checkpoint
  written with ``torch.serialization.skip_data`` and filled in later) stay holes, as ``cp`` keeps them;
* anything else (strided views, big-endian data, remote sources) is read into one reusable buffer and
  written from there. A strided view of a local file is gathered through a map of the file that is
  dropped after every chunk (``MADV_DONTNEED``), so its pages do not pile up in this process; a strided
  view of a source that is not a local file (remote, compressed) is first spooled to a temporary file
  next to the destination, then gathered from there.

Files are written under a temporary name next to DST (``.DST.ckptfs-PID.part``), fsynced, optionally
verified (read back from the disk, not the page cache, and compared with the source), and renamed into
place only when complete; the directory is fsynced too. A killed export leaves no DST (its temporary
file is removed by the next export to the same DST); ``force=False`` never replaces an existing DST.
"""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from ..errors import CkptfsError, StaleSourceError, oneline
from ..limits import DEFAULT_LIMITS, Limits
from ..model.catalog import Catalog
from ..model.extents import Content, Literal, Piece, SourceRange, source_range
from ..model.opener import Target
from ..pickle.nodes import TensorNode, contiguous_strides
from ..source import LocalFile
from ..source.options import RemoteOptions
from ..source.urls import is_url
from ..views.model_dir import ModelSource, member_files, open_model, open_passthrough
from ..views.safetensors import (
    SafetensorsFile,
    TensorEntry,
    index_name,
    plan_by_size,
    plan_members,
    select,
)
from .checkpoint import Checkpoint

#: --max-shard-size's default, as transformers' (decimal: 5 * 10^9 bytes of tensor data per shard)
DEFAULT_MAX_SHARD = 5 * 10**9
#: The buffer everything that is not copied by the kernel goes through.
CHUNK = 8 << 20
#: Bytes per copy_file_range call (progress is reported between calls).
KERNEL_CHUNK = 64 << 20
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF,
                   errno.ETXTBSY, errno.EIO)


class Progress(Protocol):
    """What an export reports as it goes (the CLI shows it as a tqdm bar on a terminal)."""

    def start(self, total: int) -> None:
        """``total`` bytes will be written (headers, tensors, files passed through)."""

    def update(self, n: int, what: str) -> None:
        """``n`` more bytes are written; ``what`` is the tensor or file being written."""

    def close(self) -> None: ...


@dataclass
class ExportResult:
    destination: str
    files: list[tuple[str, int]] = field(default_factory=list)  # (path, bytes) of every file written
    tensors: int = 0
    data_bytes: int = 0  # tensor bytes
    omitted: dict[str, str] = field(default_factory=dict)  # key -> why it is not in the output
    seconds: float = 0.0
    verified: bool = False
    kernel_copied: int = 0  # bytes copied by copy_file_range
    holes: int = 0  # bytes left as holes (holes of the source)


@dataclass
class _Output:
    """One file to write: a safetensors file, bytes, or a file passed through."""

    path: str  # relative to the destination ('' for a single-file destination)
    size: int
    safetensors: SafetensorsFile | None = None
    data: bytes | None = None
    open_content: Callable[[], tuple[Content, Callable[[], None]]] | None = None


def _nothing() -> None:
    return None


@dataclass
class _Part:
    """A piece of an output file: bytes (a content) at ``pos``, or a strided tensor written box by box."""

    content: Content | None
    pos: int
    what: str
    done: Callable[[], None] = _nothing
    entry: TensorEntry | None = None


def export(src: Target | Catalog | Checkpoint, dst: str | os.PathLike[str], *,
           max_shard_size: int = DEFAULT_MAX_SHARD, keep_shards: bool = False, force: bool = False,
           verify: bool = False, progress: Progress | None = None, strict: bool = False,
           limits: Limits = DEFAULT_LIMITS, storage_options: Mapping[str, object] | None = None,
           remote: RemoteOptions | None = None) -> ExportResult:
    """Write ``src`` as safetensors: one file when ``dst`` ends with ``.safetensors``, else a directory in
    HF's layout (``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` shards of at most
    ``max_shard_size`` tensor bytes plus ``model.safetensors.index.json``; with ``keep_shards``, one shard
    per file of a sharded source instead; a directory of several unrelated checkpoints: one
    ``<name>.safetensors`` per checkpoint file, whatever ``max_shard_size``; a model directory's other files
    are copied along). Raises CkptfsError (nothing is left at ``dst`` then)."""
    t0 = time.perf_counter()
    dst = os.path.abspath(os.fspath(dst))
    single = dst.endswith(".safetensors") and not os.path.isdir(dst)
    if max_shard_size <= 0:
        raise CkptfsError(f"max_shard_size must be positive (got {max_shard_size})")
    if isinstance(src, (str, os.PathLike)) and not is_url(src) and os.path.lexists(dst) and os.path.exists(src):
        real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
        if os.path.samefile(src, dst):
            raise CkptfsError("is the checkpoint being exported (choose another destination)", file=dst)
        if real_src.startswith(real_dst.rstrip("/") + "/"):  # --force would delete the source with it
            raise CkptfsError("holds the checkpoint being exported (choose another destination)", file=dst)
    _check_destination(dst, single, force)
    owned = not isinstance(src, (Catalog, Checkpoint))
    model = open_model(src.catalog if isinstance(src, Checkpoint) else src, strict=strict, limits=limits,
                       storage_options=storage_options, remote=remote)
    try:
        outputs, result = _plan(model, dst, single, max_shard_size, keep_shards)
        _refuse_damaged(model.catalog)
        _write_all(model, outputs, dst, single, force, verify, progress, result)
    finally:
        if owned:
            model.close()
    result.seconds = time.perf_counter() - t0
    return result


# --- what to write -------------------------------------------------------------------------------------------


def _refuse_damaged(catalog: Catalog) -> None:
    """An export is a copy: a tensor that cannot be read, or a file of the directory that could not be opened,
    fails it (a view lists them; a copy without them would pass for complete)."""
    index = catalog.index
    damaged = []
    for i in index.tensors():
        t = index.nodes[i]
        if isinstance(t, TensorNode) and t.error is not None:
            damaged.append((index.keys[i], t.error))
    problems = [(name, e.reason) for name, e in catalog.problems]
    if not damaged and not problems:
        return
    if problems:
        name, why = problems[0]
        what = f"{len(problems)} file{'s' * (len(problems) > 1)} of the directory cannot be opened ({name}: {why})"
    else:
        key, why = damaged[0]
        what = f"{len(damaged)} tensor{'s' * (len(damaged) > 1)} cannot be read ({oneline(key)}: {why})"
    raise CkptfsError(f"cannot export: {what}; nothing was written", file=catalog.name)



def _plan(model: ModelSource, dst: str, single: bool, max_shard_size: int,
          keep_shards: bool) -> tuple[list[_Output], ExportResult]:
    result = ExportResult(dst)
    outputs: list[_Output] = []
    if single:
        sel = select(model.catalog)
        st = SafetensorsFile(sel.tensors, sel.metadata(), name=os.path.basename(dst))
        outputs.append(_Output("", st.size, safetensors=st))
        result.omitted.update(sel.omitted)
    else:
        prefix = model.prefix if model.kind == "hf" else "model"
        variant = model.variant if model.kind == "hf" else None
        if model.kind == "members":  # a directory of several checkpoints: one file per checkpoint
            files, omitted = member_files(model)
            index = None
            result.omitted.update(omitted)
        elif keep_shards and model.kind == "hf":
            files, index, omitted = plan_members(model.catalog, prefix, variant)
            result.omitted.update(omitted)
        else:
            sel = select(model.catalog)
            files, index = plan_by_size(sel, max_shard_size, prefix, variant)
            result.omitted.update(sel.omitted)
        for name, st in files:
            outputs.append(_Output(name, st.size, safetensors=st))
        if index is not None:
            outputs.append(_Output(index_name(prefix, variant), len(index), data=index))
        taken = {o.path for o in outputs}
        for p in model.passthrough:
            if p.path in taken:
                continue

            def opener(p: Any = p) -> tuple[Content, Callable[[], None]]:
                f = open_passthrough(p)
                return Content([source_range(f, 0, p.size)]), f.close

            outputs.append(_Output(p.path, p.size, open_content=opener))
    for o in outputs:
        if o.safetensors is not None:
            result.tensors += len(o.safetensors.tensors)
            result.data_bytes += o.safetensors.data_bytes
    return outputs, result


# --- the destination ---------------------------------------------------------------------------------------------


def _check_destination(dst: str, single: bool, force: bool) -> None:
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise CkptfsError("the directory to write in does not exist", file=parent)
    if not os.path.lexists(dst):
        return
    if not single and os.path.isdir(dst) and not os.listdir(dst):
        return  # an empty directory made for the export
    if not force:
        raise CkptfsError("exists; pass --force to replace it", file=dst)


def _tmp_name(dst: str, pid: int | None = None) -> str:
    parent, name = os.path.split(dst)
    return os.path.join(parent, f".{name}.ckptfs-{os.getpid() if pid is None else pid}.part")


def remove_stale_parts(dst: str) -> list[str]:
    """Remove what killed exports to ``dst`` left (``.NAME.ckptfs-PID.part`` of processes gone)."""
    parent, name = os.path.split(dst)
    pattern = re.compile(r"^\." + re.escape(name) + r"\.ckptfs-(\d+)\.(part|spool\d*|old)$")
    removed: list[str] = []
    try:
        entries = os.listdir(parent)
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry)
        if m is None or _alive(int(m.group(1))):
            continue
        path = os.path.join(parent, entry)
        _remove(path)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _check_space(dst: str, need: int, sources: Sequence[object]) -> None:
    """Refuse at once what cannot fit (rather than fail with ENOSPC after writing for an hour). On the
    filesystem of a local source the copy may share its blocks (copy_file_range reflinks on btrfs and XFS):
    not refused there; a local source's holes stay holes in the copy: not counted."""
    where = os.path.dirname(dst)
    try:
        st, dev = os.statvfs(where), os.stat(where).st_dev
        local = [os.fstat(s.fd) for s in sources if isinstance(s, LocalFile)]
    except OSError:
        return  # (the writes say what is wrong)
    free = st.f_bavail * st.f_frsize
    holes = sum(max(0, f.st_size - f.st_blocks * 512) for f in local)
    if need - holes <= free or any(f.st_dev == dev for f in local):
        return
    raise CkptfsError(f"needs {need / 2**30:.2f} GiB but {where} has {free / 2**30:.2f} GiB free", file=dst)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


def _put_in_place(tmp: str, dst: str) -> None:
    """Rename the finished ``tmp`` to ``dst`` (replacing it when it exists: --force, or an empty directory)."""
    if os.path.isdir(tmp) and os.path.lexists(dst):
        if os.path.isdir(dst) and not os.path.islink(dst):
            if _exchange(tmp, dst):
                shutil.rmtree(tmp, ignore_errors=True)  # (tmp now names the old directory)
                return
            old = dst.rsplit("/", 1)
            aside = os.path.join(old[0], f".{old[1]}.ckptfs-{os.getpid()}.old")
            os.rename(dst, aside)
            os.rename(tmp, dst)
            shutil.rmtree(aside, ignore_errors=True)
            return
        os.unlink(dst)
    elif os.path.isdir(dst) and not os.path.islink(dst):
        raise CkptfsError("is a directory", file=dst)
    os.rename(tmp, dst)


# --- writing ---------------------------------------------------------------------------------------------------


def _write_all(model: ModelSource, outputs: list[_Output], dst: str, single: bool, force: bool, verify: bool,
               progress: Progress | None, result: ExportResult) -> None:
    remove_stale_parts(dst)
    tmp = _tmp_name(dst)
    writer = _Writer(model, dst, progress)
    sources = [m.source for m in model.catalog.members]
    try:
        for s in sources:
            s.check_unchanged(True)
        _check_space(dst, sum(o.size for o in outputs), sources)
        if not single:
            os.mkdir(tmp, 0o755)
        if progress is not None:
            progress.start(sum(o.size for o in outputs))
        dirs = {tmp} if not single else set()
        for o in outputs:
            path = tmp if single else os.path.join(tmp, o.path)
            if not single and os.path.dirname(path) not in dirs:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                d = os.path.dirname(path)
                while d not in dirs and d.startswith(tmp):
                    dirs.add(d)
                    d = os.path.dirname(d)
            writer.write_file(path, o, verify)
            result.files.append((dst if single else os.path.join(dst, o.path), o.size))
        for s in sources:  # the checkpoint must not have changed while we read it
            s.check_unchanged(True)
        for d in sorted(dirs, key=len, reverse=True):
            _fsync_dir(d)
        _put_in_place(tmp, dst)
        _fsync_dir(os.path.dirname(dst))
    except BaseException:
        _remove(tmp)
        raise
    finally:
        writer.close()
        if progress is not None:
            progress.close()
    result.verified = verify
    result.kernel_copied = writer.kernel_copied
    result.holes = writer.holes


class _Writer:
    """Writes contents into files: kernel copies for ranges of local files, one buffer for the rest."""

    def __init__(self, model: ModelSource, dst: str, progress: Progress | None) -> None:
        self.model = model
        self.dst = dst
        self.progress = progress
        self.buf = bytearray(CHUNK)
        self.kernel_copy = hasattr(os, "copy_file_range")
        self.kernel_copied = 0
        self.holes = 0
        self._dirty = 0
        self._private: dict[int, LocalFile] = {}  # id(LocalFile of the catalog) -> our own LocalFile of it
        self._spools = 0

    def close(self) -> None:
        for f in self._private.values():
            f.close()
        self._private.clear()

    def _wrote(self, fd: int, n: int) -> None:
        """Start writing back what was written (every WRITEBACK_EVERY bytes): the final fsync then waits for
        the last stretch only, not for the whole file (the disk works while we copy)."""
        self._dirty += n
        if self._dirty >= WRITEBACK_EVERY:
            self._dirty = 0
            _start_writeback(fd)

    def _tick(self, n: int, what: str) -> None:
        if self.progress is not None and n:
            self.progress.update(n, what)

    # --- files ------------------------------------------------------------------------------------------
    def write_file(self, path: str, o: _Output, verify: bool) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            for part in self._parts(o):
                try:
                    if part.entry is not None:
                        self.write_strided(part.entry, fd, part.pos)
                    else:
                        assert part.content is not None
                        self.write_content(part.content, fd, part.pos, part.what)
                finally:
                    part.done()
            os.ftruncate(fd, o.size)  # (a hole at the end stays a hole)
            os.fsync(fd)
        finally:
            os.close(fd)
        if verify:
            self.verify_file(path, o)

    def _parts(self, o: _Output) -> Iterator[_Part]:
        """The parts of an output, made one at a time (a spooled tensor's temporary file exists only while it
        is written)."""
        label = os.path.basename(o.path) or os.path.basename(self.dst)
        if o.data is not None:
            yield _Part(Content([Literal(o.data)]), 0, label)
        elif o.open_content is not None:
            content, done = o.open_content()
            yield _Part(content, 0, o.path, done)
        else:
            st = o.safetensors
            assert st is not None
            yield _Part(Content([Literal(st.header)]), 0, label)
            for e, off in zip(st.tensors, st.offsets, strict=True):
                d = e.data
                if d.contiguous or d.storage is None or not e.nbytes:  # ranges (or bytes held in memory)
                    yield _Part(Content(e.pieces()), st.data_start + off, e.name)
                else:
                    yield _Part(None, st.data_start + off, e.name, entry=e)

    def verify_file(self, path: str, o: _Output) -> None:
        """Read the file back from the disk (its cached pages dropped first) and compare it with the source."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != o.size:
                raise CkptfsError(f"verify: the file holds {os.fstat(fd).st_size} bytes, not {o.size}", file=path)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            want = bytearray(CHUNK)
            for part in self._parts(o):
                try:
                    if part.entry is not None:
                        self.write_strided(part.entry, fd, part.pos, compare=path)
                        continue
                    assert part.content is not None
                    at = 0
                    while at < part.content.size:
                        k = min(CHUNK, part.content.size - at)
                        part.content.readinto(memoryview(want)[:k], at)
                        _compare(fd, memoryview(want)[:k], part.pos + at, path, part.what)
                        at += k
                finally:
                    part.done()
        finally:
            os.close(fd)

    # --- strided views --------------------------------------------------------------------------------------
    def write_strided(self, e: TensorEntry, fd: int, pos: int, compare: str | None = None) -> None:
        """A strided view, box by box: each box of the view spans at most BOX_BYTES of its storage, is
        gathered from our own map of the file into a C-ordered buffer (then the box's pages are dropped),
        and lands in the output as the runs it makes there. Every stored byte is read once, whatever the
        strides (a transposed matrix too), and neither the buffer nor the mapped pages outgrow a box."""
        own, base, done = self._strided_source(e)
        try:
            t = e.node
            mm = own.mmap()
            for box, runs, run_bytes, (lo, hi) in strided_boxes(t, mm, base, BOX_BYTES):
                flat = memoryview(box.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
                e.convert(flat)
                for r, start in enumerate(runs.tolist()):
                    chunk = flat[r * run_bytes : (r + 1) * run_bytes]
                    if compare is None:
                        _pwrite_all(fd, chunk, pos + start)
                    else:
                        _compare(fd, chunk, pos + start, compare, e.name)
                if compare is None:
                    self._wrote(fd, len(runs) * run_bytes)
                del flat, box
                try:
                    mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                except (OSError, ValueError, AttributeError):  # (no madvise: the pages stay mapped)
                    pass
                if compare is None:
                    self._tick(len(runs) * run_bytes, e.name)
        finally:
            done()

    def _strided_source(self, e: TensorEntry) -> tuple[LocalFile, int, Callable[[], None]]:
        """A local file holding the view's storage, and where the storage starts in it: our own open of the
        checkpoint (its map is ours alone: dropping its pages touches nobody's data), or, for a source that is
        not a local file (remote, compressed), a spooled copy of the storage next to the destination."""
        storage = e.data.storage
        assert storage is not None
        region = storage.region()
        if region is not None:
            return self._own_file(region.file), region.offset, lambda: None
        self._spools += 1
        path = os.path.join(os.path.dirname(self.dst),
                            f".{os.path.basename(self.dst)}.ckptfs-{os.getpid()}.spool{self._spools}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                self.write_content(Content([SourceRange(storage, 0, storage.size)]), fd, 0, e.name, count=False)
            finally:
                os.close(fd)
            spool = LocalFile(path)
        finally:
            os.unlink(path)  # (an open file: its bytes stay until it is closed)
        return spool, 0, spool.close

    def _own_file(self, f: LocalFile) -> LocalFile:
        own = self._private.get(id(f))
        if own is None:
            own = LocalFile(f.name)
            if own.identity() != f.identity():
                own.close()
                raise StaleSourceError("the checkpoint changed while being exported", file=f.name)
            self._private[id(f)] = own
        return own

    # --- moving bytes ---------------------------------------------------------------------------------------
    def write_content(self, content: Content, fd: int, pos: int, what: str, count: bool = True) -> None:
        for piece in content.pieces:
            if isinstance(piece, Literal):
                _pwrite_all(fd, memoryview(piece.data), pos)
                self._wrote(fd, piece.size)
                if count:
                    self._tick(piece.size, what)
            elif isinstance(piece, SourceRange) and piece.region() is not None:
                region = piece.region()
                assert region is not None
                piece.source.check_unchanged(False)
                self._copy_local(region.fd, region.offset, piece.size, fd, pos, what if count else "")
            else:
                self._copy_buffered(piece, fd, pos, what if count else "")
            pos += piece.size

    def _copy_buffered(self, piece: Piece, fd: int, pos: int, what: str) -> None:
        mv = memoryview(self.buf)
        at = 0
        while at < piece.size:
            k = min(CHUNK, piece.size - at)
            piece.readinto(mv[:k], at)
            _pwrite_all(fd, mv[:k], pos + at)
            self._wrote(fd, k)
            at += k
            if what:
                self._tick(k, what)

    def _copy_local(self, src: int, start: int, n: int, fd: int, pos: int, what: str) -> None:
        """Bytes [start, start + n) of a local file to ``pos``: data extents by the kernel, holes skipped."""
        done = start
        for a, b in _data_extents(src, start, start + n):
            if a > done:
                self.holes += a - done
                if what:
                    self._tick(a - done, what)
            self._copy_extent(src, a, b - a, fd, pos + (a - start), what)
            done = b
        if start + n > done:
            self.holes += start + n - done
            if what:
                self._tick(start + n - done, what)

    def _copy_extent(self, src: int, start: int, n: int, fd: int, pos: int, what: str) -> None:
        at = 0
        mv = memoryview(self.buf)
        while at < n:
            k = 0
            if self.kernel_copy:
                try:
                    k = os.copy_file_range(src, fd, min(KERNEL_CHUNK, n - at), start + at, pos + at)
                except OSError as e:
                    if e.errno not in _NO_KERNEL_COPY:
                        raise
                    self.kernel_copy = False
                    k = 0
                else:
                    self.kernel_copied += k
                    self._wrote(fd, k)
            if k <= 0:  # no kernel copy here (or the source ended early: read and see)
                k = min(CHUNK, n - at)
                got = os.preadv(src, [mv[:k]], start + at)
                if got <= 0:
                    raise StaleSourceError(f"the checkpoint ends at byte {start + at} (it shrank while exported)",
                                           file=self.dst)
                k = got
                _pwrite_all(fd, mv[:k], pos + at)
                self._wrote(fd, k)
            at += k
            if what:
                self._tick(k, what)


#: Bytes written between two requests to start writeback (sync_file_range).
WRITEBACK_EVERY = 64 << 20
_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: list[Any] = []


def _start_writeback(fd: int) -> None:
    """sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE): start writing the file's dirty pages, without waiting
    (Linux; elsewhere nothing: the final fsync does it all)."""
    if not _sync_file_range:
        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
            _sync_file_range.append(fn)
        except (OSError, AttributeError):
            _sync_file_range.append(None)
    fn = _sync_file_range[0]
    if fn is not None:
        fn(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    while len(data):
        k = os.pwrite(fd, data, pos)
        data = data[k:]
        pos += k


def _data_extents(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The data extents of [start, end) of a file (SEEK_DATA / SEEK_HOLE; the whole range where the file
    system cannot tell)."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None or end <= start:
        if end > start:
            yield start, end
        return
    pos = start
    while pos < end:
        try:
            a = os.lseek(fd, pos, seek_data)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole from here to the end of the file
                return
            yield pos, end
            return
        if a >= end:
            return
        try:
            b = min(os.lseek(fd, a, seek_hole), end)
        except OSError:
            b = end
        if b <= a:
            b = end
        yield a, b
        pos = b


def _compare(fd: int, want: memoryview, pos: int, path: str, what: str) -> None:
    got = os.pread(fd, len(want), pos)
    if got != want:
        bad = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
        raise CkptfsError(f"verify: byte {pos + bad} differs from the source ({oneline(what)})", file=path)


#: Storage bytes one box of a strided view may span (export's gather buffer is at most this big).
BOX_BYTES = 32 << 20


def split_boxes(shape: Sequence[int], stride: Sequence[int], budget: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Boxes (a range per dimension) that cover a strided view, in storage order, each spanning at most
    ``budget`` elements of its storage and holding at most ``budget`` elements of the view (or a single
    element): the dimension that spreads a box most is cut, or, for a box of few stored elements repeated
    (broadcast, overlapping strides: a 1-element storage expanded to 4 TiB), its longest dimension."""
    stack = [tuple((0, n) for n in shape)]
    while stack:
        box = stack.pop()
        ext = [hi - lo for lo, hi in box]
        if 0 in ext:
            continue
        span = sum((n - 1) * st for n, st in zip(ext, stride, strict=True)) + 1
        count = math.prod(ext)
        if span <= budget and count <= budget or all(n == 1 for n in ext):
            yield box
            continue
        if span > budget:
            d = max(range(len(box)), key=lambda i: (ext[i] - 1) * stride[i])
            k = max(1, min(ext[d] // 2, budget // max(stride[d], 1)))
        else:
            d = max(range(len(box)), key=lambda i: ext[i])
            k = max(1, min(ext[d] // 2, budget // (count // ext[d])))
        lo, hi = box[d]
        subs = [box[:d] + ((a, min(a + k, hi)),) + box[d + 1 :] for a in range(lo, hi, k)]
        stack.extend(reversed(subs))


def strided_boxes(t: TensorNode, mm: mmap.mmap, base: int, budget_bytes: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray, int, tuple[int, int]]]:
    """For each box of ``t`` (a strided view of a storage at byte ``base`` of the map ``mm``): the box's
    elements in C order (a new array), the byte offsets in the tensor's C-contiguous bytes of the runs the
    box makes there, each run's length in bytes, and the page-aligned byte range of ``mm`` the box read."""
    itemsize = t.dtype.itemsize
    elem = np.dtype(f"u{itemsize}") if itemsize in (1, 2, 4, 8) else np.dtype((np.void, itemsize))
    shape = tuple(t.shape)
    stride = tuple(t.stride or ())
    cstride = contiguous_strides(shape)
    page = mmap.PAGESIZE
    for box in split_boxes(shape, stride, max(1, budget_bytes // itemsize)):
        ext = tuple(hi - lo for lo, hi in box)
        first = t.storage_offset + sum(lo * st for (lo, _), st in zip(box, stride, strict=True))
        span = sum((n - 1) * st for n, st in zip(ext, stride, strict=True)) + 1
        view = np.ndarray(ext, dtype=elem, buffer=mm, offset=base + first * itemsize,
                          strides=tuple(st * itemsize for st in stride))
        out = np.empty(ext, dtype=elem)
        _copy_tiled(view, out)
        del view
        # the runs: dimensions after j are whole in the box, so each index of the dimensions before j
        # starts one run of ext[j] * cstride[j] elements
        j = max((d for d in range(len(shape)) if ext[d] != shape[d]), default=-1)
        if j < 0:
            starts = np.zeros(1, dtype=np.int64)
            run = int(np.prod(shape)) * itemsize
        else:
            starts = np.full(1, box[j][0] * cstride[j], dtype=np.int64)
            for d in range(j - 1, -1, -1):
                starts = (np.arange(box[d][0], box[d][1], dtype=np.int64)[:, None] * cstride[d] + starts[None, :]).reshape(-1)
            run = ext[j] * cstride[j] * itemsize
        lo_b = base + first * itemsize
        lo_b -= lo_b % page
        yield out, starts * itemsize, run, (lo_b, min(len(mm), base + (first + span) * itemsize))


#: Tiles of a transposing copy: TILE_ROWS x TILE_COLS elements (measured fastest here: 12x faster than one
#: numpy assignment for a transposed float32 block, whose every element would sit on another page).
TILE_ROWS, TILE_COLS = 4096, 8


def _copy_tiled(view: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = view`` (``out`` C-ordered), in tiles when the view's fastest dimension is not its last."""
    strides = [abs(s) if n > 1 else 1 << 62 for n, s in zip(view.shape, view.strides, strict=True)]
    fast, last = int(np.argmin(strides)) if strides else 0, view.ndim - 1
    if view.ndim < 2 or fast == last or view.strides[last] <= view.itemsize * 8:
        out[...] = view
        return
    idx: list[slice] = [slice(None)] * view.ndim
    for j in range(0, view.shape[last], TILE_COLS):
        idx[last] = slice(j, j + TILE_COLS)
        for i in range(0, view.shape[fast], TILE_ROWS):
            idx[fast] = slice(i, i + TILE_ROWS)
            t = tuple(idx)
            out[t] = view[t]
