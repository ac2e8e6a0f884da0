"""Line-by-line UTF-8 reading with exact line numbers, and atomic file writing."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from workloads.errors import TraceFormatError

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


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for each line of a UTF-8 file, streaming (1-based lines)."""
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            yield number, decode_line(raw, path, number)


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
