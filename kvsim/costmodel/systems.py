"""Which all-reduce ``system`` a coefficient file may name, checked against its own fits.

A system is what a network profile's file name calls it (``a100_dgx``: the file
``network/a100_dgx__all_reduce.csv``). A coefficient file's ``allreduce.system`` must be one of
the systems kvsim ships profiles of, or the system of a file its ``provenance.allreduce.profiles``
lists (a user's own fit), or ``none`` where it holds no all-reduce fit (tp must then be 1).
Anything else is a typo or a hand edit that no fit stands behind, and is refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from kvsim.costmodel.specio import CostModelError, nonempty_str

__all__ = ["NO_SYSTEM", "SHIPPED_SYSTEMS", "check_system", "profile_systems"]

# The systems of profiles/vidur/network/SYSTEM__all_reduce.csv (a test keeps them in step).
SHIPPED_SYSTEMS = frozenset(
    {"a100_dgx", "a100_pairwise_nvlink", "h100_dgx", "h100_pairwise_nvlink"}
)
# The system of a file without an all-reduce fit (kvsim calibrate writes it).
NO_SYSTEM = "none"

_SYSTEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_NETWORK_FILE = re.compile(r"(?P<system>[^_].*?)__all_reduce\.csv")


def profile_systems(profiles: Iterable[str]) -> set[str]:
    """The systems of the network profile file names among ``profiles``."""
    return {m["system"] for p in profiles if (m := _NETWORK_FILE.fullmatch(p)) is not None}


def check_system(
    value: object, fitted_workers: Collection[int], profiles: Iterable[str], source: str
) -> str:
    """``value`` as an all-reduce system, or CostModelError naming ``source`` and the field.

    fitted_workers: the worker counts ``allreduce.by_num_workers`` fits; profiles: the file
    names of ``provenance.allreduce.profiles``.
    """
    system = nonempty_str(value, "allreduce.system", source)
    if not _SYSTEM.fullmatch(system):
        raise CostModelError(
            f"{source}: allreduce.system must name a network profile's system (letters, "
            f"digits, _ . + -, e.g. a100_dgx), got {system[:80]!r}"
        )
    if system == NO_SYSTEM:
        if fitted_workers:
            raise CostModelError(
                f"{source}: allreduce.system {NO_SYSTEM!r} means no all-reduce fit, but "
                f"allreduce.by_num_workers fits {sorted(fitted_workers)} workers"
            )
        return system
    known = SHIPPED_SYSTEMS | profile_systems(profiles)
    if system not in known:
        raise CostModelError(
            f"{source}: allreduce.system {system!r} is unknown (known: "
            f"{', '.join(sorted(known))}, the system of a SYSTEM__all_reduce.csv in "
            f"provenance.allreduce.profiles, or {NO_SYSTEM!r} without fits)"
        )
    if not fitted_workers:
        raise CostModelError(
            f"{source}: allreduce.by_num_workers is empty but allreduce.system is {system!r} "
            f"(a file without all-reduce fits names the system {NO_SYSTEM!r})"
        )
    return system
