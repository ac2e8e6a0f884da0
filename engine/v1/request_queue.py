"""The v1 scheduler's waiting queue under ``policy="priority"``.

vLLM 0.33 (vllm/v1/core/sched/request_queue.py) keeps waiting requests in a heap ordered by
(priority, arrival time, request id compared as a string); a preempted request goes back
into the heap in its place rather than to the front. This queue has the subset of
``collections.deque``'s interface the scheduler uses, so FCFS keeps a plain deque.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from engine.core.sequence import Sequence

Entry = tuple[int, float, str, Sequence]  # (priority, arrival_time, str(seq_id), seq)


class PriorityWaitingQueue:
    """Waiting sequences, lowest (priority, arrival_time, str(seq_id)) first."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[Entry] = []

    def append(self, seq: Sequence) -> None:
        heapq.heappush(self._heap, (seq.priority, seq.arrival_time, str(seq.seq_id), seq))

    appendleft = append  # a preempted sequence keeps its place in the order

    def popleft(self) -> Sequence:
        return heapq.heappop(self._heap)[3]

    def __getitem__(self, index: int) -> Sequence:
        if index != 0:
            raise IndexError("only the head of a priority queue can be read")
        return self._heap[0][3]

    def remove(self, seq: Sequence) -> None:
        self._heap = [entry for entry in self._heap if entry[3] is not seq]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Sequence]:
        """In queue order."""
        return (entry[3] for entry in sorted(self._heap))
