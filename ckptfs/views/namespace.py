"""Key <-> path naming for the mount: escaping, splitting and collisions. Pure: no I/O, no torch, no fuse.

docs/layout.md is the contract; in short:

* A string key is split on "." into path components (at most ``MAX_PIECES``; the rest stays one
  component). ``{'model': {'fc.weight': t}}`` and ``{'model.fc.weight': t}`` both give ``model/fc/weight``.
* An ``int`` key (list/tuple index, optimizer state id) is its decimal digits.
* Any other key (None, bool, float, tuple, bytes, ...) and the empty string are one component: ``%%``
  followed by the escaped ``repr()`` of the key (``%%None``, ``%%(1, 2)``, ``%%''``).
* Escaping: ``%``, ``/``, ``.`` and every character that is not printable (NUL, controls, lone
  surrogates, format characters) become ``%XX`` per UTF-8 byte (surrogates encoded with
  ``surrogatepass``), upper-case hex. So a name made from a key never contains "/" or NUL, never starts
  with "." and never contains "." at all: every name with a dot (``weight.json``, ``/.ckptfs``) is ckptfs's.
* A name longer than ``LONG_NAME`` bytes keeps its first ``KEEP_BYTES`` bytes (whole characters and
  whole escapes) followed by ``%#`` and 16 hex digits of the SHA-256 of the full name.
* Collisions inside one directory: directories made by splitting keys merge with each other and with a
  container of the same name; otherwise the entry that comes later in checkpoint order is renamed to
  ``<name>%~2`` (then ``%~3`` ...), except that a file or link never keeps a name a directory needs: the
  file is renamed, whatever the order.
* Letter case is kept: ``Weight`` and ``weight`` are two names (Linux compares names byte for byte).
"""

from __future__ import annotations

import ast
import hashlib
from typing import Iterable, Sequence, cast, overload

MAX_NAME = 255  # NAME_MAX, bytes
MAX_PIECES = 64  # a dotted key becomes at most this many components
LONG_NAME = 230  # names longer than this (bytes) are shortened ...
KEEP_BYTES = 200  # ... to this many bytes of the name, then "%#" + HASH_HEX hex digits
HASH_HEX = 16
SIDECAR_SUFFIX = ".json"
ROOT_VALUE_NAME = "%root"  # the file standing for a checkpoint whose top-level object is a tensor or value
LITERAL = "%%"  # prefix of names standing for non-string keys (and the empty string)
RENAME = "%~"  # collision suffix: "%~2", "%~3", ...
HASHED = "%#"  # marks a shortened name

DIR, FILE, LINK = 0, 1, 2

_HEX = frozenset("0123456789ABCDEF")
_UNSAFE = ("%", "/", ".")


# --- one component ----------------------------------------------------------------------------------


def escape(text: str) -> str:
    """``text`` as a safe file name fragment: '%', '/', '.' and non-printable characters as %XX."""
    if text.isprintable() and "%" not in text and "/" not in text and "." not in text:
        return text
    out: list[str] = []
    for ch in text:
        if ch in _UNSAFE or not ch.isprintable():
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        else:
            out.append(ch)
    return "".join(out)


def unescape(name: str) -> str:
    """Inverse of :func:`escape`; raises ValueError on anything escape() cannot produce."""
    if "%" not in name:
        if "/" in name or "." in name or not name.isprintable():
            raise ValueError(f"not an escaped name: {name!r}")
        return name
    raw = bytearray()
    i, n = 0, len(name)
    while i < n:
        ch = name[i]
        if ch == "%":
            hx = name[i + 1 : i + 3]
            if len(hx) != 2 or not set(hx) <= _HEX:
                raise ValueError(f"bad escape at {i} in {name!r}")
            raw.append(int(hx, 16))
            i += 3
            continue
        if ch in _UNSAFE or not ch.isprintable():
            raise ValueError(f"unescaped {ch!r} in {name!r}")
        raw += ch.encode("utf-8")
        i += 1
    text = raw.decode("utf-8", "surrogatepass")
    if escape(text) != name:  # non-canonical spellings ("%41" for "A") name nothing
        raise ValueError(f"not the canonical escape of {text!r}: {name!r}")
    return text


