"""Output folders written whole or not at all, and never over a user's files (see
kvsim/atomic/__init__.py)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kvsim.atomic.manifest import MANIFEST, Manifest
from kvsim.atomic.names import (
    NAME_MAX,
    OutputError,
    OutputLock,
    output_lock,
    remove_entry,
    remove_stale_temporaries,
    temp_path,
)

# A marker file larger than this is not kvsim's (a run's config.json is a few KB).
MAX_MARKER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class FolderKind:
    """A kind of folder kvsim writes: what it is called (the ``kind`` of its manifest), the
    marker readers know it by (a JSON file holding an object with ``marker_key``; it proves
    nothing about ownership, the manifest does), and the names kvsim writes at its top level."""

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


def _move_into_place(tmp: Path, final: Path, lock: OutputLock) -> None:
    """Put ``tmp`` at ``final``, keeping any folder already there until ``tmp`` is in place."""
    if not os.path.lexists(final):
        if not _renameat2(tmp, final, _RENAME_NOREPLACE):
            os.rename(tmp, final)
        return
    if exchange(tmp, final):
        remove_entry(tmp)  # tmp now holds the old folder
        return
    # No atomic swap: move the old folder aside, then the new one in. A process that dies in
    # between leaves the old one under an ``old`` name that the next writer puts back.
    old = lock.register(temp_path(final, "old"))
    os.rename(final, old)
    os.rename(tmp, final)
    remove_entry(old)


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


def named(exc: OSError, final: Path, tmp: Path | None = None) -> OSError:
    """``exc`` naming the output ``final`` where it names no file (a write on a full disk) or
    a file in its temporary ``tmp``: the user knows the output, not kvsim's temporary."""
    if exc.errno is None:
        return exc
    where = exc.filename
    if where is not None and tmp is not None and str(where).startswith(str(tmp)):
        where = None
    if where is not None:
        return exc
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(final))


def check_name(final: Path, what: str = "output") -> None:
    """Raise ``OutputError`` if ``final`` can never be an output folder: no name, the current
    folder or one above it, a name too long for the file system, a symbolic link."""
    if final.name in ("", ".", "..") or _holds_cwd(final):
        raise OutputError(
            f"{str(final)!r}: name a new folder for the {what}, e.g. runs/mine (kvsim never "
            "replaces the current folder or one above it)"
        )
    size = len(final.name.encode("utf-8", "surrogateescape"))
    if size > NAME_MAX:
        raise OutputError(f"{final}: file name too long ({size} bytes; at most {NAME_MAX})")
    if os.path.islink(final):
        raise OutputError(
            f"{final}: is a symbolic link; kvsim does not write through links: give the path "
            "it points to"
        )


def check_target(final: Path, kind: FolderKind, *, force: bool) -> None:
    """Raise ``OutputError`` unless ``final`` may be written: it does not exist, or it is a
    ``kind`` folder whose manifest lists every entry of its tree with the bytes it holds
    now (kvsim/atomic/manifest.py), and ``force`` is given."""
    check_name(final, kind.what)
    if not os.path.lexists(final):
        return
    if not final.is_dir():
        raise OutputError(f"{final}: exists and is not a folder; kvsim will not replace it")
    manifest = Manifest.read(final)
    if manifest is None:
        if kind.is_marked(final):
            raise OutputError(
                f"{final}: looks like a kvsim {kind.what} ({kind.marker_file}) but has no "
                f"{MANIFEST} listing what kvsim wrote (an older kvsim's, or a copy), so kvsim "
                "cannot tell that nothing in it is yours; delete it yourself if you no longer "
                "need it, or choose another --out"
            )
        empty = " (it is empty: remove it first)" if not any(os.scandir(final)) else ""
        raise OutputError(
            f"{final}: exists and is not a kvsim {kind.what} (no {MANIFEST} written by "
            f"kvsim){empty}; kvsim replaces only folders it wrote: choose another --out"
        )
    if manifest.kind != kind.what:
        raise OutputError(
            f"{final}: is a kvsim {manifest.kind}, not a kvsim {kind.what}; choose another --out"
        )
    try:
        foreign = manifest.foreign(final)
    except OSError as exc:
        raise OutputError(f"{final}: cannot read the folder: {_os_problem(exc)}") from None
    if foreign:
        raise OutputError(
            f"{final}: holds {foreign}, which kvsim did not write; move it away or choose "
            "another --out"
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


def output_folder(
    final: Path, kind: FolderKind, *, force: bool = False
) -> contextlib.AbstractContextManager[Path]:
    """Yield a fresh temporary folder beside ``final``; when the block ends without an
    exception it replaces ``final``.

    Refuses (``OutputError``, before the block runs) to write over anything but a ``kind``
    folder, and over that only with ``force``; ``OutputBusyError`` while another process
    writes ``final``. On any exception, an interrupt included, the temporary folder is
    removed and ``final`` is left as it was. Nothing of this process's is left beside
    ``final`` afterwards.
    """
    return atomic_dir(final, lambda path: check_target(path, kind, force=force), kind=kind.what)


@contextlib.contextmanager
def atomic_dir(
    final: Path, check: Callable[[Path], None] | None = None, *, kind: str
) -> Iterator[Path]:
    """``output_folder`` for a folder with rules of its own: ``check(final)`` raises unless
    ``final`` may be replaced; it runs before anything is made, again under the lock, and
    before the swap (``check_name`` always applies). The folder gets a manifest of ``kind``
    listing everything the block wrote."""
    final = Path(final)

    def may_write(path: Path) -> None:
        check_name(path)
        if check is not None:
            check(path)

    may_write(final)  # before creating anything
    created = _prepare_parent(final)
    with contextlib.ExitStack() as stack:
        # A failed or interrupted write leaves no folder it made (``runs/`` included).
        stack.callback(_remove_empty, created)  # rmdir: only folders left empty go
        try:
            lock = stack.enter_context(output_lock(final))
        except OutputError:
            raise
        except OSError as exc:
            raise OutputError(
                f"{final}: cannot write in {final.parent}: {_os_problem(exc)}"
            ) from None
        remove_stale_temporaries(final.parent)
        may_write(final)  # again, now that we hold the lock
        try:
            tmp = lock.register(temp_path(final))
            os.mkdir(tmp)  # 0777 less the umask: an ordinary folder
        except OSError as exc:
            raise OutputError(f"{final}: cannot write: {_os_problem(exc)}") from None
        try:
            try:
                yield tmp
            except OSError as exc:
                raise named(exc, final, tmp) from None
            Manifest.of_tree(tmp, kind).write(tmp)  # last: it lists every file written
            may_write(final)  # nothing else came in meanwhile
            with deferred_signals():
                _move_into_place(tmp, final, lock)
        except BaseException:
            remove_entry(tmp)
            raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename (the file
    gets the usual mode, 0666 less the umask). The caller decides whether ``path`` may be
    replaced (kvsim.atomic.output_file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(path) as lock:
        remove_stale_temporaries(path.parent)
        tmp = lock.register(temp_path(path))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # less the umask
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
