"""A secondary offload tier behind the CPU tier (a disk): vLLM 0.33's file-system tier
(vllm/v1/kv_offload/tiering/fs/manager.py, ``FileSystemTierManager``) as the scheduler sees
it, with its transfers timed on its own link and a capacity kvsim adds.

What vLLM's fs tier does, and kvsim with it (docs/offload.md, "Secondary tiers"):

- **Stores** (``submit_store``: a cascade from the CPU tier) write every key of the job, even
  one already on the tier (``batch_store_block`` rewrites its file); a chunk becomes visible
  when its write completes (the file is written to ``<path>.tmp`` and ``os.replace``'d).
- **Loads** (``submit_load``: a promotion into the CPU tier) read the keys' files.
- **Lookups are asynchronous** (tiering/async_lookup.py, ``AsyncLookupManager``): the first
  lookup of a key answers "not yet" (RETRY) and queues a probe; the step's
  ``on_schedule_end`` posts the probes (``flush``), a thread checks which files exist, and the
  answers are applied at the next step's first lookup (``drain_results``). kvsim's probe sees
  the chunks whose writes completed by the flush time (the thread runs right after it).
  An answer is kept per key while some request that asked for it is alive (``cleanup`` on
  the request's end), so a request that saw a miss keeps seeing it.
- **Capacity**: vLLM's fs tier has none (files stay until something outside vLLM deletes
  them). kvsim's tier holds ``num_chunks`` chunks and, when a store needs room, evicts the
  least recently written or read chunks that no load is reading; a store finding no room
  writes only the keys that fit. An evicted key's kept probe answer becomes a miss (vLLM's
  ``mark_miss`` after a failed load does the same for a vanished file).

Bytes on the link: one CPU chunk (``chunk_bytes``: the CPU tier's page-aligned chunk of every
tensor-parallel rank, the row the fs tier reads from the CPU tier's memory view) per key.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

from engine.offload.policies import OffloadKey
from engine.offload.transfer import TransferLink


@dataclass(frozen=True, slots=True)
class SecondaryTierConfig:
    """One secondary tier: ``name``, ``num_chunks`` CPU-sized chunks of ``chunk_bytes``
    bytes each, and its link (bytes/s read = tier -> CPU, bytes/s write = CPU -> tier, s)."""

    name: str
    num_chunks: int
    chunk_bytes: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not isinstance(self.num_chunks, int) or self.num_chunks < 1:
            raise ValueError(f"num_chunks must be an integer >= 1, got {self.num_chunks!r}")
        if not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be an integer >= 1, got {self.chunk_bytes!r}")


COMPLETION_SLACK_S = 1e-12


class TierLookup(enum.Enum):
    MISS = "miss"
    HIT = "hit"
    RETRY = "retry"  # a probe is on its way: ask again next step


class _Phase(enum.Enum):
    PENDING = 0  # queued, not posted
    IN_FLIGHT = 1  # posted at a flush, answer not applied yet
    RESOLVED = 2


@dataclass(slots=True)
class _Probe:
    generation: int
    phase: _Phase = _Phase.PENDING
    result: bool | None = None
    requests: set[int] = field(default_factory=set)


@dataclass(slots=True)
class TierJob:
    """A job on a secondary tier's link: a promotion (tier -> CPU) or a cascade (CPU ->
    tier); ``written``: the keys a cascade writes (all, unless the tier was full)."""

    job_id: int
    keys: tuple[OffloadKey, ...]
    is_promotion: bool
    nbytes: int
    submitted_s: float
    written: tuple[OffloadKey, ...] = ()
    completed_s: float | None = None


@dataclass(slots=True)
class TierStats:
    """Totals over a run (chunks, bytes, seconds of job time; lookups and hits in chunks)."""

    chunks_written: int = 0
    bytes_written: int = 0
    write_s: float = 0.0
    chunks_read: int = 0
    bytes_read: int = 0
    read_s: float = 0.0
    evictions: int = 0
    dropped: int = 0  # chunks a full tier could not take
    lookups: int = 0
    hits: int = 0


class SecondaryTier:
    """One secondary tier (module docstring); ``now`` arguments are seconds."""

    def __init__(self, config: SecondaryTierConfig) -> None:
        self.config = config
        self.name = config.name
        self.link = TransferLink(
            config.read_bytes_per_s, config.write_bytes_per_s, config.latency_s
        )
        self._stored: OrderedDict[OffloadKey, None] = OrderedDict()  # LRU first
        self._writing: dict[OffloadKey, int] = {}  # key -> writes in flight
        self._reading: dict[OffloadKey, int] = {}  # key -> loads in flight
        self._reserved = 0  # slots held by writes of keys not stored yet
        self.jobs: dict[int, TierJob] = {}  # in flight or done, not yet reported
        self._done: list[int] = []  # completed, not yet reported
        self.history: list[TierJob] = []  # every job ever submitted
        self.stats = TierStats()
        self._probes: dict[OffloadKey, _Probe] = {}
        self._request_probes: dict[int, set[OffloadKey]] = {}
        self._next_generation = 0
        self._batch: list[tuple[OffloadKey, int]] = []
        self._answers: list[tuple[OffloadKey, int, bool]] = []  # posted, to apply
        self._need_to_drain = False

    # --- contents ---------------------------------------------------------------------------

    @property
    def num_held(self) -> int:
        """Chunks on the tier or being written to it."""
        return len(self._stored) + self._reserved

    def holds(self, key: OffloadKey) -> bool:
        """``key``'s chunk is on the tier (its write completed)."""
        return key in self._stored

    def stored_keys(self) -> list[OffloadKey]:
        return list(self._stored)

    def _collect(self, now: float) -> None:
        link = self.link
        # A job due within a picosecond of ``now`` is done by it: the clock that polls may
        # have jumped to this job's completion computed by other float arithmetic (a
        # reference's transfer model), 1e-16 s off.
        due = link.next_completion_time()
        upto = max(now, link.now)
        if due is not None and upto < due <= upto + COMPLETION_SLACK_S:
            upto = due
        for t, job_id in link.advance_with_times(upto):
            job = self.jobs[job_id]  # type: ignore[index]
            job.completed_s = t
            self._done.append(job.job_id)
            if job.is_promotion:
                self.stats.read_s += t - job.submitted_s
                for key in job.keys:
                    left = self._reading[key] - 1
                    if left:
                        self._reading[key] = left
                    else:
                        del self._reading[key]
                continue
            self.stats.write_s += t - job.submitted_s
            for key in job.written:
                left = self._writing[key] - 1
                if left:
                    self._writing[key] = left
                else:
                    del self._writing[key]
                if key in self._stored:
                    self._stored.move_to_end(key)
                else:
                    self._reserved -= 1
                    self._stored[key] = None

    # --- the scheduler's calls (vLLM's SecondaryTierManager) --------------------------------

    def lookup(self, key: OffloadKey, seq_id: int) -> TierLookup:
        """AsyncLookupManager.lookup: the kept answer, or RETRY while a probe is on its way."""
        if self._need_to_drain:
            self._drain()
            self._need_to_drain = False
        probe = self._probes.get(key)
        if probe is None:
            probe = _Probe(self._next_generation)
            self._next_generation += 1
            self._probes[key] = probe
            self._batch.append((key, probe.generation))
        if seq_id not in probe.requests:  # (a request asks again every step it waits)
            probe.requests.add(seq_id)
            keys = self._request_probes.get(seq_id)
            if keys is None:
                keys = self._request_probes[seq_id] = set()
            keys.add(key)
        self.stats.lookups += 1
        if probe.result is None:
            return TierLookup.RETRY
        if probe.result:
            self.stats.hits += 1
            return TierLookup.HIT
        return TierLookup.MISS

    def _drain(self) -> None:
        answers, self._answers = self._answers, []
        for key, generation, result in answers:
            probe = self._probes.get(key)
            if probe is None or probe.generation != generation:
                continue
            if not probe.requests:
                del self._probes[key]
                continue
            probe.result = result
            probe.phase = _Phase.RESOLVED

    def on_schedule_end(self, now: float) -> None:
        """AsyncLookupManager.flush: apply answers, post this step's probes; each is answered
        with the tier's contents at ``now``."""
        self._collect(now)
        self._drain()
        self._need_to_drain = True
        batch, self._batch = self._batch, []
        for key, generation in batch:
            probe = self._probes.get(key)
            if probe is None or probe.generation != generation:
                continue
            probe.phase = _Phase.IN_FLIGHT
            self._answers.append((key, generation, key in self._stored))

    def probes_waiting(self) -> bool:
        """Lookups whose answers a next step would see (the engine steps again at once)."""
        return bool(self._batch or self._answers)

    def on_request_finished(self, seq_id: int) -> None:
        """AsyncLookupManager.cleanup: the request's probes lose it; unanswered ones stay."""
        for key in self._request_probes.pop(seq_id, ()):
            probe = self._probes[key]
            probe.requests.discard(seq_id)
            if not probe.requests and probe.phase is not _Phase.IN_FLIGHT:
                del self._probes[key]

    def submit_store(self, job_id: int, keys: tuple[OffloadKey, ...], now: float) -> TierJob:
        """A cascade: write ``keys`` (all of them, as the fs tier rewrites files), evicting
        for the new ones when the tier is full."""
        self._collect(now)
        written: list[OffloadKey] = []
        for key in keys:
            if key in self._stored or key in self._writing:
                written.append(key)
                continue
            if len(self._stored) + self._reserved >= self.config.num_chunks and not self._evict():
                self.stats.dropped += 1
                continue
            self._reserved += 1
            written.append(key)
        for key in written:
            self._writing[key] = self._writing.get(key, 0) + 1
        nbytes = len(written) * self.config.chunk_bytes
        job = TierJob(job_id, tuple(keys), False, nbytes, now, tuple(written))
        self._submit(job, "write")
        self.stats.chunks_written += len(written)
        self.stats.bytes_written += nbytes
        return job

    def _evict(self) -> bool:
        for key in self._stored:
            if key not in self._reading and key not in self._writing:
                del self._stored[key]
                self.stats.evictions += 1
                probe = self._probes.get(key)
                if probe is not None and probe.phase is _Phase.RESOLVED:
                    probe.result = False
                if self._answers:  # a probe posted before the eviction saw the chunk
                    self._answers = [(k, g, r and k != key) for k, g, r in self._answers]
                return True
        return False

    def submit_load(self, job_id: int, keys: tuple[OffloadKey, ...], now: float) -> TierJob:
        """A promotion: read ``keys`` (on the tier: a lookup found them this step)."""
        self._collect(now)
        for key in keys:
            self._reading[key] = self._reading.get(key, 0) + 1
            if key in self._stored:
                self._stored.move_to_end(key)
        nbytes = len(keys) * self.config.chunk_bytes
        job = TierJob(job_id, tuple(keys), True, nbytes, now)
        self._submit(job, "read")
        self.stats.chunks_read += len(keys)
        self.stats.bytes_read += nbytes
        return job

    def _submit(self, job: TierJob, direction: str) -> None:
        job.submitted_s = max(job.submitted_s, self.link.now)  # (the slack above)
        self.link.submit(job.job_id, direction, job.nbytes, job.submitted_s)  # type: ignore[arg-type]
        self.jobs[job.job_id] = job
        self.history.append(job)

    def get_finished_jobs(self, now: float) -> list[TierJob]:
        """The jobs completed by ``now`` not reported before, in completion order."""
        self._collect(now)
        if not self._done:
            return []
        done = [self.jobs.pop(job_id) for job_id in self._done]
        self._done = []
        return done

    def next_completion_time(self) -> float | None:
        return self.link.next_completion_time()
