"""Mount options: which are ckptfs's, which belong to mount(8) alone, which go to FUSE.

``ckptfs mount -o ...``, ``mount -t fuse.ckptfs -o ...`` and an /etc/fstab line take the same options:

* mount(8)'s and systemd's own (``noauto``, ``auto``, ``user``, ``users``, ``nouser``, ``owner``, ``group``,
  ``nofail``, ``_netdev``, ``defaults``, ``comment=``, ``x-*``): they decide whether and when to mount;
  ignored here (mount(8) strips most of them, mount.fuse3 and ``ckptfs mount`` the rest);
* ckptfs's: ``strict``, ``threads``, ``log=FILE`` (as the command's options), ``uid=``/``gid=`` (a number or a
  name: the owner every file shows) and ``umask=`` (octal: permission bits taken away from the read-only modes
  0444 / 0555, e.g. 027: files 0440, directories 0550), ``setuid=USER`` (as root: run as USER, who then owns
  the mount, as mount.fuse3's option does);
* remote checkpoints' (as ``ckptfs mount``'s options of the same names; docs/remote.md): ``timeout=SECONDS``,
  ``cache_dir=DIR``, ``cache_size=SIZE``, ``memory_cache=SIZE``, ``max_concurrency=N``, and
  ``storage.KEY=VALUE`` for the URL's backend (``--storage-option KEY=VALUE``: ``storage.endpoint_url=...``,
  ``storage.anon=true``); they apply over the command's own; ``limit.NAME=VALUE`` as ``--limit NAME=VALUE``
  (``limit.max_tensors=2M``);
* ``ro`` is the default and ``rw`` is refused;
* everything else goes to FUSE (``allow_other``, ``allow_root``, ``default_permissions``, ``max_read=``,
  ``nosuid``, ``nodev``, ``noexec``, ...).
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass, field
from typing import Any

from ..errors import CkptfsError
from ..source.options import REMOTE_TEXT_FIELDS, remote_field, set_storage_option

#: decided by mount(8) / systemd before a helper runs: never passed to FUSE
MOUNT8_ONLY = frozenset({"noauto", "auto", "user", "users", "nouser", "owner", "group", "nofail", "_netdev",
                         "defaults", "comment"})
MOUNT8_PREFIXES = ("x-", "comment=")
#: ckptfs's own
CKPTFS_OPTIONS = frozenset({"strict", "threads", "log", "uid", "gid", "umask", "setuid"})
#: ``-o storage.KEY=VALUE``: an option of a remote checkpoint's backend
STORAGE_PREFIX = "storage."
#: ``-o limit.NAME=VALUE``: a resource limit (``--limit NAME=VALUE``)
LIMIT_PREFIX = "limit."
#: mount.fuse3's options that ckptfs cannot honour
UNSUPPORTED = {"drop_privileges": "ckptfs opens /dev/fuse through libfuse itself; use setuid=USER to run as a user"}


@dataclass
class MountOptions:
    fuse: dict[str, Any] = field(default_factory=dict)  # for libfuse
    strict: bool = False
    threads: bool = False
    log: str | None = None
    uid: int | None = None
    gid: int | None = None
    umask: int = 0
    setuid: str | None = None
    remote: dict[str, Any] = field(default_factory=dict)  # RemoteOptions fields
    storage: dict[str, Any] = field(default_factory=dict)  # storage options (credentials: never shown)
    limits: dict[str, str] = field(default_factory=dict)  # -o limit.NAME=VALUE, as --limit NAME=VALUE
    ignored: list[str] = field(default_factory=list)  # mount(8)'s options, for the log


def _flag(name: str, value: Any) -> bool:
    if value is True:
        return True
    raise CkptfsError(f"-o {name}={value}: {name} takes no value")


def _id(name: str, value: Any, lookup: Any) -> int:
    text = str(value)
    if text.isdigit():
        return int(text)
    try:
        return int(lookup(text))
    except KeyError:
        raise CkptfsError(f"-o {name}={text}: no such {'user' if name == 'uid' else 'group'}") from None


def split_options(options: dict[str, Any]) -> MountOptions:
    """Sort ``-o`` options (as :func:`ckptfs.mount.daemon.parse_options` gives them) into FUSE's and ckptfs's;
    raises CkptfsError (one line) for a value ckptfs cannot use."""
    out = MountOptions()
    for name, value in options.items():
        if name == "rw":
            raise CkptfsError("the mount is read-only; -o rw is not possible")
        if name == "ro":
            continue  # always
        if name in UNSUPPORTED:
            raise CkptfsError(f"-o {name} is not supported: {UNSUPPORTED[name]}")
        if name in MOUNT8_ONLY or name.startswith(MOUNT8_PREFIXES):
            out.ignored.append(name)
        elif name == "strict":
            out.strict = _flag(name, value)
        elif name == "threads":
            out.threads = _flag(name, value)
        elif name == "log":
            if value is True or not value:
                raise CkptfsError("-o log=FILE: give the log file")
            out.log = str(value)
        elif name == "uid":
            out.uid = _id(name, value, lambda n: pwd.getpwnam(n).pw_uid)
        elif name == "gid":
            out.gid = _id(name, value, lambda n: grp.getgrnam(n).gr_gid)
        elif name == "umask":
            try:
                out.umask = int(str(value), 8)
            except ValueError:
                raise CkptfsError(f"-o umask={value}: expected octal permission bits, e.g. 027") from None
            if not 0 <= out.umask <= 0o777:
                raise CkptfsError(f"-o umask={value}: expected octal permission bits, e.g. 027")
        elif name in REMOTE_TEXT_FIELDS:
            if value is True:
                raise CkptfsError(f"-o {name}=VALUE: give the value")
            out.remote[name] = remote_field(name, str(value), f"-o {name}")
        elif name.startswith(LIMIT_PREFIX):
            if value is True:
                raise CkptfsError(f"-o {name}=VALUE: give the value (e.g. {LIMIT_PREFIX}max_tensors=2M)")
            out.limits[name[len(LIMIT_PREFIX):]] = str(value)
        elif name.startswith(STORAGE_PREFIX):
            key = name[len(STORAGE_PREFIX):]
            if not key or value is True:
                raise CkptfsError(f"-o {STORAGE_PREFIX}KEY=VALUE: a backend option and its value "
                                  f"(e.g. {STORAGE_PREFIX}endpoint_url=http://host:9000)")
            set_storage_option(out.storage, key, str(value), f"-o {STORAGE_PREFIX}{key}")
        elif name == "setuid":
            if value is True or not value:
                raise CkptfsError("-o setuid=USER: give the user")
            out.setuid = str(value)
        else:
            out.fuse[name] = value
    return out


def merge_storage(base: dict[str, Any] | None, extra: dict[str, Any]) -> dict[str, Any]:
    """Storage options ``base`` with ``extra`` set over them (nested options merged key by key)."""
    out: dict[str, Any] = dict(base or {})
    for k, v in extra.items():
        out[k] = merge_storage(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def become(user: str) -> None:
    """Run as ``user`` from now on (its uid, primary group and groups): ``-o setuid=USER`` as root."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise CkptfsError(f"-o setuid={user}: no such user") from None
    if os.geteuid() == pw.pw_uid:
        return
    if os.geteuid() != 0:
        raise CkptfsError(f"-o setuid={user} needs root (mount as root, or as {user} without setuid=)")
    os.initgroups(pw.pw_name, pw.pw_gid)
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    os.environ["HOME"] = pw.pw_dir
    os.environ["USER"] = os.environ["LOGNAME"] = pw.pw_name
