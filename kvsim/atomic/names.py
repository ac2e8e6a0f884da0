"""Temporaries beside an output, and the lock that keeps two kvsim processes from writing one
output at once.

``.NAME.kvsim-tmp-HOST-PID-RANDOM``: a folder being written (or an old output just swapped
out); ``.NAME.kvsim-old-HOST-PID-RANDOM``: an old output moved aside where no atomic swap
exists; ``.NAME.kvsim-lock``: the lock of NAME, holding its owner record
(kvsim/atomic/owner.py), which lists every temporary the holder made;
``.NAME.kvsim-lock.new-HOST-PID-RANDOM``: a new lock being made, locked and recorded before
it is linked to the lock's name. The names are for people; what a later writer removes is
decided by the record alone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from kvsim.atomic.owner import MAX_RECORD_BYTES, OwnerRecord
from kvsim.errors import KvsimError

if sys.platform != "win32":
    import fcntl

# Longest file name most file systems take, in bytes.
NAME_MAX = 255
_TEMP = re.compile(r"^\.(?P<name>.+)\.kvsim-(?P<what>tmp|old)-[0-9a-f]{6}-\d+-\w+$")
_LOCK = re.compile(r"^\..+\.kvsim-lock(\.new-[0-9a-f]{6}-\d+-\w+)?$")


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


def _new_lock_path(final: Path) -> Path:
    """A fresh name beside ``final`` for its lock being made (``output_lock``)."""
    tail = f".kvsim-lock.new-{_host_id()}-{os.getpid()}-{os.urandom(4).hex()}"
    return final.parent / f".{_short(final.name, len(tail) + 1)}{tail}"


# --- stale temporaries ---------------------------------------------------------------------


def remove_entry(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _read_record(fd: int) -> OwnerRecord | None:
    try:
        return OwnerRecord.parse(os.pread(fd, MAX_RECORD_BYTES, 0))
    except OSError:
        return None


def _remove_temporaries(parent: Path, record: OwnerRecord) -> list[Path]:
    """Remove the temporaries a dead ``record`` lists (an old output it moved aside but never
    replaced is put back under its name instead); return what went."""
    removed = []
    # Old outputs first: one may have to be put back before its name's temporaries go.
    for name in sorted(record.temporaries, key=lambda n: ".kvsim-old-" not in n):
        path = parent / name
        if not record.owns(name) or not os.path.lexists(path):
            continue
        match = _TEMP.match(name)
        if match and match["what"] == "old" and not _swapped_in(parent, match["name"], path):
            continue  # put back, or (a cut name, a failed rename) left for the user
        remove_entry(path)
        removed.append(path)
    return removed


def remove_stale_temporaries(parent: Path) -> list[Path]:
    """Remove what killed kvsim processes of this host left in ``parent``; return it.

    Only a lock file holding a valid owner record whose process is dead on this host, and the
    temporaries that record lists, are removed. Anything else, whatever its name, is left.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        if _LOCK.match(name):
            removed += _reap_lock(parent / name)
    return removed


def _reap_lock(path: Path) -> list[Path]:
    """If no process holds the lock ``path`` and its record's process is dead, remove that
    record's temporaries and the lock; return what went."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        # The record first, and the flock only of a dead writer's lock: a lock file without a
        # record is one a writer made an instant ago and is about to lock, and holding its
        # flock even briefly would make that writer report its output busy (_take).
        record = _read_record(fd)
        if record is None or not record.is_dead_here():
            return []
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not os.path.samestat(os.fstat(fd), os.lstat(path)):
                return []
        except OSError:
            return []  # held: its writer is alive
        record = _read_record(fd)
        if record is None or not record.is_dead_here():
            return []
        removed = _remove_temporaries(path.parent, record)
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
        return removed
    finally:
        os.close(fd)


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


# --- the lock ------------------------------------------------------------------------------


def _write_record(fd: int, record: OwnerRecord) -> None:
    data = record.to_bytes()
    os.ftruncate(fd, 0)
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError(28, os.strerror(28))


class OutputLock:
    """A held lock: its owner record names every temporary made beside the output."""

    def __init__(self, fd: int, record: OwnerRecord) -> None:
        self._fd = fd
        self.record = record

    def _write(self) -> None:
        _write_record(self._fd, self.record)

    def register(self, temporary: Path) -> Path:
        """Record ``temporary`` (a name beside the output) before it is made; return it."""
        self.record.temporaries.append(temporary.name)
        self._write()
        return temporary


@contextlib.contextmanager
def output_lock(final: Path) -> Iterator[OutputLock]:
    """Hold the lock of ``final`` (a file beside it holding the owner record, removed on
    release); raise ``OutputBusyError`` at once if another process holds it. A lock left by a
    dead writer of this host is reaped first (the temporaries its record lists, then the lock
    itself), one left by another host's writer taken over; a file of that name without a
    valid record is someone else's, never truncated or removed."""
    path = lock_path(final)
    lock = OutputLock(-1, OwnerRecord.mine())
    fd, previous = _take(path, final, lock.record)
    try:
        lock._fd = fd
        if previous is not None:  # another host's writer's lock, taken over
            lock._write()
        yield lock
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
# What link() says where the file system has no hard links (vfat, some FUSE and network ones).
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


