"""A disk tier for vLLM 0.33's TieringOffloadingSpec, timed by the transfer model.

vLLM's own disk tier, vllm/v1/kv_offload/tiering/fs/manager.py (FileSystemTierManager), writes
real files from a pool of I/O threads and probes them from a lookup thread: its completions
come at wall-clock times no logical clock can reproduce. This tier keeps the fs tier's
scheduler-side rules and replaces only the I/O:

- lookups go through vLLM's own AsyncLookupManager (tiering/async_lookup.py), as the fs
  tier's FsAsyncLookupManager does; its batch_lookup asks which chunks are "on disk" (their
  write completed) instead of os.path.exists, and on_schedule_end waits for the lookup
  thread's answer right after the flush (a probe answers within one engine step);
- submit_store writes every key of the job (the fs tier rewrites existing files), a chunk
  being on disk once its write completes (the fs tier's os.replace); submit_load reads;
- no capacity, no eviction (the fs tier has none);
- each job is a transfer on its own transfer_model.Link (read: disk -> CPU, write: CPU ->
  disk), one CPU chunk (the primary memory view's row, ``block_size_bytes``) per key;
  get_finished_jobs reports the jobs completed by the driver's clock ``now``.

The driver sets ``TimedFsTier.INSTANCE.now`` before each schedule() and update_from_output()
and records the jobs (``log``).
"""

from __future__ import annotations

import time

from transfer_model import Link
from vllm.v1.kv_offload.base import LookupResult, Medium, RequestOffloadingContext
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager


class _DiskLookup(AsyncLookupManager):
    def __init__(self, tier: "TimedFsTier") -> None:
        super().__init__(tier_type=tier.tier_type)
        self._tier = tier

    def batch_lookup(self, keys, req_context):
        on_disk = self._tier.on_disk
        return [k in on_disk for k in keys]


class TimedFsTier(SecondaryTierManager):
    medium = Medium.STORAGE
    INSTANCE: "TimedFsTier | None" = None

    def __init__(self, offloading_spec, primary_kv_view, tier_type, read_gbps=7.0,
                 write_gbps=5.0, latency_us=80.0, backpressure_detector=None):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.link = Link(read_gbps * 1e9, write_gbps * 1e9, latency_us * 1e-6)
        self.now = 0.0
        self.on_disk: set = set()
        self.jobs: dict[int, tuple[list, bool]] = {}  # in flight: keys, is_promotion
        self.log: list[dict] = []  # submitted and reported jobs, for the step records
        self._finished: list = []  # completed, not yet reported
        self._lookup = _DiskLookup(self)
        TimedFsTier.INSTANCE = self

    # ---------------------------------------------------------------- transfers
    def _collect(self):
        for job in self.link.collect(self.now):
            keys, is_promotion = self.jobs[job.job_id]
            if not is_promotion:
                self.on_disk.update(keys)
            self._finished.append(job)

    def submit_store(self, job_metadata):
        self._collect()
        keys = list(job_metadata.keys)
        self.jobs[job_metadata.job_id] = (keys, False)
        self.link.submit(job_metadata.job_id, "write", len(keys) * self.block_size_bytes,
                         self.now)
        self.log.append({"event": "cascade", "job": job_metadata.job_id, "keys": keys,
                         "request": job_metadata.req_context.req_id})

    def submit_load(self, job_metadata):
        self._collect()
        keys = list(job_metadata.keys)
        self.jobs[job_metadata.job_id] = (keys, True)
        self.link.submit(job_metadata.job_id, "read", len(keys) * self.block_size_bytes,
                         self.now)
        self.log.append({"event": "promotion", "job": job_metadata.job_id, "keys": keys,
                         "request": job_metadata.req_context.req_id})

    def get_finished_jobs(self):
        self._collect()
        done, self._finished = self._finished, []
        out = []
        for job in done:
            self.jobs.pop(job.job_id)
            self.log.append({"event": "done", "job": job.job_id})
            out.append(JobResult(job_id=job.job_id, success=True,
                                 transfer_time=job.done_s - job.submit_s,
                                 transfer_bytes=int(job.nbytes)))
        return out

    def next_completion(self) -> float:
        return self.link.next_completion()

    def probes_waiting(self) -> bool:
        lk = self._lookup
        return bool(lk._lookup_batch) or not lk._pending_results.empty()

    # ---------------------------------------------------------------- lookups
    def lookup(self, key, req_context):
        result = self._lookup.lookup(key, req_context)
        if result is None:
            return LookupResult.RETRY
        return LookupResult.HIT if result else LookupResult.MISS

    def on_schedule_end(self, context):
        self._collect()
        lk = self._lookup
        posted = any(
            (st := lk._lookup_state.get(k)) is not None and st.generation == g
            for k, _ctx, g in lk._lookup_batch)
        lk.flush()
        if posted:  # the probe answers within the step: wait for the lookup thread
            while lk._pending_results.empty():
                time.sleep(0.0001)

    def on_request_finished(self, req_context):
        self._lookup.cleanup(req_context.req_id)

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def drain_jobs(self):
        return

    def shutdown(self):
        self._lookup.shutdown()
