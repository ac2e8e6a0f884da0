"""An open-loop replay with its clock in the compiled core (engine/compiled/csrc/open_loop.hpp).

``run_inline`` (kvsim/sim/inline_clock.py) replays an open-loop trace's arrivals and engine
loop over one heap in Python: per request a submission through ``CompiledV1Simulation.submit``,
per arrival or pending step a return from the core, a heap entry and a Python loop turn (the
1 M-request benchmark: about a fifth of the main thread). ``run_in_core`` hands the same heap
to the core: the requests go in once, as columns (arrival times, lengths, priorities, the
prefix keys the key source gives, the final lengths the usage tracker needs), and the core
submits each at the time and in the order run_inline would, returning to Python only when
events are to be taken or progress is due. tests/kvsim/test_inline_clock.py holds the two
equal, event for event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from engine.compiled import load
from engine.core.events import EventRecorder
from kvsim.sim.simulation import Progress
from workloads import Request
from workloads.request_columns import ARRAY_COLUMNS, request_column, requests_with_extras

KeySource = Callable[[Request], tuple[list[int], int] | None]


class CoreClockSimulation(Protocol):
    """What ``run_in_core`` uses of a CompiledV1Simulation (kvsim/sim/compiled_v1.py, which
    imports this module)."""

    env: Any  # simpy.Environment
    core: Any  # engine.compiled's V1Core
    requests: list[Request]
    recorder: EventRecorder
    _submitted: list[Request]
    _key_source: KeySource
    _progress_every: int
    _next_progress: int
    _all_submitted: bool

    def final_lengths(
        self, prompt_tokens: np.ndarray, output_tokens: np.ndarray
    ) -> np.ndarray | None: ...
    def _finished(self, finished: list[tuple[int, str, str]]) -> None: ...
    def _take_events(self, at_least: int) -> None: ...
    def _report(self, progress: Progress | None) -> None: ...


def key_columns(
    requests: Sequence[Request], key_source: KeySource
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """The requests' prefix keys as OpenLoopClock takes them: (key_start, key_ids,
    key_block_size), V1Core.add_hash_id_request's hashed ids; (None, None, None) when no
    request has any. Only requests with hash_ids or a session_id are asked: the others
    have none (``key_source_of``'s rule), which a long trace's columns know without
    building their Requests."""
    starts = np.zeros(len(requests) + 1, dtype=np.int64)
    sizes = np.zeros(len(requests), dtype=np.int32)
    ids: list[int] = []
    for i, request in requests_with_extras(requests):
        keys = key_source(request)
        if keys is not None:
            starts[i + 1] = len(keys[0])
            ids.extend(hash(int(h)) for h in keys[0])
            sizes[i] = keys[1]
    if not ids:
        return None, None, None
    return np.cumsum(starts), np.array(ids, dtype=np.int64), sizes


def request_columns(requests: Sequence[Request]) -> dict[str, np.ndarray]:
    """arrival_time_s, prompt_tokens, output_tokens and priority of ``requests``, as arrays."""
    return {name: request_column(requests, name) for name in ARRAY_COLUMNS}


def run_in_core(sim: CoreClockSimulation, progress: Progress | None) -> None:
    """Replay ``sim``'s requests to the end, as ``run_inline`` would (where
    ``CompiledV1Simulation.inline_clock_applies``): every request is submitted by then."""
    core_module: Any = load()
    requests = sim.requests
    columns = request_columns(requests)
    # request i is seq_id i (final_length_of reads them); a long trace's columns stay columns
    sim._submitted = requests
    final = sim.final_lengths(columns["prompt_tokens"], columns["output_tokens"])
    key_start, key_ids, key_block_size = key_columns(requests, sim._key_source)
    clock = core_module.OpenLoopClock(
        sim.core, **columns, final_length=final, key_start=key_start, key_ids=key_ids,
        key_block_size=key_block_size, start=sim.env._now,
    )  # fmt: skip
    chunk_size = sim.recorder.chunk_size
    report_every = sim._progress_every if progress is not None else 0
    while True:
        outcome = clock.drive(report_every, sim._next_progress, chunk_size)
        # what run_inline does after each V1Core.run that returns
        sim.env._now = clock.now
        sim._finished(sim.core.take_finished())
        sim._take_events(chunk_size)
        sim._report(progress)
        if outcome == core_module.OPEN_LOOP_DONE:
            break
    sim._all_submitted = True