def _int_text(n: int) -> str:
    try:
        return str(n)
    except ValueError:  # more digits than int->str allows: hexadecimal literal instead
        return LITERAL + escape(hex(n))


def literal_name(key: object) -> str:
    """A non-str, non-int key (or the empty string) as one name: ``%%`` + escaped repr."""
    try:
        text = repr(key)
    except Exception:  # noqa: BLE001 - a hostile object: its type at least
        text = f"<{type(key).__name__}>"
    return LITERAL + escape(text)


def shorten(name: str) -> str:
    """Names over LONG_NAME bytes: the first KEEP_BYTES bytes (whole characters and escapes) + %# + hash."""
    raw = name.encode("utf-8", "surrogatepass")
    if len(raw) <= LONG_NAME:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:HASH_HEX]
    prefix = LITERAL if name.startswith(LITERAL) else ""
    keep, used = [prefix], len(prefix)
    i = len(prefix)
    while i < len(name):  # cut between whole characters and whole %XX escapes
        tok = name[i : i + 3] if name[i] == "%" else name[i]
        size = len(tok.encode("utf-8", "surrogatepass"))
        if used + size > KEEP_BYTES:
            break
        keep.append(tok)
        used += size
        i += len(tok)
    return "".join(keep) + HASHED + digest


def piece_name(piece: object) -> str:
    """One path component (already split) as a name."""
    t = type(piece)
    if t is str:
        name = escape(piece) if piece else LITERAL + "''"  # type: ignore[arg-type]
    elif t is int:
        name = _int_text(piece)  # type: ignore[arg-type]
    else:
        name = literal_name(piece)
    return shorten(name)


@overload
def split_key(key: str) -> list[str]: ...


@overload
def split_key(key: object) -> Sequence[object]: ...


def split_key(key: object) -> Sequence[object]:
    """The components a key stands for: a str split on '.', anything else itself."""
    if type(key) is str:
        return key.split(".", MAX_PIECES - 1)
    return [key]


def key_names(key: object) -> list[str]:
    """The names (one per directory level) of one container key."""
    return [piece_name(p) for p in split_key(key)]


def decode_name(name: str) -> object:
    """The component a name stands for: the str piece, or the key itself for ``%%`` literal names.

    Digits are returned as text: "0" stands for the int key 0 or the str piece "0" alike (the dotted key
    is the same; the sidecar's ``path`` says which). Raises ValueError for names that do not say their
    key alone (shortened ``%#`` names, keys with no literal form); a rename suffix ``%~N`` is stripped
    (the sidecar and /.ckptfs/index.json say which key was renamed)."""
    base = strip_rename(name)
    if HASHED in base:
        raise ValueError(f"{name!r} is shortened; its key is in its sidecar and /.ckptfs/index.json")
    if base.startswith(LITERAL):
        text = unescape(base[len(LITERAL) :])
        if text in ("inf", "-inf", "nan"):  # float reprs that are not literals
            return float(text)
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"{name!r} stands for a key with no literal form ({text[:80]})") from None
    return unescape(base)


def strip_rename(name: str) -> str:
    i = name.rfind(RENAME)
    if i > 0 and name[i + 2 :].isdigit() and name[i + 2 :].isascii():
        return name[:i]
    return name


def sidecar_name(name: str) -> str:
    return name + SIDECAR_SUFFIX


# --- the tree -----------------------------------------------------------------------------------------


