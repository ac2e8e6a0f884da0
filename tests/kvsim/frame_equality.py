"""Frame equality for the simulator's tables at the speed of their size."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def assert_frame_equal(left: pd.DataFrame, right: pd.DataFrame, **options: Any) -> None:
    """``pd.testing.assert_frame_equal`` with its default strictness, categorical columns
    compared as their categories (in order, with their dtype), ``ordered`` flags and codes:
    what pandas checks of them, without boxing every value (pandas 3 turns each value of a
    categorical with str categories into a Python object, about 2 s for an events table of
    160,000 rows). Other options go to pandas as they are."""
    if options.get("check_categorical", True):
        names = [
            name
            for name, dtype in left.dtypes.items()
            if isinstance(dtype, pd.CategoricalDtype)
            and isinstance(right.dtypes.get(name), pd.CategoricalDtype)
        ]
        for name in names:
            a, b = left[name].cat, right[name].cat
            pd.testing.assert_index_equal(a.categories, b.categories, obj=f"{name} categories")
            assert a.ordered == b.ordered, (name, a.ordered, b.ordered)
            np.testing.assert_array_equal(a.codes.to_numpy(), b.codes.to_numpy(), err_msg=name)
        if names:  # the codes are checked; compare the rest (names, order, index, dtypes)
            left = left.assign(**{name: 0 for name in names})
            right = right.assign(**{name: 0 for name in names})
    pd.testing.assert_frame_equal(left, right, **options)
