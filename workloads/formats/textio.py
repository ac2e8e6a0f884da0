"""Line-by-line UTF-8 reading with exact line numbers, and atomic file writing."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from workloads.errors import TraceFormatError
from workloads.limits import MAX_DOCUMENT_BYTES, MAX_LINE_BYTES

_BOM = "\ufeff"
_NEW_FILE_MODE = 0o644  # mkstemp creates 0600 files; a trace is not a secret


def decode_line(raw: bytes, path: str | Path, line: int) -> str:
    """Decode one line of bytes as UTF-8, or raise TraceFormatError naming the line and column."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TraceFormatError(
            f"not valid UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})",
            path=path,
            line=line,
        ) from None
    if line == 1 and text.startswith(_BOM):  # spreadsheets like to add one
        text = text[1:]
    return text


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(path: str | Path, mode: int) -> TraceFormatError:
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    return TraceFormatError(f"is {kind}, not a trace file", path=path)


def read_error(path: str | Path, err: OSError) -> TraceFormatError:
    """An OSError met while reading ``path``, as a TraceFormatError naming the file."""
    return TraceFormatError(err.strerror or str(err), path=path)


@contextlib.contextmanager
def open_regular(path: str | Path) -> Iterator[BinaryIO]:
    """Open a regular file for binary reading; refuse directories, FIFOs and devices.

    A FIFO would block forever and ``/dev/zero`` never ends, so the file's type is checked
    before opening it (no side effects of opening a device) and again on the opened descriptor
    (the path may have been swapped in between); O_NONBLOCK makes even that open of a FIFO
    return at once. Raises TraceFormatError naming the file, also for a missing file or any
    other OSError while opening or reading.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise read_error(path, err) from None
    except ValueError:  # os.stat refuses a path with a NUL character
        raise TraceFormatError("the path contains a NUL character", path=path) from None
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise read_error(path, err) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        try:
            yield file
        except OSError as err:
            raise read_error(path, err) from None


def _too_long(path: str | Path, line: int) -> TraceFormatError:
    return TraceFormatError(
        f"line is longer than {MAX_LINE_BYTES:,} bytes (1 MiB), the most one line may hold",
        path=path,
        line=line,
    )


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for each line of a UTF-8 file, streaming (1-based lines).

    Raises TraceFormatError for a line longer than MAX_LINE_BYTES, bad UTF-8, or a file that
    cannot be read (see :func:`open_regular`).
    """
    with open_regular(path) as file:
        readline = file.readline
        number = 0
        # readline with a size never reads more than that, so a line without an end (a copy of
        # /dev/zero) costs at most MAX_LINE_BYTES of memory before it is refused.
        while raw := readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise _too_long(path, number)
            yield number, decode_line(raw, path, number)


def read_document(path: str | Path) -> bytes:
    """All bytes of a regular file of at most MAX_DOCUMENT_BYTES (see :func:`open_regular`)."""
    with open_regular(path) as file:
        data = file.read(MAX_DOCUMENT_BYTES + 1)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise TraceFormatError(
            f"a JSON document trace may hold at most {MAX_DOCUMENT_BYTES:,} bytes (1 GiB); "
            "write larger traces as JSON Lines (.jsonl), which is read line by line",
            path=path,
        )
    return data


def decode_document(data: bytes, path: str | Path) -> str:
    """Decode a whole file as UTF-8, naming the line of the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise TraceFormatError(
            f"not valid UTF-8 text (byte 0x{data[err.start]:02x} at column {column})",
            path=path,
            line=line,
        ) from None
    return text.removeprefix(_BOM)


@contextlib.contextmanager
def atomic_text_writer(path: str | Path) -> Iterator[TextIO]:
    """Open a temporary file next to ``path`` for writing; move it over ``path`` only on success.

    Readers never see a half-written file: the rename (``os.replace``) is atomic on POSIX.
    """
    target = Path(path)
    if not target.parent.is_dir():  # else mkstemp would name its temporary file in the error
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(target.parent))
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp_name, _NEW_FILE_MODE)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small objects.

    Loading 1M requests allocates millions of dicts and Requests, none of them cyclic; the
    collector's repeated passes over them cost about a third of the load time. Reference counting
    still frees everything; the previous GC state is restored afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