class Tree:
    """The mount's names as columns: one node per directory, file or link (node 0 is the root directory).

    ``entries[d]`` maps names to nodes for directory ``d``; ``row_node[r]`` is the node of index row
    ``r`` (-1 if none); ``rows[n]`` is the row a node stands for (-1 for directories that only exist
    because keys were split on '.').
    """

    __slots__ = ("names", "parents", "types", "rows", "entries", "row_node", "renamed", "_suffix")

    def __init__(self, n_rows: int) -> None:
        self.names: list[str] = [""]
        self.parents: list[int] = [-1]
        self.types: list[int] = [DIR]
        self.rows: list[int] = [-1]
        self.entries: dict[int, dict[str, int]] = {0: {}}
        self.row_node: list[int] = [-1] * n_rows
        self.renamed = 0
        self._suffix: dict[tuple[int, str], int] = {}  # (dir, name) -> next rename number to try

    def __len__(self) -> int:
        return len(self.names)

    def add(self, parent: int, name: str, typ: int, row: int = -1) -> int:
        node = len(self.names)
        self.names.append(name)
        self.parents.append(parent)
        self.types.append(typ)
        self.rows.append(row)
        if typ == DIR:
            self.entries[node] = {}
        self.entries[parent][name] = node
        if row >= 0:
            self.row_node[row] = node
        return node

    def free_name(self, d: int, name: str) -> str:
        """The first free ``name%~n`` (n >= 2) in directory ``d``; remembered per name, so that 10^5 equal
        names (e.g. unknown objects used as dict keys) cost linear time, not quadratic."""
        taken = self.entries[d]
        n = self._suffix.get((d, name), 2)
        while f"{name}{RENAME}{n}" in taken:
            n += 1
        self._suffix[(d, name)] = n + 1
        self.renamed += 1
        return f"{name}{RENAME}{n}"

    def _move_away(self, d: int, node: int) -> None:
        """A file or link gives its name up to a directory."""
        name = self.names[node]
        new = self.free_name(d, name)
        del self.entries[d][name]
        self.entries[d][new] = node
        self.names[node] = new

    def subdir(self, d: int, name: str) -> int:
        """The directory ``name`` in ``d``, made if missing (a file there moves away)."""
        node = self.entries[d].get(name)
        if node is not None:
            if self.types[node] == DIR:
                return node
            self._move_away(d, node)
        return self.add(d, name, DIR)

    def place(self, d: int, name: str, typ: int, row: int) -> int:
        """Row ``row`` at ``name`` in ``d`` with the collision rules."""
        node = self.entries[d].get(name)
        if node is None:
            return self.add(d, name, typ, row)
        if typ == DIR:
            if self.types[node] == DIR:
                if self.rows[node] < 0:  # a split-made directory: the container takes it over
                    self.rows[node] = row
                    self.row_node[row] = node
                    return node
                return self.add(d, self.free_name(d, name), DIR, row)
            self._move_away(d, node)
            return self.add(d, name, DIR, row)
        return self.add(d, self.free_name(d, name), typ, row)

    # --- queries ---
    def path(self, node: int) -> str:
        """'/'-joined names from the root (no leading slash; '' for the root)."""
        parts = []
        names, parents = self.names, self.parents
        while node > 0:
            parts.append(names[node])
            node = parents[node]
        return "/".join(reversed(parts))

    def lookup(self, parts: Iterable[str]) -> int | None:
        node = 0
        entries = self.entries
        for p in parts:
            if not p:
                continue
            children = entries.get(node)
            if children is None:
                return None
            node = children.get(p)  # type: ignore[assignment]
            if node is None:
                return None
        return node

    def depth(self, node: int) -> int:
        d = 0
        while node > 0:
            node = self.parents[node]
            d += 1
        return d


