"""Key <-> name rules of the mount (ckptfs.namespace): pure functions, property-tested with hypothesis."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptfs.views import namespace as ns
from ckptfs.views.namespace import DIR, FILE, LINK, build_tree, decode_name, escape, key_names, piece_name, unescape

# Text with everything hostile keys carry: dots, slashes, percent signs, NUL and controls, lone
# surrogates, format characters, non-ASCII, case variants.
HOSTILE = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("./%\x00\n\t~# -_aAbB0123456789") + ["\udc80", "\ud800", "\u202e", "\u200b", "é", "字"]),
        st.characters(),
    ),
    max_size=40,
)
KEYS = st.one_of(
    HOSTILE,
    st.integers(min_value=-(10**30), max_value=10**30),
    st.none(), st.booleans(), st.floats(allow_nan=False), st.binary(max_size=10),
    st.tuples(st.integers(0, 9), HOSTILE),
)


def safe(name: str) -> None:
    raw = name.encode("utf-8")  # always valid UTF-8 (no lone surrogates reach the kernel)
    assert "/" not in name and "\x00" not in name
    assert not name.startswith(".") and "." not in name, name
    assert name not in ("", ".", "..")
    assert len(raw) <= ns.MAX_NAME - len(ns.SIDECAR_SUFFIX)
    assert name.isprintable()


@given(HOSTILE)
@settings(max_examples=400)
def test_escape_round_trips_and_is_safe(text):
    name = escape(text)
    assert unescape(name) == text
    if text:
        safe(name)


@given(HOSTILE, HOSTILE)
def test_escape_is_injective(a, b):
    if a != b:
        assert escape(a) != escape(b)


@given(KEYS)
@settings(max_examples=400)
def test_piece_names_are_safe_and_decode(key):
    for piece, name in zip(ns.split_key(key), key_names(key)):
        safe(name)
        if ns.HASHED in name:
            continue  # shortened: reversible through the sidecar, not by name
        got = decode_name(name)
        if type(piece) is int:
            assert got == str(piece)  # digits read back as text; the sidecar's path keeps the int
        elif type(piece) is float and piece != piece:
            assert got != got
        else:
            assert got == piece and type(got) is type(piece)


@given(st.lists(HOSTILE, min_size=1, max_size=6))
def test_str_pieces_never_collide(pieces):
    names = [piece_name(p) for p in pieces]
    for p, q, a, b in zip(pieces, pieces[1:], names, names[1:]):
        assert (p == q) == (a == b)


def test_hostile_examples():
    assert key_names("layer1.0.conv1.weight") == ["layer1", "0", "conv1", "weight"]
    assert piece_name("") == "%%''"
    assert piece_name(".") == "%2E" and piece_name("..") == "%2E%2E"
    assert piece_name("a/b") == "a%2Fb" and piece_name("\x00") == "%00"
    assert piece_name("%") == "%25"
    assert piece_name(None) == "%%None" and piece_name(7) == "7" and piece_name(True) == "%%True"
    assert piece_name((1, "x.y")) == "%%(1, 'x%2Ey')"
    assert piece_name("\udc80") == "%ED%B2%80" and decode_name("%ED%B2%80") == "\udc80"
    assert piece_name("Weight") != piece_name("weight")
    long = piece_name("k" * 70_000)
    assert ns.HASHED in long and len(long.encode()) <= ns.LONG_NAME
    assert long != piece_name("k" * 69_999)
    big = piece_name(10**5000)  # more digits than str(int) allows
    safe(big)
    assert key_names("a." * 100 + "b")[-1].count("%2E") == 100 - ns.MAX_PIECES + 1


def test_decode_rejects_non_canonical():
    for bad in ("%41", "%2e", "%G0", "a.b", "a/b", "%"):
        try:
            unescape(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


# --- the tree: collisions ------------------------------------------------------------------------------------

Entry = tuple  # (parent row, name, type)


def layout(entries: list[Entry]):
    """A synthetic index (row 0: a dict root) laid out; returns the tree and each row's path."""
    parents = [-1] + [e[0] for e in entries]
    names = [None] + [e[1] for e in entries]
    types = [DIR] + [e[2] for e in entries]
    tree = build_tree(parents, names, types, range(len(parents)))
    return tree, [tree.path(tree.row_node[r]) for r in range(len(parents))]


def test_dotted_keys_and_nested_containers_merge():
    tree, paths = layout([(0, "model", DIR), (1, "fc.weight", FILE), (0, "model.fc.bias", FILE),
                          (0, "epoch", FILE)])
    assert paths[2] == "model/fc/weight" and paths[3] == "model/fc/bias" and paths[4] == "epoch"
    assert tree.renamed == 0


def test_leaf_and_prefix_the_file_is_renamed_whatever_the_order():
    for entries in ([(0, "a.b", FILE), (0, "a.b.c", FILE)], [(0, "a.b.c", FILE), (0, "a.b", FILE)]):
        tree, paths = layout(entries)
        by_name = {e[1]: paths[i + 1] for i, e in enumerate(entries)}
        assert by_name == {"a.b": "a/b%~2", "a.b.c": "a/b/c"}


