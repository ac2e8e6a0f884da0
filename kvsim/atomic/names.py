"""Temporaries beside an output, named so that a later process can tell whose they are, and
the lock that keeps two kvsim processes from writing one folder at once.

``.NAME.kvsim-tmp-HOST-PID-RANDOM``: a folder or file being written (or an old run just
swapped out); ``.NAME.kvsim-old-HOST-PID-RANDOM``: an old run moved aside where no atomic swap
exists; ``.NAME.kvsim-lock``: the lock of NAME. HOST is a hash of the host name, PID the
writer's process id: the temporaries of dead processes of this host are stale.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

from kvsim.errors import KvsimError

if sys.platform != "win32":
    import fcntl

# Longest file name most file systems take, in bytes.
NAME_MAX = 255
_TEMP = re.compile(
    r"^\.(?P<name>.+)\.kvsim-(?P<what>tmp|old)-(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-\w+$"
)
_LOCK = re.compile(r"^\..+\.kvsim-lock$")


class OutputError(KvsimError):
    """An output cannot be written where it was asked for (the message says why)."""


class OutputBusyError(OutputError):
    """Another kvsim process is writing the same output folder."""


# --- names of temporaries ------------------------------------------------------------------


def _host_id() -> str:
    if hasattr(os, "uname"):
        host = os.uname().nodename  # what socket.gethostname() gives, without its 5 ms import
    else:  # Windows
        import socket

        host = socket.gethostname()
    return f"{zlib.crc32(host.encode()) & 0xFFFFFF:06x}"


def _short(name: str, room: int) -> str:
    """``name``, cut (and made unique by a hash) to leave ``room`` bytes of a file name."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) + room <= NAME_MAX:
        return name
    digest = f"{zlib.crc32(raw):08x}"
    keep = raw[: NAME_MAX - room - len(digest) - 1].decode("utf-8", "ignore")
    return f"{keep}~{digest}"


def temp_path(final: Path, what: str = "tmp") -> Path:
    """A fresh temporary path beside ``final``, recognisable as this process's."""
    # os.urandom, not secrets.token_hex (the same bytes): importing secrets took 9 ms of each run
    tail = f".kvsim-{what}-{_host_id()}-{os.getpid()}-{os.urandom(4).hex()}"
    return final.parent / f".{_short(final.name, len(tail) + 1)}{tail}"


def lock_path(final: Path) -> Path:
    tail = ".kvsim-lock"
    return final.parent / f".{_short(final.name, len(tail) + 1)}{tail}"


# --- stale temporaries ---------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_entry(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_stale_temporaries(parent: Path) -> list[Path]:
    """Remove what killed kvsim processes of this host left in ``parent``; return it.

    An old folder a process moved aside but never replaced (it died between its two renames)
    is put back under its name instead. Temporaries of live processes are left alone, and so
    is anything whose name kvsim would not have made.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    host, me = _host_id(), os.getpid()
    removed = []
    # Old folders first: one may have to be put back before its name's temporaries go.
    for name in sorted(names, key=lambda n: ".kvsim-old-" not in n):
        match = _TEMP.match(name)
        if match is None:
            if _LOCK.match(name) and _take_stale_lock(lock := parent / name):
                removed.append(lock)
            continue
        path = parent / name
        pid = int(match["pid"])
        if match["host"] != host or pid == me or _alive(pid):
            continue
        if match["what"] == "old" and not _swapped_in(parent, match["name"], path):
            continue  # put back, or (a cut name, a failed rename) left for the user
        remove_entry(path)
        removed.append(path)
    return removed


def _swapped_in(parent: Path, name: str, old: Path) -> bool:
    """For an old folder a dead process moved aside: True if the new one replaced it (the
    old can go); else put it back under its name and return False. Never loses it: a name
    that was cut to fit ("~") or a failed rename leaves it where it is."""
    final = parent / name
    if "~" in name:
        return False
    if os.path.lexists(final):
        return True
    with contextlib.suppress(OSError):
        os.rename(old, final)
    return False


def _take_stale_lock(path: Path) -> bool:
    """Remove the lock file ``path`` if no process holds it."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    try:
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            os.unlink(path)
            return True
        return False
    except OSError:
        return False
    finally:
        os.close(fd)


# --- the lock ------------------------------------------------------------------------------


@contextlib.contextmanager
def output_lock(final: Path) -> Iterator[None]:
    """Hold the lock of ``final`` (a file beside it, removed on release); raise
    ``OutputBusyError`` at once if another process holds it."""
    path = lock_path(final)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise OutputBusyError(
                f"{final}: another kvsim process{who} is writing this folder; wait for it "
                "or choose another --out"
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:  # not a file another process unlinked while we waited for it
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
