"""kvsim-manifest.json: the proof that a folder, and everything in it, is kvsim's.

Every folder kvsim writes (a run, a sweep, pictures, a cache curve, a profile, a validation)
gets a manifest as its last file: its kind, every folder in it and every file with its size
and SHA-256. kvsim replaces an existing folder only when its manifest is valid, of the same
kind, and lists every entry of the folder's tree with the bytes it holds now: a file the user
added (at any depth), edited, or a link, is not kvsim's and stops the replacement. A
marker file or a copied config.json proves nothing on its own.

A single file kvsim writes outside such a folder gets a sidecar instead, ``.NAME.kvsim.json``
beside it (the same fields for that one file); a copied file, or one written over, has none
that matches. Commands that add files to a kvsim folder (``kvsim plot RUN``, ``kvsim report
RUN``) list them in the folder's manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "kvsim-manifest.json"
MANIFEST_KEY = "kvsim_manifest"
SIDECAR_KEY = "kvsim_file"
# A manifest larger than this is not kvsim's (a sweep of 10,000 points lists ~2 MB).
MAX_MANIFEST_BYTES = 64 << 20
# How many folders up from a file kvsim looks for the manifest of the folder holding it
# (a sweep point's plots/x.png is 3 below the sweep folder).
MAX_ROOT_DEPTH = 4


# Digests this process computed of files that had been left alone for _SETTLED_NS before it
# read them, by the file's identity, size and times. Any write to a file, and any change of
# its times, sets its ctime to the time of the change, which no one can set back; so a file
# whose (device, inode, size, mtime, ctime) is still the same holds the same bytes. A folder
# replaced with --force is checked three times (before anything is made, under the lock,
# before the swap), then the new one is hashed for its manifest: a `kvsim run --force` over
# the whole Azure conversation trace's run folder (29.5 MB) read 4 x 29.5 MB, now 2 x (one
# hash of it: ~18 ms of CPU, Manifest.of_tree, 4 runs).
_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}
_SETTLED_NS = 2_000_000_000  # coarser than any file system's time stamps


def file_digest(path: Path) -> str:
    """SHA-256 of ``path``'s bytes (hex); a link is not followed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        known = _DIGESTS.get(key)
        if known is not None:
            return known
        start_ns = time.time_ns()
        digest = hashlib.sha256()
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    hexdigest = digest.hexdigest()
    if max(st.st_mtime_ns, st.st_ctime_ns) < start_ns - _SETTLED_NS:
        _DIGESTS[key] = hexdigest
    return hexdigest


@dataclass(slots=True)
class Manifest:
    """What kvsim wrote in a folder: ``files`` maps a relative path (``/``-separated) to
    ``(size in bytes, sha256 hex)``; ``folders`` lists every folder below the top one."""

    kind: str
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    folders: set[str] = field(default_factory=set)

    @classmethod
    def of_tree(cls, folder: Path, kind: str) -> Manifest:
        """The manifest of everything now under ``folder`` (the manifest itself left out)."""
        manifest = cls(kind)
        for rel, entry in _walk(folder):
            if entry.is_dir(follow_symlinks=False):
                manifest.folders.add(rel)
            elif rel != MANIFEST:
                manifest.add_file(folder, rel)
        return manifest

    def add_file(self, root: Path, rel: str) -> None:
        path = root / rel
        self.files[rel] = (os.lstat(path).st_size, file_digest(path))
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.folders.add("/".join(parts[:i]))

    def to_bytes(self) -> bytes:
        data = {
            MANIFEST_KEY: 1,
            "kind": self.kind,
            "folders": sorted(self.folders),
            "files": {k: {"size": s, "sha256": h} for k, (s, h) in sorted(self.files.items())},
        }
        return (json.dumps(data, indent=1) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes) -> Manifest | None:
        """The manifest in ``raw``; None unless every field is what kvsim writes."""
        try:
            data: Any = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.get(MANIFEST_KEY) != 1:
            return None
        kind, folders, files = data.get("kind"), data.get("folders"), data.get("files")
        if not isinstance(kind, str) or not isinstance(folders, list):
            return None
        if not isinstance(files, dict) or not all(_is_rel(f) for f in [*folders, *files]):
            return None
        manifest = cls(kind, folders=set(folders))
        for rel, entry in files.items():
            if not isinstance(entry, dict):
                return None
            size, digest = entry.get("size"), entry.get("sha256")
            if type(size) is not int or size < 0 or not isinstance(digest, str):
                return None
            if not _is_digest(digest):
                return None
            manifest.files[rel] = (size, digest)
        return manifest

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """``folder``'s manifest; None if it has none kvsim could have written."""
        raw = _read_small(folder / MANIFEST, MAX_MANIFEST_BYTES)
        return None if raw is None else cls.parse(raw)

    def write(self, folder: Path) -> None:
        """Write the manifest into ``folder`` through a temporary file and a rename."""
        tmp = folder / f".{MANIFEST}.writing"
        tmp.write_bytes(self.to_bytes())
        os.replace(tmp, folder / MANIFEST)

    def foreign(self, folder: Path) -> str | None:
        """The first entry of ``folder``'s tree this manifest does not vouch for (a path
        relative to ``folder``, with why), or None when every entry is listed with its bytes.
        A listed file that is missing is no one's loss and is not reported."""
        changed, unlisted_folder = [], None
        for rel, entry in _walk(folder):
            if entry.is_symlink():
                return f"{rel!r} (a symbolic link)"
            if entry.is_dir(follow_symlinks=False):
                if rel not in self.folders and unlisted_folder is None:
                    unlisted_folder = f"{rel + '/'!r}"  # named if nothing in it is
                continue
            if rel == MANIFEST:
                continue
            mode = entry.stat(follow_symlinks=False)
            if rel not in self.files or not stat.S_ISREG(mode.st_mode):
                return f"{rel!r}"
            if mode.st_size != self.files[rel][0]:
                return f"{rel!r} (changed since kvsim wrote it)"
            changed.append(rel)
        if unlisted_folder is not None:
            return unlisted_folder
        for rel in changed:  # the sizes first: hashing is the slow part
            if file_digest(folder / rel) != self.files[rel][1]:
                return f"{rel!r} (changed since kvsim wrote it)"
        return None


