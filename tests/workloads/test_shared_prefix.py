"""The shared-prefix recipe (workloads/shared_prefix.py): what inference-perf sends, as a trace."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import SpecError
from workloads.shared_prefix import (
    SharedPrefixRecipe,
    Stage,
    shared_prefix_trace,
    stage_of,
)


def recipe(**changes: object) -> SharedPrefixRecipe:
    fields: dict[str, object] = {
        "name": "codegen",
        "system_prompt_tokens": 105,
        "question_tokens": 487,
        "output_tokens": 247,
        "stages": (Stage(5.0, 60.0), Stage(10.0, 30.0)),
        "seed": 3,
    }
    fields.update(changes)
    return SharedPrefixRecipe(**fields)  # type: ignore[arg-type]


def test_each_stage_sends_exactly_rate_times_duration_within_its_window() -> None:
    trace = shared_prefix_trace(recipe())
    stages = np.array([stage_of(r.request_id) for r in trace.requests])
    times = np.array([r.arrival_time_s for r in trace.requests])
    assert np.bincount(stages).tolist() == [300, 300]
    first, second = times[stages == 0], times[stages == 1]
    assert first[0] == 0.0 and first.max() < 60.0
    assert second[0] == 60.0 and second.max() < 90.0
    assert np.all(np.diff(times) >= 0)
    # Exponential gaps: their spread is the mean's (coefficient of variation near 1), not a
    # fixed interval.
    gaps = np.diff(first)
    assert 0.8 < gaps.std() / gaps.mean() < 1.2


def test_request_i_sends_prompt_i_mod_100_and_groups_share_the_system_prompt() -> None:
    r = recipe()
    requests = [q for q in shared_prefix_trace(r).requests if stage_of(q.request_id) == 0]
    by_index = {int(q.request_id.split("-")[1]): q for q in requests}
    ids = {i: q.hash_ids or () for i, q in by_index.items()}
    assert all(q.prompt_tokens == 592 and q.output_tokens == 247 for q in requests)
    assert all(q.cancel_after_s == 300.0 for q in requests)
    assert ids[7] == ids[107] == ids[207]
    assert ids[7] != ids[8]
    shared = 105 // 16  # whole 16-token blocks inside the system prompt
    assert ids[10][:shared] == ids[19][:shared]  # group 1
    assert ids[10][shared] != ids[19][shared]  # the block holding the question differs
    assert not set(ids[0]) & set(ids[10])  # groups 0 and 1 share nothing
    assert len(ids[0]) == -(-592 // 16)


def test_same_recipe_same_trace_and_the_seed_matters() -> None:
    a = shared_prefix_trace(recipe()).requests
    assert a == shared_prefix_trace(recipe()).requests
    assert a != shared_prefix_trace(recipe(seed=4)).requests


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"output_tokens": 0}, "output_tokens must be a positive integer"),
        ({"stages": ()}, "at least one stage"),
        ({"stages": (Stage(0.001, 10.0),)}, "stages[0]"),
        ({"timeout_s": -1.0}, "timeout_s must be positive"),
        ({"stages": (Stage(float("inf"), 10.0),)}, "stages[0]"),
        ({"stages": (Stage(1e9, 1e9),)}, "stages[0]"),
        ({"stages": (Stage(9e3, 1e3), Stage(9e3, 1e3))}, "at most 10,000,000"),
    ],
)
def test_bad_recipes_are_refused_with_the_field(changes: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        recipe(**changes)
