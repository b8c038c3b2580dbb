"""TorchScript archives (``torch.jit.save``): a torch zip whose ``data.pkl`` holds the module object.

Layout: ``data.pkl`` (the top module: ``__torch__.<Class>`` objects built with NEWOBJ + BUILD, whose
attributes are parameters, buffers, submodules and plain values; tensors are the usual
``_rebuild_tensor_v2`` calls on ``data/<key>``), ``constants.pkl`` (tensors the code names
``CONSTANTS.cN``, stored in ``constants/<key>``), ``code/**.py`` (the TorchScript source, deflated) and
``code/**.py.debug_pkl``, ``extra/`` files, ``traced_inputs.pkl``, ``version``, ``byteorder``.

ckptfs indexes ``data.pkl`` like any checkpoint (the module objects are opaque: their attributes are the
tree) and never compiles or runs the code: torch.load hands such archives to ``torch.jit.load``, which
does (CVE-2025-32434). The sources are readable as text through :meth:`TorchScriptZip.code_files`.
"""

from __future__ import annotations

from typing import Sequence

from .base import Attachment
from .torchzip import TorchZip

CODE_DIR = "code/"


def is_torchscript(z: TorchZip) -> bool:
    arch = z.archive
    return arch.has("constants.pkl") or arch.has_prefix(CODE_DIR)


class TorchScriptZip(TorchZip):
    """A TorchZip known to be a TorchScript archive (made from an opened TorchZip)."""

    kind = "torchscript"

    def __init__(self, z: TorchZip) -> None:  # adopts an opened archive: no super().__init__
        self.__dict__.update(z.__dict__)
        names = self.archive.names()
        self.code_names = sorted(n for n in names if n.startswith(CODE_DIR) and n.endswith(".py"))
        info = self.info
        info["kind"] = "torchscript"
        info["code_files"] = len(self.code_names)
        info["constants"] = sum(1 for n in names if n.startswith("constants/"))
        info["extra_files"] = sorted(n[len("extra/"):] for n in names if n.startswith("extra/") and not n.endswith("/"))
        info["other_pickles"] = sorted(n for n in names if n.endswith(".pkl") and n != "data.pkl"
                                       and not n.startswith(CODE_DIR))

    def attachments(self) -> Sequence[Attachment]:
        """The TorchScript sources (``code/**.py``), group "code", paths relative to ``code/``; inflated
        only when read."""
        out = []
        for name in self.code_names:
            rec = self.archive.get(name)
            if rec is not None:
                out.append(Attachment("code", name[len(CODE_DIR):], rec.size, rec.data))
        return out
