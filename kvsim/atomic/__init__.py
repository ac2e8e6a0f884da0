"""Write outputs so that nothing half-written is ever left behind and nothing of the user's is
ever replaced: one rule for every command that writes.

A folder (run, sweep, pictures, cache curve, profile, validation) is written into a temporary
folder beside it and swapped into place at the end (``output_folder``), with a manifest of
every file in it, sizes and SHA-256 (kvsim/atomic/manifest.py). A single file is written the
same way (``output_file``) and gets a sidecar, or a line in the manifest of the kvsim folder
holding it. An existing output is replaced only with ``force`` and only when that manifest or
sidecar proves every byte of it is kvsim's; the command's own input is never its output. A
lock beside the output keeps two kvsim processes from writing it at once.

Every temporary kvsim makes beside an output is listed, before it is made, in the owner
record of the writer's lock file ``.NAME.kvsim-lock`` (pid, host, boot, process start time:
kvsim/atomic/owner.py). A process that ends normally, fails or is interrupted removes its
own; one that was killed (SIGKILL, power loss) cannot, so each writer first removes what the
records of dead processes of this host list in the same parent folder, and puts back an old
output a dead process had moved aside without replacing it. Names alone prove nothing: a
look-alike without a valid record is left alone.
"""

from kvsim.atomic.files import check_output_file, output_file
from kvsim.atomic.folders import (
    FolderKind,
    atomic_dir,
    atomic_write_bytes,
    check_name,
    check_target,
    deferred_signals,
    exchange,
    output_folder,
)
from kvsim.atomic.names import (
    OutputBusyError,
    OutputError,
    lock_path,
    output_lock,
    remove_stale_temporaries,
    temp_path,
)

__all__ = [
    "FolderKind",
    "OutputBusyError",
    "OutputError",
    "atomic_dir",
    "atomic_write_bytes",
    "check_name",
    "check_output_file",
    "check_target",
    "deferred_signals",
    "exchange",
    "lock_path",
    "output_file",
    "output_folder",
    "output_lock",
    "remove_stale_temporaries",
    "temp_path",
]
