"""Write outputs so that nothing half-written is ever left behind and nothing of the user's is
ever replaced.

A run or sweep folder is written into a temporary folder beside it and swapped into place at
the end (``output_folder``). The target must not exist, or be a folder kvsim wrote (its marker
file says so) holding only what kvsim writes, and replacing one takes ``force``. A lock beside
the target keeps two kvsim processes from writing the same folder at once.

Every temporary kvsim makes beside an output is named after the output, kvsim, the host and
the writer's process id: ``.NAME.kvsim-tmp-HOST-PID-RANDOM`` (being written, or an old run
just replaced), ``.NAME.kvsim-old-HOST-PID-RANDOM`` (an old run moved aside, where the file
system cannot swap two folders in one step) and ``.NAME.kvsim-lock``. A process that ends
normally, fails or is interrupted removes its own; one that was killed (SIGKILL, power loss)
cannot, so each writer first removes the temporaries of dead processes of this host in the same
parent folder, and puts back an old run a dead process had moved aside without replacing it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kvsim.errors import KvsimError

if sys.platform != "win32":
    import fcntl

# A marker file larger than this is not kvsim's (a run's config.json is a few KB).
MAX_MARKER_BYTES = 1 << 20
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


@dataclass(frozen=True, slots=True)
class FolderKind:
    """A kind of folder kvsim writes: what it is called, the marker that identifies it (a JSON
    file holding an object with ``marker_key``), and every name kvsim writes at its top level
    (and, for ``plots``, only PNGs inside)."""

    what: str  # "run folder"
    marker_file: str  # "config.json"
    marker_key: str  # "kvsim_run"
    entries: frozenset[str]

    def is_marked(self, folder: Path) -> bool:
        """Whether ``folder`` holds this kind's marker: written by kvsim, not guessed."""
        path = folder / self.marker_file
        try:
            if not path.is_file() or path.stat().st_size > MAX_MARKER_BYTES:
                return False
            data = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            return False
        return isinstance(data, dict) and data.get(self.marker_key) is not None

    def foreign_entries(self, folder: Path) -> list[str]:
        """Names in ``folder`` kvsim does not write there (sorted; ``plots/x`` for plots)."""
        foreign = []
        for entry in sorted(os.listdir(folder)):
            if entry not in self.entries:
                foreign.append(entry)
            elif entry == "plots" and (folder / entry).is_dir():
                foreign += [f"plots/{p}" for p in sorted(os.listdir(folder / entry))
                            if not p.endswith(".png")]  # fmt: skip
        return foreign


# --- names of temporaries ------------------------------------------------------------------


def _host_id() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()) & 0xFFFFFF:06x}"


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
    tail = f".kvsim-{what}-{_host_id()}-{os.getpid()}-{secrets.token_hex(4)}"
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


def _remove(path: Path) -> None:
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
        path = parent / name
        if match is None:
            if _LOCK.match(name) and _take_stale_lock(path):
                removed.append(path)
            continue
        pid = int(match["pid"])
        if match["host"] != host or pid == me or _alive(pid):
            continue
        final = parent / match["name"]
        if match["what"] == "old" and "~" not in match["name"] and not os.path.lexists(final):
            with contextlib.suppress(OSError):
                os.rename(path, final)
                continue
        _remove(path)
        removed.append(path)
    return removed


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


# --- swapping a folder into place ----------------------------------------------------------

_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux's renameat2; False where the system or file system does not offer ``flags``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


def exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (Linux); False where that is not possible."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _move_into_place(tmp: Path, final: Path) -> None:
    """Put ``tmp`` at ``final``, keeping any folder already there until ``tmp`` is in place."""
    if not os.path.lexists(final):
        if not _renameat2(tmp, final, _RENAME_NOREPLACE):
            os.rename(tmp, final)
        return
    if exchange(tmp, final):
        _remove(tmp)  # tmp now holds the old folder
        return
    # No atomic swap: move the old folder aside, then the new one in. A process that dies in
    # between leaves the old one under an ``old`` name that the next writer puts back.
    old = temp_path(final, "old")
    os.rename(final, old)
    os.rename(tmp, final)
    _remove(old)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver them (main thread only): a
    few renames that must not be cut in the middle."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    # Only signals whose handler Python set can be put back (getsignal() is None otherwise).
    previous = {
        s: h for s in (signal.SIGINT, signal.SIGTERM) if (h := signal.getsignal(s)) is not None
    }
    for s in previous:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for held in dict.fromkeys(pending):
            signal.raise_signal(held)


