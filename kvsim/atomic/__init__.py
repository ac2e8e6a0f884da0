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

from kvsim.atomic.folders import (
    FolderKind,
    atomic_dir,
    atomic_write_bytes,
    check_name,
    check_output_file,
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
    "output_folder",
    "output_lock",
    "remove_stale_temporaries",
    "temp_path",
]