def _is_rel(path: object) -> bool:
    """A relative path kvsim writes: ``/``-separated, no empty, ``.`` or ``..`` part."""
    if not isinstance(path, str) or not path or "\x00" in path or "\\" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def _is_digest(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def _walk(folder: Path, prefix: str = "") -> list[tuple[str, os.DirEntry[str]]]:
    """Every entry under ``folder`` with its ``/``-separated relative path (links not
    followed), folders before what they hold."""
    found = []
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            rel = f"{prefix}{entry.name}"
            found.append((rel, entry))
            if entry.is_dir(follow_symlinks=False):
                found += _walk(Path(entry.path), f"{rel}/")
    return found


def _read_small(path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file ``path`` (not a link) if it holds at most ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw if len(raw) <= limit else None


# --- single files ------------------------------------------------------------------------


def sidecar_path(path: Path) -> Path:
    """``.NAME.kvsim.json`` beside ``path``: what proves ``path`` is a file kvsim wrote."""
    from kvsim.atomic.names import _short

    tail = ".kvsim.json"
    return path.parent / f".{_short(path.name, len(tail) + 1)}{tail}"


def sidecar_bytes(path: Path) -> bytes:
    """The sidecar of the file now at ``path``."""
    data = {
        SIDECAR_KEY: 1,
        "name": path.name,
        "size": os.lstat(path).st_size,
        "sha256": file_digest(path),
    }
    return (json.dumps(data, indent=1) + "\n").encode()


def has_valid_sidecar(path: Path) -> bool:
    """Whether ``path`` is a regular file whose sidecar kvsim wrote for these very bytes."""
    raw = _read_small(sidecar_path(path), 1 << 16)
    if raw is None:
        return False
    try:
        data: Any = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    if not isinstance(data, dict) or data.get(SIDECAR_KEY) != 1 or data.get("name") != path.name:
        return False
    try:
        mode = os.lstat(path)
        if not stat.S_ISREG(mode.st_mode) or mode.st_size != data.get("size"):
            return False
        return _is_digest(data.get("sha256")) and file_digest(path) == data["sha256"]
    except OSError:
        return False


def find_roots(path: Path) -> list[Path]:
    """The folders above ``path`` (at most MAX_ROOT_DEPTH up) holding a manifest kvsim
    wrote, nearest first: a sweep point's run folder, then the sweep folder. A file of that
    name holding anything else ends the search (it may be the user's)."""
    roots = []
    for folder in [path.parent, *path.parent.parents][:MAX_ROOT_DEPTH]:
        if os.path.lexists(folder / MANIFEST):
            if Manifest.read(folder) is None:
                break
            roots.append(folder)
    return roots


def find_root(path: Path) -> Path | None:
    """The nearest of ``find_roots(path)``, if any."""
    roots = find_roots(path)
    return roots[0] if roots else None
