"""A run's tables (requests, steps, the plots' PREEMPT/REJECT marks) as numpy columns.

The run computes every metric on these columns and writes requests.parquet and
steps.parquet through pyarrow; a pandas DataFrame is built only when something asks for one
(plots, notebooks, sweeps). Importing pandas costs 0.3-0.5 s, a third of what `kvsim run
--no-plots` on the default trace may take in all (issue 13: 1.0 s).

Analysis functions that read a table (``kvsim.analysis.load``, ``metrics.summarize``) take a
``Table`` or a DataFrame with the same columns: ``column`` and ``is_label`` read either.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd


@dataclass(slots=True)
class Table:
    """Equal-length numpy columns, in order; read like a DataFrame (``t["name"]``, ``"name"
    in t``, ``len(t)`` rows). A column named in ``categories`` holds int8 codes into its
    labels (a categorical); one in ``text`` holds ``str`` objects (``None`` where missing)."""

    columns: dict[str, np.ndarray]
    categories: dict[str, tuple[str, ...]] = field(default_factory=dict)
    text: frozenset[str] = frozenset()

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __setitem__(self, name: str, values: np.ndarray) -> None:
        self.columns[name] = values  # replaced in place, or added last

    def insert_after(self, after: str, name: str, values: np.ndarray) -> None:
        """Add column ``name`` right after column ``after``."""
        items = list(self.columns.items())
        at = [n for n, _ in items].index(after) + 1
        self.columns = dict([*items[:at], (name, values), *items[at:]])

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def code_of(self, name: str, label: str) -> int:
        """The code of ``label`` in the categorical column ``name`` (-1 if it has none)."""
        labels = self.categories[name]
        return labels.index(label) if label in labels else -1

    def to_arrow(self) -> pa.Table:
        """The table as Arrow, typed as pandas writes the DataFrame (``to_pandas``): a
        categorical becomes a dictionary of strings, NaN a null, text a large string."""
        arrays: dict[str, pa.Array] = {}
        for name, values in self.columns.items():
            if name in self.categories:
                arrays[name] = dictionary_array(values, self.categories[name])
            elif name in self.text:
                arrays[name] = string_array(values, large=True)
            else:
                arrays[name] = numeric_array(values, nan_is_null=True)
        return pa.table(arrays)

    def to_pandas(self) -> pd.DataFrame:
        """The table as a DataFrame: what ``pd.read_parquet`` gives for the file written from
        ``to_arrow`` (categoricals as ``pd.Categorical``, text in pandas' string dtype)."""
        return self.to_arrow().to_pandas()


TableLike = Any  # a Table, or a DataFrame with the same columns


def column(table: TableLike, name: str, dtype: Any = None) -> np.ndarray:
    """Column ``name`` as a numpy array (a DataFrame's Series converted; a Table's
    categorical as its codes: compare those with ``is_label``)."""
    values: np.ndarray = table[name] if isinstance(table, Table) else table[name].to_numpy()
    return values if dtype is None else values.astype(dtype, copy=False)


def is_any(values: np.ndarray, codes: Sequence[int]) -> np.ndarray:
    """``np.isin(values, codes)`` for integer ``values`` and a few ``codes``, as one ``==``
    per code: np.isin's set machinery costs more than the comparisons it saves (an event
    chunk of 300,000 kinds, two codes: 2.9 -> 0.8 ms; 42,000 steps, one: 0.27 -> 0.02 ms)."""
    if len(codes) > 4:
        return np.isin(values, codes)
    out = np.zeros(len(values), dtype=bool)
    for code in codes:
        out |= values == code
    return out


def is_label(table: TableLike, name: str, labels: str | Sequence[str]) -> np.ndarray:
    """Rows whose categorical (or text) column ``name`` holds ``labels`` (one or several)."""
    wanted = [labels] if isinstance(labels, str) else list(labels)
    if isinstance(table, Table) and name in table.categories:
        codes = [table.code_of(name, label) for label in wanted]
        return is_any(table.columns[name], codes)
    if isinstance(table, Table):
        return np.isin(table.columns[name], wanted)
    rows: np.ndarray = table[name].isin(wanted).to_numpy(dtype=bool)
    return rows


# pa.array() imports pandas on its first call, whatever it is given (pyarrow's pandas shim):
# 0.3-0.5 s of a 1.0 s `kvsim run`. These hand numpy's buffers to Arrow directly instead.


def numeric_array(values: np.ndarray, *, nan_is_null: bool = False) -> pa.Array:
    """A numeric numpy array as Arrow, sharing its memory; with ``nan_is_null`` a float NaN
    becomes a null (as ``pa.array(values, from_pandas=True)``)."""
    values = np.ascontiguousarray(values)
    if values.dtype.kind not in "iuf":
        raise TypeError(f"numeric_array: expected integers or floats, got {values.dtype}")
    validity, null_count = None, 0
    if nan_is_null and values.dtype.kind == "f":
        valid = ~np.isnan(values)
        null_count = len(values) - int(np.count_nonzero(valid))
        if null_count:
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(values.dtype),
        len(values),
        [validity, pa.py_buffer(values)],
        null_count=null_count,
    )


def string_array(values: Sequence[str | None] | np.ndarray, *, large: bool = False) -> pa.Array:
    """``str`` values (``None``: null) as an Arrow string (``large``: large_string) array."""
    encoded = [b"" if v is None else v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    valid = np.fromiter((v is not None for v in values), bool, len(encoded))
    null_count = len(encoded) - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    return pa.Array.from_buffers(
        pa.large_string() if large else pa.string(),
        len(encoded),
        [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
        null_count=null_count,
    )


def dictionary_array(codes: np.ndarray, labels: Sequence[str]) -> pa.DictionaryArray:
    """A categorical (int8 ``codes`` into ``labels``) as an Arrow dictionary of strings.
    Raises ValueError for a code outside ``labels``."""
    codes = codes.astype(np.int8, copy=False)
    # The codes' bounds checked by numpy, not by Arrow (safe=True): 0.22 -> 0.03 ms for an
    # events.parquet row group of 262,144 rows, on the events writer's thread
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= len(labels)):
        raise ValueError(f"category codes outside 0..{len(labels) - 1}")
    return pa.DictionaryArray.from_arrays(
        numeric_array(codes), string_array(list(labels)), safe=False
    )