def _take(path: Path, final: Path, record: OwnerRecord) -> tuple[int, OwnerRecord | None]:
    """An open, flocked descriptor of the lock file ``path``: a new one holding ``record``
    (and None), or another host's writer's, taken over (and its record). A dead writer's of
    this host is reaped, and a new one made."""
    strangers = 0
    while True:
        fd = _made(path, final, record)
        if fd is not None:
            return fd, None
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:  # its holder released it meanwhile
            continue
        try:
            _flock_unless_live(fd, final)
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            same = False
        if not same:  # a file another process unlinked while we waited for it
            os.close(fd)
            continue
        previous = _read_record(fd)
        if previous is not None and previous.is_dead_here():
            # Reaped as a sweep reaps it, so that whoever holds a lock under a dead writer's
            # record is a reaper, about to let go (``_flock_unless_live``).
            _remove_temporaries(path.parent, previous)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)
            continue
        if previous is not None:
            return fd, previous
        os.close(fd)
        # Not kvsim's; or, on a file system without hard links (``_made_in_place``), a writer
        # that made it an instant ago and has yet to lock and record.
        strangers += 1
        if strangers > 3:
            raise OutputError(
                f"{path}: exists and is not a kvsim lock (no owner record kvsim wrote); kvsim "
                f"will not replace it: remove it if it is not yours, or choose another name"
            )
        time.sleep(0.05)


# How long a writer waits for a reaper of a dead writer's lock (removing its temporaries: an
# unfinished run folder takes milliseconds; a big one, seconds) before it says busy.
REAPER_WAIT_S = 10.0


def _flock_unless_live(fd: int, final: Path) -> None:
    """Lock ``fd`` (an existing lock file); raise ``OutputBusyError`` if a live writer holds
    it. One held under a dead writer's record is held by a reaper (a sweep, or a writer of
    the same output), which removes it and lets go: waited for."""
    deadline = time.monotonic() + REAPER_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _read_record(fd)
            if holder is None or not holder.is_dead_here() or time.monotonic() > deadline:
                raise _busy(final, holder) from None
        time.sleep(0.01)


def _busy(final: Path, holder: OwnerRecord | None) -> OutputBusyError:
    who = f" (pid {holder.pid})" if holder is not None else ""
    return OutputBusyError(
        f"{final}: another kvsim process{who} is writing this output; wait for it or choose "
        "another --out"
    )


def _made(path: Path, final: Path, record: OwnerRecord) -> int | None:
    """A new lock file at ``path``, flocked and holding ``record`` from the instant it has
    that name; None if ``path`` exists.

    It is made under a name of its own (``_new_lock_path``), locked and recorded there, and
    then hard-linked to ``path``: no other process ever sees the lock unlocked or without its
    record, so none takes a live writer's lock for a stranger's, nor holds the flock its maker
    is about to take (which made the maker say its output was busy). Where the file system
    has no hard links it is made in place (``_made_in_place``)."""
    staging = _new_lock_path(final)
    fd = os.open(staging, _NEW, 0o644)  # 0644 less the umask
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # nobody else's name: at most a sweep's instant
        _write_record(fd, record)
        os.link(staging, path)
    except OSError as exc:
        os.close(fd)
        if isinstance(exc, FileExistsError):
            return None
        if exc.errno in _NO_LINKS:
            return _made_in_place(path, final, record)
        raise
    except BaseException:
        os.close(fd)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
    return fd


def _made_in_place(path: Path, final: Path, record: OwnerRecord) -> int | None:
    """``_made`` without hard links: made at ``path``, then locked and recorded (another
    writer may see it without a record meanwhile, and waits a moment for one: ``_take``)."""
    try:
        fd = os.open(path, _NEW, 0o644)
    except FileExistsError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _write_record(fd, record)
    except BlockingIOError:  # another writer of the same output found it first: ours to remove
        os.unlink(path)
        os.close(fd)
        raise _busy(final, None) from None
    except BaseException:
        os.close(fd)
        raise
    return fd