def test_files_colliding_get_numbered_in_order():
    tree, paths = layout([(0, "0", FILE), (0, 0, FILE), (0, "x", DIR), (3, "y", FILE), (0, "x.y", FILE)])
    assert paths[1:] == ["0", "0%~2", "x", "x/y", "x/y%~2"]


def test_containers_colliding_are_renamed_not_merged():
    tree, paths = layout([(0, "a", DIR), (0, "a.", DIR), (0, "a.b", DIR), (1, "b", DIR), (4, "k", FILE)])
    assert paths[1] == "a" and paths[2] == "a/%%''"
    assert {paths[3], paths[4]} == {"a/b", "a/b%~2"}


def test_root_value_and_links():
    tree, paths = layout([(0, "t", LINK)])
    assert paths[1] == "t" and tree.types[tree.row_node[1]] == LINK
    t = build_tree([-1], [None], [FILE], [0])
    assert t.path(t.row_node[0]) == ns.ROOT_VALUE_NAME


CONTAINER_KEYS = st.one_of(HOSTILE, st.integers(-3, 3), st.none(), st.sampled_from(["a", "a.b", "A", "a.b.c", ""]))


@st.composite
def indexes(draw):
    """Random nested containers with hostile keys, as index-like rows (unique keys per container)."""
    entries: list[Entry] = []
    dirs = [0]
    for _ in range(draw(st.integers(1, 40))):
        parent = draw(st.sampled_from(dirs))
        taken = {(type(e[1]), e[1]) for e in entries if e[0] == parent}
        key = draw(CONTAINER_KEYS)
        if (type(key), key) in taken:  # a container's keys are unique
            continue
        typ = draw(st.sampled_from([DIR, FILE, FILE, LINK]))
        entries.append((parent, key, typ))
        if typ == DIR:
            dirs.append(len(entries))
    return entries


@given(indexes())
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_every_row_gets_exactly_one_safe_path(entries):
    tree, paths = layout(entries)
    rows = paths[1:]
    assert len(set(rows)) == len(rows)  # no two rows share a path
    seen = set()
    for d, children in tree.entries.items():
        for name, node in children.items():
            safe(name)
            assert tree.names[node] == name and tree.parents[node] == d
            assert node not in seen
            seen.add(node)
    for r, path in enumerate(rows, start=1):
        assert tree.lookup(path.split("/")) == tree.row_node[r]
        # the name decodes to the row's last key piece (up to a rename), and the directories above it
        # decode to the pieces of the keys above it
        last = path.rsplit("/", 1)[-1]
        key = entries[r - 1][1]
        if ns.HASHED not in last:
            want = ns.split_key(key)[-1]
            got = decode_name(last)
            assert got == (str(want) if type(want) is int else want)


def test_the_core_never_imports_fuse_or_torch():
    import subprocess
    import sys

    code = ("import sys, ckptfs, ckptfs.cli, ckptfs.views.namespace, ckptfs.views.tree, ckptfs.mount.daemon, "
            "ckptfs.mount.fuse_ops\n"
            "bad = [m for m in sys.modules if 'fuse' in m.replace('fuse_ops', '') or m.split('.')[0] == 'torch']\n"
            "print(sorted(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_printable_ascii_keys_stay_readable():
    for k in string.ascii_letters + string.digits + "-_ +=!@$^&*()[]{}:;,<>?|~`'\"":
        assert piece_name(k) == k


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=240), st.text(alphabet=string.ascii_letters + "%/._ ~", max_size=240)),
                min_size=1, max_size=20, unique=True))
def test_a_flat_dict_s_names_are_piece_names(keys):
    """build_tree takes plain keys as their own names without asking piece_name (the million-key fast path):
    every top-level key without a dot gets exactly piece_name's name."""
    keys = [k for k in keys if "." not in k]
    parents, names, types = [-1] + [0] * len(keys), [None, *keys], [DIR] + [FILE] * len(keys)
    tree = build_tree(parents, names, types, range(len(parents)))
    got = {tree.names[tree.rows[r]] for r in range(1, len(parents))}
    assert got == {piece_name(k) for k in keys}


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.text(alphabet=string.ascii_letters + string.digits + "_-+ ~", min_size=1, max_size=12),
                     min_size=1, max_size=30, unique=True), data=st.data())
def test_a_flat_plain_tree_is_made_in_bulk_as_row_by_row(keys, data, monkeypatch):
    """build_tree lays out a flat state_dict of plain keys a column at a time (_flat_tree); every column equals
    what the row-by-row loop makes of the same index."""
    types = [DIR] + data.draw(st.lists(st.sampled_from([FILE, LINK]), min_size=len(keys), max_size=len(keys)))
    parents, names = [-1] + [0] * len(keys), [None, *keys]
    assert ns._flat_and_plain(parents, names, types, range(len(parents)))
    bulk = build_tree(parents, names, types, range(len(parents)))
    with monkeypatch.context() as m:
        m.setattr(ns, "_flat_and_plain", lambda *a: False)
        rows = build_tree(parents, names, types, range(len(parents)))
    for column in ("names", "parents", "types", "rows", "entries", "row_node", "renamed"):
        assert getattr(bulk, column) == getattr(rows, column), column
