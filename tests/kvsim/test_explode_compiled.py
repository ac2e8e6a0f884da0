"""events.parquet's rows: the compiled explode (engine/compiled/_explode.pxi) gives the numpy
rule's arrays (kvsim/analysis/events_io.py's exploded_columns_numpy), keys or none."""

from __future__ import annotations

import numpy as np
import pytest

from engine import EventKind
from engine.compiled import load
from kvsim.analysis.events_io import exploded_columns_numpy

core = load()
pytestmark = pytest.mark.skipif(core is None, reason="the compiled core is not built")


def chunk(seed: int, n: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, len(EventKind), n).astype(np.int8)
    counts = np.where(rng.random(n) < 0.5, rng.integers(0, 7, n), 0).astype(np.int32)
    cols = {
        "time_s": np.sort(rng.random(n)) * 100,
        "step": np.sort(rng.integers(0, 1000, n)).astype(np.int32),
        "kind": kinds,
        "seq_id": rng.integers(-1, 50, n).astype(np.int32),
        "free_blocks": rng.integers(0, 900, n).astype(np.int32),
        "num_tokens": rng.integers(0, 5000, n).astype(np.int32),
        "num_blocks": counts,
    }
    block_ids = rng.integers(0, 1 << 20, int(counts.sum()))
    keyed = np.isin(kinds, (EventKind.CACHE, EventKind.EVICT))
    hashes = rng.integers(-(1 << 62), 1 << 62, int(counts[keyed].sum()))
    return cols, block_ids, hashes


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("keyed", [False, True])
def test_compiled_explode_gives_the_numpy_rows(seed: int, keyed: bool) -> None:
    cols, block_ids, hashes = chunk(seed, [0, 1, 50, 3000, 10, 700][seed])
    want = exploded_columns_numpy(cols, block_ids, hashes if keyed else None)
    got = core.explode_events(cols, block_ids, hashes if keyed else None)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_mismatched_blocks_and_keys_are_refused() -> None:
    cols, block_ids, hashes = chunk(3, 200)
    with pytest.raises(ValueError, match="sum to"):
        core.explode_events(cols, block_ids[:-1])
    with pytest.raises(ValueError, match="block keys"):
        core.explode_events(cols, block_ids, hashes[:-1])
    negative = {**cols, "num_blocks": cols["num_blocks"].copy()}
    negative["num_blocks"][:2] += np.array([-1, 1], dtype=np.int32) - negative["num_blocks"][:2]
    negative["num_blocks"][2] += int(cols["num_blocks"][:2].sum())  # the same sum, one below 0
    with pytest.raises(ValueError, match="sum to"):
        core.explode_events(negative, block_ids)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("keyed", [False, True])
def test_cursor_pieces_give_the_numpy_rows(seed: int, keyed: bool) -> None:
    """The events writer fills its reused row-group buffer with ExplodeCursor.fill, a piece at
    a time: the pieces, whatever their sizes, are the numpy rule's rows in order (keys 0
    where a reused buffer held another row's)."""
    cols, block_ids, hashes = chunk(seed, [0, 1, 50, 3000, 10, 700][seed])
    want = exploded_columns_numpy(cols, block_ids, hashes if keyed else None)
    cursor = core.ExplodeCursor(cols, block_ids, hashes if keyed else None)
    assert cursor.rows == len(want["step"])
    rng = np.random.default_rng(seed)
    pieces: dict[str, list[np.ndarray]] = {name: [] for name in want}
    while not cursor.done:
        size = int(rng.integers(1, 40))
        buffer = {n: np.full(size, 7, dtype=want[n].dtype) for n in want}  # stale values
        start = int(rng.integers(0, size))
        took = cursor.fill(buffer, start)
        assert 0 < took <= size - start
        for name in want:
            pieces[name].append(buffer[name][start : start + took])
    for name in want:
        got = np.concatenate(pieces[name]) if pieces[name] else want[name][:0]
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    assert cursor.fill({n: np.empty(3, want[n].dtype) for n in want}, 0) == 0  # done


def test_the_exploded_dtypes_are_the_writers() -> None:
    from kvsim.analysis.events_io import EXPLODED_DTYPES

    assert core.EXPLODED_DTYPES == EXPLODED_DTYPES
