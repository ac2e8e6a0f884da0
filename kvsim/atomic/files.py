"""Single output files (a trace, a report, a timeline, an animation, coefficients): written
whole through a temporary folder beside them and a rename, never over a user's file, never
over the command's own input.

An existing file is replaced only when it is provably kvsim's: listed with its present bytes
in the manifest of the kvsim folder holding it (a run folder's report.html), or with a
matching sidecar ``.NAME.kvsim.json`` that kvsim wrote beside it (kvsim/atomic/manifest.py).
A file the user named is replaced only with ``--force``; a kvsim folder's own default files
(``kvsim report RUN`` rewrites RUN/report.html) are kvsim's to rewrite.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvsim.atomic.folders import (
    _os_problem,
    _prepare_parent,
    _remove_empty,
    check_name,
    named,
)
from kvsim.atomic.manifest import (
    MANIFEST,
    SIDECAR_KEY,
    Manifest,
    _read_small,
    file_digest,
    find_root,
    find_roots,
    has_valid_sidecar,
    sidecar_bytes,
    sidecar_path,
)
from kvsim.atomic.names import OutputError, output_lock, remove_entry, remove_stale_temporaries
from kvsim.atomic.names import temp_path as _temp_path


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _is_input(final: Path, inputs: Sequence[Path]) -> Path | None:
    """The input that ``final`` is (the same file, through links or another name), if any."""
    for given in inputs:
        try:
            if os.path.samefile(final, given):
                return Path(given)
        except (OSError, ValueError):
            pass
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            if Path(final).resolve() == Path(given).resolve():
                return Path(given)
    return None


@contextlib.contextmanager
def _naming(final: Path, staging: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise named(exc, final, staging) from None


def check_output_file(
    path: Path, *, force: bool, inputs: Sequence[Path] = (), default: bool = False
) -> None:
    """Raise ``OutputError`` unless ``path`` may be written as one output file.

    It must not be a folder, a symbolic link, or one of ``inputs``; an existing file must be
    provably kvsim's, and is replaced only with ``force`` unless ``default`` (the kvsim
    folder's own file, which the command rewrites).
    """
    path = Path(path)
    given = _is_input(path, inputs)
    if given is not None:
        raise OutputError(
            f"{path}: is this command's input ({given}); write the output to another file"
        )
    check_name(path, "output file")
    if os.path.isdir(path):
        raise OutputError(f"{path}: is a folder (a directory), not a file: name the file to write")
    root = find_root(path)
    if root is not None:  # kvsim writes into its folder's own tree, never through a link
        for part in path.parents[: len(path.relative_to(root).parts) - 1]:
            if os.path.islink(part):
                raise OutputError(f"{part}: is a symbolic link; kvsim does not write through it")
    if not os.path.lexists(path):
        return
    ours = _listed(root, path) if root is not None else has_valid_sidecar(path)
    if not ours:
        proof = (
            f"not listed with these bytes in {root / MANIFEST}"
            if root is not None
            else f"no matching {sidecar_path(path).name} beside it"
        )
        raise OutputError(
            f"{path}: exists and is not a file kvsim wrote ({proof}); kvsim replaces only its "
            "own files: choose another file, or delete it yourself"
        )
    if not (force or default):
        raise OutputError(f"{path}: exists (written by kvsim); pass --force to replace it")


def _listed(root: Path, path: Path) -> bool:
    manifest = Manifest.read(root)
    if manifest is None or os.path.islink(path) or not path.is_file():
        return False
    rel = _rel(root, path)
    if rel not in manifest.files:
        return False
    size, digest = manifest.files[rel]
    try:
        return os.lstat(path).st_size == size and file_digest(path) == digest
    except OSError:
        return False


def _check_sidecar_slot(path: Path) -> None:
    """The sidecar's own name must be free or hold a kvsim sidecar (never a user's file)."""
    side = sidecar_path(path)
    if not os.path.lexists(side):
        return
    raw = _read_small(side, 1 << 16)
    if raw is None or f'"{SIDECAR_KEY}": 1'.encode() not in raw:
        raise OutputError(f"{side}: exists and is not kvsim's; kvsim will not replace it")


@contextlib.contextmanager
def output_file(
    final: Path, *, force: bool = False, inputs: Sequence[Path] = (), default: bool = False
) -> Iterator[Path]:
    """Yield a path named like ``final`` inside a fresh temporary folder beside it; when the
    block ends without an exception, the file written there replaces ``final`` (see
    ``check_output_file``, which runs before the block, under the lock and before the
    rename) and is recorded as kvsim's: in the manifest of the kvsim folder holding it, else
    in its sidecar. On any exception the temporary is removed and ``final`` is untouched."""
    final = Path(final)
    check_output_file(final, force=force, inputs=inputs, default=default)
    created = _prepare_parent(final)
    roots = find_roots(final)
    root = roots[0] if roots else None
    with contextlib.ExitStack() as stack:
        stack.callback(_remove_empty, created)
        # Inside a kvsim folder, the folders' locks (those `kvsim run --force` and `kvsim
        # sweep --force` take) and a temporary beside the nearest, so that nothing foreign
        # appears in their trees.
        anchor = final if root is None else root
        try:
            for outer in roots[1:]:
                stack.enter_context(output_lock(outer))
            lock = stack.enter_context(output_lock(anchor))
            remove_stale_temporaries(anchor.parent)
            check_output_file(final, force=force, inputs=inputs, default=default)
            if root is None:
                _check_sidecar_slot(final)
            staging = lock.register(_temp_path(anchor))
            os.mkdir(staging)
        except OSError as exc:
            raise OutputError(f"{final}: cannot write: {_os_problem(exc)}") from None
        try:
            with _naming(final, staging):
                yield staging / final.name
            written = staging / final.name
            if os.path.islink(written) or not written.is_file():
                raise OutputError(f"{final}: nothing was written")
            check_output_file(final, force=force, inputs=inputs, default=default)
            if root is None:
                side = staging / ".sidecar"
                side.write_bytes(sidecar_bytes(written))  # the same name and bytes as final
                os.replace(written, final)
                os.replace(side, sidecar_path(final))
            else:
                manifests = [Manifest.read(r) for r in roots]
                if any(m is None for m in manifests):
                    raise OutputError(f"{final}: a {MANIFEST} above it changed meanwhile")
                os.replace(written, final)
                for i, (folder, manifest) in enumerate(zip(roots, manifests, strict=True)):
                    assert manifest is not None
                    manifest.add_file(folder, _rel(folder, final))
                    for inner in roots[:i]:  # an outer manifest lists the inner ones' bytes
                        manifest.add_file(folder, _rel(folder, inner / MANIFEST))
                    manifest.write(folder)
        finally:
            remove_entry(staging)


__all__ = ["check_output_file", "output_file"]
