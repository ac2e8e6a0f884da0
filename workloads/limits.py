"""Bounds on what a trace, an import or a generator option may hold, each with its reason.

Values past these bounds are refused with a message that names the bound, instead of failing
later deep inside numpy, the engine or the Parquet writer (docs/formats.md lists them).
"""

from __future__ import annotations

import numbers
from typing import TypeGuard

# Prompt or output length, tokens. The engine packs token counts into int32 event columns;
# with each length at most 2^30, a whole sequence (prompt + output) still fits in 2^31 - 1.
MAX_TOKENS = 2**30

# Arrival times and patience, seconds. Below 2^32 s (about 136 years) one step of a float64
# clock is under 1 microsecond, the resolution kvsim writes times at; far beyond it a 10 ms
# decode step rounds to nothing and latencies stop meaning anything.
MAX_TIME_S = float(2**32)

# Integer request/session ids and hash_ids: 64-bit values, signed or unsigned (hashes of either
# kind fit). priority: a signed 64-bit integer, as in vLLM and Parquet.
MIN_INT64 = -(2**63)
MAX_INT64 = 2**63 - 1
MAX_UINT64 = 2**64 - 1

# Characters of a request_id, session_id or trace name. Real ids are UUIDs or hashes (36-64);
# the bound keeps every id inside Python's 131,072-character CSV cell limit (so any trace can be
# saved as CSV and read back) and ids usable as labels.
MAX_ID_CHARS = 1024

# One line of a JSON Lines or CSV file (its line end included), bytes. A record holds a few
# numbers and at most ceil(prompt / hash_block_size) hash ids; 1 MiB is ample, and the cap keeps
# a file with no line ends (e.g. a copy of /dev/zero) from filling memory.
MAX_LINE_BYTES = 1 << 20

# A whole JSON document trace (parsed at once; Python needs about 10x its size), bytes.
MAX_DOCUMENT_BYTES = 1 << 30

# Requests one generator call may draw: 10^8 requests already need tens of GiB as Python
# objects; a larger count is a typo (e.g. 1e14), not a workload.
MAX_GENERATED_REQUESTS = 10**8

# Coefficient of variation of Gamma inter-arrival gaps. Above 100 the Gamma shape (1/CV^2) is
# so small that nearly every gap underflows to 0 and a sample's mean rate no longer matches
# --rate (measured: CV 1000 gives a sample mean gap 50x too small); below 0.001 the gaps are
# constant to 6 decimals anyway.
MIN_GAMMA_CV = 1e-3
MAX_CV = 100.0

# Integers with more significant digits than this are out of every range above; parsers keep
# them as OversizedInteger instead of calling int() (which refuses more than 4,300 digits).
MAX_INTEGER_DIGITS = 30


def is_number(value: object) -> TypeGuard[float]:
    """A real number option (int, float or numpy scalar), not a bool: ``True`` is no rate."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_integer(value: object) -> TypeGuard[int]:
    """An integer option (int or numpy integer), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