def build_tree(parents: Sequence[int], names: Sequence[object], types: Sequence[int], order: Iterable[int]) -> Tree:
    """Lay an index out as a tree. ``types[r]`` is DIR (a container), FILE or LINK for each row; rows come
    in ``order`` (checkpoint order, parents before children; row 0 is the root object)."""
    tree = Tree(len(parents))
    if _flat_and_plain(parents, names, types, order):
        return _flat_tree(tree, names, types)
    row_dir = tree.row_node  # a container row's directory node
    cache: dict[object, str] = {}  # str piece / int -> name
    prefix_dirs: dict[tuple[int, str], int] = {}  # (directory, dotted prefix) -> directory
    subdir, place = tree.subdir, tree.place
    t_names, t_parents, t_types, t_rows, entries = tree.names, tree.parents, tree.types, tree.rows, tree.entries

    def name_of(piece: object) -> str:
        t = type(piece)
        if t is str:
            text = cast(str, piece)
            if text and text.isascii() and len(text) <= LONG_NAME and text.isprintable() and "%" not in text \
                    and "/" not in text and "." not in text:
                return text  # its own name: piece_name's answer, without a cache entry (a million keys)
        if t is str or t is int:
            nm = cache.get(piece)
            if nm is None:
                nm = cache[piece] = piece_name(piece)
            return nm
        return piece_name(piece)

    for r in order:
        if r == 0:
            if types[0] == DIR:
                tree.rows[0] = 0
                row_dir[0] = 0
            else:
                tree.add(0, ROOT_VALUE_NAME, types[0], 0)
            continue
        d = row_dir[parents[r]]
        key = names[r]
        if type(key) is str and "." not in key and key and len(key) <= LONG_NAME and key.isascii() \
                and key.isprintable() and "%" not in key and "/" not in key:
            nm = key  # name_of's first answer, inline: this loop runs once per key
        elif type(key) is str and "." in key:
            head, _, last = key.rpartition(".")
            dd = prefix_dirs.get((d, head))
            if dd is None:
                pieces = split_key(key)
                if len(pieces) == MAX_PIECES and "." in pieces[-1]:  # over the split limit
                    last = pieces[-1]
                    for p in pieces[:-1]:
                        d = subdir(d, name_of(p))
                else:
                    start = d
                    for p in pieces[:-1]:
                        d = subdir(d, name_of(p))
                    prefix_dirs[(start, head)] = d
            else:
                d = dd
            nm = name_of(last)
        else:
            nm = name_of(key)
        children = entries[d]
        typ = types[r]
        if nm in children:
            place(d, nm, typ, r)  # a collision: the rules
            continue
        node = len(t_names)  # Tree.add, inlined: this loop runs once per key
        t_names.append(nm)
        t_parents.append(d)
        t_types.append(typ)
        t_rows.append(r)
        if typ == DIR:
            entries[node] = {}
        children[nm] = node
        row_dir[r] = node
    return tree


def _flat_and_plain(parents: Sequence[int], names: Sequence[object], types: Sequence[int], order: Iterable[int]) -> bool:
    """Every row but the root is a file directly under it, named by a key that is its own name (a flat
    state_dict with plain keys: names are unique, and no name can be a sidecar's or the reserved directory's,
    which hold a '.'). Checked with a few passes in C over all the keys at once."""
    n = len(parents)
    if n < 2 or not isinstance(order, range) or order != range(n) or types[0] != DIR \
            or parents.count(0) != n - 1 or DIR in types[1:]:
        return False
    keys = names[1:]
    if set(map(type, keys)) != {str}:
        return False
    text = "".join(keys)  # type: ignore[arg-type]
    return (text.isascii() and text.isprintable() and "." not in text and "%" not in text and "/" not in text
            and min(map(len, keys)) > 0 and max(map(len, keys)) <= LONG_NAME)  # type: ignore[arg-type]


def _flat_tree(tree: Tree, names: Sequence[object], types: Sequence[int]) -> Tree:
    """build_tree's result for a flat, plain index (_flat_and_plain), made a column at a time."""
    n = len(names)
    keys: list[str] = list(names[1:])  # type: ignore[arg-type]
    tree.names += keys
    tree.parents += [0] * (n - 1)
    tree.types += types[1:]
    tree.rows = list(range(n))  # node k is row k (the root directory is row 0's, as build_tree makes it)
    tree.entries[0] = dict(zip(keys, range(1, n), strict=True))
    tree.row_node[:] = range(n)
    return tree
