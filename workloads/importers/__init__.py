"""Importers for public LLM-serving traces, keyed by the names the CLI and scripts use.

Every importer takes the source path and a keyword ``name`` (default: the file's stem) and
returns an :class:`ImportResult` (trace, rows read, rows dropped by reason). ``lengths`` also
needs ``arrivals`` (an ArrivalProcess) and takes ``seed`` and ``num_requests``.
"""

from __future__ import annotations

from collections.abc import Callable

from workloads.importers.azure import import_azure
from workloads.importers.burstgpt import import_burstgpt
from workloads.importers.common import ImportResult
from workloads.importers.lengths import import_lengths
from workloads.importers.mooncake import import_mooncake

IMPORTERS: dict[str, Callable[..., ImportResult]] = {
    "azure": import_azure,
    "mooncake": import_mooncake,
    "lengths": import_lengths,
    "burstgpt": import_burstgpt,
}

__all__ = [
    "IMPORTERS",
    "ImportResult",
    "import_azure",
    "import_burstgpt",
    "import_lengths",
    "import_mooncake",
]
