"""Who made a temporary: the owner record a kvsim writer keeps in its lock file.

A writer's lock file (``.NAME.kvsim-lock`` beside the output) holds a JSON record of the
process that holds it (pid, host, boot id and the process's start time) and of every
temporary it makes beside the output. A later writer removes a temporary only when a valid
record lists it and that record's process is dead on this host: the lock's ``flock`` is free
(the kernel drops it when its holder dies) and the pid is gone or now belongs to a process
started at another time. A file whose name merely looks like a kvsim temporary, or a lock
file with no valid record, is never removed.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORD_KEY = "kvsim_owner"
MAX_RECORD_BYTES = 1 << 16
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _host() -> str:
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket  # Windows

    return socket.gethostname()


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux's /proc/PID/stat field
    22); None where that cannot be read (no /proc, or no such process)."""
    text = _read_text(Path(f"/proc/{pid}/stat"))
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return int(fields[19])  # field 22 of the line; fields[0] is field 3
    except (IndexError, ValueError):
        return None


@dataclass(slots=True)
class OwnerRecord:
    """A lock holder and the temporaries (plain names beside the output) it made."""

    pid: int
    host: str
    boot: str | None
    started: int | None
    temporaries: list[str] = field(default_factory=list)

    @classmethod
    def mine(cls) -> OwnerRecord:
        pid = os.getpid()
        return cls(pid, _host(), _read_text(_BOOT_ID), process_start(pid))

    def to_bytes(self) -> bytes:
        data = {
            RECORD_KEY: 1, "pid": self.pid, "host": self.host, "boot": self.boot,
            "started": self.started, "temporaries": self.temporaries,
        }  # fmt: skip
        return json.dumps(data).encode()

    @classmethod
    def parse(cls, raw: bytes) -> OwnerRecord | None:
        """The record in ``raw``; None unless it is one kvsim wrote (all fields well typed)."""
        try:
            data: Any = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.get(RECORD_KEY) != 1:
            return None
        pid, host, boot, started = (data.get(k) for k in ("pid", "host", "boot", "started"))
        temporaries = data.get("temporaries")
        if type(pid) is not int or pid < 1 or not isinstance(host, str) or not host:
            return None
        if not (boot is None or isinstance(boot, str)):
            return None
        if not (started is None or type(started) is int):
            return None
        if not isinstance(temporaries, list) or not all(isinstance(t, str) for t in temporaries):
            return None
        return cls(pid, host, boot, started, list(temporaries))

    def is_dead_here(self) -> bool:
        """Whether the recorded process is provably gone: of this host, and its pid no longer
        runs, or runs a process started at another time (or the machine rebooted since)."""
        if self.host != _host():
            return False
        if self.pid == os.getpid():
            return False
        boot = _read_text(_BOOT_ID)
        if self.boot is not None and boot is not None and boot != self.boot:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # someone else's live process
            pass
        if self.started is None:
            return False
        started = process_start(self.pid)
        return started is not None and started != self.started

    def owns(self, name: str) -> bool:
        """Whether ``name`` is one of this record's temporaries as kvsim names them: a plain
        hidden name made by this pid (a hand-edited record cannot point anywhere else)."""
        return (
            name in self.temporaries
            and name not in ("", ".", "..")
            and "/" not in name
            and "\x00" not in name
            and _TEMP.match(name) is not None
            and f"-{self.pid}-" in name
        )


_TEMP = re.compile(r"^\..+\.kvsim-(tmp|old)-[0-9a-f]{6}-\d+-\w+$")