# --- the output folder ---------------------------------------------------------------------


def _os_problem(exc: OSError) -> str:
    return exc.strerror or str(exc)


def check_target(final: Path, kind: FolderKind, *, force: bool) -> None:
    """Raise ``OutputError`` unless ``final`` may be written: it does not exist, or it is a
    ``kind`` folder holding only what kvsim writes and ``force`` is given."""
    if final.name in ("", ".", "..") or _holds_cwd(final):
        raise OutputError(
            f"{str(final)!r}: name a new folder for the {kind.what}, e.g. runs/mine (kvsim "
            "never replaces the current folder or one above it)"
        )
    size = len(final.name.encode("utf-8", "surrogateescape"))
    if size > NAME_MAX:
        raise OutputError(f"{final}: file name too long ({size} bytes; at most {NAME_MAX})")
    if os.path.islink(final):
        raise OutputError(f"{final}: is a symbolic link; give the folder it points to")
    if not os.path.lexists(final):
        return
    if not final.is_dir():
        raise OutputError(f"{final}: exists and is not a folder; kvsim will not replace it")
    if not kind.is_marked(final):
        raise OutputError(
            f"{final}: exists and is not a kvsim {kind.what} (no {kind.marker_file} written "
            "by kvsim); kvsim replaces only folders it wrote: choose another --out"
        )
    try:
        foreign = kind.foreign_entries(final)
    except OSError as exc:
        raise OutputError(f"{final}: cannot read the folder: {_os_problem(exc)}") from None
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise OutputError(
            f"{final}: holds {foreign[0]!r}{more}, which kvsim did not write; move it away or "
            "choose another --out"
        )
    if not force:
        raise OutputError(f"{final}: holds an earlier kvsim {kind.what}; --force replaces it")


def _holds_cwd(final: Path) -> bool:
    try:
        return Path.cwd().resolve().is_relative_to(final.resolve())
    except OSError:  # the current folder is gone, or the path cannot be resolved
        return False


def _prepare_parent(final: Path) -> list[Path]:
    """Create ``final``'s parent folders; return those it created, deepest first."""
    parent = final.parent
    created = []
    for folder in (parent, *parent.parents):
        if os.path.lexists(folder):
            if not folder.is_dir():
                raise OutputError(f"{folder}: is not a folder, so {final} cannot be written")
            break
        created.append(folder)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(created)
        raise OutputError(f"{final}: cannot create {parent}: {_os_problem(exc)}") from None
    return created


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) that are still empty: what a failed write made."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def output_folder(final: Path, kind: FolderKind, *, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``final``; when the block ends without an
    exception it replaces ``final``.

    Refuses (``OutputError``, before the block runs) to write over anything but a ``kind``
    folder, and over that only with ``force``; ``OutputBusyError`` while another process
    writes ``final``. On any exception, an interrupt included, the temporary folder is
    removed and ``final`` is left as it was. Nothing of this process's is left beside
    ``final`` afterwards.
    """
    final = Path(final)
    check_target(final, kind, force=force)  # before creating anything
    created = _prepare_parent(final)
    with contextlib.ExitStack() as stack:
        # A failed or interrupted write leaves no folder it made (``runs/`` included).
        stack.callback(_remove_empty, created)  # rmdir: only folders left empty go
        try:
            stack.enter_context(output_lock(final))
        except OutputError:
            raise
        except OSError as exc:
            raise OutputError(
                f"{final}: cannot write in {final.parent}: {_os_problem(exc)}"
            ) from None
        remove_stale_temporaries(final.parent)
        check_target(final, kind, force=force)  # again, now that we hold the lock
        tmp = temp_path(final)
        try:
            os.mkdir(tmp)  # 0777 less the umask: an ordinary folder
        except OSError as exc:
            raise OutputError(f"{final}: cannot write: {_os_problem(exc)}") from None
        try:
            yield tmp
            check_target(final, kind, force=force)  # nothing else came in meanwhile
            with deferred_signals():
                _move_into_place(tmp, final)
        except BaseException:
            _remove(tmp)
            raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename (the file
    gets the usual mode, 0666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    tmp = temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # less the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
