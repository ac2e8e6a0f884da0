"""kvsim.analysis.table: the run's numpy tables, written through Arrow without pandas, must
read back as the DataFrames the run gives (RunResult.requests / .steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from frame_equality import assert_frame_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.analysis.table import (
    Table,
    column,
    dictionary_array,
    is_label,
    numeric_array,
    string_array,
)

LABELS = ("finished", "aborted", "rejected", "unfinished")


@st.composite
def tables(draw: st.DrawFn) -> Table:
    n = draw(st.integers(1, 40))

    def values(elements: st.SearchStrategy[Any], dtype: Any) -> np.ndarray:
        return np.array(draw(st.lists(elements, min_size=n, max_size=n)), dtype=dtype)

    return Table(
        {
            "seq_id": values(st.integers(-(2**63), 2**63 - 1), np.int64),
            "time_s": values(st.floats(allow_nan=True, allow_infinity=True), np.float64),
            "status": values(st.integers(0, 3), np.int8),
            "request_id": values(st.text(max_size=8), object),
            "finish_reason": values(st.one_of(st.none(), st.text(max_size=12)), object),
            "free_blocks": values(st.integers(0, 2**31 - 1), np.int32),
        },
        categories={"status": LABELS},
        text=frozenset({"request_id", "finish_reason"}),
    )


@settings(max_examples=60, deadline=None)
@given(table=tables())
def test_arrow_is_what_pa_array_makes_of_the_columns(table: Table) -> None:
    """The buffer-built Arrow columns equal pyarrow's own ``pa.array`` conversion (which the
    builders avoid only because it imports pandas): NaN as null, a categorical as a
    dictionary of strings, text as large strings."""
    theirs = {}
    for name, values in table.columns.items():
        if name in table.categories:
            theirs[name] = pa.DictionaryArray.from_arrays(
                pa.array(values), pa.array(table.categories[name], type=pa.string())
            )
        elif name in table.text:
            theirs[name] = pa.array(values.tolist(), type=pa.large_string())
        else:
            theirs[name] = pa.array(values, from_pandas=True)
    ours = table.to_arrow()
    assert ours.schema.equals(pa.table(theirs).schema)
    assert ours.equals(pa.table(theirs))


@settings(max_examples=30, deadline=None)
@given(table=tables())
def test_a_written_table_reads_back_as_its_dataframe(table: Table, tmp_path_factory) -> None:
    path = Path(tmp_path_factory.mktemp("t")) / "t.parquet"
    pq.write_table(table.to_arrow(), path, compression="zstd")
    assert_frame_equal(pd.read_parquet(path), table.to_pandas())


def test_an_empty_table_keeps_its_types() -> None:
    # a run cut by --until before any request arrived still writes typed columns
    empty = Table(
        {"request_id": np.empty(0, dtype=object), "status": np.empty(0, dtype=np.int8),
         "time_s": np.empty(0)},
        categories={"status": LABELS}, text=frozenset({"request_id"}),
    )  # fmt: skip
    schema = empty.to_arrow().schema
    assert schema.field("request_id").type == pa.large_string()
    assert schema.field("status").type == pa.dictionary(pa.int8(), pa.string())
    assert schema.field("time_s").type == pa.float64()
    assert len(empty.to_pandas()) == 0


def test_column_and_is_label_read_a_table_and_its_dataframe_alike() -> None:
    table = Table(
        {"status": np.array([0, 2, 3, 2], dtype=np.int8), "x": np.array([1.5, np.nan, 3, 4])},
        categories={"status": LABELS},
    )
    frame = table.to_pandas()
    for source in (table, frame):
        assert is_label(source, "status", "rejected").tolist() == [False, True, False, True]
        assert is_label(source, "status", ("finished", "unfinished")).tolist() == [
            True, False, True, False,
        ]  # fmt: skip
        assert is_label(source, "status", "aborted").sum() == 0
        np.testing.assert_array_equal(column(source, "x", float), [1.5, np.nan, 3, 4])
        assert len(source) == 4 and "x" in source


def test_the_builders_keep_values_nulls_and_types() -> None:
    assert numeric_array(np.array([1.0, np.nan]), nan_is_null=True).null_count == 1
    assert numeric_array(np.array([1.0, np.nan])).null_count == 0  # NaN is a value here
    # a strided view is copied into contiguous memory first
    assert numeric_array(np.arange(10, dtype=np.int16)[::3]).to_pylist() == [0, 3, 6, 9]
    strings = string_array(["é", None, ""], large=True)
    assert strings.type == pa.large_string() and strings.to_pylist() == ["é", None, ""]
    kinds = dictionary_array(np.array([1, 0, 1]), ["a", "b"])
    assert kinds.type == pa.dictionary(pa.int8(), pa.string())
    assert kinds.to_pylist() == ["b", "a", "b"]
    for outside in (2, -1):  # a code without a label is refused, not written
        with pytest.raises(ValueError, match="outside"):
            dictionary_array(np.array([0, outside]), ["a", "b"])
    with pytest.raises(TypeError, match="integers or floats"):
        numeric_array(np.array(["x"], dtype=object))


def test_columns_are_added_last_or_after_a_named_one() -> None:
    table = Table({"a": np.arange(2), "c": np.arange(2)})
    table["d"] = np.zeros(2)
    table.insert_after("a", "b", np.ones(2))
    table["a"] = np.arange(2) + 5  # replaced where it is
    assert list(table) == ["a", "b", "c", "d"]
    assert table["a"].tolist() == [5, 6] and table.to_arrow().column_names == ["a", "b", "c", "d"]
