"""The hostile corpus: crafted checkpoints, each with the outcome ckptfs must produce.

    python tests/hostile/make_corpus.py OUTDIR      # writes every case + OUTDIR/cases.json

Families: ``exec`` (code-execution attempts), ``resource`` (nesting, floods, bombs, counts), ``lies``
(geometry, sizes, names that lie about the data), ``zip`` (container attacks), ``legacy`` (torch < 1.6
streams). Every case is built here by hand: pickles opcode by opcode (:class:`craft.P`) and zips field by
field (:func:`craft.write_zip`). Gadgets that would run code try to create a file in ``marker_dir``; the
test asserts the directory stays empty.

Expected outcomes (``Case.expect``):

- ``"index"``: the file indexes; ``tensors`` maps keys to their exact logical bytes (computed here with
  numpy from the storage bytes, checked against torch separately where torch loads the file),
  ``tensor_errors`` maps keys that must fail, alone, with a one-line ckptfs error naming file and key
  (and containing the given text);
- ``"error"``: opening fails with one ckptfs error line naming the file (and containing ``error_has``).
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hostile.craft import P, Emit, Entry, _deflate, find_entry, legacy_stream, legacy_tensor, state_dict, torch_zip, write_zip
else:
    from .craft import P, Emit, Entry, _deflate, find_entry, legacy_stream, legacy_tensor, state_dict, torch_zip, write_zip

KiB, MiB = 1 << 10, 1 << 20


@dataclass
class Case:
    name: str
    family: str
    what: str  # one line: the attack
    data: bytes | None = None
    write: Callable[[Path], None] | None = None  # for big files: writes itself
    expect: str = "index"  # "index" | "error"
    error_has: str | None = None
    tensors: dict[str, bytes | None] = field(default_factory=dict)  # key -> exact bytes (None: readable)
    tensor_errors: dict[str, str] = field(default_factory=dict)  # key -> text in the error
    keys_present: list[str] = field(default_factory=list)  # other keys that must be listed
    limits: dict | None = None  # ckptfs.Limits(**limits) instead of the defaults
    timeout: float = 5.0
    torch_ok: bool = True  # safe to hand to torch.load(weights_only=True) in the torch-comparison run
    strict_error: bool = False  # also: strict=True must refuse it
    error_type: str | None = None  # the CkptfsError subclass expected (LimitError for every resource limit)
    suffix: str = ".pt"
    max_read: int | None = None

    def path(self, outdir: Path) -> Path:
        return outdir / f"{self.name}{self.suffix}"

    def materialise(self, outdir: Path) -> Path:
        p = self.path(outdir)
        if self.write is not None:
            self.write(p)
        else:
            p.write_bytes(self.data or b"")
        return p

    def spec(self) -> dict:
        return {"name": self.name, "family": self.family, "what": self.what, "expect": self.expect,
                "error_has": self.error_has, "limits": self.limits, "timeout": self.timeout,
                "tensor_errors": self.tensor_errors, "keys_present": self.keys_present, "error_type": self.error_type,
                "tensors": {k: (None if v is None else v.hex()) for k, v in self.tensors.items()}}


# --- shared pieces ---------------------------------------------------------------------------------------------

W = np.arange(6, dtype="<f4")  # storage "0": the tensor "w" (2, 3)
W_BYTES = W.tobytes()


def w_tensor(p: P) -> None:
    p.tensor("0", 6, (2, 3), (3, 1))


def good_pickle(extra: list[tuple[object, Callable[[P], object]]] = (), proto: int = 2) -> bytes:
    """OrderedDict {'w': tensor, **extra} (extra values emitted by callables)."""
    return state_dict([("w", w_tensor), *extra], proto=proto)  # type: ignore[list-item]


def good_zip(pickle: bytes | None = None, storages: dict[str, bytes] | None = None, **kw: object) -> bytes:
    return torch_zip(pickle or good_pickle(), {"0": W_BYTES} if storages is None else storages, **kw).data  # type: ignore[arg-type]


def strided(storage: bytes, dtype: str, shape: tuple, stride: tuple, offset: int = 0) -> bytes:
    """What torch.as_strided(storage_tensor, shape, stride, offset).contiguous() holds, as bytes."""
    a = np.frombuffer(storage, dtype=dtype)
    if not all(shape):
        return b""
    v = np.lib.stride_tricks.as_strided(a[offset:], shape=shape, strides=tuple(s * a.itemsize for s in stride))
    return np.ascontiguousarray(v).tobytes()


W_EXPECT = {"w": W_BYTES}

CASES: list[Callable[[Path], list[Case]]] = []


def family(fn: Callable[[Path], list[Case]]) -> Callable[[Path], list[Case]]:
    CASES.append(fn)
    return fn


# --- 1. code execution attempts ------------------------------------------------------------------------------


def _cmd(marker_dir: Path, name: str) -> tuple[str, str]:
    m = str(marker_dir / name)
    return m, f"touch {m}"


@family
def exec_cases(marker_dir: Path) -> list[Case]:
    out: list[Case] = []

    def gadget(name: str, what: str, emit: Callable[[P, str, str], object], proto: int = 2, **kw: object) -> None:
        m, cmd = _cmd(marker_dir, name)
        pk = good_pickle([("evil", lambda p: emit(p, m, cmd))], proto=proto)
        strict = kw.pop("strict", True)
        kw.setdefault("tensors", dict(W_EXPECT))
        kw.setdefault("keys_present", ["evil"])
        out.append(Case(name, "exec", what, good_zip(pk), strict_error=bool(strict), **kw))  # type: ignore[arg-type]

    def call(mod: str, fn: str, *args: object) -> Callable[[P, str, str], object]:
        return lambda p, m, c: p.call(mod, fn, *[a.replace("@CMD", c).replace("@M", m) if isinstance(a, str) else a
                                                 for a in args])

    gadget("exec_os_system", "GLOBAL os.system + REDUCE", call("os", "system", "@CMD"))
    gadget("exec_posix_system", "GLOBAL posix.system + REDUCE", call("posix", "system", "@CMD"))
    gadget("exec_nt_system", "GLOBAL nt.system + REDUCE", call("nt", "system", "@CMD"))
    gadget("exec_subprocess_popen", "GLOBAL subprocess.Popen + REDUCE with an argv list",
           lambda p, m, c: p.global_("subprocess", "Popen").mark().value(["touch", m]).tuple().reduce())
    gadget("exec_subprocess_check_output", "subprocess.check_output(cmd, shell=True) via REDUCE",
           call("subprocess", "check_output", "@CMD", True))
    gadget("exec_builtins_eval", "builtins.eval of Python source",
           call("builtins", "eval", "open('@M', 'w')"))
    gadget("exec_builtins_exec", "builtins.exec of Python source",
           call("builtins", "exec", "import os; os.system('@CMD')"))
    gadget("exec_py2_builtin_eval", "__builtin__.eval (Python 2 module name)",
           call("__builtin__", "eval", "open('@M', 'w')"))
    gadget("exec_compile_exec", "builtins.exec(builtins.compile(src, '', 'exec'))",
           lambda p, m, c: p.global_("builtins", "exec").mark().value(
               Emit(lambda q: q.call("builtins", "compile", f"open('{m}','w')", "<x>", "exec"))).tuple().reduce())
    gadget("exec_getattr_import", "getattr(__import__('os'), 'system')(cmd): a chained gadget",
           lambda p, m, c: p.global_("builtins", "getattr").mark().value(
               Emit(lambda q: q.call("builtins", "__import__", "os"))).str("system").tuple().reduce()
           .mark().str(c).tuple().reduce())
    gadget("exec_importlib", "getattr(importlib.import_module('os'), 'system')(cmd)",
           lambda p, m, c: p.global_("builtins", "getattr").mark().value(
               Emit(lambda q: q.call("importlib", "import_module", "os"))).str("system").tuple().reduce()
           .mark().str(c).tuple().reduce())
    gadget("exec_pkgutil_resolve_name", "pkgutil.resolve_name('os:system')(cmd)",
           lambda p, m, c: p.call("pkgutil", "resolve_name", "os:system").mark().str(c).tuple().reduce())
    gadget("exec_operator_methodcaller", "operator.methodcaller('system', cmd)(__import__('os'))",
           lambda p, m, c: p.call("operator", "methodcaller", "system", c).mark().value(
               Emit(lambda q: q.call("builtins", "__import__", "os"))).tuple().reduce())
    gadget("exec_operator_attrgetter", "operator.attrgetter('system')(importlib.import_module('os'))(cmd)",
           lambda p, m, c: p.call("operator", "attrgetter", "system").mark().value(
               Emit(lambda q: q.call("importlib", "import_module", "os"))).tuple().reduce()
           .mark().str(c).tuple().reduce())
    gadget("exec_functools_partial", "functools.partial(os.system, cmd)()",
           lambda p, m, c: p.global_("functools", "partial").mark().global_("os", "system").str(c).tuple().reduce()
           .empty_tuple().reduce())
    gadget("exec_stack_global", "STACK_GLOBAL os.system (protocol 4) + REDUCE",
           lambda p, m, c: p.stack_global("os", "system").mark().str(c).tuple().reduce(), proto=4)
    gadget("exec_stack_global_dotted", "STACK_GLOBAL with a dotted name: os.path.os.system",
           lambda p, m, c: p.stack_global("os", "path.os.system").mark().str(c).tuple().reduce(), proto=4)
    gadget("exec_inst", "INST os system (protocol 0 instantiation)",
           lambda p, m, c: p.mark().str(c).inst("os", "system"))
    gadget("exec_obj", "OBJ with os.system as the class",
           lambda p, m, c: p.mark().global_("os", "system").str(c).obj())
    gadget("exec_newobj", "NEWOBJ on subprocess.Popen",
           lambda p, m, c: p.global_("subprocess", "Popen").mark().value(["touch", m]).tuple().newobj(), proto=4)
    gadget("exec_newobj_ex", "NEWOBJ_EX on subprocess.Popen with shell=True",
           lambda p, m, c: p.global_("subprocess", "Popen").mark().str(c).tuple().value({"shell": True}).newobj_ex(),
           proto=4)
    gadget("exec_build_setstate", "BUILD on an unknown object with a __setstate__ / __reduce__ state",
           lambda p, m, c: p.global_("argparse", "Namespace").empty_tuple().reduce().value(
               {"__setstate__": Emit(lambda q: q.global_("os", "system")), "__reduce__": c}).build())
    gadget("exec_build_slotstate", "BUILD with (None, slotstate) that would setattr __class__ on an OrderedDict",
           lambda p, m, c: p.ordered_dict().mark().none().value(
               {"__class__": Emit(lambda q: q.global_("os", "system")), "keys": c}).tuple().build())
    gadget("exec_build_ordereddict_dict", "BUILD on collections.OrderedDict with a dict state shadowing methods",
           lambda p, m, c: p.ordered_dict().value({"__getitem__": Emit(lambda q: q.global_("os", "system")),
                                                   "items": c}).build())
    gadget("exec_parameter_with_state", "_rebuild_parameter_with_state whose state would setattr gadgets",
           lambda p, m, c: p.global_("torch._utils", "_rebuild_parameter_with_state").mark().value(
               Emit(lambda q: q.tensor("0", 6, (6,), (1,)))).bool(True).ordered_dict().value(
               {"__class__": Emit(lambda q: q.global_("os", "system")),
                "__reduce_ex__": Emit(lambda q: q.call("os", "system", c))}).tuple().reduce(),
           tensors={"w": W_BYTES, "evil": W_BYTES})
    gadget("exec_from_type_state", "_rebuild_from_type_v2 with an unknown subclass and a state with gadgets",
           lambda p, m, c: p.global_("torch._tensor", "_rebuild_from_type_v2").mark()
           .global_("torch._utils", "_rebuild_tensor_v2").global_("os", "system").value(
               Emit(lambda q: q.mark().storage_pid("0", "FloatStorage", 6).int(0).value((6,)).value((1,))
                     .bool(False).ordered_dict().tuple()))
           .value({"x": Emit(lambda q: q.call("os", "system", c))}).tuple().reduce(),
           tensors={"w": W_BYTES, "evil": W_BYTES})
    gadget("exec_from_type_func", "_rebuild_from_type_v2 whose rebuild function is os.system",
           lambda p, m, c: p.global_("torch._tensor", "_rebuild_from_type_v2").mark().global_("os", "system")
           .global_("torch", "Tensor").value((c,)).empty_dict().tuple().reduce(),
           tensor_errors={"evil": "rebuild function"})
    gadget("exec_reconstructor", "copyreg._reconstructor(os.system, object, cmd)",
           lambda p, m, c: p.global_("copyreg", "_reconstructor").mark().global_("os", "system")
           .global_("builtins", "object").str(c).tuple().reduce())
    gadget("exec_newobj_copyreg", "copyreg.__newobj__(subprocess.Popen, cmd)",
           lambda p, m, c: p.global_("copyreg", "__newobj__").mark().global_("subprocess", "Popen").str(c)
           .tuple().reduce())
    gadget("exec_codecs_rot13", "_codecs.encode(s, 'rot13'): a codec lookup would import encodings.rot_13",
           call("_codecs", "encode", "abc", "rot13"), strict=False)
    gadget("exec_codecs_zlib", "_codecs.encode(s, 'zlib_codec'): would import encodings.zlib_codec",
           call("_codecs", "encode", "abc", "zlib_codec"), strict=False)
    gadget("exec_torch_load", "torch.load / torch.jit.load / torch.storage._load_from_bytes named",
           lambda p, m, c: p.value([Emit(lambda q: q.call("torch", "load", m)),
                                    Emit(lambda q: q.call("torch.jit", "load", m)),
                                    Emit(lambda q: q.call("torch.storage", "_load_from_bytes", b"x"))]))
    gadget("exec_numpy_reconstruct", "numpy _reconstruct with os.system as the array class",
           lambda p, m, c: p.global_("numpy.core.multiarray", "_reconstruct").mark().global_("os", "system")
           .value((0,)).value(b"b").tuple().reduce().value((1, (1,), "x", False, c)).build())
    gadget("exec_numpy_load", "numpy.load(marker, allow_pickle=True)", call("numpy", "load", "@M", True))
    gadget("exec_setattr_globals", "builtins.setattr / globals / sys.modules", lambda p, m, c: p.value([
        Emit(lambda q: q.call("builtins", "setattr", "x", "y", "z")),
        Emit(lambda q: q.call("builtins", "globals")),
        Emit(lambda q: q.global_("sys", "modules"))]))
    gadget("exec_torch_size_device", "torch.Size / torch.device / _get_layout given gadgets",
           lambda p, m, c: p.value([
               Emit(lambda q: q.global_("torch", "Size").mark().value(Emit(lambda r: r.call("os", "system", c)))
                     .tuple().reduce()),
               Emit(lambda q: q.global_("torch", "device").mark().value(Emit(lambda r: r.call("os", "system", c)))
                     .tuple().reduce()),
               Emit(lambda q: q.call("torch.serialization", "_get_layout", "os.system"))]))
    gadget("exec_wrapper_subclass", "_rebuild_wrapper_subclass with os.system as the class",
           lambda p, m, c: p.global_("torch._utils", "_rebuild_wrapper_subclass").mark().global_("os", "system")
           .global_("torch", "float32").value((2,)).value((1,)).int(0).global_("torch", "strided")
           .value(Emit(lambda q: q.call("torch", "device", "cpu"))).bool(False).tuple().reduce())
    gadget("exec_hooks", "_rebuild_tensor_v2 whose backward_hooks hold os.system",
           lambda p, m, c: p.global_("torch._utils", "_rebuild_tensor_v2").mark().storage_pid("0", "FloatStorage", 6)
           .int(0).value((6,)).value((1,)).bool(False).ordered_dict().mark().int(0).global_("os", "system")
           .setitems().tuple().reduce(), tensors={"w": W_BYTES, "evil": W_BYTES})
    gadget("exec_memo_global_key", "os.system memoised and used as a dict key and a value",
           lambda p, m, c: p.empty_dict().global_("os", "system").put(200).get(200).setitem())
    gadget("exec_dunder_names", "GLOBAL with dunder and dotted names: builtins.__import__, os.__dict__, "
           "__main__.__builtins__", lambda p, m, c: p.value([
               Emit(lambda q: q.global_("builtins", "__import__")),
               Emit(lambda q: q.global_("os", "__dict__")),
               Emit(lambda q: q.global_("__main__", "__builtins__"))]))
    gadget("exec_nonascii_global", "STACK_GLOBAL with a lone-surrogate module name (printed by `info`)",
           lambda p, m, c: p.str("os\udcff").str("sys\u202etem").raw(b"\x93"), proto=4)

    # opcodes that must fail cleanly
    for code, op in ((1, "ext1"), (2, "ext2"), (4, "ext4")):
        pk = good_pickle([("evil", lambda p, op=op: getattr(p, op)(7))])
        out.append(Case(f"exec_{op}", "exec", f"{op.upper()} opcode (extension registry lookup)", good_zip(pk),
                        expect="error", error_has="extension"))
    # persistent ids that are not storages
    pk = good_pickle([
        ("pid_str", lambda p: p.str("os.system").persid()),
        ("pid_module", lambda p: p.value(("module", "os", "system")).persid()),
        ("pid_list", lambda p: p.value(["storage", "x"]).persid()),
        ("pid_evil_type", lambda p: p.global_("torch._utils", "_rebuild_tensor_v2").mark()
         .mark().str("storage").global_("os", "system").str("0").str("cpu").int(6).tuple().persid()
         .int(0).value((6,)).value((1,)).bool(False).ordered_dict().tuple().reduce()),
        ("pid_tuple_key", lambda p: p.global_("torch._utils", "_rebuild_tensor_v2").mark()
         .mark().str("storage").global_("torch", "FloatStorage").value(("0",)).str("cpu").int(6).tuple().persid()
         .int(0).value((6,)).value((1,)).bool(False).ordered_dict().tuple().reduce()),
        ("pid_negative_numel", lambda p: p.tensor("0", -6, (6,), (1,))),
        ("storage_is_str", lambda p: p.global_("torch._utils", "_rebuild_tensor_v2").mark().str("0").int(0)
         .value((6,)).value((1,)).bool(False).ordered_dict().tuple().reduce()),
    ])
    out.append(Case("exec_persistent_ids", "exec", "persistent ids that are not storages (str, module tuple, list, "
                    "os.system as storage type, tuple key, negative numel, a str as storage)", good_zip(pk),
                    tensors=dict(W_EXPECT), tensor_errors={
                        "pid_evil_type": "storage", "pid_tuple_key": "storage", "pid_negative_numel": "-6",
                        "storage_is_str": "storage", "pid_str": "storage", "pid_module": "storage",
                        "pid_list": "storage"}))
    # a whole protocol-0 pickle
    m, c = _cmd(marker_dir, "exec_protocol0")
    pk0 = (b"ccollections\nOrderedDict\n(tRVw\n(S'" + c.encode() + b"'\nios\nsystem\nsV__builtin__\n(S'" +
           m.encode() + b"'\nS'w'\ni__builtin__\nopen\ns.")
    out.append(Case("exec_protocol0", "exec", "a protocol-0 text pickle: INST os.system and __builtin__.open",
                    good_zip(pk0, storages={}), keys_present=["w", "__builtin__"], strict_error=True))
    # BUILD refusals: state given to inert objects (whole file refused: BUILD happens inside the unpickler)
    for name, what, emit in (
        ("exec_build_on_tensor", "BUILD on a rebuilt tensor (would set attributes on it)",
         lambda p: p.tensor("0", 6, (6,), (1,)).value({"__class__": Emit(lambda q: q.global_("os", "system"))})
         .build()),
        ("exec_build_on_builder", "BUILD on the _codecs.encode builder (would set __defaults__ / __code__)",
         lambda p: p.global_("_codecs", "encode").value({"__code__": 1}).build()),
        ("exec_build_on_dtype", "BUILD on torch.float32", lambda p: p.global_("torch", "float32").value({"x": 1}).build()),
        ("exec_build_on_class", "BUILD on the OrderedDict class itself",
         lambda p: p.global_("collections", "OrderedDict").value({"__init__": 1}).build()),
    ):
        out.append(Case(name, "exec", what, good_zip(good_pickle([("evil", emit)])), expect="error",
                        error_has="BUILD" if "class" not in name else None))
    # NEWOBJ / INST-without-args on allowlisted classes skip their __init__: inert objects with unset slots
    pk = good_pickle([
        ("np_dtype_newobj", lambda p: p.global_("numpy", "dtype").empty_tuple().newobj()),
        ("np_scalar_newobj", lambda p: p.global_("numpy.core.multiarray", "scalar").empty_tuple().newobj()),
        ("odict_newobj", lambda p: p.global_("collections", "OrderedDict").value(([1, 2],)).newobj()),
        ("odict_inst", lambda p: p.mark().inst("collections", "OrderedDict")),
        ("np_scalar_inst", lambda p: p.mark().inst("numpy.core.multiarray", "scalar")),
        ("np_array_dtype_newobj", lambda p: p.global_("numpy.core.multiarray", "_reconstruct").mark()
         .global_("numpy", "ndarray").value((0,)).value(b"b").tuple().reduce()
         .mark().int(1).value((2,)).global_("numpy", "dtype").empty_tuple().newobj().bool(False).value(b"abcdefgh")
         .tuple().build()),
        ("np_scalar_of_newobj_dtype", lambda p: p.global_("numpy.core.multiarray", "scalar").mark()
         .global_("numpy", "dtype").empty_tuple().newobj().value(b"abcd").tuple().reduce()),
    ], proto=2)
    out.append(Case("exec_newobj_allowlisted", "exec", "NEWOBJ / INST on allowlisted classes (numpy.dtype, "
                    "numpy scalar, OrderedDict): __init__ skipped, slots unset", good_zip(pk), tensors=dict(W_EXPECT),
                    keys_present=["np_dtype_newobj", "np_scalar_newobj"]))
    return out




# --- 2. resource attacks ---------------------------------------------------------------------------------------


def _big(name: str, builder: Callable[[], bytes]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(builder())

    return write


@family
def resource_cases(marker_dir: Path) -> list[Case]:
    out: list[Case] = []
    N = 1_000_000

    def add(name: str, what: str, pk: "bytes | Callable[[], bytes]", *, storages: dict | None = None,
            **kw: object) -> None:
        st = {"0": W_BYTES} if storages is None else storages
        if callable(pk):
            case = Case(name, "resource", what, write=_big(name, lambda: good_zip(pk(), storages=st)), **kw)  # type: ignore[arg-type]
        else:
            case = Case(name, "resource", what, good_zip(pk, storages=st), **kw)  # type: ignore[arg-type]
        case.torch_ok = False
        out.append(case)

    # nesting: lists, dicts, tuples, opaque objects, rebuild calls
    add("res_deep_list", "10^6-deep nested lists", bytes(P().empty_list().raw(b"]" * N).raw(b"a" * N).stop()),
        error_type="LimitError", expect="error", error_has="nest")
    add("res_deep_dict", "10^6-deep nested dicts",
        bytes(P().empty_dict().raw((b"X\x01\x00\x00\x00k}") * N).raw(b"s" * N).stop()), error_type="LimitError", expect="error",
        error_has="nest")
    add("res_deep_tuple_value", "10^6-deep nested tuples (a value)",
        bytes(P().empty_tuple().raw(b"\x85" * N).stop()), error_type="LimitError", expect="error", error_has="nest")
    add("res_deep_tuple_key", "a 10^6-deep tuple used as a dict key (hashing it recurses in C: a segfault)",
        bytes(P().empty_dict().empty_tuple().raw(b"\x85" * N).none().setitem().stop()), expect="error")
    add("res_dag_tuple_key", "a tuple DAG of depth 64 used as a dict key (hashing is 2^64 steps: a hang)",
        bytes(P().empty_dict().empty_tuple().raw(b"q\x00h\x00\x86" * 64).none().setitem().stop()), error_type="LimitError", expect="error")
    add("res_dag_tuple_frozenset", "a tuple DAG of depth 64 inside a frozenset (hashed when built)",
        bytes(P().mark().empty_tuple().raw(b"q\x00h\x00\x86" * 64).frozenset().stop()), error_type="LimitError", expect="error")
    # Bar(Bar(...Bar(None)...)): N GETs of Bar, then None, then N times TUPLE1 + REDUCE
    chain = bytes(P().global_("foo", "Bar").put(0).pop().raw(b"h\x00" * N).none().raw(b"\x85R" * N).stop())
    add("res_deep_opaque", "10^6-deep chain of unknown objects, each made from the previous", chain,
        error_type="LimitError", expect="error", error_has="nest")
    # _rebuild_parameter(_rebuild_parameter(... tensor, True, {}) ...): args (inner, True, OrderedDict())
    pp = P().global_("collections", "OrderedDict").empty_tuple().reduce().put(1).pop()
    pp.global_("torch._utils", "_rebuild_parameter").put(0).pop()
    pp.raw(b"h\x00" * 100_000)
    pp.tensor("0", 6, (6,), (1,))
    pp.raw(b"\x88h\x01\x87R" * 100_000)
    add("res_deep_rebuild_calls", "10^5 nested _rebuild_parameter calls", bytes(pp.stop()), error_type="LimitError", expect="error",
        error_has="nest")
    # metadata / state nesting and DAGs that a recursive or expanding walker would blow up on
    deep_meta = P().empty_list().raw(b"]" * 100_000).raw(b"a" * 100_000)
    dag = P().empty_list().put(0)  # list i holds list i-1 three times: 3^59 leaves once expanded
    for i in range(1, 60):
        dag.pop().empty_list().mark().get(i - 1).get(i - 1).get(i - 1).appends().put(i)
    dag_bytes = bytes(dag)

    def v2_with_meta(meta: bytes) -> Callable[[P], object]:
        return lambda p: p.global_("torch._utils", "_rebuild_tensor_v2").mark().storage_pid("0", "FloatStorage", 6) \
            .int(0).value((6,)).value((1,)).bool(False).ordered_dict().empty_dict().str("x").raw(meta).setitem() \
            .tuple().reduce()

    add("res_deep_metadata", "a tensor whose metadata dict holds 10^5-deep lists",
        good_pickle([("t", v2_with_meta(bytes(deep_meta)[2:]))]), tensors={"w": W_BYTES, "t": W_BYTES})
    add("res_dag_metadata", "a tensor whose metadata holds a 3^59 memo DAG (billion laughs)",
        good_pickle([("t", v2_with_meta(dag_bytes[2:]))]), tensors={"w": W_BYTES, "t": W_BYTES})
    add("res_dag_param_state", "a Parameter whose python state is a 3^59 memo DAG",
        good_pickle([("p", lambda p: p.raw(dag_bytes[2:]).pop().global_("torch._utils", "_rebuild_parameter_with_state")
                      .mark().value(Emit(lambda q: q.tensor("0", 6, (6,), (1,)))).bool(True).ordered_dict()
                      .empty_dict().str("s").get(59).setitem().tuple().reduce())]),
        tensors={"w": W_BYTES, "p": W_BYTES})
    add("res_dag_lists", "a 3^59 memo DAG of lists (billion laughs) as a value",
        good_pickle([("laughs", lambda p: p.raw(dag_bytes[2:]))]), tensors=dict(W_EXPECT))
    dagd = P().empty_dict().put(0)
    for i in range(1, 60):
        dagd.pop().empty_dict().mark().str("a").get(i - 1).str("b").get(i - 1).str("c").get(i - 1).setitems().put(i)
    add("res_dag_dicts", "a 3^59 memo DAG of dicts", good_pickle([("laughs", lambda p: p.raw(bytes(dagd)[2:]))]),
        tensors=dict(W_EXPECT))
    dago = P().global_("foo", "Node").put(250).pop().none().put(0)
    for i in range(1, 60):
        dago.pop().get(250).mark().get(i - 1).get(i - 1).get(i - 1).tuple().reduce().put(i)
    add("res_dag_opaque", "a 3^59 memo DAG of unknown objects",
        good_pickle([("laughs", lambda p: p.raw(bytes(dago)[2:]))]), tensors=dict(W_EXPECT))
    # a size tuple that is not ints but a DAG (an error message must not repr it in full)
    dagt = P().str("x").put(0)
    for i in range(1, 60):
        dagt.pop().get(i - 1).get(i - 1).get(i - 1).tuple(3).put(i)
    add("res_dag_size_repr", "a tensor whose size is a 3^59 tuple DAG (a full repr would never end)",
        good_pickle([("t", lambda p: p.raw(bytes(dagt)[2:]).pop().global_("torch._utils", "_rebuild_tensor_v2").mark()
                      .storage_pid("0", "FloatStorage", 6).int(0).get(59).value((1,)).bool(False).ordered_dict()
                      .tuple().reduce())]),
        tensors=dict(W_EXPECT), tensor_errors={"t": "size"})
    # floods
    add("res_mark_flood", "60 MB of MARK opcodes (the unpickler's mark stack: 8 bytes each)",
        lambda: bytes(P().raw(b"(" * (60 * MiB)).stop()), expect="error", timeout=10.0)
    add("res_mark_flood_small", "1 MB of MARK opcodes", bytes(P().raw(b"(" * MiB).stop()), expect="error")
    add("res_empty_dict_flood", "60 MB of EMPTY_DICT (64 bytes of memory per pickle byte) into one list",
        lambda: bytes(P().empty_list().mark().raw(b"}" * (60 * MiB)).appends().stop()), error_type="LimitError", expect="error",
        error_has="memory", timeout=10.0)
    add("res_empty_set_flood", "30 MB of EMPTY_SET (216 bytes of memory per pickle byte)",
        lambda: bytes(P(4).empty_list().mark().raw(b"\x8f" * (30 * MiB)).appends().stop()), error_type="LimitError", expect="error",
        error_has="memory", timeout=10.0)
    add("res_memo_index_huge", "LONG_BINPUT 2^28: the unpickler's memo array would grow to 4 GiB",
        bytes(P().none().raw(b"r" + struct.pack("<I", 1 << 28)).stop()), error_type="LimitError", expect="error")
    add("res_memo_index_max", "LONG_BINPUT 2^32-1", bytes(P().none().raw(b"r\xff\xff\xff\xff").stop()),
        expect="error")
    add("res_long_string", "BINUNICODE declaring 4 GiB with 10 bytes present",
        bytes(P().raw(b"X\xff\xff\xff\xff" + b"x" * 10)), expect="error")
    add("res_binbytes8", "BINBYTES8 declaring 2^62 bytes", bytes(P(4).raw(b"\x8e" + struct.pack("<Q", 1 << 62) + b"x")),
        expect="error")
    add("res_bytearray8", "BYTEARRAY8 declaring 800 MB with 10 bytes present",
        bytes(P(5).raw(b"\x96" + struct.pack("<Q", 800 * MiB) + b"x" * 10)), expect="error")
    add("res_long4", "LONG4 declaring 2 GB", bytes(P().raw(b"\x8b\xff\xff\xff\x7f" + b"\x01" * 10)), expect="error")
    add("res_text_long", "a 1 MB decimal LONG (int parsing is quadratic without Python's digit limit)",
        bytes(P().raw(b"L" + b"9" * MiB + b"L\n").stop()), expect="error")
    # counts
    tens = P().empty_list().mark().tensor("0", 6, (6,), (1,)).put(1).raw(b"h\x01" * 600_000).appends().stop()
    add("res_tensor_count", "600 k references to one tensor (over the 500 k tensor limit)", bytes(tens),
        error_type="LimitError", expect="error", error_has="tensors")
    add("res_tensor_count_custom", "2001 tensors with Limits(max_tensors=2000)",
        bytes(P().empty_list().mark().tensor("0", 6, (6,), (1,)).put(1).raw(b"h\x01" * 2000).appends().stop()),
        error_type="LimitError", expect="error", error_has="tensors", limits={"max_tensors": 2000})
    add("res_node_count", "3 M Nones in one list (over the node limit)",
        bytes(P().empty_list().mark().raw(b"N" * 3_000_000).appends().stop()), error_type="LimitError", expect="error", error_has="objects")
    add("res_node_count_custom", "1001 values with Limits(max_nodes=1000)",
        bytes(P().empty_list().mark().raw(b"N" * 1001).appends().stop()), error_type="LimitError", expect="error", error_has="objects",
        limits={"max_nodes": 1000})
    add("res_depth_custom", "depth 11 with Limits(max_depth=10)",
        bytes(P().empty_list().raw(b"]" * 11).raw(b"a" * 11).stop()), error_type="LimitError", expect="error", error_has="nest",
        limits={"max_depth": 10})
    add("res_pickle_size_custom", "a 3 kB pickle with Limits(max_pickle_bytes=2000)",
        good_pickle([("pad", lambda p: p.str("x" * 3000))]), error_type="LimitError", expect="error", error_has="limit",
        limits={"max_pickle_bytes": 2000})
    add("res_pickle_size", "a 65 MiB pickle (over the 64 MiB default)",
        lambda: good_pickle([("pad", lambda p: p.bytes(b"\0" * (65 * MiB)))], proto=3), error_type="LimitError", expect="error",
        error_has="limit", timeout=10.0)
    add("res_globals_count", "10,001 distinct unknown globals (over the limit of distinct opaque classes)",
        bytes(P().empty_list().mark().raw(b"".join(b"cm\nc%d\n" % i for i in range(10_001))).appends().stop()),
        error_type="LimitError", expect="error", error_has="globals")
    # many tensors on one storage: accepted, and every one served
    n = 200_000
    pk = P().ordered_dict().mark()
    pk.str("t0").global_("torch._utils", "_rebuild_tensor_v2").put(1).mark()
    pk.storage_pid("0", "FloatStorage", 6).put(2).int(0).value((1,)).put(3).value((1,)).put(4).bool(False)
    pk.ordered_dict().tuple().reduce()
    for i in range(1, n):
        pk.str(f"t{i}").get(1).mark().get(2).int(i % 6).get(3).get(4).bool(False).ordered_dict().tuple().reduce()
    pk.setitems().stop()
    out.append(Case("res_200k_tensors_one_storage", "resource", "200,000 tensors viewing one 6-element storage",
                    good_zip(bytes(pk)), tensors={f"t{i}": W_BYTES[4 * (i % 6): 4 * (i % 6) + 4]
                                                   for i in range(0, n, 997)},
                    timeout=60.0, torch_ok=False))
    # sizes that lie or overflow
    add("res_numel_huge", "a storage declaring 2^62 elements over a 24-byte record",
        good_pickle([("t", lambda p: p.tensor("1", 1 << 62, (6,), (1,)))]), tensor_errors={"t": "holds 24 bytes"},
        storages={"0": W_BYTES, "1": W_BYTES}, expect="index", tensors=dict(W_EXPECT))
    add("res_numel_overflow", "shape (2^40, 2^40, 2^40) with stride 0: 2^120 elements",
        good_pickle([("t", lambda p: p.tensor("0", 6, (1 << 40,) * 3, (0, 0, 0)))]), tensor_errors={"t": "too large"},
        tensors=dict(W_EXPECT))
    add("res_expanded_4tb", "shape (2^20, 2^20) with stride (0, 0): a 4 TiB expanded view of one element",
        good_pickle([("t", lambda p: p.tensor("0", 6, (1 << 20, 1 << 20), (0, 0), offset=2))]),
        tensors={"w": W_BYTES, "t": None})
    add("res_meta_2e80", "a meta tensor of 2^80 elements",
        good_pickle([("m", lambda p: p.global_("torch._utils", "_rebuild_meta_tensor_no_storage").mark()
                      .global_("torch", "float32").value((1 << 40, 1 << 40)).value((1 << 40, 1)).bool(False)
                      .tuple().reduce())]), tensors=dict(W_EXPECT), keys_present=["m"])
    add("res_ndim_huge", "a 100,000-dimension size tuple shared by 10,000 tensors (memo)",
        good_pickle([("many", lambda p: p.value(tuple([1] * 100_000)).put(100).pop().empty_list().mark()
                      .raw(b"".join(bytes(P(None).global_("torch._utils", "_rebuild_tensor_v2").mark()
                                          .storage_pid("0", "FloatStorage", 6).int(0).get(100).get(100).bool(False)
                                          .ordered_dict().tuple().reduce()) for _ in range(1)) * 10_000)
                      .appends())]),
        tensors=dict(W_EXPECT), tensor_errors={"many.0": "dimensions", "many.9999": "dimensions"})
    # keys that explode when joined into dotted paths, and that collide
    kk = P().str("k" * MiB).put(0).pop().empty_dict().raw((b"h\x00" + b"}") * 199).raw(b"h\x00").none() \
        .raw(b"s" * 200)
    add("res_key_bytes", "a 1 MiB key shared (memo) by 200 nested dicts: dotted keys of 1..200 MiB",
        lambda: good_pickle([("deep", lambda p: p.raw(bytes(kk)[2:]))]), error_type="LimitError", expect="error", error_has="key")
    okb = bytes(P().global_("foo", "K").put(1).pop().empty_dict().mark()) + \
        b"h\x01)\x81N" * 100_000 + b"u"
    add("res_key_collisions", "100,000 distinct unknown objects as keys (all named '<Opaque[foo.K]>')",
        good_pickle([("coll", lambda p: p.raw(okb[2:]))]), tensors=dict(W_EXPECT), timeout=10.0)
    # numpy data inline, shared many times (must not be copied per reference)
    arr = P().global_("numpy.core.multiarray", "_reconstruct").mark().global_("numpy", "ndarray").value((0,)) \
        .value(b"b").tuple().reduce().mark().int(1).value((4 * MiB,)).global_("numpy", "dtype").mark().str("u1") \
        .bool(False).bool(True).tuple().reduce().mark().int(3).str("|").none().none().none().int(-1).int(-1).int(0) \
        .tuple().build().bool(False).raw(b"\x96" + struct.pack("<Q", 4 * MiB)).raw(b"\x07" * (4 * MiB)).tuple() \
        .build().put(7)
    add("res_numpy_shared", "a 4 MiB inline numpy array (bytearray) referenced 2,000 times",
        lambda: good_pickle([("arrs", lambda p: p.raw(bytes(arr)[2:]).pop().empty_list().mark()
                              .raw(b"h\x07" * 2000).appends())], proto=5),
        tensors={"w": W_BYTES, "arrs.0": b"\x07" * (4 * MiB), "arrs.1": b"\x07" * (4 * MiB)}, max_read=20,
        keys_present=["arrs.1999"],
        timeout=10.0)
    # deflate bombs
    out.append(Case("res_deflate_bomb", "resource", "a deflated storage of 64 MiB of zeros (65 KiB in the file), "
                    "read in full", write=lambda path: path.write_bytes(torch_zip(
                        good_pickle([("z", lambda p: p.tensor("1", 16 * MiB, (16 * MiB,), (1,)))]),
                        {"0": W_BYTES, "1": b""}, tweak=lambda es: with_bomb_1(es)).data),
                    tensors={"w": W_BYTES, "z": None}, timeout=10.0, torch_ok=False))

    def with_bomb_1(entries: list) -> None:
        e = find_entry(entries, b"data/1")
        e.data, e.method = b"\0" * (64 * MiB), 8

    pkl = good_pickle()

    def longer(entries: list) -> None:
        e = find_entry(entries, b"data.pkl")
        e.method, e.data, e.size, e.crc = 8, pkl + b"\0" * 1000, len(pkl), zlib.crc32(pkl)
        e.local_sizes = (len(_deflate(e.data)), len(pkl))  # the local header tells the same lie

    out.append(Case("res_deflate_pickle_longer", "resource", "data.pkl deflated, inflating past its declared size "
                    "(CRC of the declared part)", good_zip(tweak=longer), expect="error", error_has="inflate",
                    torch_ok=True))
    return out


# --- 3. lies about the data -------------------------------------------------------------------------------------


@family
def lies_cases(marker_dir: Path) -> list[Case]:
    out: list[Case] = []
    S = np.arange(24, dtype="<f4").tobytes()  # storage "1": 24 floats

    def add(name: str, what: str, items: list, errors: dict[str, str], ok: dict[str, bytes] | None = None,
            storages: dict[str, bytes] | None = None, **kw: object) -> None:
        st = {"0": W_BYTES, "1": S} if storages is None else storages
        tensors = dict(W_EXPECT)
        tensors.update(ok or {})
        out.append(Case(name, "lies", what, good_zip(good_pickle(items), storages=st), tensors=tensors,
                        tensor_errors=errors, **kw))  # type: ignore[arg-type]

    T = lambda *a, **k: (lambda p: p.tensor(*a, **k))  # noqa: E731
    add("lie_shape_beyond", "shape (100,) over a 24-element storage", [("t", T("1", 24, (100,), (1,)))],
        {"t": "reach"})
    add("lie_stride_beyond", "shape (4, 6) stride (7, 1): the last element past the storage",
        [("t", T("1", 24, (4, 6), (7, 1)))], {"t": "reach"})
    add("lie_offset_beyond", "storage offset 1000", [("t", T("1", 24, (2,), (1,), offset=1000))], {"t": "reach"})
    add("lie_negative_stride", "stride -1", [("t", T("1", 24, (4,), (-1,), offset=10))], {"t": "negative"})
    add("lie_negative_offset", "storage offset -4", [("t", T("1", 24, (4,), (1,), offset=-4))], {"t": "negative"})
    add("lie_negative_size", "size -3", [("t", T("1", 24, (-3,), (1,)))], {"t": "negative"})
    add("lie_numel_bigger", "numel 48 over a 24-element record", [("t", T("1", 48, (24,), (1,)))], {"t": "holds"})
    add("lie_numel_smaller", "numel 12 over a 24-element record (torch: reads the first 12)",
        [("t", T("1", 12, (12,), (1,)))], {"t": "holds"})
    add("lie_two_dtypes", "one record referenced as FloatStorage(24) and as IntStorage(24)",
        [("f", T("1", 24, (24,), (1,))), ("i", T("1", 24, (24,), (1,), storage="IntStorage"))], {"i": "referenced"},
        ok={"f": S})
    add("lie_two_numels", "one record referenced with numel 24 and numel 6", [("a", T("1", 24, (24,), (1,))),
                                                                              ("b", T("1", 6, (6,), (1,)))],
        {"b": "referenced"}, ok={"a": S})
    add("lie_missing_record", "a storage whose record is missing", [("t", T("7", 6, (6,), (1,)))], {"t": "missing"})
    add("lie_key_dotdot", "storage key '../data.pkl'", [("t", T("../data.pkl", 6, (6,), (1,)))], {"t": "missing"})
    add("lie_key_nul", "storage key '0\\x00junk' (a C string would stop at the NUL and read data/0)",
        [("t", T("0\x00junk", 6, (6,), (1,)))], {"t": "missing"})
    add("lie_key_slash", "storage key '1/' naming a directory entry (torch returns heap garbage)",
        [("t", T("1/", 6, (6,), (1,)))], {"t": "directory"}, storages={"0": W_BYTES, "1/": b""})
    add("lie_key_dir_stored", "storage key '2/' whose directory entry holds 24 bytes",
        [("t", T("2/", 6, (6,), (1,)))], {"t": "directory"}, storages={"0": W_BYTES, "2/": W_BYTES})
    add("lie_key_empty", "storage key '' (record 'data/')", [("t", T("", 6, (6,), (1,)))], {"t": ""},
        storages={"0": W_BYTES, "": W_BYTES})
    add("lie_key_int", "storage key as an int (7) with record data/7", [("t", lambda p: p.global_(
        "torch._utils", "_rebuild_tensor_v2").mark().mark().str("storage").global_("torch", "FloatStorage").int(7)
        .str("cpu").int(6).tuple().persid().int(0).value((6,)).value((1,)).bool(False).ordered_dict().tuple()
        .reduce())], {}, ok={"t": W_BYTES}, storages={"0": W_BYTES, "7": W_BYTES})
    add("lie_size_bools", "size (True, 2)", [("t", T("1", 24, (True, 2), (2, 1)))], {"t": "size"})
    add("lie_size_huge_int", "size (2^100,)", [("t", T("1", 24, (1 << 100,), (1,)))], {"t": "large"})
    add("lie_stride_huge_size1", "shape (1, 6) stride (2^70, 1): the huge stride never applies",
        [("t", T("1", 24, (1, 6), (1 << 70, 1)))], {}, ok={"t": S[:24]})
    add("lie_stride_huge", "shape (2, 6) stride (2^70, 1)", [("t", T("1", 24, (2, 6), (1 << 70, 1)))], {"t": "reach"})
    add("lie_empty_offset_beyond", "a 0-element tensor at offset 10^6 (allowed: it addresses nothing)",
        [("t", T("1", 24, (0, 5), (5, 1), offset=10 ** 6))], {}, ok={"t": b""})
    add("lie_empty_huge_stride", "shape (0, 5) stride (2^100, 1)", [("t", T("1", 24, (0, 5), (1 << 100, 1)))], {},
        ok={"t": b""})
    add("lie_zero_storage", "numel 0 over an empty record", [("t", T("9", 0, (0,), (1,)))], {}, ok={"t": b""},
        storages={"0": W_BYTES, "9": b""})
    add("lie_views", "transposed, expanded, sliced and overlapping views (legal; served)", [
        ("tr", T("1", 24, (6, 4), (1, 6))), ("ex", T("1", 24, (3, 4), (0, 1), offset=4)),
        ("sl", T("1", 24, (2, 3), (12, 2), offset=1)), ("ov", T("1", 24, (5, 4), (2, 1)))], {},
        ok={"tr": strided(S, "<f4", (6, 4), (1, 6)), "ex": strided(S, "<f4", (3, 4), (0, 1), 4),
            "sl": strided(S, "<f4", (2, 3), (12, 2), 1), "ov": strided(S, "<f4", (5, 4), (2, 1))})
    add("lie_v3_bad_dtype", "_rebuild_tensor_v3 whose dtype is a string", [("t", lambda p: p.global_(
        "torch._utils", "_rebuild_tensor_v3").mark().storage_pid("1", "UntypedStorage", 96, module="torch.storage")
        .int(0).value((24,)).value((1,)).bool(False).ordered_dict().str("float32").tuple().reduce())], {"t": "dtype"})
    add("lie_v3_untyped_short", "_rebuild_tensor_v3 float64 over a 96-byte untyped storage, 24 elements",
        [("t", lambda p: p.global_("torch._utils", "_rebuild_tensor_v3").mark()
          .storage_pid("1", "UntypedStorage", 96, module="torch.storage").int(0).value((24,)).value((1,)).bool(False)
          .ordered_dict().global_("torch", "float64").tuple().reduce())], {"t": "reach"})
    add("lie_weird_args", "requires_grad 'yes', hooks a list, metadata a list", [("t", lambda p: p.global_(
        "torch._utils", "_rebuild_tensor_v2").mark().storage_pid("1", "FloatStorage", 24).int(0).value((24,))
        .value((1,)).str("yes").value([1, 2]).value([3]).tuple().reduce())], {}, ok={"t": S})
    add("lie_arg_count", "_rebuild_tensor_v2 with 2 and with 12 arguments", [
        ("few", lambda p: p.call("torch._utils", "_rebuild_tensor_v2", 1, 2)),
        ("many", lambda p: p.call("torch._utils", "_rebuild_tensor_v2", *range(12)))],
        {"few": "argument", "many": "argument"})
    # hostile state_dict keys: all legal in torch; ckptfs must list them and serve their tensors
    keys = ["", ".", "..", "a/b", "../../etc/passwd", "a\x00b", "k" * 70_000, "\udc80lone", "\x1b[2J\x1b]0;pwned\x07",
            "line\nbreak", "tab\tcr\r", "\u202eevil", "#2", "w#2"]
    items = [(k, T("1", 24, (24,), (1,))) for k in keys]
    items += [(5, T("1", 24, (24,), (1,))), ((1, 2), T("1", 24, (24,), (1,))), (None, T("1", 24, (24,), (1,))),
              (1.5, T("1", 24, (24,), (1,))), ("5", T("1", 24, (24,), (1,)))]
    out.append(Case("lie_hostile_keys", "lies", "state_dict keys: '', '.', '..', '/', '../../etc/passwd', NUL, a 70 kB "
                    "key, a lone surrogate, terminal escapes, newlines, RTL override, int/tuple/None/float keys, "
                    "and keys that collide once dotted", good_zip(good_pickle(items), storages={"0": W_BYTES, "1": S}),
                    tensors=dict(W_EXPECT)))
    # byte order record says big: bytes are served as stored (torch swaps them into native order)
    out.append(Case("lie_byteorder_big", "lies", "byteorder record 'big' over little-endian bytes (served as stored, "
                    "byteorder reported)", good_zip(byteorder=b"big"), tensors=dict(W_EXPECT)))
    return out


# --- 4. zip attacks -----------------------------------------------------------------------------------------------


@family
def zip_cases(marker_dir: Path) -> list[Case]:
    out: list[Case] = []
    base = torch_zip(good_pickle(), {"0": W_BYTES})
    data = base.data

    def add(name: str, what: str, blob: bytes, expect: str = "error", error_has: str | None = None,
            **kw: object) -> None:
        if expect == "index" and "tensors" not in kw:
            kw["tensors"] = dict(W_EXPECT)
        out.append(Case(name, "zip", what, blob, expect=expect, error_has=error_has, **kw))  # type: ignore[arg-type]

    def patch(blob: bytes, at: int, new: bytes) -> bytes:
        return blob[:at] + new + blob[at + len(new):]

    def tz(**kw: object) -> bytes:
        return torch_zip(good_pickle(), {"0": W_BYTES}, **kw).data  # type: ignore[arg-type]

    def tweak(fn: Callable[[list], None], **kw: object) -> bytes:
        return tz(tweak=fn, **kw)

    # truncation anywhere
    cuts = sorted({0, 1, 4, 29, 30, 40, base.data_at[b"archive/data.pkl"] + 10, base.data_at[b"archive/data/0"] + 3,
                   base.cd_offset - 1, base.cd_offset + 10, base.cd_offset + 46, base.eocd64 or 0, base.locator or 0,
                   base.eocd, base.eocd + 10, len(data) - 1} | set(range(0, len(data), 97)))
    for c in cuts:
        add(f"zip_truncated_{c}", f"truncated to {c} bytes", data[:c])
    # directory vs local headers
    e = b"archive/data.pkl"
    add("zip_local_name_pkl", "data.pkl's local header names another file",
        patch(data, base.local[e] + 30, b"archive/data.pkX"), error_has="disagree")
    add("zip_local_name_storage", "data/0's local header names another file (read fails, alone)",
        patch(data, base.local[b"archive/data/0"] + 30, b"archive/data/9"), expect="index",
        tensors={}, tensor_errors={"w": "disagree"})
    add("zip_local_method", "data/0: local header says deflate, directory says stored",
        patch(data, base.local[b"archive/data/0"] + 8, b"\x08\x00"), expect="index", tensors={},
        tensor_errors={"w": "disagree"})
    add("zip_local_sizes", "data/0: local header sizes disagree with the directory (no data descriptor flag)",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "local_sizes", (12, 12))), expect="index", tensors={},
        tensor_errors={"w": "disagree"})
    add("zip_local_crc", "data/0: local header CRC disagrees with the directory",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "local_crc", 0x1234)), expect="index", tensors={},
        tensor_errors={"w": "disagree"})
    add("zip_local_sizes_pkl", "data.pkl: local header sizes disagree with the directory",
        tweak(lambda es: setattr(find_entry(es, b"data.pkl"), "local_sizes", (5, 5))), error_has="disagree")
    add("zip_data_descriptor_zeros", "flags 0x0808 with zero CRC/sizes in local headers (what torch writes)",
        tweak(lambda es: [setattr(x, "flags", 0x0808) or setattr(x, "local_sizes", (0, 0)) or
                          setattr(x, "local_crc", 0) for x in es]), expect="index")
    # overlaps and shared bytes
    add("zip_overlap", "data/0's directory offset points inside data.pkl's data",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "header_offset", base.local[e] + 50)),
        error_has="overlap")
    sb = torch_zip(good_pickle(), {"0": W_BYTES, "1": W_BYTES})
    blob = bytearray(sb.data)
    struct.pack_into("<L", blob, sb.cd[b"archive/data/1"] + 42, sb.local[b"archive/data/0"])
    add("zip_two_entries_one_header", "data/1's directory entry points at data/0's local header", bytes(blob),
        error_has="overlap")
    # duplicate names
    dup = tweak(lambda es: es.insert(5, Entry(b"archive/data/0", np.arange(10, 16, dtype="<f4").tobytes())))
    add("zip_duplicate_storage", "two entries named data/0 with different bytes (torch reads the first, zipfile "
        "the last)", dup, error_has="duplicate")
    dup2 = tweak(lambda es: es.insert(5, Entry(b"archive/data.pkl", good_pickle([("x", lambda p: p.int(1))]))))
    add("zip_duplicate_pickle", "two entries named data.pkl", dup2, error_has="duplicate")
    # zip64 lies
    add("zip64_offset_past", "zip64 locator points past itself",
        tz(eocd64_offset_override=len(data) + 100), error_has="zip64")
    add("zip64_offset_garbage", "zip64 locator points at data.pkl's bytes",
        tz(eocd64_offset_override=base.data_at[e]), error_has="zip64")
    add("zip64_counts_disagree", "zip64 end record counts 9 entries, the classic one 8",
        tz(eocd64_counts=(9, 9), eocd_counts=(8, 8), classic_sentinels=True), error_has="disagree")
    add("zip64_count_huge", "zip64 end record declares 2^40 entries",
        tz(eocd64_counts=(1 << 40, 1 << 40), eocd_counts=(0xFFFF, 0xFFFF)), error_has="limit", error_type="LimitError")
    add("zip64_cd_offset_huge", "zip64 end record puts the directory at 2^50",
        tz(cd_offset_override=1 << 50), error_has=None)
    add("zip64_extra_missing", "directory sizes 0xFFFFFFFF without a zip64 extra field",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "size", 0xFFFFFFFF) or
              setattr(find_entry(es, b"data/0"), "csize", 0xFFFFFFFF)), error_has="zip64")
    add("zip64_extra_huge_size", "a zip64 extra giving data/0 a size of 2^62",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "zip64", True) or
              setattr(find_entry(es, b"data/0"), "size", 1 << 62) or
              setattr(find_entry(es, b"data/0"), "csize", 1 << 62)), error_has="overlap")
    add("zip64_extra_short", "a zip64 extra field too short for the 0xFFFFFFFF fields",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "size", 0xFFFFFFFF) or
              setattr(find_entry(es, b"data/0"), "extra_cd", struct.pack("<2H", 1, 4) + b"\0" * 4)), error_has="zip64")
    add("zip64_extra_valid", "correct zip64 extras on every entry (legal)",
        tweak(lambda es: [setattr(x, "zip64", True) for x in es]), expect="index")
    # offsets past EOF and lying directory
    add("zip_offset_past_eof", "data/0's local header offset is 10^9",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "header_offset", 10 ** 9)), error_has="overlap")
    add("zip_cd_size_lies", "end record's directory size is 10 bytes too big", tz(cd_size_override=base.cd_size + 10),
        error_has=None)
    add("zip_cd_offset_lies", "end record's directory offset is 46 bytes early",
        tz(cd_offset_override=base.cd_offset - 46), error_has=None)
    add("zip_count_hides_entry", "end records count one entry less than the directory holds",
        tz(eocd_counts=(8, 8), eocd64_counts=(8, 8)), error_has=None)
    add("zip_count_extra_entry", "end records count one entry more", tz(eocd_counts=(10, 10), eocd64_counts=(10, 10)),
        error_has=None)
    add("zip_multidisk", "the end record says entries are on another disk",
        patch(data, base.eocd + 4, b"\x01\x00"), error_has=None)
    add("zip_no_zip64_end", "classic end record only (no zip64 records; legal)", tz(zip64_end=False), expect="index")
    # compression
    add("zip_deflated_storage", "data/0 deflated (legal; torch's own reader inflates it)",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "method", 8)), expect="index")
    add("zip_deflated_pickle", "data.pkl deflated (legal)", tweak(lambda es: setattr(find_entry(es, b"data.pkl"),
                                                                                      "method", 8)), expect="index")
    add("zip_deflated_bad_crc", "deflated data/0 with a wrong CRC", tweak(lambda es: setattr(
        find_entry(es, b"data/0"), "method", 8) or setattr(find_entry(es, b"data/0"), "crc", 1)), expect="index",
        tensors={}, tensor_errors={"w": "CRC"})
    add("zip_deflated_size_lies", "deflated data/0 that inflates to fewer bytes than declared",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "method", 8) or setattr(find_entry(es, b"data/0"),
                                                                                    "data", W_BYTES[:20])
              or setattr(find_entry(es, b"data/0"), "size", 24)
              or setattr(find_entry(es, b"data/0"), "local_sizes", (len(_deflate(W_BYTES[:20])), 24))),
        expect="index", tensors={},
        tensor_errors={"w": "yields"})
    add("zip_deflated_corrupt", "deflated data/0 whose stream is garbage",
        patch(tweak(lambda es: setattr(find_entry(es, b"data/0"), "method", 8)),
              torch_zip(good_pickle(), {"0": W_BYTES}, tweak=lambda es: setattr(find_entry(es, b"data/0"), "method", 8))
              .data_at[b"archive/data/0"], b"\xff\xff\xff\xff"), expect="index", tensors={},
        tensor_errors={"w": "deflate"})
    add("zip_bzip2", "data/0 with compression method 12", tweak(lambda es: setattr(find_entry(es, b"data/0"),
                                                                                   "method", 12)),
        expect="index", tensors={}, tensor_errors={"w": "method"})
    add("zip_bzip2_pickle", "data.pkl with compression method 12",
        tweak(lambda es: setattr(find_entry(es, b"data.pkl"), "method", 12)), error_has="method")
    add("zip_stored_csize_lies", "stored data/0 with compressed size != size",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "csize", 20)), expect="index", tensors={},
        tensor_errors={"w": "size"})
    add("zip_encrypted", "data/0 flagged encrypted", tweak(lambda es: setattr(find_entry(es, b"data/0"), "flags",
                                                                              0x0801)), expect="index", tensors={},
        tensor_errors={"w": "encrypt"})
    add("zip_encrypted_pickle", "data.pkl flagged encrypted",
        tweak(lambda es: setattr(find_entry(es, b"data.pkl"), "flags", 0x0801)), error_has="encrypt")
    add("zip_bad_crc_stored", "stored data/0 with a wrong CRC (served as stored: torch does not check either)",
        tweak(lambda es: setattr(find_entry(es, b"data/0"), "crc", 0xDEADBEEF)), expect="index")
    add("zip_local_extra_overrun", "data/0's local extra length pushes its data into the next entry",
        patch(data, base.local[b"archive/data/0"] + 28, struct.pack("<H", 200)), expect="index", tensors={},
        tensor_errors={"w": "overlap"})
    # names
    add("zip_name_not_utf8", "an extra entry named with bytes that are not UTF-8 (no UTF-8 flag: cp437)",
        tweak(lambda es: es.insert(4, Entry(b"archive/\xff\xfe\x80", b"x", flags=0))), expect="index")
    add("zip_name_bad_utf8_flagged", "an entry flagged UTF-8 whose name is not UTF-8",
        tweak(lambda es: es.insert(4, Entry(b"archive/\xff\xfe", b"x"))), error_has="UTF-8")
    add("zip_name_decoded_collision", "data/\\x80 (cp437: 'Ç') next to data/Ç (UTF-8): equal once decoded",
        tweak(lambda es: es.insert(4, Entry("archive/data/Ç".encode(), b"y" * 24)) or
              es.insert(5, Entry(b"archive/data/\x80", b"z" * 24, flags=0))), error_has="duplicate")
    add("zip_name_nul", "an entry name with a NUL byte", tweak(lambda es: es.insert(4, Entry(b"archive/a\x00b", b"x"))),
        error_has="NUL")
    add("zip_outside_root", "an entry outside the root folder",
        tweak(lambda es: es.insert(4, Entry(b"other/data/0", b"x"))), error_has="root")
    add("zip_absolute_first", "the first entry is /etc/passwd",
        tweak(lambda es: es.insert(0, Entry(b"/etc/passwd", b"x"))), error_has="root")
    add("zip_dotdot_names", "entries named archive/../../x and archive/./data.pkl (names, never paths)",
        tweak(lambda es: es.insert(4, Entry(b"archive/../../x", b"x")) or es.insert(5, Entry(b"archive/./data.pkl",
                                                                                         b"y"))), expect="index")
    add("zip_no_root", "entries without a root folder", write_zip([Entry(b"data.pkl", good_pickle()),
                                                                   Entry(b"data/0", W_BYTES)]).data, error_has="root")
    add("zip_empty", "an archive with no entries", write_zip([]).data, error_has="empty")
    add("zip_no_pickle", "no data.pkl", write_zip([Entry(b"archive/data/0", W_BYTES)]).data, error_has="data.pkl")
    add("zip_pickle_dir", "data.pkl is a directory entry", write_zip([Entry(b"archive/data.pkl/", b""),
                                                                      Entry(b"archive/data/0", W_BYTES)]).data,
        error_has="data.pkl")
    # junk
    add("zip_junk_before", "100 bytes of junk before the archive", b"\x00" * 100 + data, error_has="not a torch")
    add("zip_junk_before_pk", "a second archive's bytes prepended (starts with PK\\x03\\x04)",
        data[:200] + data, error_has=None)
    add("zip_junk_after", "100 bytes of junk after the archive", data + b"J" * 100, error_has="end")
    add("zip_fake_eocd_comment", "a comment holding a fake end record",
        tz(comment=b"PK\x05\x06" + b"\0" * 18), error_has="ambiguous")
    add("zip_comment_ok", "an archive comment (legal)", tz(zip64_end=True, comment=b"hello"), expect="index")
    add("zip_between_cd_and_end", "junk between the directory and the end records",
        tz(between_cd_and_end=b"JUNK" * 4), error_has=None)
    # torch's small records
    add("zip_byteorder_garbage", "byteorder record 'middle'", tz(byteorder=b"middle"), error_has="byteorder")
    add("zip_byteorder_huge", "byteorder record of 1 MiB", tz(byteorder=b"little" * 200_000), error_has="byteorder")
    add("zip_byteorder_absent", "no byteorder record (torch < 2.1 files: little endian)", tz(byteorder=None),
        expect="index")
    add("zip_byteorder_dir", "byteorder is a directory entry",
        tweak(lambda es: setattr(find_entry(es, b"byteorder"), "name", b"archive/byteorder/")), expect="index")
    add("zip_version_garbage", "version record '999\\n' and a 1 MiB .format_version; .storage_alignment 'x'",
        tweak(lambda es: setattr(find_entry(es, b"/version"), "data", b"999\n") or
              setattr(find_entry(es, b".format_version"), "data", b"9" * MiB) or
              setattr(find_entry(es, b".storage_alignment"), "data", b"x")), expect="index")
    add("zip_torchscript", "a TorchScript-style archive: constants.pkl, code/, data.pkl naming __torch__ classes",
        tweak(lambda es: es.insert(1, Entry(b"archive/constants.pkl", bytes(P().empty_tuple().stop()))) or
              es.insert(2, Entry(b"archive/code/__torch__.py", b"import os\nos.system('x')\n")) or
              setattr(es[0], "data", good_pickle([("m", lambda p: p.global_("__torch__", "Model").empty_tuple()
                                                   .newobj())]))), expect="index", keys_present=["m"])
    # not zips at all
    add("file_empty", "an empty file", b"", error_has="empty")
    add("file_one_byte", "one byte", b"P", error_has="not a torch")
    add("file_pk_only", "just 'PK\\x03\\x04'", b"PK\x03\x04", error_has=None)
    add("file_bare_pickle", "a bare pickle (no zip, no legacy magic)", bytes(P().value({"a": 1}).stop()),
        error_has="pickle")
    add("file_tar", "a tar header", b"\0" * 257 + b"ustar" + b"\0" * 250, error_has="tar")
    return out


# --- 5. legacy streams ------------------------------------------------------------------------------------------------


@family
def legacy_cases(marker_dir: Path) -> list[Case]:
    out: list[Case] = []

    def obj(items: list) -> bytes:
        p = P().empty_dict().mark()
        for k, emit in items:
            p.value(k)
            emit(p)
        return bytes(p.setitems().stop())

    wl = lambda p: legacy_tensor(p, "k1", 6, (2, 3), (3, 1))  # noqa: E731
    good = legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)])

    def add(name: str, what: str, blob: bytes, expect: str = "error", **kw: object) -> None:
        out.append(Case(name, "legacy", what, blob, expect=expect, **kw))  # type: ignore[arg-type]

    add("legacy_ok", "a well-formed legacy stream (control)", good, expect="index", tensors=dict(W_EXPECT))
    add("legacy_bad_magic", "magic number off by one", legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)],
                                                                      magic=0x1950A86A20F9469CFC6D), error_has=None)
    add("legacy_bad_protocol", "protocol version 1002", legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)],
                                                                       protocol=1002), error_has="protocol")
    m, c = _cmd(marker_dir, "legacy_sys_info_exec")
    add("legacy_sys_info_exec", "sys_info is os.system(cmd)",
        legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)], sys_info=bytes(P().call("os", "system", c).stop())),
        error_has=None)
    add("legacy_sys_info_deep", "sys_info is 10^6-deep lists",
        legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)],
                      sys_info=bytes(P().empty_list().raw(b"]" * 10 ** 6).raw(b"a" * 10 ** 6).stop())), error_has=None)
    add("legacy_sys_info_not_dict", "sys_info is a list",
        legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)], sys_info=bytes(P().value([1]).stop())), error_has=None)
    add("legacy_sys_info_big_endian", "sys_info says big endian (torch would byteswap; data is little-endian "
        "by torch's own convention)", legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)], sys_info=bytes(
            P().value({"protocol_version": 1001, "little_endian": False,
                       "type_sizes": {"short": 2, "int": 4, "long": 8}}).stop())), expect="index",
        tensors=dict(W_EXPECT))
    m, c = _cmd(marker_dir, "legacy_obj_exec")
    add("legacy_obj_exec", "the object pickle holds os.system(cmd)",
        legacy_stream(obj([("w", wl), ("evil", lambda p: p.call("os", "system", c))]), [("k1", 6, W_BYTES)]),
        expect="index", tensors=dict(W_EXPECT), keys_present=["evil"])
    add("legacy_truncated_storage", "the last storage is cut short", good[:-5], expect="index", tensors={},
        tensor_errors={"w": "end"})
    add("legacy_truncated_pickle", "the stream ends inside the object pickle", good[:60], error_has=None)
    add("legacy_count_disagrees", "the storage header counts 5 elements, the pickle 6",
        legacy_stream(obj([("w", wl)]), [("k1", 5, W_BYTES[:20])]), expect="index", tensors={},
        tensor_errors={"w": "elements"})
    add("legacy_count_huge", "the storage header counts 2^62 elements",
        legacy_stream(obj([("w", wl)]), [("k1", 1 << 62, W_BYTES)]), expect="index", tensors={},
        tensor_errors={"w": ""})
    add("legacy_keys_not_list", "the key list is a dict",
        legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)], keys=[]).replace(
            bytes(P().value([]).stop()), bytes(P().value({"k1": 1}).stop())), error_has=None)
    add("legacy_keys_unknown", "the key list names a storage the pickle never uses, before the real one",
        legacy_stream(obj([("w", wl)]), [("zz", 1, b"\0" * 4), ("k1", 6, W_BYTES)]), expect="index", tensors={},
        tensor_errors={"w": ""})
    add("legacy_keys_twice", "the key list names k1 twice",
        legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES), ("k1", 6, W_BYTES)]), expect="index", tensors={},
        tensor_errors={"w": "twice"})
    add("legacy_keys_missing", "the key list omits k1 (its data is absent)",
        legacy_stream(obj([("w", wl)]), []), expect="index", tensors={}, tensor_errors={"w": ""})
    add("legacy_keys_evil", "the key list holds os.system(cmd)",
        legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)], keys=[]).replace(
            bytes(P().value([]).stop()), bytes(P().empty_list().mark().value("k1").raw(
                bytes(P(None).call("os", "system", c))).appends().stop())), error_has=None)
    add("legacy_deep_object", "the object pickle is 10^6-deep lists",
        legacy_stream(bytes(P().empty_list().raw(b"]" * 10 ** 6).raw(b"a" * 10 ** 6).stop()), []), error_has="nest")
    add("legacy_keys_dag", "the storage key list holds a dict keyed by a tuple DAG (strict unpickler, a hang in C)",
        legacy_stream(obj([("w", wl)]), [("k1", 6, W_BYTES)], keys=[]).replace(
            bytes(P().value([]).stop()), bytes(P().empty_list().mark().value("k1").empty_dict().empty_tuple()
                                                .raw(b"q\x00h\x00\x86" * 64).none().setitem().appends().stop())),
        error_type="LimitError", torch_ok=False)
    add("legacy_dag_key", "the object pickle hashes a tuple DAG (a hang in C)",
        legacy_stream(bytes(P().empty_dict().empty_tuple().raw(b"q\x00h\x00\x86" * 64).none().setitem().stop()), []),
        error_type="LimitError", torch_ok=False)
    add("legacy_two_dtypes", "one storage key with two dtypes", legacy_stream(
        obj([("f", lambda p: legacy_tensor(p, "k1", 6, (6,), (1,))),
             ("i", lambda p: legacy_tensor(p, "k1", 6, (6,), (1,), storage="IntStorage"))]), [("k1", 6, W_BYTES)]),
        expect="index", tensors={"f": W_BYTES}, tensor_errors={"i": "referenced"})
    add("legacy_geometry", "a legacy tensor reaching past its storage", legacy_stream(
        obj([("t", lambda p: legacy_tensor(p, "k1", 6, (10,), (1,)))]), [("k1", 6, W_BYTES)]), expect="index",
        tensors={}, tensor_errors={"t": "reach"})
    add("legacy_trailing_junk", "1 kB of junk after the last storage (ignored, reported)",
        good + b"J" * 1024, expect="index", tensors=dict(W_EXPECT))
    for c in (10, 40, 90, 150, len(good) - 30):
        add(f"legacy_cut_{c}", f"a legacy stream cut to {c} bytes", good[:c], expect="any")
    return out


# --- all ----------------------------------------------------------------------------------------------------------


def all_cases(marker_dir: Path) -> list[Case]:
    cases: list[Case] = []
    for fn in CASES:
        cases.extend(fn(marker_dir))
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise RuntimeError(f"duplicate case names: {sorted(dup)}")
    return cases


def main(argv: list[str]) -> int:
    outdir = Path(argv[0]) if argv else Path("corpus")
    outdir.mkdir(parents=True, exist_ok=True)
    marker_dir = outdir / "markers"
    marker_dir.mkdir(exist_ok=True)
    cases = all_cases(marker_dir)
    specs = []
    for c in cases:
        c.materialise(outdir)
        specs.append(c.spec())
    (outdir / "cases.json").write_text(json.dumps(specs, indent=1))
    print(f"{len(cases)} cases in {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
